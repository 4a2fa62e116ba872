"""Interrupts that stop a run cleanly: SIGINT (Ctrl-C) and SIGTERM (a scheduler's pre-emption).

Inside :func:`deferred` a signal never raises where it lands: the handler only
records it (an exception raised at a random bytecode can be swallowed by library
code that catches ``Exception``, or by a ``__del__``, and the signal is lost). What
happens next depends on the phase the run is in:

* **computing** (a jitted block of rounds; ``lax.scan`` cannot be cut short): the
  training loop stops at the end of the block, writes its checkpoint and results,
  and raises :class:`Interrupted`. A signal during the last block, or while the run
  writes its results, is acted on too: the run raises :class:`Interrupted` once the
  results are written (never a silent exit 0).
* **preparing** (:func:`prompt`: building, planning, initialising; nothing computed
  that a stop would lose): :class:`Stopped`, a ``BaseException`` that ``except
  Exception`` does not catch, is raised at once and leaves the block as
  :class:`Interrupted` (nothing trained).
* **stuck** (the main thread inside C code, where Python runs no handler: an XLA
  compilation, a hung build): a watchdog thread, woken by the signal itself
  (``signal.set_wakeup_fd``), waits ``GRACE_S`` seconds for the main thread to act;
  then it prints the run's last line and ends the process with the signal's exit
  code. It watches :func:`prompt` blocks and the first block of rounds a process
  runs (its compilation), never a block whose rounds are kept.

Further signals while a run writes what it has are ignored: a second Ctrl-C cannot
make the block end sooner, and would only lose what it was about to write (SIGQUIT,
Ctrl-\\, still stops the process at once). ``deferred`` blocks nest, sharing the
outermost block's :class:`Pending`. A signal the process ignores (``nohup``; SIGINT in a
shell's background job) stays ignored. Outside the main thread signals cannot be
caught, and nothing is changed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
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


class Stopped(BaseException):
    """Raised by the handler inside :func:`prompt` (a ``BaseException``, so that library code
    catching ``Exception`` cannot swallow it); :func:`prompt` turns it into
    :class:`Interrupted`."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Pending:
    """The first signal received inside :func:`deferred` (None: none yet), and the phase
    the run is in: ``at_once`` (inside :func:`prompt`: the handler raises
    :class:`Stopped`) and ``watched`` (the watchdog may end a process stuck in C code)."""

    signum: int | None = None
    at_once: bool = False
    watched: bool = False

    def agreed(self) -> int | None:
        """The signal, agreed between the processes of a multi-process run (each checks
        between blocks; a process that stopped alone would leave the others waiting in
        their next collective): the largest any process received, or None."""
        if jax.process_count() == 1:
            return self.signum
        every = multihost_utils.process_allgather(np.int32(self.signum or 0))
        self.signum = int(np.max(every)) or None
        return self.signum


GRACE_S = 3.0  # how long the watchdog lets a stuck main thread take to act on a signal
_active: list[Pending] = []  # the outermost ``deferred`` block's, while one is open


@contextlib.contextmanager
def deferred() -> Iterator[Pending]:
    """Defers SIGINT and SIGTERM for the duration; yields the :class:`Pending` the first one
    sets (inside another ``deferred`` block: that block's). A watchdog thread runs for the
    duration (module docstring), acting only while ``Pending.watched``."""
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
            if pending.at_once:
                raise Stopped(signum)

    # A signal the process was told to ignore (``nohup``, a background job's SIGINT) stays ignored.
    previous = {
        s: signal.signal(s, remember) for s in SIGNALS if signal.getsignal(s) != signal.SIG_IGN
    }
    _active.append(pending)
    try:
        with _watchdog(pending, bool(previous)):
            yield pending
    finally:
        for s, handler in previous.items():  # restored first: no signal lands in a dead block
            signal.signal(s, handler)
        _active.clear()


@contextlib.contextmanager
def prompt() -> Iterator[None]:
    """Work that keeps nothing when cut short (building, planning, GANDALF's GAN phases):
    a signal stops it at once, :class:`Interrupted` (nothing trained) leaving the block;
    the watchdog ends the process ``GRACE_S`` seconds after the signal if the main thread
    is stuck in C code. Opens a :func:`deferred` block if none is open."""
    with deferred() as pending:
        if pending.signum is not None:  # received before: act on it now
            raise Interrupted(pending.signum, trained=False)
        pending.at_once = pending.watched = True
        try:
            yield
        except Stopped as stop:
            raise Interrupted(stop.signum, trained=False) from None
        finally:
            pending.at_once = pending.watched = False
        if pending.signum is not None:  # landed where the handler could not raise
            raise Interrupted(pending.signum, trained=False)


def raised() -> contextlib.AbstractContextManager[None]:
    """:func:`prompt` under GANDALF's name for its GAN phases."""
    return prompt()


@contextlib.contextmanager
def _watchdog(pending: Pending, handled: bool) -> Iterator[None]:
    """A thread woken by any SIGINT or SIGTERM the process receives (``signal.set_wakeup_fd``:
    written by the C-level handler, so even while the main thread is inside C code); if
    ``pending.watched`` still holds ``GRACE_S`` seconds later, it prints one line and ends
    the process with the signal's exit code."""
    if not handled:  # both signals ignored: nothing to watch
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    done = threading.Event()
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    thread = threading.Thread(target=_watch, args=(read, done, pending), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.write(write, b"\0")  # wakes the thread, which returns
        thread.join()
        os.close(read)
        os.close(write)


def _watch(read: int, done: threading.Event, pending: Pending) -> None:
    while True:
        got = os.read(read, 64)
        if done.is_set():
            return
        signums = [b for b in got if b in {int(s) for s in SIGNALS}]
        if not signums or not pending.watched:
            continue
        if done.wait(GRACE_S):
            return
        if pending.watched:
            name = signal.Signals(signums[0]).name
            sys.stderr.write(
                f"fedjax-het: interrupted by {name} while the run was prepared or compiled; "
                f"still busy {GRACE_S:g} s later, so stopped at once: nothing more was trained\n"
            )
            sys.stderr.flush()
            os._exit(128 + signums[0])
