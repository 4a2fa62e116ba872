"""The round schedule: who is selected, who finishes, who fails and why, how long rounds take.

docs/design.md §5: for most algorithms the timing of a run depends only on the
client profiles, the round policy, the payload and the seed, never on model
values, so it is computed apart from learning, as arrays for the whole run
(``schedule``, a ``lax.scan`` over rounds), or one round at a time for
selection rules that look at losses inside the training loop
(``schedule_round``).

The round model (synchronous; ``version`` = round index). A round starts at
``start``; the server spends ``overhead`` seconds, then at ``t0 = start +
overhead`` the selected clients start (availability-aware selection looks at
who is ready at ``t0``, as FLHetBench does, notes §3.2 and §4.2). A selected
client that is not ready at ``t0`` is UNAVAILABLE. Each started client then
works through download, local steps and upload, in ready seconds:

    work_k = payload_down / v_down + steps_k * step_time_k + payload_up_k / v_up

with both speeds drawn afresh for each transfer (``profiles.transfer_time``).
Under ``on_unavailable="pause"`` the work advances only while the device is
ready (FLHetBench's F_i(t, d)); under "lost" it fails when the ready interval
holding ``t0`` ends (FLASH). A client drops out with probability
``profiles.dropout[k]`` per round, at a point drawn uniformly over its work
(in ready seconds): the work done until then is spent, the rest never happens.

The policy decides when the round ends (``end``, seconds after ``t0``) and
whose work counts (OK), as ``policy.round_end`` states: wait for everyone,
a deadline (ending at the last success, FLHetBench's training server, notes
§4.2, or at the deadline whenever a client is late, its Monte-Carlo metrics,
§4.7), or readiness (the ``1 - r`` quantile of the finish times), each with
optional over-commitment. A failure (drop, or lost work) before the round
ends is DROPPED; every other started client that is not OK is LATE and stops
when the round ends.

Duration = overhead + end; the clock of the next round starts at ``start +
duration``. ``finish`` (seconds after ``start``) is when a slot finished or
gave up: ``overhead +`` its finish (OK), its failure (DROPPED) or ``end``
(LATE); ``overhead`` (UNAVAILABLE), 0 (EMPTY). ``steps_done`` counts the
local steps a slot completed before it finished or gave up, whatever its
outcome (compute spent); only OK slots are aggregated. A transfer's bytes
count once it completes.

Randomness: for round ``r`` the key is ``fold_in(key, r)``; selection uses its
``"select"`` stream (as ``simulate.Round`` does, so a schedule and a run with
the same key and sampler select the same cohorts), and each client's speeds
and dropout use ``fold_in(stream, client_id)`` on the ``"download"``,
``"upload"`` and ``"dropout"`` streams, so nothing depends on slot order.

The parts live beside this module, their names importable from here too:
the rows and outcome codes (``schedule_row``), selection (``selection``),
each slot's work and when it ends (``slot_timing``) and stale tasks
(``stale_tasks``).

>>> import jax
>>> from fedjax_het.system import policy as policies, profiles as prof
>>> clients = prof.uniform_profiles(8, step_time=0.5, bandwidth=1e6)
>>> s = schedule(clients, policies.wait_all(overhead=2.0), select_among_ready(8, 4), rounds=3,
...              cohort_size=4, steps_needed=10, payload_down=3e6, payload_up=1e6,
...              key=jax.random.key(0))
>>> s.duration.tolist()  # 2 s overhead + 3 s down + 10 * 0.5 s + 1 s up
[11.0, 11.0, 11.0]
>>> s.clock.tolist(), bool((s.outcome == OK).all())
([11.0, 22.0, 33.0], True)

Over 400 lines on purpose: the whole run's schedule and one round's (the in-loop path) are the
same round model and must stay bit for bit equal.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import rng
from fedjax_het.system import availability as avail
from fedjax_het.system.policy import KINDS, RoundPolicy, num_selected, round_end
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.sampler import Sampler
from fedjax_het.system.schedule_row import (
    DROPPED,
    EMPTY,
    LATE,
    OK,
    OUTCOMES,
    UNAVAILABLE,
    Schedule,
)
from fedjax_het.system.selection import SelectFn, as_select_fn, sampler_select, select_among_ready
from fedjax_het.system.slot_timing import (
    SlotTiming,
    per_client,
    query_slots,
    ready_seconds_until,
    steps_within,
    time_slots,
)
from fedjax_het.system.stale_tasks import no_pending, stale_round
from fedjax_het.typing import PRNGKey

# Whole schedules (a run's, the FLHetBench metrics' batched runs) compile at LLVM level 1,
# not 3: the same bits, and on 2 CPU cores `hetero describe`'s cold start went from
# 11.2-11.8 s to 9.9 s (its programs run about as fast; the level is XLA's default 3).
# XLA:CPU's older fusion emitters compile them faster still (the run's 200-round schedule
# 1.4 s, not 2.1; the metrics' R and T programs 0.8 s, not 1.4), to the same bits; an XLA
# without that option compiles at the level alone (``schedule_jit``).
SCHEDULE_LEVEL = {"xla_backend_optimization_level": 1}
SCHEDULE_COMPILE = {**SCHEDULE_LEVEL, "xla_cpu_use_fusion_emitters": False}


class schedule_jit:
    """``jax.jit(fn, **jit_kwargs)`` compiled with ``SCHEDULE_COMPILE``, or with
    ``SCHEDULE_LEVEL`` once an XLA refuses an option it does not know (then for good)."""

    def __init__(self, fn, **jit_kwargs):
        self._jitted = [jax.jit(fn, compiler_options=options, **jit_kwargs)
                        for options in (SCHEDULE_COMPILE, SCHEDULE_LEVEL)]

    def __call__(self, *args, **kwargs):
        try:
            return self._jitted[0](*args, **kwargs)
        except jax.errors.JaxRuntimeError as error:
            if "No such compile option" not in str(error) or len(self._jitted) == 1:
                raise
            self._jitted.pop(0)
            return self._jitted[0](*args, **kwargs)

__all__ = [
    "DROPPED", "EMPTY", "LATE", "OK", "OUTCOMES", "UNAVAILABLE", "Schedule", "SelectFn",
    "as_select_fn", "never_ready", "nobody_ready_after", "plan_round", "sampler_select", "schedule", "schedule_jit",
    "schedule_round", "select_among_ready", "wait_for_ready",
]  # fmt: skip


def schedule_round(
    profiles: ClientProfiles,
    policy: RoundPolicy,
    *,
    round_idx: jax.Array,
    start: jax.Array,
    key: PRNGKey,
    selected: jax.Array,
    valid: jax.Array,
    steps_needed: jax.Array,
    payload_down: jax.Array,
    payload_up: jax.Array,
    cohort_size: int | jax.Array | None = None,
    completion: bool = False,
) -> tuple[Schedule, jax.Array] | tuple[Schedule, jax.Array, tuple[jax.Array, jax.Array]]:
    """One round's schedule row (no ``R`` axis) for a given selection, and the end clock.

    Args:
      profiles: the population (``[N]`` arrays).
      policy: the round policy (see the module docstring for the round model).
      round_idx: the round index (keys: ``fold_in(key, round_idx)``; the version).
      start: virtual time the round starts (seconds).
      key: the run's root key.
      selected, valid: ``[S]`` client ids and whether each slot holds a client.
      steps_needed: scalar or ``[N]`` local steps each client's task takes.
      payload_down, payload_up: scalar or ``[N]`` bytes each client downloads / uploads.
      cohort_size: keep the first ``cohort_size`` OK finishers (over-commitment);
        ``None`` keeps them all.
      completion: also return, per slot, when a LATE client that keeps working would
        complete its planned steps (seconds after ``start``; inf for every other slot)
        and those steps (stale tasks, ``policy.max_staleness``).

    Returns:
      ``(row, clock)``: the ``Schedule`` of this round and ``start + duration``;
      ``(row, clock, (complete, planned))`` with ``completion``.
    """
    if policy.kind not in KINDS:
        raise ValueError(f"policy.kind must be one of {KINDS}, got {policy.kind!r}")
    n, dtype = profiles.num_clients, profiles.step_time.dtype
    ids, valid = jnp.asarray(selected, jnp.int32), jnp.asarray(valid, bool)
    num_slots = ids.shape[0]
    av, trace = avail.queryable(profiles.availability), profiles.trace[ids]
    start = jnp.asarray(start, dtype)
    overhead = policy.overhead.astype(dtype)
    t0s = jnp.full((num_slots,), start + overhead)
    started = valid & query_slots(avail.is_ready, av, trace, t0s)
    slots = time_slots(
        profiles, policy, rng.round_key(key, round_idx), ids, av, t0s,
        needed=per_client(steps_needed, n, "steps_needed", jnp.int32)[ids],
        bytes_down=per_client(payload_down, n, "payload_down", dtype)[ids],
        bytes_up=per_client(payload_up, n, "payload_up", dtype)[ids],
    )  # fmt: skip
    fails = started & jnp.isfinite(slots.fail)
    end, ok = round_end(
        policy, t0=t0s[0], started=started, finished=started & ~fails, eligible=slots.eligible,
        done=slots.done, fail=slots.fail, ids=ids,
        keep=num_slots if cohort_size is None else cohort_size,
    )  # fmt: skip
    row, late = _row(
        policy, av, trace, t0s, profiles.step_time[ids], slots, ids=ids, valid=valid,
        round_idx=round_idx, start=start, overhead=overhead, end=end, started=started,
        fails=fails, ok=ok,
    )  # fmt: skip
    if completion:
        complete = jnp.where(late & ~fails & slots.eligible, overhead + slots.done, jnp.inf)
        return row, row.clock, (complete.astype(dtype), slots.planned)
    return row, row.clock


def _row(
    policy: RoundPolicy,
    av,
    trace,
    t0s,
    step_time,
    slots: SlotTiming,
    *,
    ids,
    valid,
    round_idx,
    start,
    overhead,
    end,
    started,
    fails,
    ok,
) -> tuple[Schedule, jax.Array]:
    """The round's ``Schedule`` row once it ends (``end`` seconds after ``t0``, ``ok`` its OK
    slots), and which slots are LATE."""
    dropped = fails & (slots.fail <= end)
    late = started & ~ok & ~dropped
    late_progress = ready_seconds_until(policy, av, trace, t0s, end)
    work = slots.work
    progress = jnp.minimum(
        work, jnp.where(ok, work, jnp.where(dropped, slots.fail_progress, late * late_progress))
    )
    stop = jnp.where(ok, slots.done, jnp.where(dropped, slots.fail, late * end))  # after t0
    steps_done = steps_within(progress - slots.down, step_time, slots.planned)
    row = Schedule(
        selected=ids,
        valid=valid,
        outcome=jnp.select(
            [~valid, ~started, ok, dropped], [EMPTY, UNAVAILABLE, OK, DROPPED], LATE
        ).astype(jnp.int32),
        steps_done=jnp.where(ok, slots.planned, jnp.where(started, steps_done, 0)),
        version=jnp.full(ids.shape, round_idx, jnp.int32),
        start=start,
        duration=overhead + end,
        clock=start + (overhead + end),
        finish=jnp.where(valid, overhead + stop, 0.0).astype(start.dtype),
        bytes_down=jnp.where(started & (ok | (progress >= slots.down)), slots.bytes_down, 0.0),
        bytes_up=jnp.where(started & (ok | (progress >= work)), slots.bytes_up, 0.0),
    )
    return row, late


def wait_for_ready(
    profiles: ClientProfiles, policy: RoundPolicy, start: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(start, ready)``: when a synchronous round starts, and who is ready when clients start.

    A round whose selection looks at availability waits on the virtual clock while nobody
    is ready: its start moves to the first time a client becomes ready (less the
    overhead), as the asynchronous server jumps to the next ready time; FLHetBench's server
    waits in 20 s windows instead (notes §4.2). Then nobody trains in a zero-length round.
    When no client will ever be ready the start stays and nobody is ready (the run's plan
    refuses that: ``never_ready``). Selection blind to availability sees everyone ready.
    """
    dtype = profiles.step_time.dtype
    start = jnp.asarray(start, dtype)
    if not policy.availability_aware:
        return start, jnp.ones((profiles.num_clients,), bool)
    av, overhead = avail.queryable(profiles.availability), policy.overhead.astype(dtype)
    first = jnp.min(jax.vmap(avail.next_ready, in_axes=(None, 0, None))(
        av, profiles.trace, start + overhead
    ))  # fmt: skip
    # One ulp later, so that start + overhead lands in the interval, not before it by rounding.
    waited = jnp.maximum(start, jnp.nextafter(first - overhead, jnp.asarray(jnp.inf, dtype)))
    start = jnp.where(first > start + overhead, jnp.where(jnp.isfinite(first), waited, start), start)
    ready = jax.vmap(avail.is_ready, in_axes=(None, 0, None))(av, profiles.trace, start + overhead)
    return start, ready


