"""A run, top-down (docs/design.md §3): ``run`` checks its options, builds the round
(``programs.Setup``), opens its results (``recorder.Recorder``, a checkpoint to resume
from: ``resume``), plans the schedule before training (``plan``) or inside it
(``online``), loops over blocks of rounds (``train_loop``) and records the ``History``.

A round (``fedjax_het.engine.round``) is one jitted program: select the cohort,
train it (chunked ``vmap``), aggregate, update the server. Rounds run as
``lax.scan`` blocks of ``eval_every`` rounds; between blocks the host
evaluates, logs, draws the progress bar and writes results. ``run`` keeps its flat
keywords; inside, they travel grouped (``options``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import rng
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.models import Model
from fedjax_het.system import events as event_schedule
from fedjax_het.system import schedule as scheduling
from fedjax_het.system.sampler import LearnedSelect, Sampler
from fedjax_het.system.schedule import Schedule
from fedjax_het.system.setup import System
from fedjax_het.training import checkpoint, compilation, interrupt, online
from fedjax_het.training.divergence import Diverged
from fedjax_het.training.loop import LoopEnd, train_loop
from fedjax_het.training.metrics import (
    EventAccounting,
    ScheduleAccounting,
    event_accounting,
    schedule_accounting,
)
from fedjax_het.training.options import Engine, Output, Timing, Training, grouped
from fedjax_het.training.plan import (
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
    "run",
    "selection_slots",
    "steps_needed",
    "train_loop",
]


@compilation.engine_options
def run(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    sampler: Sampler,
    *,
    rounds: int,
    work: LocalWork,
    hyper: Mapping[str, float] | None = None,
    seed: int = 0,
    eval_every: int = 10,
    chunk: int | None = None,
    unroll: int = 1,
    weighting: str = "examples",
    eval_batch_size: int = 1024,
    progress: bool = True,
    out_dir: str | Path | None = None,
    config: Mapping[str, Any] | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    system: System | None = None,
    select: LearnedSelect | None = None,
    targets: Sequence[float] = (0.5, 0.6, 0.7, 0.8),
    client_state: str = "auto",
    devices: int | None = None,
    precision: str = "float32",
    nonfinite: str = "stop",
    checkpoint_every: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    server: event_schedule.AsyncServer | None = None,
    matmul_precision: str = compilation.DEFAULT_MATMUL_PRECISION,
    compile_cache: bool = True,
    conv: str = "auto",
) -> History:
    """Simulates ``rounds`` rounds of federated training and evaluates every ``eval_every``.

    Args:
      data: the federated dataset; its test split gives global and per-client accuracy.
      model, algorithm, sampler: what to train, how, and who takes part.
      rounds, work, hyper, seed, eval_every, weighting, nonfinite: what is trained and for
        how long (:class:`~fedjax_het.training.options.Training` says each).
      chunk, unroll, eval_batch_size, client_state, devices, precision, conv: how the rounds run
        on the devices (:class:`~fedjax_het.training.options.Engine`).
      system, select, server: device timings and the server that follows them
        (:class:`~fedjax_het.training.options.Timing`).
      progress, out_dir, config, on_eval, targets, checkpoint_every, resume, overwrite:
        what the run writes and reports (:class:`~fedjax_het.training.options.Output`).
      matmul_precision: "highest", "high" or "default": ``jax.default_matmul_precision``
        while the run traces its programs (``fedjax_het.training.compilation``; on CPU all three
        are the same arithmetic, on GPU "default" is TF32 and "high" bf16x3).
      compile_cache: keep compiled programs in the persistent compilation cache
        (``compilation.cache_dir()``), so that the next process running the same config
        loads them instead of compiling; False: the cache off for this process.
        ``summary["compile_cache"]`` counts what the run compiled and loaded.

    Returns:
      A :class:`History`.

    Raises:
      Diverged: the run diverged (see ``nonfinite``).
      Interrupted: SIGINT or SIGTERM stopped the run after a block; the checkpoint
        and results were written (``interrupt.Interrupted``, its ``history`` holds them).
        Stopped before its first round, its ``trained`` is False and no checkpoint was
        written (a Ctrl-C while the round is built or planned: nothing was computed, no
        ``history``).
      NotWritten: some result files could not be written (``results.NotWritten``).
    """
    training, engine, timing, output = grouped(locals())
    return _run(data, model, algorithm, sampler, training, engine, timing, output)


def _run(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    sampler: Sampler,
    training: Training,
    engine: Engine,
    timing: Timing,
    output: Output,
) -> History:
    """The steps of a run: check, build the round, plan, open the results, loop, record.

    A Ctrl-C before the results are opened stops the run at once (nothing was computed);
    from then on SIGINT and SIGTERM are deferred (``interrupt.deferred``) until the last
    result file is written."""
    timing.check(algorithm)
    try:
        setup = _setup(data, model, algorithm, sampler, training, engine, timing)
        key, start = rng.seed_key(training.seed), time.perf_counter()
        online_ = timing.in_loop(algorithm)
        plans, accounting = (None, None) if online_ else _plan(setup, timing, training.rounds, key)
    except KeyboardInterrupt:
        raise interrupt.Interrupted(trained=False) from None
    with interrupt.deferred():
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
        if online_:
            end, plans = _run_online(setup, timing, key, recorder, loop, output, resumed)
        else:
            end = _run_planned(setup, plans, key, recorder, loop, output, resumed)
        return _finish(recorder, end, setup, plans, output.targets)


def _setup(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    sampler: Sampler,
    training: Training,
    engine: Engine,
    timing: Timing,
) -> Setup:
    """``Setup.build`` for the options: the round sized for the clients it writes at most
    and the model versions it keeps."""
    return Setup.build(
        data,
        model,
        algorithm,
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
        return plans, schedule_accounting(plans, spec, data.train.count, data.num_clients, origin)
    return None, None


def _run_planned(
    setup: Setup,
    plans: Schedule | event_schedule.EventSchedule | None,
    key: PRNGKey,
    recorder: Recorder,
    loop: Callable[..., LoopEnd],
    output: Output,
    resumed: checkpoint.Loaded | None,
) -> LoopEnd:
    """``run``'s loop over the jitted blocks, following ``plans`` (None: no system)."""
    block, evaluate_ = setup.programs(key)
    state = setup.init(key)
    if resumed is not None:
        state = restore_state(resumed, state, setup.round.store)
    return loop(
        state,
        block=block,
        evaluate=evaluate_,
        plans=plans,
        on_eval=recorder.record,
        save=checkpointer(output.out_dir, output.config, [recorder], setup.round.store, dict),
    )


