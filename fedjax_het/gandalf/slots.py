"""The slots of a mediator round: who trains when, whether it fails, and what it costs.

GANDALF (Chou, Chang, Chou), Algorithm 3 and the fault tolerance of §3.4 and
§5.5, as ``fedjax_het.gandalf.mediator``'s docstring states them: a group of
``G`` members has ``S = E_m G`` slots a round; each slot's client works ``down
+ steps * step_time + up`` ready seconds, pausing while its device is not
ready, and fails UNAVAILABLE, DROPPED or LATE. With fault tolerance the next
member is the least-trained one of the pass and a gone client is noticed after
``heartbeat`` seconds; without it the order is fixed and a failure costs
``T_R``. :class:`Timing` holds the traced numbers (``T_R``, the heartbeat, the
bytes of the weights), :func:`plan_group` plays one group's slots. Nothing here
depends on model values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het import rng
from fedjax_het.system import availability as avail
from fedjax_het.system.profiles import ClientProfiles, transfer_time
from fedjax_het.system.schedule import DROPPED, EMPTY, LATE, OK, UNAVAILABLE
from fedjax_het.typing import PRNGKey

SlotCost = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
"""``(client k, pass e, t seconds into the round) -> (outcome, seconds)`` of one slot."""


@struct.dataclass
class Timing:
    """The traced numbers of a mediator round (a sweep may vary them).

    Attributes:
      max_wait: ``T_R``, seconds a mediator waits for a client before it counts as failed.
      heartbeat: seconds of silence after which a gone client is noticed (``inf``:
        only at ``T_R``, the baseline without fault tolerance).
      payload_down, payload_up: bytes of the weights a client receives and sends.
    """

    max_wait: jax.Array
    heartbeat: jax.Array
    payload_down: jax.Array
    payload_up: jax.Array


def timing(
    max_wait: float,
    *,
    heartbeat: float | None = None,
    payload_down: float = 0.0,
    payload_up: float = 0.0,
) -> Timing:
    """A validated ``Timing``.

    Args:
      max_wait: ``T_R`` in seconds, > 0 and finite.
      heartbeat: the heartbeat timeout in ``[0, T_R]`` seconds; None (the baseline
        without fault tolerance): failures are noticed only at ``T_R``.
      payload_down, payload_up: bytes of the weights in and out of a client
        (``costs.payload_bytes``).
    """
    if not 0 < max_wait < math.inf:
        raise ValueError(f"max_wait (T_R) must be > 0 seconds and finite, got {max_wait}")
    if heartbeat is not None and not 0 <= heartbeat <= max_wait:
        raise ValueError(f"heartbeat must be in [0, max_wait={max_wait}] seconds, got {heartbeat}")
    if not (0 <= payload_down < math.inf and 0 <= payload_up < math.inf):
        raise ValueError(f"payloads must be finite bytes >= 0, got {payload_down}, {payload_up}")
    as32 = lambda v: jnp.asarray(v, jnp.float32)
    return Timing(
        as32(max_wait),
        as32(math.inf if heartbeat is None else heartbeat),
        as32(payload_down),
        as32(payload_up),
    )


@struct.dataclass
class GroupPlan:
    """Who trains in each slot of each group this round, and what it cost (``S = E_m G``).

    Attributes:
      client: int32 ``[M, S]`` client of each slot (0 in an empty slot).
      position: int32 ``[M, S]`` the client's position in its group's members.
      outcome: int32 ``[M, S]`` OK, UNAVAILABLE, LATE, DROPPED or EMPTY (``system.schedule``'s codes).
      seconds: ``[M, S]`` what each slot cost its group.
      duration: ``[M]`` each group's round, the sum of its slots' costs.
    """

    client: jax.Array
    position: jax.Array
    outcome: jax.Array
    seconds: jax.Array
    duration: jax.Array

    @property
    def trained(self) -> jax.Array:
        return self.outcome == OK


def slot_costs(
    profiles: ClientProfiles,
    times: Timing,
    steps: jax.Array,
    *,
    round_idx: jax.Array,
    start: jax.Array,
    key: PRNGKey,
    fault_tolerant: bool,
) -> SlotCost:
    """The outcome and cost of any slot of round ``round_idx``, which starts at ``start``.

    Client ``k``'s pass ``e`` draws its speeds and its dropout from
    ``fold_in(client_key(stream(round_key(key, round_idx), name), k), e)`` for the
    "download", "upload" and "dropout" streams; ``steps``: ``[N]`` local steps of
    each client. A failed slot costs ``T_R``, or with ``fault_tolerant``
    ``min(silent_since + heartbeat, T_R)`` when its client is gone.
    """
    av = avail.queryable(profiles.availability)
    key_r = rng.round_key(key, round_idx)
    streams = [rng.stream(key_r, name) for name in ("download", "upload", "dropout")]

    def slot_cost(k, e, t):
        """Outcome and cost of client ``k``'s pass ``e``, asked at ``t`` seconds into the round."""
        down_key, up_key, drop_key = (jax.random.fold_in(rng.client_key(s, k), e) for s in streams)
        down = transfer_time(
            down_key, times.payload_down, profiles.down_mean[k], profiles.down_std[k]
        )
        up = transfer_time(up_key, times.payload_up, profiles.up_mean[k], profiles.up_std[k])
        work = down + steps[k] * profiles.step_time[k] + up
        draws = jax.random.uniform(drop_key, (2,), work.dtype)
        t_abs, trace = start + t, profiles.trace[k]
        ready = avail.is_ready(av, trace, t_abs)
        walls = (
            jax.vmap(avail.finish_time, in_axes=(None, None, None, 0))(
                av, trace, t_abs, jnp.stack([work, draws[1] * work])
            )
            - t_abs
        )
        done, dropped_at = walls[0], walls[1]
        drops = (draws[0] < profiles.dropout[k]) & (dropped_at <= times.max_wait)
        outcome = jnp.select(
            [~ready, drops, done > times.max_wait], [UNAVAILABLE, DROPPED, LATE], OK
        )
        silent_since = jnp.where(outcome == UNAVAILABLE, 0.0, dropped_at)
        gone = (outcome == UNAVAILABLE) | (outcome == DROPPED)
        failed = times.max_wait
        if fault_tolerant:
            failed = jnp.where(gone, jnp.minimum(silent_since + times.heartbeat, failed), failed)
        return outcome, jnp.where(outcome == OK, done, failed)

    return slot_cost


def next_member(
    j: jax.Array, used: jax.Array, counts: jax.Array, *, fault_tolerant: bool
) -> jax.Array:
    """The position in its group of the member that trains in slot ``j`` of a pass.

    With ``fault_tolerant``: among the members not ``used`` in this pass, the one
    with the fewest completed tasks ``counts`` (ties: group order); else the
    ``j``-th (the fixed order).
    """
    if fault_tolerant:
        size = used.shape[0]
        rank = jnp.where(used, jnp.iinfo(jnp.int32).max, counts * size + jnp.arange(size))
        return jnp.argmin(rank).astype(jnp.int32)
    return j.astype(jnp.int32)


def plan_group(
    ids: jax.Array,
    is_member: jax.Array,
    counts: jax.Array,
    *,
    slot_cost: SlotCost,
    passes: int,
    fault_tolerant: bool,
    clock_dtype: jnp.dtype,
) -> GroupPlan:
    """One group's ``GroupPlan`` (``[S]`` rows, ``duration`` a scalar), a ``lax.scan`` over slots.

    Args:
      ids, is_member: ``[G]`` the group's row of ``Groups.members`` and ``Groups.mask``.
      counts: ``[G]`` local training tasks each member completed before this round.
      slot_cost: from :func:`slot_costs`.
      passes: ``E_m``.
      fault_tolerant: the order of :func:`next_member`.
      clock_dtype: dtype of the group's clock (the profiles' ``step_time``).
    """
    size = ids.shape[0]

    def slot(carry, s):
        t, counts, used = carry
        e, j = s // size, s % size
        used = jnp.where(j == 0, ~is_member, used)  # a new pass
        position = next_member(j, used, counts, fault_tolerant=fault_tolerant)
        valid = is_member[position] & ~used[position]
        k = jnp.where(valid, ids[position], 0)
        outcome, cost = slot_cost(k, e, t)
        outcome = jnp.where(valid, outcome, EMPTY)
        cost = jnp.where(valid, cost, 0.0)
        counts = counts.at[position].add((outcome == OK).astype(jnp.int32))
        used = used.at[position].set(True)
        return (t + cost, counts, used), (k, position, outcome, cost)

    init = (jnp.zeros((), clock_dtype), counts, ~is_member)
    (t, _, _), (k, position, outcome, cost) = jax.lax.scan(
        slot, init, jnp.arange(passes * size, dtype=jnp.int32)
    )
    return GroupPlan(k, position, outcome.astype(jnp.int32), cost, t)
