"""Interrupts that stop a run cleanly: SIGINT (Ctrl-C) and SIGTERM (a scheduler's pre-emption).

Inside :func:`deferred` the first SIGINT or SIGTERM does not raise: it is
remembered, and the training loop stops at the end of the block of rounds it
is computing (a jitted ``lax.scan`` cannot be cut short), writes its checkpoint
and results, and raises :class:`Interrupted`. Further signals while it does so
are ignored: a second Ctrl-C cannot make the block end sooner, and would only
lose what it was about to write (SIGQUIT, Ctrl-\\, still stops the process at
once). ``deferred`` blocks nest: a run defers signals from its loop to its last
written file, the loop inside it sharing the run's :class:`Pending`. A signal
the process ignores (``nohup``; SIGINT in a shell's background job) stays
ignored. Outside the main thread signals cannot be caught, and nothing is changed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """A run stopped by a signal after writing what it had; ``history`` holds it.

    ``exit_code`` is the shell's for the signal: 130 for SIGINT, 143 for SIGTERM.
    ``trained``: whether anything was trained (False: stopped before its first round, no
    checkpoint; ``history``, when the results were opened, holds round 0's evaluation).
    The defaults are a Ctrl-C before anything was computed.
    """

    def __init__(
        self, signum: int = signal.SIGINT, done: int = 0, history=None, *, trained: bool = True
    ):
        self.signum, self.done, self.history, self.trained = signum, done, history, trained
        when = f"after round {done}" if done else "before the first round"
        super().__init__(f"interrupted by {signal.Signals(signum).name} {when}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def describe(self, out: str | Path, resume: str) -> str:
        """The line a command ends with: what was kept, where, and the ``resume`` command."""
        if not self.trained:
            kept = "" if self.history is None else f"; round 0's evaluation is in {out}"
            return f"{self}: nothing was trained{kept}"
        return f"{self}; checkpoint and results so far in {out}; continue with: {resume}"


def ignore_further_sigint() -> None:
    """For a command that ends after an interrupt: a further Ctrl-C is ignored, so that it
    cannot turn the exit code into a death by SIGINT (and a traceback) while the interpreter
    shuts down."""
    if threading.current_thread() is threading.main_thread():  # the only one that may
        signal.signal(signal.SIGINT, signal.SIG_IGN)


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


_active: list[Pending] = []  # the outermost ``deferred`` block's, while one is open


@contextlib.contextmanager
def deferred() -> Iterator[Pending]:
    """Defers SIGINT and SIGTERM for the duration; yields the :class:`Pending` the first one
    sets (inside another ``deferred`` block: that block's)."""
    if threading.current_thread() is not threading.main_thread():
        yield Pending()
        return
    if _active:
        yield _active[0]
        return
    pending = Pending()

    def remember(signum, frame):
        if pending.signum is None:
            pending.signum = signum

    # A signal the process was told to ignore (``nohup``, a background job's SIGINT) stays ignored.
    previous = {
        s: signal.signal(s, remember) for s in SIGNALS if signal.getsignal(s) != signal.SIG_IGN
    }
    _active.append(pending)
    try:
        yield pending
    finally:
        _active.clear()
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def raised() -> Iterator[None]:
    """For work that keeps nothing when cut short (GANDALF's GAN phases): SIGINT and
    SIGTERM raise :class:`Interrupted` (nothing trained) at once for the duration,
    instead of a ``KeyboardInterrupt`` traceback or a death by SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Interrupted(signum, trained=False)

    previous = {
        s: signal.signal(s, stop) for s in SIGNALS if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
