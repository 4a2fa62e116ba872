"""A cohort of a few width levels run as one smaller dense program per level (docs/design.md §3).

Masks make a sub-model cost the full model's work (``algorithms/submodels.py``). When each
client trains one of a few widths for the whole round (HeteroFL, FedRolex:
``submodel.DenseLevels``), the slots are sorted by level (then by work, as
``cohort.run_cohort`` sorts them) and each level's slots run in chunks of their own: a
``lax.scan`` over chunks whose body switches (``lax.switch``) to the chunk's level's
program, the level's clients trained on the dense sub-model (``Model.at_width``), their
contributions summed in the level's shapes and widened once a chunk. Only the taken
branch runs: on 2 CPU cores, W1's round of 100 clients of widths 1, 1/2, 1/4 and 1/8 took
0.65-0.68x a full-width FedAvg round, as masks 1.15x (``experiments/README.md``).

The chunks of a level hold only that level's slots: a level of ``n`` slots takes
``ceil(n / chunk)`` chunks, the scan ``ceil(m / chunk) + levels - 1`` (the rest idle, no
step). Each level's contributions are added by their own pairwise tree (``reduction``),
as ``run_cohort`` adds a cohort's, and the levels' sums then widest first, so the sums
are the same bits for every vmapped chunk size. The chunk is at most ``ceil(m / levels)``
(a cohort run as one chunk would run every level's program over all ``m`` slots).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.engine.algorithm import Aggregator, ClientStats
from fedjax_het.engine.cohort import ClientFn, _contributions, _padded, _run_chunk, effective_chunk
from fedjax_het.engine.local import NO_STEP_LIMIT, ClientTask
from fedjax_het.engine.reduction import push, tree_sum
from fedjax_het.typing import ClientState, PyTree


def grouped_chunk(chunk: int, slots: int, levels: int) -> int:
    """The clients per ``vmap`` of a grouped cohort: ``effective_chunk`` of ``chunk`` capped at
    ``ceil(slots / levels)``."""
    return effective_chunk(min(chunk, -(-slots // levels)), slots)


def run_grouped(
    client_fns: Sequence[tuple[ClientFn, Callable[[PyTree], PyTree]]],
    levels: jax.Array,
    client_states: ClientState,
    tasks: ClientTask,
    aggregator: Aggregator,
    *,
    chunk: int,
    steps: jax.Array,
    drop_nonfinite: bool = False,
    proportional: bool = True,
) -> tuple[PyTree, ClientState, ClientStats]:
    """``cohort.run_cohort`` on one device for slots of ``len(client_fns)`` levels.

    Args:
      client_fns: level ``l``'s client round and the widening of its sums
        (``DenseLevels.client_fn``), widest first.
      levels: int32 ``[m]`` each slot's level.
      client_states, tasks, aggregator, drop_nonfinite, proportional: as ``run_cohort``.
      chunk: the requested clients per ``vmap`` (``grouped_chunk``).
      steps: int32 ``[m]`` each slot's planned local steps.

    Returns:
      As ``run_cohort``: the sums, the new client states ``[m]`` and stats ``[m]``, in
      cohort order.
    """
    m, num_levels = tasks.client_id.shape[0], len(client_fns)
    c = grouped_chunk(chunk, m, num_levels)
    idle = (tasks.weight == 0) & (steps == 0)
    level = jnp.where(idle, num_levels - 1, jnp.clip(levels, 0, num_levels - 1))
    order = jnp.lexsort((jnp.arange(m), -steps, idle, level))  # by level, then work, idle last
    layout = _Layout.of(level[order], c, num_levels)
    states, padded_tasks, padded_steps = jax.tree.map(
        lambda x: x[order], (client_states, tasks, steps)
    )
    states, padded_tasks, padded_steps = _padded(states, padded_tasks, padded_steps, m + 1)
    gathered = jax.tree.map(lambda x: x[layout.position], (states, padded_tasks, padded_steps))
    num_chunks = layout.position.shape[0]
    depth = max(1, num_chunks.bit_length())

    branches = [_level_chunk(*fns, aggregator, drop_nonfinite, c) for fns in client_fns]

    def flush(carry, level):
        """Adds the finished level's root to the sums and empties the counter."""
        pending, sums = carry
        total = dynamic_root(pending, layout.chunks[level], depth)
        return jax.tree.map(jnp.zeros_like, pending), jax.tree.map(jnp.add, sums, total)

    def body(carry, inputs):
        at, index, before, states, chunk_tasks, chunk_steps = inputs
        bound = jnp.max(chunk_steps) if proportional else NO_STEP_LIMIT
        total, new_states, stats = jax.lax.switch(at, branches, states, chunk_tasks, bound)
        # A level's first chunk closes the level of the chunk before it (widest first).
        carry = jax.lax.cond((index == 0) & (at != before), flush, lambda carry, _: carry,
                             carry, before)
        pending, sums = carry
        return (push(pending, index, total, depth), sums), (new_states, stats)

    first = jax.tree.map(lambda x: x[0], gathered)
    shapes = jax.eval_shape(branches[0], *first[:2], jnp.int32(0))[0]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    pending = jax.tree.map(lambda z: jnp.zeros((depth, *z.shape), z.dtype), zeros)
    (pending, sums), (new_states, stats) = jax.lax.scan(
        body, (pending, zeros),
        (layout.level, layout.within, jnp.roll(layout.level, 1).at[0].set(layout.level[0]),
         *gathered),
    )
    sums = flush((pending, sums), layout.level[-1])[1]
    place = layout.slot[jnp.argsort(order)]  # each slot's lane of the chunks
    unchunk = lambda x: x.reshape(num_chunks * c, *x.shape[2:])[place]
    return sums, jax.tree.map(unchunk, new_states), jax.tree.map(unchunk, stats)


