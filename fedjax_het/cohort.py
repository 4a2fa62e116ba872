"""Running a cohort of clients as one program (DESIGN.md §6).

The only place that adds the client axis. Clients run in chunks: a
``lax.scan`` over chunks of ``chunk`` clients, each chunk a ``vmap``, with the
running sums of the aggregator as the scan carry, added slot by slot in cohort
order. Memory is ``chunk x params``, and the sums are the same bits for every
chunk size: vmapped chunks of any size give bitwise the same run; chunk 1 runs
each client without ``vmap``, which XLA compiles to other kernels, so it
matches them to float rounding of the client's own arithmetic
(``tests/test_engine_invariance.py``).

With a ``mesh`` the cohort is first split over devices (``shard_map``): each
device runs its share of the slots in chunks and the devices' sums are added
with a ``psum``. Results do not depend on the number of devices beyond float
summation order either (``tests/test_multidevice.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fedjax_het.algorithm import Aggregator, ClientStats
from fedjax_het.local import ClientTask
from fedjax_het.typing import ClientState, PyTree, Update

ClientFn = Callable[[ClientState, ClientTask], tuple[Update, ClientState, ClientStats]]


def auto_chunk(cohort_size: int, *, backend: str | None = None) -> int:
    """The chunk size used when none is given.

    On CPU one client at a time (chunk 1) wins: XLA:CPU gains nothing from
    batching small matmuls and loses on batched convolutions (see
    ``experiments/README.md``). On accelerators the whole cohort runs as one
    ``vmap`` up to 128 clients per chunk, past which a CNN cohort's
    activations stop fitting fast memory (DESIGN.md §6 measured a 6x per-client
    slowdown for 1000 CNN clients in one ``vmap``).
    """
    backend = backend or jax.default_backend()
    if backend == "cpu":
        return 1
    return min(cohort_size, 128)


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


def run_cohort(
    client_fn: ClientFn,
    client_states: ClientState,
    tasks: ClientTask,
    aggregator: Aggregator,
    *,
    chunk: int,
    mesh: Mesh | None = None,
    drop_nonfinite: bool = False,
) -> tuple[PyTree, ClientState, ClientStats]:
    """Runs every slot of a cohort and sums their contributions.

    Args:
      client_fn: one client's round, ``(client_state, task) -> (update, state, stats)``.
      client_states: the cohort's states, leading axis ``[m]``.
      tasks: the cohort's tasks, leading axis ``[m]``.
      aggregator: supplies each client's contribution to the sums.
      chunk: clients per ``vmap``; the cohort is padded with weight-0,
        zero-step slots up to a multiple of it.
      mesh: shard the slots over this mesh's ``CLIENTS`` axis (``shard_map``):
        each device runs ``ceil(m / devices)`` slots in chunks, and the sums are
        a ``psum`` across devices. None: one device.
      drop_nonfinite: a slot whose update holds a NaN or an infinity enters the
        sums as a zero update at weight 0 (else it poisons them, and the run's
        divergence check stops the run).

    Returns:
      The aggregator's sums, the new client states ``[m]`` and stats ``[m]``, whose
      ``finite`` says which updates were finite.
    """
    if mesh is None or mesh.size == 1:
        return _run_chunks(client_fn, client_states, tasks, aggregator, chunk, drop_nonfinite)
    m = tasks.client_id.shape[0]
    per_device = math.ceil(m / mesh.size)
    states, tasks = _padded(client_states, tasks, per_device * mesh.size)

    def shard(states, tasks):
        sums, new_states, stats = _run_chunks(
            client_fn, states, tasks, aggregator, chunk, drop_nonfinite
        )
        return jax.lax.psum(sums, CLIENTS), new_states, stats

    sharded = P(CLIENTS)
    # check_vma off: user algorithms may hold custom derivatives (SCAFFOLD's
    # gradient_term) whose primal outputs do not carry the device-varying type.
    sums, new_states, stats = jax.shard_map(
        shard, mesh=mesh, in_specs=(sharded, sharded), out_specs=(P(), sharded, sharded),
        check_vma=False,
    )(states, tasks)
    return sums, *jax.tree.map(lambda x: x[:m], (new_states, stats))


def _padded(states: ClientState, tasks: ClientTask, size: int) -> tuple[ClientState, ClientTask]:
    """States and tasks padded to ``size`` slots by copies of the first, at weight 0 and no steps."""
    m = tasks.client_id.shape[0]

    def pad(x, fill=None):
        extra = (size - m, *x.shape[1:])
        filler = jnp.broadcast_to(x[:1], extra) if fill is None else jnp.full(extra, fill, x.dtype)
        return jnp.concatenate([x, filler])

    padded_tasks = jax.tree.map(pad, tasks).replace(
        weight=pad(tasks.weight, 0), step_limit=pad(tasks.step_limit, 0)
    )
    return jax.tree.map(pad, states), padded_tasks


def _run_chunks(
    client_fn: ClientFn, client_states: ClientState, tasks: ClientTask, aggregator: Aggregator,
    chunk: int, drop_nonfinite: bool,
) -> tuple[PyTree, ClientState, ClientStats]:
    """``run_cohort`` on one device: a ``lax.scan`` over chunks, each a ``vmap``."""
    m = tasks.client_id.shape[0]
    chunk = max(1, min(chunk, m))
    num_chunks = math.ceil(m / chunk)
    padded = num_chunks * chunk
    states, tasks = _padded(client_states, tasks, padded)
    chunked_states, chunked_tasks = jax.tree.map(
        lambda x: x.reshape(num_chunks, chunk, *x.shape[1:]), (states, tasks)
    )

    def run_chunk(states, chunk_tasks):
        if chunk == 1:
            single = jax.tree.map(lambda x: x[0], (states, chunk_tasks))
            update, state, stats = jax.tree.map(lambda x: x[None], client_fn(*single))
        else:
            update, state, stats = jax.vmap(client_fn)(states, chunk_tasks)
        return update, state, stats.replace(finite=jax.vmap(_all_finite)(update))

    def contributions(updates, weights, stats):
        if drop_nonfinite:
            weights = jnp.where(stats.finite, weights, 0)
            updates = jax.tree.map(
                lambda u: jnp.where(_per_slot(stats.finite, u), u, 0), updates
            )
        return jax.vmap(aggregator.contribute)(updates, weights, stats)

    def chunk_contributions(states, chunk_tasks):
        updates, new_states, stats = run_chunk(states, chunk_tasks)
        return contributions(updates, chunk_tasks.weight, stats), (new_states, stats)

    def body(sums, inputs):
        chunk_sums, outputs = chunk_contributions(*inputs)
        return _add_in_slot_order(sums, chunk_sums), outputs

    first = jax.tree.map(lambda x: x[0], (chunked_states, chunked_tasks))
    per_slot = jax.eval_shape(chunk_contributions, *first)[0]
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape[1:], s.dtype), per_slot)
    sums, (new_states, stats) = jax.lax.scan(body, zeros, (chunked_states, chunked_tasks))
    unchunk = lambda x: x.reshape(padded, *x.shape[2:])[:m]
    return sums, jax.tree.map(unchunk, new_states), jax.tree.map(unchunk, stats)


def _add_in_slot_order(sums: PyTree, contributions: PyTree) -> PyTree:
    """``sums`` plus each slot's contribution ``[chunk, ...]``, one slot after another.

    Float addition is not associative, so a per-chunk ``jnp.sum`` followed by
    adding chunk totals gives bits that depend on the chunk size. Adding slot
    by slot gives ``(((0 + c_0) + c_1) + ...)`` whatever the chunking.
    """
    add = lambda total, contribution: (jax.tree.map(jnp.add, total, contribution), None)
    return jax.lax.scan(add, sums, contributions)[0]


def _all_finite(tree: PyTree) -> jax.Array:
    """Whether every value of ``tree`` is finite (one client's update)."""
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _per_slot(flags: jax.Array, x: jax.Array) -> jax.Array:
    """``flags [c]`` broadcast against ``x [c, ...]``."""
    return flags.reshape(flags.shape + (1,) * (x.ndim - 1))
