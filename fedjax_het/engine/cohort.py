"""Running a cohort of clients as one program (docs/design.md §3).

The only place that adds the client axis. Clients run in chunks: a
``lax.scan`` over chunks of ``chunk`` clients, each chunk a ``vmap``. The
slots run in work order (most planned steps first, idle slots last) and each
chunk's step loop stops at its longest client (a chunk of idle slots runs no
step), so a heterogeneous round costs about the work its clients do.

Contributions are added by a fixed pairwise tree over the slots in that order:
inside a chunk one parallel add per level, across chunks a binary counter of
pending subtrees in the scan's carry. Memory is ``chunk x params``, the adds run
in parallel, and the sums are the same bits for every chunk size: vmapped
chunks of any size give bitwise the same run (``effective_chunk``: a power of
two, or the whole cohort); chunk 1 runs each client without ``vmap``, which XLA
compiles to other kernels, so it matches them to float rounding of the
client's own arithmetic (``tests/test_engine_invariance.py``).

With a ``mesh`` the cohort is first dealt over devices (``shard_map``; slot
``i`` of the work order to device ``i % devices``, so each gets an even share of
the work): each device runs its share of the slots in chunks and the devices'
sums are added with a ``psum``. Results do not depend on the number of devices beyond float
summation order either (``tests/test_multidevice.py``).

Over 400 lines on purpose: the work order, the chunks and the reduction tree are one mechanism
whose bits depend on each other (every vmapped chunk size must add the same numbers in the same
order); split, the invariant would live in no one module.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fedjax_het.engine.algorithm import Aggregator, ClientStats
from fedjax_het.engine.client_store import ClientStore
from fedjax_het.engine.local import NO_STEP_LIMIT, ClientTask
from fedjax_het.engine.reduction import push, root, tree_sum
from fedjax_het.typing import ClientState, PyTree, Update

ClientFn = Callable[[ClientState, ClientTask], tuple[Update, ClientState, ClientStats]]


CPU_CHUNK = 8  # a dense model's clients per vmap on CPU (experiments/README.md, "Throughput")
WORK_CHUNKS = 8  # accelerators: a round whose clients' steps differ runs in about this many chunks
CHUNK_STEP_FLOPS = 4e9  # ... none of whose steps does fewer floating-point operations


def auto_chunk(
    cohort_size: int,
    *,
    backend: str | None = None,
    convolutional: bool = False,
    step_flops: float | None = None,
) -> int:
    """The chunk a backend prefers before memory is counted (``memory.plan_chunk`` lowers it).

    On accelerators the whole cohort as one ``vmap``: the bigger the batch of
    clients, the fuller the device. But a chunk's step loop runs to its longest
    client, so a round whose clients' steps differ (``step_flops`` given: one
    client's training step) runs in about ``WORK_CHUNKS`` chunks, sorted by work
    (``run_cohort``), each at least ``CHUNK_STEP_FLOPS`` a step. On one H200 the
    flash-deadline round (58 % of the steps) went from 0.98x to 0.86x the
    homogeneous round at W1/1,000 (chunk 256; 8 chunks of 128: 0.95x), from 1.00x
    to 0.69x at W1/10,000 (2,048) and from 1.00x to 0.71x at W2/100 (16)
    (``experiments/bench_results/gpu-h200-20261126b``).

    On CPU a dense model runs ``CPU_CHUNK`` clients per ``vmap`` (W1's MLP, 100
    clients: chunk 8 1.02x the per-client loop, 16 1.28x, 32 1.62x, 1 1.56x), or
    the whole cohort when that is under two chunks (10 clients as one chunk:
    0.97x; as 8 + 2 padded: 2.1x); a convolutional one chunk 1 (XLA:CPU's batched
    convolutions are slower than a loop of single ones; ``experiments/README.md``).
    """
    backend = backend or jax.default_backend()
    if backend != "cpu":
        if step_flops is None:
            return cohort_size
        size = max(-(-cohort_size // WORK_CHUNKS), math.ceil(CHUNK_STEP_FLOPS / step_flops))
        return min(cohort_size, 1 << (size - 1).bit_length())
    if convolutional:
        return 1
    return cohort_size if cohort_size < 2 * CPU_CHUNK else CPU_CHUNK


CLIENTS = "clients"  # the mesh axis the cohort is sharded over


def client_mesh(devices: int | None = None) -> Mesh | None:
    """A one-axis mesh over ``devices`` of ``jax.devices()`` (None: all), or None for one device.

    After ``jax.distributed.initialize`` the devices are every process's, so the
    same mesh spans hosts.
    """
    available = jax.devices()
    count = len(available) if devices is None else devices
    if not 1 <= count <= len(available):
        raise ValueError(
            f"devices must be between 1 and the {len(available)} devices JAX sees, got {devices}"
        )
    return None if count == 1 else Mesh(np.asarray(available[:count]), (CLIENTS,))


@struct.dataclass
class StateTable:
    """Every client's state ``[N, ...]`` as its store holds it, read and written in place.

    Given to ``run_cohort``, each chunk gathers its slots' rows (``rows``, the
    client ids) from ``held`` and writes back the rows of its counted slots, so
    that a round never holds the cohort's states beside the table: memory is
    ``table + chunk x row``, not ``table + 2 x cohort x row``. The rows of one
    cohort must be distinct (a synchronous cohort's are).
    """

    held: ClientState
    rows: jax.Array
    store: ClientStore = struct.field(pytree_node=False)


def effective_chunk(chunk: int, slots: int) -> int:
    """The clients per ``vmap`` a cohort of ``slots`` runs with for a requested ``chunk``.

    Every slot in one chunk when ``chunk >= slots``; otherwise the largest power of
    two not above ``chunk``, so that chunks are whole subtrees of the cohort's
    reduction tree (``run_cohort``) and every chunk size sums to the same bits.
    """
    if chunk < 1 or slots < 1:
        raise ValueError(f"chunk and slots must be >= 1, got {chunk} and {slots}")
    return slots if chunk >= slots else 1 << (chunk.bit_length() - 1)


def run_cohort(
    client_fn: ClientFn,
    client_states: ClientState,
    tasks: ClientTask,
    aggregator: Aggregator,
    *,
    chunk: int,
    mesh: Mesh | None = None,
    drop_nonfinite: bool = False,
    steps: jax.Array | None = None,
    table: StateTable | None = None,
    proportional: bool = True,
) -> tuple[PyTree, ClientState, ClientStats]:
    """Runs every slot of a cohort and sums their contributions.

    **Order and reduction.** With ``steps`` the slots run in their *work order*:
    sorted (stably) by planned steps, most first, with the idle slots last (weight 0
    and no steps: dropped, late, unavailable, padding); without, in cohort order.
    Contributions are added by a fixed pairwise tree over that order (padded with
    zeros to a power of two), so every chunk size that runs clients as a ``vmap``
    gives the same bits, and the tree's levels run in parallel instead of one slot
    after another. Homogeneous cohorts (equal steps) keep cohort order.

    **Work.** A chunk's step loop stops at its most planned steps
    (``ClientTask.step_bound``; none for a chunk of idle slots), so sorted chunks
    do about the work their clients do. The masks keep their meaning: the results
    equal a run of every masked step bit for bit (``proportional=False``,
    ``tests/test_work_proportional.py``). The loop is the same program either way,
    only its trip count differs; no ``cond`` compiles the work apart.

    Args:
      client_fn: one client's round, ``(client_state, task) -> (update, state, stats)``.
      client_states: the cohort's per-slot inputs, leading axis ``[m]`` (with
        ``table``: what ``client_fn`` receives beside its state row, as
        ``(row, input)``; None: the row alone).
      tasks: the cohort's tasks, leading axis ``[m]``.
      aggregator: supplies each client's contribution to the sums.
      chunk: clients per ``vmap`` (``effective_chunk``); chunk 1 runs each client
        without ``vmap``.
      mesh: shard the slots over this mesh's ``CLIENTS`` axis (``shard_map``):
        each device runs ``ceil(m / devices)`` slots in chunks, and the sums are
        a ``psum`` across devices (equal to one device's within float summation
        order). None: one device.
      drop_nonfinite: a slot whose update holds a NaN or an infinity enters the
        sums as a zero update at weight 0 (else it poisons them, and the run's
        divergence check stops the run).
      steps: int32 ``[m]`` each slot's planned local steps (``local.planned_steps``),
        for the work order and the chunks' step bounds; None: cohort order, and each
        client bounds its own steps.
      table: read and write the client states in place, chunk by chunk (one device).
      proportional: bound each chunk's steps (above); False runs every static step
        of every slot, masked past its own count, in the same order, to the same bits.

    Returns:
      The aggregator's sums, the new client states ``[m]`` (with ``table``: the
      table with the counted slots' rows written) and stats ``[m]``, whose
      ``finite`` says which updates were finite; all in cohort order.
    """
    order = None if steps is None else work_order(tasks, steps)
    if order is not None:
        client_states, tasks, steps = _take((client_states, tasks, steps), order)
        table = None if table is None else table.replace(rows=table.rows[order])
    if mesh is None or mesh.size == 1:
        sums, new_states, stats = _run_chunks(
            client_fn, client_states, tasks, aggregator, chunk, drop_nonfinite, steps, table,
            proportional,
        )  # fmt: skip
    else:
        if table is not None:
            raise ValueError("a state table is read in place on one device only; gather instead")
        sums, new_states, stats = _run_sharded(
            client_fn, client_states, tasks, aggregator, chunk, mesh, drop_nonfinite, steps,
            proportional,
        )  # fmt: skip
    if order is not None:
        inverse = jnp.argsort(order)
        stats = _take(stats, inverse)
        if table is None:
            new_states = _take(new_states, inverse)
    return sums, new_states, stats


def _run_sharded(
    client_fn: ClientFn,
    client_states: ClientState,
    tasks: ClientTask,
    aggregator: Aggregator,
    chunk: int,
    mesh: Mesh,
    drop_nonfinite: bool,
    steps: jax.Array | None,
    proportional: bool,
) -> tuple[PyTree, ClientState, ClientStats]:
    """``run_cohort`` over the devices of ``mesh``: the slots dealt over them (``shard_map``),
    each device's in chunks (``_run_chunks``), the sums added across devices (``psum``)."""
    m = tasks.client_id.shape[0]
    per_device = math.ceil(m / mesh.size)
    # Dealt like cards, slot i to device i % devices, so that every device gets an even
    # share of the work order (contiguous blocks would give one device the longest).
    deal = lambda x: _deal(x, per_device, mesh.size)
    states, padded_tasks, padded_steps = jax.tree.map(
        deal, _padded(client_states, tasks, steps, per_device * mesh.size)
    )

    def shard(states, tasks, steps):
        sums, new_states, stats = _run_chunks(
            client_fn, states, tasks, aggregator, chunk, drop_nonfinite, steps, None,
            proportional,
        )  # fmt: skip
        return jax.lax.psum(sums, CLIENTS), new_states, stats

    sharded = P(CLIENTS)
    # check_vma off: user algorithms may hold custom derivatives (SCAFFOLD's
    # gradient_term) whose primal outputs do not carry the device-varying type.
    sums, new_states, stats = jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(sharded, sharded, sharded),
        out_specs=(P(), sharded, sharded),
        check_vma=False,
    )(states, padded_tasks, padded_steps)
    undeal = lambda x: _deal(x, mesh.size, per_device)[:m]
    new_states, stats = jax.tree.map(undeal, (new_states, stats))
    return sums, new_states, stats


