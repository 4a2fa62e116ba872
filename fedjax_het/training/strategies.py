"""Where a run's schedule rows come from: the strategies of ``simulate.run``'s one path.

Every run trains the engine's one round (``engine.round.Round.train_cohort``) in jitted blocks
that donate their state, evaluates and checkpoints between blocks (``loop.train_loop``) and
prices its rounds with ``training.costs``. What differs is who decides each round's cohort and
timing (docs/design.md §5):

* **planned** (``planned``): no system (the sampler selects, everyone trains fully), or a
  schedule computed before training (``plan.plan_run``, ``plan.plan_events``) whose rows the
  blocks read;
* **in the loop** (``in_loop``): each round's row is computed inside the block from what the
  previous rounds returned (a learned selection, FreezeFL's freezing: ``online.OnlineRound``);
  the rows come back with the metrics and are accounted as they arrive.

Either strategy hands ``train_loop`` the same pieces (``RunPath``), so the loop, the
checkpoint and the records are written once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import rng
from fedjax_het.engine.hooks import Freezing
from fedjax_het.system import events as event_schedule
from fedjax_het.system import schedule as scheduling
from fedjax_het.system.sampler import LearnedSelect
from fedjax_het.system.schedule import Schedule
from fedjax_het.system.setup import System
from fedjax_het.training import checkpoint, freeze_pricing, online
from fedjax_het.training.loop import LoopEnd
from fedjax_het.training.metrics import ScheduleAccounting, schedule_accounting
from fedjax_het.training.options import Timing
from fedjax_het.training.plan import selection_slots, steps_needed
from fedjax_het.training.programs import Setup
from fedjax_het.training.recorder import Recorder
from fedjax_het.training.resume import restore_state
from fedjax_het.typing import PRNGKey


@dataclasses.dataclass
class RunPath:
    """What ``train_loop`` runs, whichever strategy made it.

    Attributes:
      state: the loop's first state (resumed, when the run resumes).
      block: jitted ``(state, round_ids, plans) -> (state, output)``, donating ``state``.
      evaluate: jitted ``state -> evaluation``.
      plans: the rows the blocks read (None: no system, or rows made in the loop).
      on_eval: ``(done, block_output, evaluation) -> stop?``, the recorder's, after the
        strategy has read what it needs from ``block_output``.
      saved: ``() -> arrays`` the checkpoint keeps besides the state and the records.
      finished: ``LoopEnd -> (LoopEnd with the engine's RunState, the run's rows)``.
    """

    state: Any
    block: Callable
    evaluate: Callable
    plans: Schedule | event_schedule.EventSchedule | None
    on_eval: Callable[[int, Any, Any], bool | None]
    saved: Callable[[], dict[str, np.ndarray]]
    finished: Callable[[LoopEnd], tuple[LoopEnd, Schedule | None]]


def planned(
    setup: Setup,
    plans: Schedule | event_schedule.EventSchedule | None,
    key: PRNGKey,
    recorder: Recorder,
    resumed: checkpoint.Loaded | None,
) -> RunPath:
    """The rounds follow ``plans`` (None: no system)."""
    block, evaluate = setup.programs(key)
    state = setup.init(key)
    if resumed is not None:
        state = restore_state(resumed, state, setup.round.store)
    return RunPath(
        state, block, evaluate, plans, recorder.record, dict, lambda end: (end, plans)
    )


def in_loop(
    setup: Setup,
    timing: Timing,
    key: PRNGKey,
    recorder: Recorder,
    resumed: checkpoint.Loaded | None,
) -> RunPath:
    """Each round computes its own row in the block (``online.OnlineRound``); the rows come
    back with the metrics, are accounted as they arrive and kept in the checkpoint."""
    data, spec = setup.data, setup.round.spec
    program, inputs = _online_round(setup, timing.system, timing.select, key)
    jitted = jax.jit(program.run_block, donate_argnums=0)
    _, evaluate = setup.programs(key)
    rows: list[Schedule] = []
    origin = float(timing.system.policy.start)
    recorder.accounting = ScheduleAccounting.empty(data.num_clients)

    def account():
        recorder.accounting = schedule_accounting(
            _concat(rows), spec, data.train.count, data.num_clients, origin,
            readiness=(timing.system.profiles, timing.system.policy),
        )

    def on_eval(done, block_output, ev):
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
    state = _owned(state)

    def finished(end: LoopEnd) -> tuple[LoopEnd, Schedule | None]:
        return dataclasses.replace(end, state=end.state.run), _concat(rows) if rows else None

    return RunPath(
        state,
        lambda state, ids, _: jitted(state, ids, inputs),
        lambda state: evaluate(state.run),
        None,
        on_eval,
        lambda: checkpoint.leaves("schedule", _concat(rows)) if rows else {},
        finished,
    )


def _owned(state: online.OnlineState) -> online.OnlineState:
    """``state`` whose loop fields are buffers of its own. The block donates its state, but the
    clock starts as the policy's own array (``policy.start``) and the record's fields may share
    one constant: donated, the policy's would be deleted (a second run of the same system fails)
    and a buffer donated twice crashes XLA:CPU. The run state is the init's or the
    checkpoint's own; the copies are ``[N]`` arrays at most."""
    copies = jax.tree.map(lambda x: jnp.array(x, copy=True), state.replace(run=None))
    return copies.replace(run=state.run)


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
    freezing = setup.round.algorithm.hook(Freezing)
    if freezing is not None:
        masks = freezing.depth_masks(setup.round.model.init(rng.stream(key, "init")))
        costs = freeze_pricing.step_costs(spec, setup.hyper, setup.train, masks)
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
