"""A run, top-down (docs/design.md §3): ``run`` checks its options, builds the round
(``programs.Setup``), opens its results (``recorder.Recorder``, a checkpoint to resume
from: ``resume``), plans the schedule before training (``plan``) or inside it
(``online``), loops over blocks of rounds (``train_loop``) and records the ``History``.

A round (``fedjax_het.engine.round``) is one jitted program: select the cohort,
train it (chunked ``vmap``), aggregate, update the server. Rounds run as
``lax.scan`` blocks of ``eval_every`` rounds; between blocks the host
evaluates, logs, draws the progress bar and writes results. ``run`` takes four
option groups (``options``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from fedjax_het import rng
from fedjax_het.data.federated import FederatedData
from fedjax_het.system import events as event_schedule
from fedjax_het.system.schedule import Schedule
from fedjax_het.training import checkpoint, compilation, interrupt, strategies
from fedjax_het.training.divergence import Diverged
from fedjax_het.training.loop import LoopEnd, train_loop
from fedjax_het.training.metrics import (
    EventAccounting,
    ScheduleAccounting,
    event_accounting,
    schedule_accounting,
)
from fedjax_het.training.options import Engine, Output, RunOptions, Timing, Training, run_options
from fedjax_het.training.plan import (
    check_ready_at_start,
    local_spec,
    plan_events,
    plan_run,
    ring_depth,
    selection_slots,
    steps_needed,
    written_slots,
)
from fedjax_het.training.programs import Setup
from fedjax_het.training.recorder import History, Recorder
from fedjax_het.training.resume import checkpointer, load_checkpoint, restore_state
from fedjax_het.typing import PRNGKey

# Reached as ``simulate.<name>`` by the CLI, the tests and the experiments.
__all__ = [
    "History",
    "Recorder",
    "Schedule",
    "Setup",
    "checkpointer",
    "load_checkpoint",
    "local_spec",
    "plan_events",
    "plan_run",
    "restore_state",
    "round_setup",
    "run",
    "run_options",
    "RunOptions",
    "selection_slots",
    "steps_needed",
    "train_loop",
]


def run(
    data: FederatedData,
    training: Training,
    timing: Timing = Timing(),
    engine: Engine = Engine(),
    output: Output = Output(),
) -> History:
    """Simulates ``training.rounds`` rounds of federated training, evaluating every
    ``training.eval_every``.

    Args:
      data: the federated dataset; its test split gives global and per-client accuracy.
      training: what is trained, by which algorithm, on whom, for how long
        (:class:`~fedjax_het.training.options.Training`).
      timing: device timings and the server that follows them
        (:class:`~fedjax_het.training.options.Timing`; default: none, every selected
        client trains fully).
      engine: how the rounds run on the devices (:class:`~fedjax_het.training.options.Engine`).
      output: what the run writes and reports (:class:`~fedjax_het.training.options.Output`).

    ``options.run_options(**keywords)`` builds the four groups from flat keywords.

    Returns:
      A :class:`History`.

    Raises:
      Diverged: the run diverged (see ``Training.nonfinite``).
      Interrupted: SIGINT or SIGTERM stopped the run after a block; the checkpoint
        and results were written (``interrupt.Interrupted``, its ``history`` holds them).
        Stopped before its first round, its ``trained`` is False and no checkpoint was
        written (a Ctrl-C while the round is built or planned: nothing was computed, no
        ``history``).
      NotWritten: some result files could not be written (``results.NotWritten``).
    """
    with compilation.applied(engine.matmul_precision, engine.compile_cache):
        return _run(data, training, timing, engine, output)


def _run(
    data: FederatedData, training: Training, timing: Timing, engine: Engine, output: Output
) -> History:
    """The steps of a run: check, build the round, plan, open the results, loop, record.

    A SIGINT or SIGTERM before the results are opened stops the run at once (nothing was
    computed, ``interrupt.prompt``); from then on it is deferred (``interrupt.deferred``)
    to the end of the block of rounds computing, or of the last result file written; one
    that arrives while the round is built or compiled, if the main thread is stuck there
    ``interrupt.GRACE_S`` seconds later, ends the process (the watchdog)."""
    algorithm = training.algorithm
    timing.check(algorithm)
    with interrupt.deferred() as pending:
        with interrupt.prompt():  # nothing computed yet: a signal stops the run at once
            setup = round_setup(data, training, engine, timing)
            key, start = rng.seed_key(training.seed), time.perf_counter()
            online_ = timing.in_loop(algorithm)
            if online_:
                check_ready_at_start(timing.system)
            plans, accounting = (
                (None, None) if online_ else _plan(setup, timing, training.rounds, key)
            )
        pending.watched = True  # until the first block ran (train_loop): a stuck compile ends
        recorder, resumed = _open_results(output, data, training.nonfinite, start)
        recorder.accounting = accounting
        loop = functools.partial(
            train_loop,
            rounds=training.rounds,
            eval_every=training.eval_every,
            progress=output.progress,
            checkpoint_every=output.checkpoint_every,
            done=0 if resumed is None else resumed.done,
            unit="round" if timing.server is None else "event",
        )
        path = (
            strategies.in_loop(setup, timing, key, recorder, resumed)
            if online_
            else strategies.planned(setup, plans, key, recorder, resumed)
        )
        end = loop(
            path.state,
            block=path.block,
            evaluate=path.evaluate,
            plans=path.plans,
            on_eval=path.on_eval,
            save=checkpointer(
                output.out_dir, output.config, [recorder], setup.round.store, path.saved
            ),
        )
        end, plans = path.finished(end)
        history = _finish(recorder, end, setup, plans, output.targets)
        if pending.signum is not None:  # arrived while the results were written: complete
            raise interrupt.Interrupted(pending.signum, end.done, history)
        return history


def round_setup(
    data: FederatedData, training: Training, engine: Engine, timing: Timing
) -> Setup:
    """``Setup.build`` for ``run``'s options: the round sized for the clients it writes at
    most and the model versions it keeps, with its chunk plan (what ``run`` records in
    ``summary.json``; the benchmark harness builds its engine rows with it)."""
    sampler = training.sampler
    return Setup.build(
        data,
        training.model,
        training.algorithm,
        sampler,
        rounds=training.rounds,
        work=training.work,
        hyper=training.hyper,
        eval_every=training.eval_every,
        chunk=engine.chunk,
        unroll=engine.unroll,
        weighting=training.weighting,
        eval_batch_size=engine.eval_batch_size,
        client_state=engine.client_state,
        slots=written_slots(sampler, timing.system, timing.server),
        precision=engine.precision,
        devices=engine.devices,
        nonfinite=training.nonfinite,
        ring_depth=ring_depth(timing.system, timing.server),
        system=timing.system is not None,
        conv=engine.conv,
    )


def _open_results(
    output: Output, data: FederatedData, nonfinite: str, start: float
) -> tuple[Recorder, checkpoint.Loaded | None]:
    """The run's recorder (its results directory opened; its wall clock from ``start``) and,
    resuming, the checkpoint, its records restored into the recorder."""
    if output.resume and output.config is not None:  # before the Recorder rewrites config.toml
        checkpoint.check_config(output.out_dir, output.config)
    recorder = Recorder(
        start,
        None,
        out_dir=output.out_dir,
        config=output.config,
        data=data,
        on_eval=output.on_eval,
        drop_nonfinite=nonfinite == "drop",
        overwrite=output.overwrite,
        resume=output.resume,
    )
    return recorder, load_checkpoint(output.out_dir, [recorder]) if output.resume else None


def _plan(
    setup: Setup, timing: Timing, rounds: int, key: PRNGKey
) -> tuple[
    Schedule | event_schedule.EventSchedule | None, ScheduleAccounting | EventAccounting | None
]:
    """The schedule computed before training (None without a system) and its accounting."""
    data, spec = setup.data, setup.round.spec
    if timing.server is not None:
        plans = plan_events(timing.system, data, spec, timing.server, events=rounds, key=key)
        return plans, event_accounting(
            plans, spec, data.train.count, data.num_clients, timing.server.max_staleness
        )
    if timing.system is not None:
        plans = plan_run(timing.system, data, spec, setup.round.sampler, rounds=rounds, key=key)
        origin = float(timing.system.policy.start)
        readiness = (timing.system.profiles, timing.system.policy)
        return plans, schedule_accounting(
            plans, spec, data.train.count, data.num_clients, origin, readiness=readiness
        )
    return None, None


def _finish(
    recorder: Recorder, end: LoopEnd, setup: Setup, plans: Schedule | None, targets: Sequence[float]
) -> History:
    """``run``'s History from where its loop ended; raises what ended it early."""
    recorder.interrupted = end.interrupted
    timing = {
        "wall_s": round(recorder.wall_before + time.perf_counter() - recorder.start, 3),
        "first_block_s_with_compile": None if end.compile_s is None else round(end.compile_s, 3),
    }
    history = recorder.history(
        end.state, end.ev, setup, plans=plans, targets=targets, timing=timing
    )
    if recorder.divergence is not None:
        raise Diverged(recorder.divergence, history)
    if end.interrupted is not None:
        raise interrupt.Interrupted(end.interrupted, end.done, history, trained=end.done > 0)
    return history
