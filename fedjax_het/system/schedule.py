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
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het import rng
from fedjax_het.system import availability as avail
from fedjax_het.system.policy import KINDS, RoundPolicy, num_selected, round_end
from fedjax_het.system.profiles import ClientProfiles, transfer_time
from fedjax_het.system.sampler import Sampler
from fedjax_het.typing import PRNGKey

OK, UNAVAILABLE, LATE, DROPPED, EMPTY = 0, 1, 2, 3, 4
OUTCOMES = ("ok", "unavailable", "late", "dropped", "empty")  # names, indexed by code


@struct.dataclass
class Schedule:
    """The timing of ``R`` rounds with ``m`` slots each (one round: no ``R`` axis).

    Attributes:
      selected: int32 ``[R, m]`` client id in each slot (arbitrary where not valid).
      valid: bool ``[R, m]`` the slot holds a selected client.
      outcome: int32 ``[R, m]`` OK, UNAVAILABLE, LATE, DROPPED or EMPTY.
      steps_done: int32 ``[R, m]`` local steps completed (compute spent; aggregate only OK).
      version: int32 ``[R, m]`` global-model version the slot trains from (= round here).
      start: ``[R]`` virtual time the round starts.
      duration: ``[R]`` round duration, server overhead included.
      clock: ``[R]`` virtual time at the end of the round, ``start + duration``.
      finish: ``[R, m]`` seconds after ``start`` when the slot finished or gave up.
      bytes_down: ``[R, m]`` bytes downloaded (a transfer counts once complete).
      bytes_up: ``[R, m]`` bytes uploaded (0 when the client never finished).
    """

    selected: jax.Array
    valid: jax.Array
    outcome: jax.Array
    steps_done: jax.Array
    version: jax.Array
    start: jax.Array
    duration: jax.Array
    clock: jax.Array
    finish: jax.Array
    bytes_down: jax.Array
    bytes_up: jax.Array


