"""Stale tasks: late work that arrives in a later round (FLHetBench's synchronous server).

FLHetBench (notes §4.4) lets a client that misses a round's deadline keep
working; its update joins the first round whose deadline it meets, if it is
at most ``policy.max_staleness`` rounds old, trained from the model of the
round it started in. ``Pending`` holds the tasks still working between rounds
of the schedule's scan (``fedjax_het.system.schedule``); ``stale_round`` adds
a round's arrivals to its row and its own late tasks to the pending ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.system.policy import RoundPolicy
from fedjax_het.system.schedule_row import EMPTY, LATE, OK, Schedule


@struct.dataclass
class Pending:
    """Late tasks still working (stale tasks): ``[max_staleness * S]`` each, a block of ``S``
    slots per origin round ``r`` at block ``r % max_staleness``."""

    client: jax.Array
    origin: jax.Array
    arrival: jax.Array  # virtual time the update would arrive
    steps: jax.Array
    valid: jax.Array


def stale_round(
    policy: RoundPolicy,
    row: Schedule,
    pending: Pending,
    round_idx: jax.Array,
    late: tuple[jax.Array, jax.Array],
    bytes_up: jax.Array,
    cap: int,
):
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
    pending = Pending(
        client=pending.client.at[block].set(row.selected),
        origin=pending.origin.at[block].set(round_idx),
        arrival=pending.arrival.at[block].set(row.start + complete),
        steps=pending.steps.at[block].set(planned),
        valid=still.at[block].set(jnp.isfinite(complete) & (row.outcome == LATE)),
    )
    return extended, pending


def no_pending(size: int, dtype) -> Pending:
    """``size`` empty pending slots, arrival times in ``dtype``."""
    return Pending(
        client=jnp.zeros((size,), jnp.int32),
        origin=jnp.zeros((size,), jnp.int32),
        arrival=jnp.full((size,), jnp.inf, dtype),
        steps=jnp.zeros((size,), jnp.int32),
        valid=jnp.zeros((size,), bool),
    )
