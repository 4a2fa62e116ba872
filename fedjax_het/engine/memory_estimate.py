"""The memory terms of one round, from XLA's compiled analysis or from shapes (docs/design.md §8).

``memory.plan_chunk`` plans with these terms (its docstring gives the sum):

* "xla": ``chunk_program_bytes`` compiles (never runs) ``vmap(local_update)``
  over ``c`` clients on abstract inputs and reads ``Compiled.memory_analysis()``
  (arguments + outputs + temporaries - aliased); the slope and intercept come
  from ``c`` = 2 and 4 (not 1 and 2: ``run_cohort`` runs chunk 1 without
  ``vmap``, and the FEMNIST CNN's size-1 program lies off the line), and the plan
  then compiles the chosen chunk's own program to check it.
* "analytic": sums of shapes from ``jax.eval_shape`` (one client's inputs and
  outputs, one step's batch, two params-sized buffers, the optimizer state and
  the residuals of one batch's backward pass); ``tests/test_memory.py`` holds it
  at 1-2x XLA's figure.
* ``NO_ANALYSIS``: "xla" asked on a backend whose compiled programs give no
  memory analysis: the analytic sums, doubled (the analytic figure stayed
  within 2x of XLA's on every model measured).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fedjax_het.engine.client_store import tree_bytes
from fedjax_het.engine.local import ClientTask, LocalSpec, local_update

NO_ANALYSIS = "analytic x2, no XLA memory analysis on this backend"


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes: one more client in a chunk, per run for any chunk, per cohort slot; and the
    source they came from."""

    per_client: int
    fixed: int
    slot: int
    source: str


@functools.lru_cache(maxsize=32)
def estimate(
    spec: LocalSpec, num_clients: int, source: str, in_place: bool, treedef, leaves
) -> Estimate:
    """The memory terms of one round, cached by its static description and input shapes
    (``leaves`` of ``treedef``: the abstract ``(hyper, train)``)."""
    hyper, train = jax.tree.unflatten(treedef, leaves)
    algorithm = spec.algorithm
    params, server, broadcast, state = _shapes(spec, hyper, num_clients)
    client_fn = functools.partial(local_update, spec)
    outputs = jax.eval_shape(client_fn, hyper, broadcast, state, tasks(), train)
    # A slot's task and stats; its state read and written beside the table too, unless
    # the table is read and written in place (then the rows are the chunk's, below).
    slot = tree_bytes((tasks(), outputs[2] if in_place else (state, outputs[1:])))
    if source == "xla":
        at = {c: chunk_program_bytes(spec, num_clients, treedef, leaves, c) for c in (2, 4)}
        if None not in at.values():
            per_client = (at[4] - at[2]) // 2
            fixed = at[2] - 2 * per_client - tree_bytes(train) + tree_bytes(server)
            return Estimate(per_client, max(fixed, 0), slot, "xla")
    x, y = (
        jax.ShapeDtypeStruct((spec.work.batch_size, *a.shape[1:]), a.dtype)
        for a in (train.x, train.y)
    )
    batches = tree_bytes((x, y))  # one step's batch, gathered inside the step loop
    optimizer_state = jax.eval_shape(
        lambda h, p: algorithm.local.optimizer(h).init(p), hyper, params
    )
    per_client = (
        tree_bytes((state, tasks(), outputs))
        + batches
        + 2 * tree_bytes(params)
        + tree_bytes(optimizer_state)
        + tree_bytes(_residuals(spec, params, x, y))
    )
    fixed = tree_bytes((hyper, broadcast, server))
    if source == "xla":  # asked for, but the backend has no analysis: be conservative
        return Estimate(2 * per_client, 2 * fixed, slot, NO_ANALYSIS)
    return Estimate(per_client, fixed, slot, "analytic")


@functools.lru_cache(maxsize=64)
def chunk_program_bytes(spec: LocalSpec, num_clients: int, treedef, leaves, c: int) -> int | None:
    """XLA's memory for ``vmap(local_update)`` over ``c`` clients (arguments + outputs +
    temporaries - aliased; the training split is an argument), compiled on abstract inputs
    and never run; None on a backend without the analysis. Cached: each size compiles once."""
    hyper, train = jax.tree.unflatten(treedef, leaves)
    _, _, broadcast, state = _shapes(spec, hyper, num_clients)

    def chunk_program(hyper, broadcast, train, states, tasks):
        return jax.vmap(functools.partial(local_update, spec, hyper, broadcast, data=train))(
            states, tasks
        )

    states = jax.tree.map(lambda s: jax.ShapeDtypeStruct((c, *s.shape), s.dtype), state)
    compiled = jax.jit(chunk_program).lower(hyper, broadcast, train, states, tasks(c)).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )


def server_bytes(spec: LocalSpec, hyper, num_clients: int) -> int:
    """The server state's bytes (held beside a chunk program, not one of its arguments)."""
    return tree_bytes(_shapes(spec, hyper, num_clients)[1])


def tasks(*shape: int) -> ClientTask:
    """The shapes of tasks ``[*shape]`` as ``Round.cohort`` builds them (no shape: one client)."""
    s = lambda d: jax.ShapeDtypeStruct(shape, d)
    return ClientTask(s(jnp.int32), s(jnp.float32), s(jnp.int32), s(jax.random.key(0).dtype))


def _shapes(spec: LocalSpec, hyper, num_clients: int):
    """Abstract params, server state, broadcast and one client's state."""
    algorithm = spec.algorithm
    params = jax.eval_shape(spec.model.init, jax.random.key(0))
    server = jax.eval_shape(lambda p, h: algorithm.server_init(p, h, num_clients), params, hyper)
    broadcast = jax.eval_shape(algorithm.broadcast, server)
    return params, server, broadcast, jax.eval_shape(algorithm.client_init, params)


def _residuals(spec: LocalSpec, params, x, y):
    """The arrays the backward pass of the model's loss on one batch keeps (their shapes)."""
    model = spec.model

    def loss(p, x, y):
        outputs = model.apply(p, x, train=True, key=jax.random.key(0))
        return model.loss(outputs, y, jnp.ones(y.shape[:1], bool))

    return jax.eval_shape(lambda p, x, y: jax.vjp(lambda q: loss(q, x, y), p)[1], params, x, y)