def counted_slots(weight: jax.Array, finite: jax.Array, drop_nonfinite: bool) -> jax.Array:
    """The slots whose update counts (their state is kept): weight > 0, and finite unless
    non-finite updates are dropped."""
    return (weight > 0) & ~(~finite & drop_nonfinite)


def work_order(tasks: ClientTask, steps: jax.Array) -> jax.Array:
    """The slots sorted by planned ``steps``, most first, then the idle slots (weight 0 and no
    steps: their outputs are discarded); ties in cohort order."""
    idle = (tasks.weight == 0) & (steps == 0)
    return jnp.argsort(-jnp.where(idle, -1, steps), stable=True)


def _deal(x: jax.Array, rows: int, columns: int) -> jax.Array:
    """``x [rows * columns, ...]`` read as ``[rows, columns]`` and transposed: slot ``i`` of each
    run of ``columns`` goes to block ``i`` (``_deal(_deal(x, r, c), c, r)`` is ``x``)."""
    grid = x.reshape(rows, columns, *x.shape[1:])
    return jnp.swapaxes(grid, 0, 1).reshape(x.shape)


def _take(tree: PyTree, order: jax.Array) -> PyTree:
    return jax.tree.map(lambda x: x[order], tree)


def _padded(
    states: ClientState, tasks: ClientTask, steps: jax.Array | None, size: int
) -> tuple[ClientState, ClientTask, jax.Array | None]:
    """States and tasks padded to ``size`` slots by copies of the first, at weight 0 and no steps."""
    m = tasks.client_id.shape[0]

    def pad(x, fill=None):
        extra = (size - m, *x.shape[1:])
        filler = jnp.broadcast_to(x[:1], extra) if fill is None else jnp.full(extra, fill, x.dtype)
        return jnp.concatenate([x, filler])

    padded_tasks = jax.tree.map(pad, tasks).replace(
        weight=pad(tasks.weight, 0), step_limit=pad(tasks.step_limit, 0)
    )
    return jax.tree.map(pad, states), padded_tasks, None if steps is None else pad(steps, 0)