def never_ready(profiles: ClientProfiles, policy: RoundPolicy, rows: Schedule) -> int | None:
    """The first round of ``rows`` (``[R, S]``) from whose start on no client is ever ready
    again, so that it and every later round trains nobody; None if there is none."""
    if not policy.availability_aware:
        return None
    valid = np.asarray(rows.valid)
    empty = (valid & (np.asarray(rows.outcome) == UNAVAILABLE)).sum(-1) == valid.sum(-1)
    if not empty.any():
        return None
    first = int(np.argmax(empty))
    return first if nobody_ready_after(profiles, policy, np.asarray(rows.start)[first]) else None


def nobody_ready_after(profiles: ClientProfiles, policy: RoundPolicy, start: float) -> bool:
    """Whether no client is ready at, or ever after, a round that starts at virtual time
    ``start`` (its ``start + overhead``): every round from then on would train nobody."""
    at = jnp.asarray(start, profiles.step_time.dtype)
    at = at + policy.overhead.astype(at.dtype)
    later = jax.vmap(avail.next_ready, in_axes=(None, 0, None))(
        avail.queryable(profiles.availability), profiles.trace, at
    )
    return not bool(jnp.isfinite(later).any())


def plan_round(
    profiles: ClientProfiles,
    policy: RoundPolicy,
    select: Sampler | SelectFn,
    *,
    round_idx: jax.Array,
    start: jax.Array,
    key: PRNGKey,
    cohort_size: int,
    steps_needed: jax.Array,
    payload_down: jax.Array,
    payload_up: jax.Array,
    completion: bool = False,
):
    """Selects round ``round_idx``'s clients (with over-commitment), then ``schedule_round``
    (whose results it returns, ``completion`` included).

    Availability-aware policies pass the readiness of every client at ``start +
    overhead`` to ``select``; ``ceil(cohort_size * (1 + over_commit))`` slots are used.
    """
    start, ready = wait_for_ready(profiles, policy, start)
    key_r = rng.round_key(key, round_idx)
    ids, valid = as_select_fn(select)(rng.stream(key_r, "select"), round_idx, ready)
    num_slots = ids.shape[0]
    if not isinstance(policy.over_commit, jax.core.Tracer):  # checkable on the host
        with jax.ensure_compile_time_eval():
            wanted = int(num_selected(cohort_size, policy.over_commit))
        if wanted > num_slots:
            raise ValueError(
                f"select returns {num_slots} ids but the policy selects "
                f"ceil(cohort_size * (1 + over_commit)) = {wanted}; give select that many slots"
            )
    if num_slots < cohort_size:
        raise ValueError(f"select returns {num_slots} ids, fewer than cohort_size={cohort_size}")
    valid = valid & (jnp.arange(num_slots) < num_selected(cohort_size, policy.over_commit))
    return schedule_round(
        profiles,
        policy,
        round_idx=round_idx,
        start=start,
        key=key,
        selected=ids,
        valid=valid,
        steps_needed=steps_needed,
        payload_down=payload_down,
        payload_up=payload_up,
        cohort_size=cohort_size,
        completion=completion,
    )


