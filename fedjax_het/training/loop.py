"""The loop over blocks of rounds, shared by ``simulate.run`` and ``sweep.sweep``
(docs/design.md §3): run a jitted block, bring its per-round metrics to the host,
evaluate, record, maybe checkpoint, repeat. Only this loop runs in Python; a round
never does. SIGINT and SIGTERM stop it after the current block, the last one included
(``interrupt.deferred``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_het.engine.round import RunState
from fedjax_het.system.schedule import Schedule
from fedjax_het.training import interrupt
from fedjax_het.training import progress as progress_bar


@dataclasses.dataclass(frozen=True)
class LoopEnd:
    """Where ``train_loop`` stopped: the state, its evaluation, the first block's time
    (compile included; None if no block ran), rounds done, and the signal that
    interrupted the loop (None: it ran to the end or diverged)."""

    state: Any
    ev: Any
    compile_s: float | None
    done: int
    interrupted: int | None = None


def train_loop(
    state: RunState,
    *,
    rounds: int,
    eval_every: int,
    block: Callable,
    evaluate: Callable,
    plans: Schedule | None,
    on_eval: Callable[[int, Any, Any], bool | None],
    progress: bool,
    round_axis: int = 0,
    done: int = 0,
    save: Callable[[int, Any], None] | None = None,
    checkpoint_every: int = 0,
    unit: str = "round",
) -> LoopEnd:
    """Runs ``block`` over blocks of ``eval_every`` rounds, evaluating after each.

    ``block(state, round_ids, block_plans)`` and ``evaluate(state)`` are jitted
    (and may carry a leading axis of several runs, ``round_axis = 1`` on the
    plans then); ``on_eval(done, block_metrics, ev)`` gets host arrays and
    stops the loop by returning True (a diverged run).

    ``done``: rounds already done (a resumed run; ``state`` is its state then, and
    blocks keep their boundaries at multiples of ``eval_every``, so every block is
    the one the uninterrupted run computes). ``save(done, state)`` writes a
    checkpoint: at the first block end at or past each multiple of
    ``checkpoint_every`` rounds (0: never), at the end, and when SIGINT or SIGTERM
    arrives (``interrupt.deferred``: the loop stops after the current block).
    ``unit`` names a round on the progress bar ("event" for an asynchronous server).
    """
    with interrupt.deferred() as pending:
        ev = jax.device_get(evaluate(state))
        if done == 0:
            on_eval(0, None, ev)
        compile_s, saved_at, stopped, stop = None, done, None, False
        bar = progress_bar.bar(rounds, desc=f"{unit}s", unit=unit, progress=progress, initial=done)
        while done < rounds:
            stopped = pending.agreed()  # once per block, at the same point in every process
            if stopped is not None:
                break
            size = min(eval_every - done % eval_every, rounds - done)
            round_ids = jnp.arange(done, done + size, dtype=jnp.int32)
            rows = (slice(None),) * round_axis + (slice(done, done + size),)
            block_plans = (
                None if plans is None else jax.tree.map(lambda a, rows=rows: a[rows], plans)
            )
            t0 = time.perf_counter()
            state, block_metrics = block(state, round_ids, block_plans)
            block_metrics = jax.device_get(block_metrics)
            pending.watched = False  # compiled and run: from here the blocks' rounds are kept
            compile_s = time.perf_counter() - t0 if compile_s is None else compile_s
            before, done = done, done + size
            ev = jax.device_get(evaluate(state))
            stop = on_eval(done, block_metrics, ev)
            bar.update(size)
            bar.set_postfix_str(progress_bar.accuracy(ev["accuracy"]))
            if stop:
                break
            due = checkpoint_every and done // checkpoint_every > before // checkpoint_every
            if save is not None and (due or done == rounds):
                save(done, state)
                saved_at = done
        pending.watched = False
        if stopped is None and not stop:  # a signal during the last block is acted on too
            stopped = pending.agreed()
        if save is not None and stopped is not None and saved_at != done:
            save(done, state)
        bar.close()
    return LoopEnd(state, ev, compile_s, done, stopped)
