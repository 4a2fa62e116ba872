"""The shapes of one client's round, computed abstractly (``jax.eval_shape``, nothing runs):
what the config checks read (``transforms.schema``) and what the simulated network carries
(``training.costs.payload_bytes``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_het.engine.algorithm import Batches, ClientStats, FederatedAlgorithm, LocalContext
from fedjax_het.models import Model


class OneClient(NamedTuple):
    """Abstract shapes (``jax.ShapeDtypeStruct`` pytrees) of one client's round."""

    broadcast: Any  # what the client downloads
    start: Any  # the params it trains from
    update: Any  # what it uploads
    aggregate: Any  # the server's aggregate of that one update


def one_client(algorithm: FederatedAlgorithm, model: Model, x: Any, y: Any) -> OneClient:
    """The shapes of one client's round on inputs shaped like ``x[:1]``, ``y[:1]`` (one batch
    of one example), from the algorithm's own functions."""
    key = jax.random.key(0)
    one = lambda a: jax.ShapeDtypeStruct((1, 1, *a.shape[1:]), a.dtype)

    def round_of_one(x: jax.Array, y: jax.Array) -> OneClient:
        params = model.init(key)
        hyper = algorithm.hyper()
        broadcast = algorithm.broadcast(algorithm.server_init(params, hyper, 1))
        batches = Batches(x, y, jnp.ones(x.shape[:2], bool))
        start, state = algorithm.local.start(
            model, broadcast, algorithm.client_init(params), batches, hyper, key
        )
        steps = jnp.ones((), jnp.int32)
        ctx = LocalContext(broadcast, start, state, steps, steps, key, client_id=steps - 1)
        update, _ = algorithm.local.finalize(start, ctx, hyper)
        stats = ClientStats(jnp.zeros(()), jnp.ones(()), steps)
        sums = algorithm.aggregator.contribute(update, jnp.ones(()), stats)
        return OneClient(broadcast, start, update, algorithm.aggregator.finalize(sums))

    return jax.eval_shape(round_of_one, one(x), one(y))