def _run_online(
    setup: Setup,
    timing: Timing,
    key: PRNGKey,
    recorder: Recorder,
    loop: Callable[..., LoopEnd],
    output: Output,
    resumed: checkpoint.Loaded | None,
) -> tuple[LoopEnd, Schedule | None]:
    """``run``'s loop with the schedule computed in the loop; returns where it ended and
    the schedule rows it produced (a checkpoint keeps them)."""
    data, spec = setup.data, setup.round.spec
    program, inputs = _online_round(setup, timing.system, timing.select, key)
    block_fn = jax.jit(program.run_block)
    _, evaluate_ = setup.programs(key)
    rows: list[Schedule] = []

    def account():
        recorder.accounting = schedule_accounting(
            _concat(rows),
            spec,
            data.train.count,
            data.num_clients,
            float(timing.system.policy.start),
        )

    def record(done, block_output, ev):
        metrics = None
        if block_output is not None:
            metrics, row = block_output
            rows.append(row)
            account()
        return recorder.record(done, metrics, ev)

    state = setup.on_mesh(program.init(setup.init(key), data.num_clients))
    if resumed is not None:
        state = restore_state(resumed, state, setup.round.store)
        stored = resumed.group("schedule")
        if stored:
            rows.append(
                Schedule(**{name.lstrip("."): jnp.asarray(a) for name, a in stored.items()})
            )
            account()
    end = loop(
        state,
        block=lambda state, ids, _: block_fn(state, ids, inputs),
        evaluate=lambda state: evaluate_(state.run),
        plans=None,
        on_eval=record,
        save=checkpointer(
            output.out_dir,
            output.config,
            [recorder],
            setup.round.store,
            lambda: checkpoint.leaves("schedule", _concat(rows)) if rows else {},
        ),
    )
    return dataclasses.replace(end, state=end.state.run), _concat(rows) if rows else None


def _online_round(
    setup: Setup, system: System, select: LearnedSelect | None, key: PRNGKey
) -> tuple[online.OnlineRound, online.RoundInputs]:
    """The round that computes its schedule row itself (``online.OnlineRound``), and its
    traced inputs."""
    data, spec = setup.data, setup.round.spec
    sampler = setup.round.sampler
    if select is None:  # as plan_run selects, so that a run and its online twin agree
        slots = selection_slots(system, sampler, data.num_clients)
        plain = scheduling.as_select_fn(
            sampler if slots is None else scheduling.select_among_ready(data.num_clients, slots)
        )
        select = lambda key, round_idx, ready, record: plain(key, round_idx, ready)
    program = online.OnlineRound(setup.round, system.policy, select)
    costs = np.ones(1, np.float32)
    freezing = setup.round.algorithm.freezing
    if freezing is not None:
        masks = freezing.depth_masks(setup.round.model.init(rng.stream(key, "init")))
        costs = online.step_costs(spec, setup.hyper, setup.train, masks)
    inputs = online.RoundInputs(
        setup.hyper,
        setup.train,
        key,
        system.profiles,
        jnp.asarray(steps_needed(spec, data.train.count)),
        jnp.asarray(costs),
    )
    return program, inputs


def _concat(rows: Sequence[Schedule]) -> Schedule:
    return jax.tree.map(lambda *blocks: jnp.concatenate(blocks), *rows)


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