def schedule(
    profiles: ClientProfiles,
    policy: RoundPolicy,
    select: Sampler | SelectFn,
    *,
    rounds: int,
    cohort_size: int,
    steps_needed: jax.Array,
    payload_down: jax.Array,
    payload_up: jax.Array,
    key: PRNGKey,
) -> Schedule:
    """The schedule of ``rounds`` rounds from clock ``policy.start``: a ``lax.scan`` of ``plan_round``.

    Jit-able (``rounds``, ``cohort_size``, ``select`` and the policy's static
    fields static) and ``vmap``-able over keys, profile numbers and policy numbers.

    Args:
      profiles: the population (``[N]`` arrays); check it with ``profiles.validate``.
      policy: the round policy.
      select: a ``Sampler`` or a ``SelectFn``; its number of ids is the slot count ``S``,
        which must cover ``ceil(cohort_size * (1 + over_commit))``.
      rounds: number of rounds ``R``.
      cohort_size: clients per round ``m`` (results kept under over-commitment).
      steps_needed: scalar or ``[N]`` local steps of each client's task.
      payload_down: scalar or ``[N]`` bytes downloaded per round.
      payload_up: scalar or ``[N]`` bytes uploaded per round (frozen layers are not uploaded).
      key: the run's root key.

    Returns:
      A ``Schedule`` with ``[R]`` and ``[R, S]`` fields; with stale tasks
      (``policy.max_staleness``), ``[R, S + cohort_size]``: the last ``cohort_size``
      slots hold the round's stale arrivals (``stale_tasks.stale_round``), their ``version`` the
      round they started in.
    """
    if rounds < 1 or cohort_size < 1:
        raise ValueError(f"rounds and cohort_size must be >= 1, got {rounds} and {cohort_size}")
    if policy.max_staleness:
        return _schedule_with_stale_tasks(
            profiles,
            policy,
            select,
            rounds=rounds,
            cohort_size=cohort_size,
            steps_needed=steps_needed,
            payload_down=payload_down,
            payload_up=payload_up,
            key=key,
        )

    def one_round(clock, round_idx):
        row, clock = plan_round(
            profiles,
            policy,
            select,
            round_idx=round_idx,
            start=clock,
            key=key,
            cohort_size=cohort_size,
            steps_needed=steps_needed,
            payload_down=payload_down,
            payload_up=payload_up,
        )
        return clock, row

    clock0 = jnp.asarray(policy.start, profiles.step_time.dtype)
    _, rows = jax.lax.scan(one_round, clock0, jnp.arange(rounds, dtype=jnp.int32))
    return rows