def _run_chunks(
    client_fn: ClientFn,
    client_states: ClientState,
    tasks: ClientTask,
    aggregator: Aggregator,
    chunk: int,
    drop_nonfinite: bool,
    steps: jax.Array | None,
    table: StateTable | None,
    proportional: bool,
) -> tuple[PyTree, ClientState, ClientStats]:
    """``run_cohort`` on one device, slots in run order: a ``lax.scan`` over chunks, each a
    ``vmap``, whose carry holds the reduction tree's pending subtrees (and the table)."""
    m = tasks.client_id.shape[0]
    chunk = effective_chunk(chunk, m)
    num_chunks = math.ceil(m / chunk)
    padded = num_chunks * chunk
    (states, rows), tasks, steps = _padded(
        (client_states, None if table is None else table.rows), tasks, steps, padded
    )
    chunked = jax.tree.map(
        lambda x: x.reshape(num_chunks, chunk, *x.shape[1:]), (states, tasks, steps, rows)
    )

    def work(states, chunk_tasks, bound):
        updates, new_states, stats = _run_chunk(client_fn, chunk, states, chunk_tasks, bound)
        contributions = _contributions(
            aggregator, drop_nonfinite, updates, chunk_tasks.weight, stats
        )
        return contributions, new_states, stats

    def chunk_inputs(held, states, chunk_rows):
        if table is None:
            return states
        row_states = table.store.gather(held, chunk_rows)
        return row_states if client_states is None else (row_states, states)

    first = jax.tree.map(lambda x: x[0], chunked)
    first_inputs = jax.eval_shape(
        chunk_inputs, None if table is None else table.held, first[0], first[3]
    )
    shapes = jax.eval_shape(work, first_inputs, first[1], None if steps is None else first[2][0])
    levels = num_chunks.bit_length()  # pending subtrees of 2^k chunks, k < levels

    def body(carry, inputs):
        pending, held = carry
        index, states, chunk_tasks, chunk_steps, chunk_rows = inputs
        states = chunk_inputs(held, states, chunk_rows)
        if not proportional:  # every static step, masked where a client has stopped
            bound = NO_STEP_LIMIT
        elif chunk_steps is None:  # each client its own count
            bound = None
        else:  # the chunk's longest client: a chunk of idle slots runs no step at all
            bound = jnp.max(chunk_steps)
        contributions_, new_states, stats = work(states, chunk_tasks, bound)
        # The barrier keeps XLA from contracting the contributions' products into the
        # tree's adds (FMA), which it may do differently for each chunk size.
        total = tree_sum(jax.lax.optimization_barrier(contributions_))
        pending = push(pending, index, total, levels)
        if table is None:
            return (pending, held), (new_states, stats)
        counted = counted_slots(chunk_tasks.weight, stats.finite, drop_nonfinite)
        held = table.store.scatter(held, chunk_rows, new_states, counted)
        return (pending, held), (None, stats)

    pending = jax.tree.map(lambda s: jnp.zeros((levels, *s.shape[1:]), s.dtype), shapes[0])
    held = None if table is None else table.held
    (pending, held), (new_states, stats) = jax.lax.scan(
        body, (pending, held), (jnp.arange(num_chunks), *chunked)
    )
    unchunk = lambda x: x.reshape(padded, *x.shape[2:])[:m]
    new_states = held if table is not None else jax.tree.map(unchunk, new_states)
    return root(pending, num_chunks), new_states, jax.tree.map(unchunk, stats)