# ``(key, round_idx, ready bool [N]) -> (ids int32 [S], valid bool [S])``. ``key`` is already
# the round's "select" stream; ``ready`` is all True unless the policy is availability-aware.
SelectFn = Callable[[PRNGKey, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def select_among_ready(num_clients: int, num_slots: int) -> SelectFn:
    """Uniform selection of ``min(num_slots, #ready)`` clients among the ready ones.

    FLHetBench's selection (notes §3.2, §4.2): every ready client is equally
    likely; slots beyond the number of ready clients are EMPTY.
    """
    if not 1 <= num_slots <= num_clients:
        raise ValueError(f"num_slots must be in [1, num_clients={num_clients}], got {num_slots}")

    def select(key: PRNGKey, round_idx: jax.Array, ready: jax.Array):
        del round_idx  # the key is already fold_in(seed, round)
        priority = jnp.where(ready, jax.random.uniform(key, (num_clients,)), 2.0)
        ids = jnp.argsort(priority)[:num_slots].astype(jnp.int32)
        return ids, jnp.arange(num_slots) < jnp.sum(ready)

    return select


def sampler_select(sampler: Sampler) -> SelectFn:
    """A ``Sampler`` as a ``SelectFn``.

    A sampler does not see readiness: under availability-aware selection the
    clients it draws that are not ready are left out (EMPTY slots), so a round
    may have fewer than ``cohort_size`` clients. For FLHetBench's "pick among
    the ready" use ``select_among_ready``.
    """

    def select(key: PRNGKey, round_idx: jax.Array, ready: jax.Array):
        ids = sampler.select(key, round_idx).astype(jnp.int32)
        return ids, ready[ids]

    return select


def _per_client(value, num_clients: int, name: str, dtype) -> jax.Array:
    """A scalar or ``[N]`` per-client quantity as ``[N]``."""
    value = jnp.asarray(value, dtype)
    if value.shape not in ((), (num_clients,)):
        raise ValueError(
            f"{name} must be a scalar or have shape ({num_clients},), got {value.shape}"
        )
    return jnp.broadcast_to(value, (num_clients,))


def _query(fn, av, *per_slot):
    """The availability query ``fn(av, *args)`` over the leading axis of every argument.

    Queries are batched (both halves of a round in one call) because each is a
    bisection loop, and loops dominate the compile time of a round.
    """
    return jax.vmap(fn, in_axes=(None,) + (0,) * len(per_slot))(av, *per_slot)


def _pair(a, b):
    return jnp.concatenate([a, b])


def _client_keys(key_r: PRNGKey, ids) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-slot keys ``fold_in(stream(round key, name), client_id)`` for each name.

    The names are "download", "upload" and "dropout"; the keys are derived in one batch.
    """
    streams = jnp.stack([rng.stream(key_r, name) for name in ("download", "upload", "dropout")])
    keys = jax.vmap(jax.vmap(rng.client_key, in_axes=(None, 0)), in_axes=(0, None))(streams, ids)
    return keys[0], keys[1], keys[2]


def _transfer_times(keys_down, keys_up, profiles: ClientProfiles, ids, bytes_down, bytes_up):
    """Download and upload seconds of every slot, each speed drawn afresh (one batched call)."""
    seconds = jax.vmap(transfer_time)(
        _pair(keys_down, keys_up),
        _pair(bytes_down, bytes_up),
        _pair(profiles.down_mean[ids], profiles.up_mean[ids]),
        _pair(profiles.down_std[ids], profiles.up_std[ids]),
    )
    return jnp.split(seconds, 2)


def _steps_within(seconds, step_time, limit) -> jax.Array:
    """Whole steps of ``step_time`` that fit in ``seconds``, in ``[0, limit]``."""
    safe = jnp.where(step_time > 0, step_time, 1.0)
    fit = jnp.clip(jnp.floor(seconds / safe), 0, limit)
    fit = jnp.where(step_time > 0, fit, jnp.where(seconds >= 0, limit, 0))
    return fit.astype(jnp.int32)


def _client_work(profiles, policy, key_r, ids, needed, bytes_down, bytes_up):
    """Each slot's transfers and planned steps, its work in ready seconds, and its dropout.

    Returns ``(down, planned, eligible, work, drops, drop_progress)``: download
    seconds, local steps planned (fewer than needed only for partial deadline
    work), whether the plan can count (at least one step when any is needed),
    the total work, whether the client drops out, and after how much work.
    """
    keys_down, keys_up, keys_drop = _client_keys(key_r, ids)
    down, up = _transfer_times(keys_down, keys_up, profiles, ids, bytes_down, bytes_up)
    step_time = profiles.step_time[ids]
    if policy.kind == "deadline" and policy.on_late == "partial":
        planned = _steps_within(policy.deadline - down - up, step_time, needed)
    else:
        planned = needed
    work = down + planned * step_time + up
    draws = jax.vmap(lambda k: jax.random.uniform(k, (2,), work.dtype))(keys_drop)
    drops = draws[:, 0] < profiles.dropout[ids]
    # The drop point is uniform over the work, in ready seconds.
    return down, planned, planned >= jnp.minimum(needed, 1), work, drops, draws[:, 1] * work


def _gate(policy, av, trace, t0s, work, drops, drop_progress):
    """The work on the device's availability: ``(done, fail, fail_progress)``.

    ``done``: seconds after ``t0`` the work would finish; ``fail``: seconds
    after ``t0`` the client fails (drop, or loss under "lost"), inf if it does
    not; ``fail_progress``: the ready seconds of work done by then.
    """
    always = trace == avail.ALWAYS
    t0 = t0s[0]
    if policy.on_unavailable == "pause":  # progress only while ready (F_i(t, d))
        ready_work = _pair(work, drop_progress)
        finish = _query(avail.finish_time, av, _pair(trace, trace), _pair(t0s, t0s), ready_work)
        done, to_drop = jnp.split(jnp.where(_pair(always, always), ready_work, finish - t0), 2)
        return done, jnp.where(drops, to_drop, jnp.inf), drop_progress
    room = _query(avail.ready_until, av, trace, t0s) - t0  # lost when the interval ends
    fail = jnp.minimum(
        jnp.where(drops, drop_progress, jnp.inf), jnp.where(work > room, room, jnp.inf)
    )
    return work, fail, fail  # ready until the failure: its wall time is its progress


def _ready_seconds_until(policy, av, trace, t0s, end):
    """Ready seconds each slot had in ``[t0, t0 + end]`` (the progress of a LATE client)."""
    if policy.on_unavailable == "lost":  # a client still running was ready all along
        return jnp.broadcast_to(end, t0s.shape)
    seconds = _query(avail.ready_seconds, av, _pair(trace, trace), _pair(t0s + end, t0s))
    since_t0 = seconds[: trace.shape[0]] - seconds[trace.shape[0] :]
    return jnp.where(trace == avail.ALWAYS, end, since_t0)


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
    started = valid & _query(avail.is_ready, av, trace, t0s)

    bytes_down = _per_client(payload_down, n, "payload_down", dtype)[ids]
    bytes_up = _per_client(payload_up, n, "payload_up", dtype)[ids]
    needed = _per_client(steps_needed, n, "steps_needed", jnp.int32)[ids]
    key_r = rng.round_key(key, round_idx)
    down, planned, eligible, work, drops, drop_progress = _client_work(
        profiles, policy, key_r, ids, needed, bytes_down, bytes_up
    )
    done, fail, fail_progress = _gate(policy, av, trace, t0s, work, drops, drop_progress)
    fails = started & jnp.isfinite(fail)
    end, ok = round_end(
        policy,
        t0=t0s[0],
        started=started,
        finished=started & ~fails,
        eligible=eligible,
        done=done,
        fail=fail,
        ids=ids,
        keep=num_slots if cohort_size is None else cohort_size,
    )
    dropped = fails & (fail <= end)
    late = started & ~ok & ~dropped
    late_progress = _ready_seconds_until(policy, av, trace, t0s, end)
    progress = jnp.minimum(
        work, jnp.where(ok, work, jnp.where(dropped, fail_progress, late * late_progress))
    )
    stop = jnp.where(ok, done, jnp.where(dropped, fail, late * end))  # seconds after t0
    steps_done = _steps_within(progress - down, profiles.step_time[ids], planned)
    row = Schedule(
        selected=ids,
        valid=valid,
        outcome=jnp.select(
            [~valid, ~started, ok, dropped], [EMPTY, UNAVAILABLE, OK, DROPPED], LATE
        ).astype(jnp.int32),
        steps_done=jnp.where(ok, planned, jnp.where(started, steps_done, 0)),
        version=jnp.full((num_slots,), round_idx, jnp.int32),
        start=start,
        duration=overhead + end,
        clock=start + (overhead + end),
        finish=jnp.where(valid, overhead + stop, 0.0).astype(dtype),
        bytes_down=jnp.where(started & (ok | (progress >= down)), bytes_down, 0.0),
        bytes_up=jnp.where(started & (ok | (progress >= work)), bytes_up, 0.0),
    )
    if completion:
        complete = jnp.where(late & ~fails & eligible, overhead + done, jnp.inf).astype(dtype)
        return row, row.clock, (complete, planned)
    return row, row.clock


def as_select_fn(select: Sampler | SelectFn) -> SelectFn:
    """A ``Sampler`` through ``sampler_select``; a ``SelectFn`` as it is."""
    return sampler_select(select) if isinstance(select, Sampler) else select


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
    t0 = jnp.asarray(start, profiles.step_time.dtype) + policy.overhead
    if policy.availability_aware:
        ready = jax.vmap(avail.is_ready, in_axes=(None, 0, None))(
            avail.queryable(profiles.availability), profiles.trace, t0
        )
    else:
        ready = jnp.ones((profiles.num_clients,), bool)
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


@struct.dataclass
class _Pending:
    """Late tasks still working (stale tasks): ``[max_staleness * S]`` each, a block of ``S``
    slots per origin round ``r`` at block ``r % max_staleness``."""

    client: jax.Array
    origin: jax.Array
    arrival: jax.Array  # virtual time the update would arrive
    steps: jax.Array
    valid: jax.Array


def _stale_round(policy: RoundPolicy, row: Schedule, pending: _Pending, round_idx: jax.Array,
                 late: tuple[jax.Array, jax.Array], bytes_up: jax.Array, cap: int):
    """Round ``round_idx``'s row with up to ``cap`` stale arrivals appended, and the pending tasks.

    FLHetBench's synchronous server with stale tasks (notes §4.4): every pending
    task that has arrived by this round's deadline and is at most
    ``max_staleness`` rounds old joins the round (trained from its origin
    round's model: the slot's ``version``), the earliest first, at most ``cap``
    of them (the rest wait for the next round); older arrivals are dropped.
    The round ends no earlier than its last stale arrival (and, as before, no
    later than the deadline). The round's own late tasks then become pending,
    arriving when their planned steps complete (the full task, notes §8 item
    15's recommendation, not the end of the phase that overran).
    """
    staleness = policy.max_staleness
    dtype = row.start.dtype
    deadline_at = row.start + policy.overhead.astype(dtype) + policy.deadline.astype(dtype)
    age = round_idx - pending.origin
    arrived = pending.valid & (pending.arrival <= deadline_at)
    usable = arrived & (age <= staleness)
    order = jnp.argsort(jnp.where(usable, pending.arrival, jnp.inf))[:cap]
    take = usable[order]
    taken = jnp.zeros_like(pending.valid).at[order].set(take)
    clients = pending.client[order]
    since_start = pending.arrival[order] - row.start
    last = jnp.max(jnp.where(take, since_start, 0.0))
    duration = jnp.maximum(row.duration, last)
    extended = row.replace(
        selected=jnp.concatenate([row.selected, clients]),
        valid=jnp.concatenate([row.valid, take]),
        outcome=jnp.concatenate([row.outcome, jnp.where(take, OK, EMPTY).astype(jnp.int32)]),
        steps_done=jnp.concatenate([row.steps_done, jnp.where(take, pending.steps[order], 0)]),
        version=jnp.concatenate([row.version, pending.origin[order]]),
        duration=duration,
        clock=row.start + duration,
        finish=jnp.concatenate([row.finish, jnp.where(take, since_start, 0.0).astype(dtype)]),
        bytes_down=jnp.concatenate([row.bytes_down, jnp.zeros((cap,), dtype)]),
        bytes_up=jnp.concatenate([row.bytes_up, jnp.where(take, bytes_up[clients], 0.0)]),
    )
    complete, planned = late
    width = row.selected.shape[0]
    block = (round_idx % staleness) * width + jnp.arange(width)
    still = pending.valid & ~taken & ~(arrived & (age > staleness))
    pending = _Pending(
        client=pending.client.at[block].set(row.selected),
        origin=pending.origin.at[block].set(round_idx),
        arrival=pending.arrival.at[block].set(row.start + complete),
        steps=pending.steps.at[block].set(planned),
        valid=still.at[block].set(jnp.isfinite(complete) & (row.outcome == LATE)),
    )
    return extended, pending


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
      slots hold the round's stale arrivals (``_stale_round``), their ``version`` the
      round they started in.
    """
    if rounds < 1 or cohort_size < 1:
        raise ValueError(f"rounds and cohort_size must be >= 1, got {rounds} and {cohort_size}")
    if policy.max_staleness:
        return _schedule_with_stale_tasks(
            profiles, policy, select, rounds=rounds, cohort_size=cohort_size,
            steps_needed=steps_needed, payload_down=payload_down, payload_up=payload_up, key=key,
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
    profiles: ClientProfiles, policy: RoundPolicy, select: Sampler | SelectFn, *, rounds: int,
    cohort_size: int, steps_needed: jax.Array, payload_down: jax.Array, payload_up: jax.Array,
    key: PRNGKey,
) -> Schedule:
    """``schedule`` whose late tasks arrive in later rounds (``_stale_round``)."""
    dtype = profiles.step_time.dtype
    bytes_up = _per_client(payload_up, profiles.num_clients, "payload_up", dtype)
    plan = functools.partial(
        plan_round, profiles, policy, select, key=key, cohort_size=cohort_size,
        steps_needed=steps_needed, payload_down=payload_down, payload_up=payload_up,
        completion=True,
    )
    width = jax.eval_shape(lambda: plan(round_idx=jnp.int32(0), start=jnp.zeros((), dtype)))[0]
    size = policy.max_staleness * width.selected.shape[0]
    pending = _Pending(
        client=jnp.zeros((size,), jnp.int32), origin=jnp.zeros((size,), jnp.int32),
        arrival=jnp.full((size,), jnp.inf, dtype), steps=jnp.zeros((size,), jnp.int32),
        valid=jnp.zeros((size,), bool),
    )

    def one_round(carry, round_idx):
        clock, pending = carry
        row, _, late = plan(round_idx=round_idx, start=clock)
        row, pending = _stale_round(policy, row, pending, round_idx, late, bytes_up, cohort_size)
        return (row.clock, pending), row

    clock0 = jnp.asarray(policy.start, dtype)
    _, rows = jax.lax.scan(one_round, (clock0, pending), jnp.arange(rounds, dtype=jnp.int32))
    return rows