def _schedule_with_stale_tasks(
    profiles: ClientProfiles,
    policy: RoundPolicy,
    select: Sampler | SelectFn,
    *,
    rounds: int,
    cohort_size: int,
    steps_needed: jax.Array,
    payload_down: jax.Array,
    payload_up: jax.Array,
    key: PRNGKey,
) -> Schedule:
    """``schedule`` whose late tasks arrive in later rounds (``stale_tasks.stale_round``)."""
    dtype = profiles.step_time.dtype
    bytes_up = per_client(payload_up, profiles.num_clients, "payload_up", dtype)
    plan = functools.partial(
        plan_round,
        profiles,
        policy,
        select,
        key=key,
        cohort_size=cohort_size,
        steps_needed=steps_needed,
        payload_down=payload_down,
        payload_up=payload_up,
        completion=True,
    )
    width = jax.eval_shape(lambda: plan(round_idx=jnp.int32(0), start=jnp.zeros((), dtype)))[0]
    pending = no_pending(policy.max_staleness * width.selected.shape[0], dtype)

    def one_round(carry, round_idx):
        clock, pending = carry
        row, _, late = plan(round_idx=round_idx, start=clock)
        row, pending = stale_round(policy, row, pending, round_idx, late, bytes_up, cohort_size)
        return (row.clock, pending), row

    clock0 = jnp.asarray(policy.start, dtype)
    _, rows = jax.lax.scan(one_round, (clock0, pending), jnp.arange(rounds, dtype=jnp.int32))
    return rows
