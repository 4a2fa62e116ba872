"""Interrupts that stop a run cleanly: SIGINT (Ctrl-C) and SIGTERM (a scheduler's pre-emption).

Inside :func:`deferred` the first SIGINT or SIGTERM does not raise: it is
remembered, and the training loop stops at the end of the block of rounds it
is computing (a jitted ``lax.scan`` cannot be cut short), writes its checkpoint
and results, and raises :class:`Interrupted`. A second signal while it does so
stops the process at once (``KeyboardInterrupt``), as a user pressing Ctrl-C
twice expects. A signal the process ignores (``nohup``; SIGINT in a shell's
background job) stays ignored. Outside the main thread signals cannot be
caught, and nothing is changed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """A run stopped by a signal after writing what it had; ``history`` holds it.

    ``exit_code`` is the shell's for the signal: 130 for SIGINT, 143 for SIGTERM.
    """

    def __init__(self, signum: int, done: int, history=None):
        self.signum, self.done, self.history = signum, done, history
        super().__init__(f"interrupted by {signal.Signals(signum).name} after round {done}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Pending:
    """The first signal received inside :func:`deferred`, or None."""

    signum: int | None = None

    def agreed(self) -> int | None:
        """The signal, agreed between the processes of a multi-process run (each checks
        between blocks; a process that stopped alone would leave the others waiting in
        their next collective): the largest any process received, or None."""
        if jax.process_count() == 1:
            return self.signum
        every = multihost_utils.process_allgather(np.int32(self.signum or 0))
        self.signum = int(np.max(every)) or None
        return self.signum


@contextlib.contextmanager
def deferred() -> Iterator[Pending]:
    """Defers SIGINT and SIGTERM for the duration; yields the :class:`Pending` they set."""
    pending = Pending()
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def remember(signum, frame):
        if pending.signum is not None:
            raise KeyboardInterrupt
        pending.signum = signum

    # A signal the process was told to ignore (``nohup``, a background job's SIGINT) stays ignored.
    previous = {
        s: signal.signal(s, remember) for s in SIGNALS if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        yield pending
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
