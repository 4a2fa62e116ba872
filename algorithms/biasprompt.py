"""BiasPrompt+'s server: momentum on the fresh updates, stale updates added after gradient surgery.

Zhang, Zeng, Zhang, Wang, Wang, Zhou, Liang and Qu, "FLHetBench: Benchmarking
Device and State Heterogeneity in Federated Learning" (CVPR 2024), §5,
BiasPrompt+ (a) "staleness-aware aggregation via gradient surgery", in the
form of the authors' code (notes: flhetbench-notes §5.1 (a'), §4.4). A
client that missed the deadline of round ``r`` still trains from the model of
round ``r`` and arrives in a later round ``r'`` with staleness
``tau = r' - r`` in ``1..max_staleness`` (the engine sets
``ClientStats.staleness``; 0 is fresh). With ``u_k = x_start - x_k`` each
slot's pseudo-gradient, weights ``w_k`` and momentum ``beta``:

    g = sum_fresh w_k u_k / sum_fresh w_k                   (0 when nobody fresh counts)
    v <- beta v + g                                         (server momentum, fresh part only)
    "sum":   s = sum_stale w_j u_j / sqrt(1 + tau_j) / sum_stale w_j
    "seq":   R = 0; for tau = max_staleness .. 1:
                 A_tau = sum_{stale, tau_j = tau} w_j u_j;  R <- pc(R, A_tau) + A_tau
             s = R / sum_stale w_j
    "naive": s as in "sum", never projected
    "sum", "seq": s <- pc(s, v)                             (against the post-momentum update)
    x <- x - server_lr (v + s)                              (s = 0 when nobody stale counts)

where ``pc(a, b) = a - min(<a, b>, 0) / ||b||^2 b`` is PCGrad's projection
(Yu et al. 2020) of ``a`` onto the normal plane of ``b``, applied only when
they conflict; ``b = 0`` projects nothing. Dot products run over the flat
vector of all parameters, not layer by layer. Clients run plain SGD. The
notes write deltas ``x_local - x_start = -u``: the conflict test is the
same for both signs, and ``x - (v + s)`` here is their ``x + v + s``.

Only the server side is here, for any model. The paper's BiasPrompt model
(ViT-B/16 with deep prompts, trained biases and head) is not: a train mask
that keeps only the biases gives its "stable weights" part.

.. warning:: Deliberate deviations and choices:

   - The means use the engine's weights (examples by default); the authors'
     code takes plain means, which ``weighting = "uniform"`` reproduces.
   - The paper's formula divides by ``||g||`` and projects unconditionally;
     this follows the code (``||v||^2``, only when ``<s, v> < 0``), and the
     ``1 / sqrt(1 + tau)`` weight of "sum" and "naive" is the code's too.
   - A slot staler than ``max_staleness`` counts nowhere (the code drops it).
   - Without staleness (a synchronous round) every slot is fresh: FedAvgM.

>>> algorithm = biasprompt_plus(aggregation="seq", max_staleness=3)
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr', 'server_momentum']
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import Aggregator, ClientStats, FederatedAlgorithm
from fedjax_het.engine.hyper import DECAY
from fedjax_het.typing import Hyper, Params, PRNGKey, PyTree, Update

AGGREGATIONS = ("sum", "seq", "naive")


@struct.dataclass
class ServerState:
    """The global model and the momentum ``v`` of the fresh updates (pseudo-gradient sign)."""

    params: Params
    momentum: Params


@struct.dataclass
class StaleAggregate:
    """What the aggregator hands the server: the fresh mean ``g`` and the stale part ``s``
    before its projection against ``v`` (zeros where nobody counts)."""

    fresh: Update
    stale: Update


def tree_dot(a: PyTree, b: PyTree) -> jax.Array:
    """``<a, b>`` over the flat vector of every leaf."""
    return sum(jnp.sum(x * y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def project_conflicting(a: PyTree, b: PyTree) -> PyTree:
    """PCGrad: ``a - <a, b> / ||b||^2 b`` when ``<a, b> < 0``, else ``a`` (also when ``b = 0``)."""
    dot = tree_dot(a, b)
    norm = tree_dot(b, b)
    scale = jnp.where(dot < 0, dot / jnp.where(norm > 0, norm, 1), 0)
    return jax.tree.map(lambda x, y: x - scale.astype(x.dtype) * y, a, b)


def staleness_aggregator(aggregation: str, max_staleness: int) -> Aggregator:
    """The sums behind ``g`` and ``s`` (module docstring), over slots of weight > 0.

    Sums: the weighted fresh sum and weight; the stale part, which is the
    ``1 / sqrt(1 + tau)``-weighted sum ("sum", "naive") or one weighted sum per
    staleness ``[max_staleness, ...]`` ("seq"); the stale weight.
    """

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        tau = jnp.int32(0) if stats.staleness is None else stats.staleness
        fresh = (weight > 0) & (tau == 0)
        stale = (weight > 0) & (tau >= 1) & (tau <= max_staleness)
        fresh_sum = jax.tree.map(lambda u: jnp.where(fresh, weight.astype(u.dtype) * u, 0), update)
        if aggregation == "seq":
            bucket = jnp.arange(1, max_staleness + 1) == tau  # [max_staleness]

            def stale_part(u):
                into = (bucket & stale).reshape(bucket.shape + (1,) * u.ndim)
                return jnp.where(into, weight.astype(u.dtype) * u[None], 0)

        else:

            def stale_part(u):
                factor = weight.astype(u.dtype) / jnp.sqrt(1 + tau.astype(u.dtype))
                return jnp.where(stale, factor * u, 0)

        stale_sum = jax.tree.map(stale_part, update)
        return fresh_sum, jnp.where(fresh, weight, 0), stale_sum, jnp.where(stale, weight, 0)

    def mean(total: PyTree, weight: jax.Array) -> PyTree:
        safe = jnp.where(weight > 0, weight, 1)
        return jax.tree.map(lambda t: t / safe.astype(t.dtype), total)

    def finalize(sums: PyTree) -> StaleAggregate:
        fresh_sum, fresh_weight, stale_sum, stale_weight = sums
        if aggregation == "seq":
            running = jax.tree.map(lambda a: jnp.zeros(a.shape[1:], a.dtype), stale_sum)
            for index in reversed(range(max_staleness)):  # the stalest bucket first
                bucket = jax.tree.map(lambda a, i=index: a[i], stale_sum)
                running = jax.tree.map(jnp.add, project_conflicting(running, bucket), bucket)
            stale_sum = running
        return StaleAggregate(mean(fresh_sum, fresh_weight), mean(stale_sum, stale_weight))

    return Aggregator(contribute, finalize)


def biasprompt_plus(
    *,
    aggregation: str = "sum",
    max_staleness: int = 5,
    momentum: float = 0.9,
    client_lr: float = 0.05,
    server_lr: float = 1.0,
) -> FederatedAlgorithm:
    """BiasPrompt+'s server with local SGD (FLHetBench, CVPR 2024, §5 (a); notes §5.1 (a')).

    Args:
      aggregation: how stale updates join: "sum" (one staleness-weighted mean,
        projected against ``v``; the authors' config), "seq" (per-staleness
        sums merged stalest first with PCGrad, then projected; their
        command-line default) or "naive" (the staleness-weighted mean, unprojected).
      max_staleness: the stalest update that counts (the paper: 5); static.
      momentum: ``beta`` (traced ``server_momentum``), in [0, 1); the paper: 0.9.
      client_lr, server_lr: local SGD's rate and the server's (1: ``x - (v + s)``).

    Returns:
      The algorithm; its aggregate is a ``StaleAggregate``.

    References:
      Zhang, Zeng, Zhang, Wang, Wang, Zhou, Liang and Qu, "FLHetBench: Benchmarking Device and
      State Heterogeneity in Federated Learning" (CVPR 2024), §5, BiasPrompt+ (a).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(
            f"biasprompt_plus: aggregation must be one of {AGGREGATIONS}, got {aggregation!r}"
        )
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 1:
        raise ValueError(
            f"biasprompt_plus: max_staleness must be an int >= 1, got {max_staleness!r}"
        )
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=staleness_aggregator(aggregation, max_staleness),
        extra_hyper=(("server_momentum", float(momentum)),),
        hyper_ranges=(("server_momentum", DECAY),),
        name="biasprompt_plus",
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        del hyper, num_clients
        return ServerState(params, jax.tree.map(jnp.zeros_like, params))

    def server_update(
        state: ServerState, aggregate: StaleAggregate, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        del key
        velocity = jax.tree.map(
            lambda v, g: hyper["server_momentum"].astype(v.dtype) * v + g,
            state.momentum,
            aggregate.fresh,
        )
        stale = aggregate.stale
        if aggregation != "naive":
            stale = project_conflicting(stale, velocity)
        params = jax.tree.map(
            lambda p, v, s: p - hyper["server_lr"].astype(p.dtype) * (v + s),
            state.params,
            velocity,
            stale,
        )
        return ServerState(params, velocity)

    return dataclasses.replace(
        base,
        server_init=server_init,
        server_update=server_update,
        global_params=lambda state: state.params,
    )
