"""Running a cohort of clients as one program (DESIGN.md §6).

The only place that adds the client axis. Clients run in chunks: a
``lax.scan`` over chunks of ``chunk`` clients, each chunk a ``vmap``, with the
running sums of the aggregator as the scan carry. Memory is ``chunk x params``
and results do not depend on the chunk size beyond float summation order.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

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


def run_cohort(
    client_fn: ClientFn,
    client_states: ClientState,
    tasks: ClientTask,
    aggregator: Aggregator,
    *,
    chunk: int,
) -> tuple[PyTree, ClientState, ClientStats]:
    """Runs every slot of a cohort and sums their contributions.

    Args:
      client_fn: one client's round, ``(client_state, task) -> (update, state, stats)``.
      client_states: the cohort's states, leading axis ``[m]``.
      tasks: the cohort's tasks, leading axis ``[m]``.
      aggregator: supplies each client's contribution to the sums.
      chunk: clients per ``vmap``; the cohort is padded with weight-0,
        zero-step slots up to a multiple of it.

    Returns:
      The aggregator's sums, the new client states ``[m]`` and stats ``[m]``.
    """
    m = tasks.client_id.shape[0]
    chunk = max(1, min(chunk, m))
    num_chunks = math.ceil(m / chunk)
    padded = num_chunks * chunk

    def pad(x, fill=None):
        extra = (padded - m, *x.shape[1:])
        filler = jnp.broadcast_to(x[:1], extra) if fill is None else jnp.full(extra, fill, x.dtype)
        return jnp.concatenate([x, filler]).reshape(num_chunks, chunk, *x.shape[1:])

    chunked_tasks = jax.tree.map(pad, tasks).replace(
        weight=pad(tasks.weight, 0), step_limit=pad(tasks.step_limit, 0)
    )
    chunked_states = jax.tree.map(pad, client_states)

    def run_chunk(states, chunk_tasks):
        if chunk == 1:
            single = jax.tree.map(lambda x: x[0], (states, chunk_tasks))
            return jax.tree.map(lambda x: x[None], client_fn(*single))
        return jax.vmap(client_fn)(states, chunk_tasks)

    def chunk_sums(updates, weights, stats):
        contributions = jax.vmap(aggregator.contribute)(updates, weights, stats)
        return jax.tree.map(lambda c: jnp.sum(c, axis=0), contributions)

    def body(sums, inputs):
        updates, new_states, stats = run_chunk(*inputs)
        sums = jax.tree.map(jnp.add, sums, chunk_sums(updates, inputs[1].weight, stats))
        return sums, (new_states, stats)

    first = jax.tree.map(lambda x: x[0], (chunked_states, chunked_tasks))
    sums_shape = jax.eval_shape(
        lambda states, tasks: chunk_sums(run_chunk(states, tasks)[0], tasks.weight,
                                         run_chunk(states, tasks)[2]),
        *first,
    )
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)
    sums, (new_states, stats) = jax.lax.scan(body, zeros, (chunked_states, chunked_tasks))
    unchunk = lambda x: x.reshape(padded, *x.shape[2:])[:m]
    return sums, jax.tree.map(unchunk, new_states), jax.tree.map(unchunk, stats)