def _run_chunk(
    client_fn: ClientFn,
    chunk: int,
    states: ClientState,
    tasks: ClientTask,
    bound: jax.Array | int | None,
) -> tuple[Update, ClientState, ClientStats]:
    """One chunk's clients (a ``vmap``; chunk 1: the client alone), their loops bounded by
    ``bound`` (None: each its own count); ``stats.finite`` says whose update is finite."""
    bound = None if bound is None else jnp.asarray(bound, jnp.int32)
    bounded = lambda s, t: client_fn(s, t if bound is None else t.replace(step_bound=bound))
    if chunk == 1:
        single = jax.tree.map(lambda x: x[0], (states, tasks))
        update, state, stats = jax.tree.map(lambda x: x[None], bounded(*single))
    else:
        update, state, stats = jax.vmap(bounded)(states, tasks)
    return update, state, stats.replace(finite=jax.vmap(_all_finite)(update))


def _contributions(
    aggregator: Aggregator,
    drop_nonfinite: bool,
    updates: Update,
    weights: jax.Array,
    stats: ClientStats,
) -> PyTree:
    """A chunk's contributions to the sums; with ``drop_nonfinite`` a non-finite update
    enters as zeros at weight 0."""
    if drop_nonfinite:
        weights = jnp.where(stats.finite, weights, 0)
        updates = jax.tree.map(lambda u: jnp.where(_per_slot(stats.finite, u), u, 0), updates)
    return jax.vmap(aggregator.contribute)(updates, weights, stats)


def _all_finite(tree: PyTree) -> jax.Array:
    """Whether every value of ``tree`` is finite (one client's update)."""
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _per_slot(flags: jax.Array, x: jax.Array) -> jax.Array:
    """``flags [c]`` broadcast against ``x [c, ...]``."""
    return flags.reshape(flags.shape + (1,) * (x.ndim - 1))