def _level_chunk(client_fn: ClientFn, widen: Callable[[PyTree], PyTree], aggregator: Aggregator,
                 drop_nonfinite: bool, c: int) -> Callable:
    """One chunk of a level: its clients (a ``vmap``), their contributions summed by the
    pairwise tree in the level's shapes, the sums widened to the full ones."""

    def work(states, chunk_tasks, bound):
        updates, new_states, stats = _run_chunk(client_fn, c, states, chunk_tasks, bound)
        contributions = _contributions(aggregator, drop_nonfinite, updates, chunk_tasks.weight,
                                       stats.replace(trained=None))
        # The barrier keeps XLA from contracting the products into the tree's adds.
        total = tree_sum(jax.lax.optimization_barrier(contributions))
        return tuple(map(widen, total)), new_states, stats

    return work


@struct.dataclass
class _Layout:
    """Where the sorted slots run: chunk ``j`` is of level ``level[j]``, its ``within[j]``-th;
    its lanes hold sorted slots ``position[j]`` (``m``: a padding slot); level ``l`` has
    ``chunks[l]`` chunks (the last also the idle ones after it); sorted slot ``i`` runs in
    lane ``slot[i]`` of the chunks laid end to end."""

    level: jax.Array
    within: jax.Array
    position: jax.Array
    chunks: jax.Array
    slot: jax.Array

    @classmethod
    def of(cls, level: jax.Array, c: int, num_levels: int) -> _Layout:
        """The layout of sorted slot levels ``level [m]`` (non-decreasing) in chunks of ``c``."""
        m = level.shape[0]
        num_chunks = -(-m // c) + num_levels - 1
        count = jnp.bincount(level, length=num_levels)
        chunks = -(-count // c)
        chunks = chunks.at[-1].add(num_chunks - jnp.sum(chunks))
        first_chunk, first_slot = jnp.cumsum(chunks) - chunks, jnp.cumsum(count) - count
        at = jnp.searchsorted(jnp.cumsum(chunks), jnp.arange(num_chunks), side="right")
        within = jnp.arange(num_chunks) - first_chunk[at]
        lane = within[:, None] * c + jnp.arange(c)[None, :]
        position = jnp.where(lane < count[at][:, None], first_slot[at][:, None] + lane, m)
        slot = first_chunk[level] * c + jnp.arange(m) - first_slot[level]
        return cls(at, within, position, chunks, slot)


def dynamic_root(pending: PyTree, num_chunks: jax.Array, depth: int) -> PyTree:
    """``reduction.root`` for a traced ``num_chunks`` (< ``2**depth``): the pending subtree of
    each set bit of the count added on the left, low bits first, as ``root`` adds them (its
    ``+ 0`` of a partial subtree changes no bit but a zero's sign; 0 chunks: zeros)."""
    partial = jax.tree.map(lambda p: jnp.zeros_like(p[0]), pending)
    for k in range(depth):
        bit = (num_chunks >> k & 1).astype(bool)
        partial = jax.tree.map(
            lambda p, r, k=k, bit=bit: jnp.where(bit, p[k] + r, r), pending, partial
        )
    return partial
