"""When each slot's work finishes or fails: transfers, planned steps, dropout, availability.

The per-slot half of the round model (``fedjax_het.system.schedule``'s module
docstring): a started client downloads, trains its planned steps and uploads,

    work_k = payload_down / v_down + steps_k * step_time_k + payload_up_k / v_up

in ready seconds, both speeds drawn afresh for each transfer; it drops out
with probability ``dropout[k]`` at a point drawn uniformly over its work. On
the device's availability the work pauses while the device is not ready
(``on_unavailable="pause"``, FLHetBench's F_i(t, d)) or is lost when the
ready interval holding ``t0`` ends ("lost", FLASH). The synchronous schedule
and the asynchronous one (``fedjax_het.system.events``) time their slots with
``time_slots``.

Each client's speeds and dropout use ``fold_in(stream, client_id)`` on the
``"download"``, ``"upload"`` and ``"dropout"`` streams of the key given, so
nothing depends on slot order.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_het import rng
from fedjax_het.system import availability as avail
from fedjax_het.system.policy import RoundPolicy
from fedjax_het.system.profiles import ClientProfiles, transfer_time
from fedjax_het.typing import PRNGKey


class SlotTiming(NamedTuple):
    """Each slot's work and when it ends (``time_slots``), all ``[S]``."""

    down: jax.Array  # download seconds
    planned: jax.Array  # local steps planned (fewer than needed only for partial deadline work)
    eligible: jax.Array  # the plan can count: at least one step when any is needed
    work: jax.Array  # the whole work, in ready seconds
    done: jax.Array  # seconds after t0 the work would finish
    fail: jax.Array  # seconds after t0 the client fails (drop, or loss under "lost"); inf if not
    fail_progress: jax.Array  # ready seconds of work done by the failure
    bytes_down: jax.Array  # bytes the download moves
    bytes_up: jax.Array  # bytes the upload moves


def per_client(value, num_clients: int, name: str, dtype) -> jax.Array:
    """A scalar or ``[N]`` per-client quantity as ``[N]``."""
    value = jnp.asarray(value, dtype)
    if value.shape not in ((), (num_clients,)):
        raise ValueError(
            f"{name} must be a scalar or have shape ({num_clients},), got {value.shape}"
        )
    return jnp.broadcast_to(value, (num_clients,))


def query_slots(fn, av, *per_slot):
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


def steps_within(seconds, step_time, limit) -> jax.Array:
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
        planned = steps_within(policy.deadline.astype(down.dtype) - down - up, step_time, needed)
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
        finish = query_slots(
            avail.finish_time, av, _pair(trace, trace), _pair(t0s, t0s), ready_work
        )
        done, to_drop = jnp.split(jnp.where(_pair(always, always), ready_work, finish - t0), 2)
        return done, jnp.where(drops, to_drop, jnp.inf), drop_progress
    room = query_slots(avail.ready_until, av, trace, t0s) - t0  # lost when the interval ends
    fail = jnp.minimum(
        jnp.where(drops, drop_progress, jnp.inf), jnp.where(work > room, room, jnp.inf)
    )
    return work, fail, fail  # ready until the failure: its wall time is its progress


def time_slots(
    profiles: ClientProfiles,
    policy: RoundPolicy,
    key: PRNGKey,
    ids: jax.Array,
    av: avail.Availability,
    t0s: jax.Array,
    *,
    needed: jax.Array,
    bytes_down: jax.Array,
    bytes_up: jax.Array,
) -> SlotTiming:
    """The work of the clients ``ids`` started at ``t0s``, and when it finishes or fails.

    Args:
      profiles: the population (``[N]`` arrays).
      policy: the round policy (its partial deadline work and ``on_unavailable``).
      key: the key whose streams draw speeds and dropout (a round's, or a task's).
      ids: int32 ``[S]`` the slots' clients.
      av: ``avail.queryable(profiles.availability)``.
      t0s: ``[S]`` virtual time each slot starts (the same for every slot).
      needed, bytes_down, bytes_up: ``[S]`` each slot's local steps and payloads.
    """
    down, planned, eligible, work, drops, drop_progress = _client_work(
        profiles, policy, key, ids, needed, bytes_down, bytes_up
    )
    trace = profiles.trace[ids]
    done, fail, fail_progress = _gate(policy, av, trace, t0s, work, drops, drop_progress)
    return SlotTiming(
        down, planned, eligible, work, done, fail, fail_progress, bytes_down, bytes_up
    )


def ready_seconds_until(policy: RoundPolicy, av, trace, t0s, end) -> jax.Array:
    """Ready seconds each slot had in ``[t0, t0 + end]`` (the progress of a LATE client)."""
    if policy.on_unavailable == "lost":  # a client still running was ready all along
        return jnp.broadcast_to(end, t0s.shape)
    seconds = query_slots(avail.ready_seconds, av, _pair(trace, trace), _pair(t0s + end, t0s))
    since_t0 = seconds[: trace.shape[0]] - seconds[trace.shape[0] :]
    return jnp.where(trace == avail.ALWAYS, end, since_t0)
