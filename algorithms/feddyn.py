"""FedDyn: dynamic regularisation, so that local optima line up with the global one.

Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning
Based on Dynamic Regularization" (ICLR 2021), Algorithm 1. Client ``k`` keeps
``g_k = ∇L_k(θ_k^{t-1})`` (zeros at first). From the global model ``θ^{t-1}``
it takes its local SGD steps on

    L_k(θ) - <g_k, θ> + α/2 ||θ - θ^{t-1}||^2

to ``θ_k``, then sets ``g_k <- g_k - α (θ_k - θ^{t-1})``. Over the clients ``P``
that count (weight ``w_k > 0``) the server updates

    h   <- h - α (1/N) Σ_{k∈P} (θ_k - θ^{t-1}),
    θ^t  = θ^{t-1} - η_g (Σ_k w_k (θ^{t-1} - θ_k) / Σ_k w_k + h / α),

``N`` the population (``server_init``'s ``num_clients``). With uniform weights
and ``η_g = 1`` this is the paper's ``θ^t = (1/|P|) Σ_k θ_k - h / α``; the
step is FedAvg's server SGD on that pseudo-gradient. ``α`` is the traced
hyperparameter ``feddyn_alpha`` (in ``(0, inf)``); its default 0.01 is
FLHetBench's (``flhetbench-notes.md`` §5.4).

>>> algorithm = feddyn(alpha=0.5)
>>> sorted(algorithm.hyper())
['client_lr', 'feddyn_alpha', 'server_lr']
>>> float(algorithm.hyper()["feddyn_alpha"])
0.5

.. warning:: The mean of ``θ_k`` is the engine's weighted mean: example-weighted
   by default (``Round(weighting="examples")``); ``weighting="uniform"`` gives
   the paper's ``1 / |P|``. ``h`` moves by the unweighted ``1 / N`` sum, as in the paper.
.. warning:: ``server_lr`` (``η_g``, default 1) is not in the paper; 1 is the paper.
.. warning:: When no client counts (``P`` empty: the paper divides by 0) the
   server state does not change. A client that counts but took no step
   has ``θ_k = θ^{t-1}``: ``g_k`` is unchanged and it enters the mean.
.. warning:: FLHetBench's own FedDyn (notes §5.4) keeps a correction per
   client and averages ``θ_i + h_i``; this is the paper's server ``h``. The
   reported training loss is ``L_k`` alone, without the two added terms.
.. warning:: Client states hold a whole model per client (``[num_clients, ...params]``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState as ModelState
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.loss_terms import gradient_term
from fedjax_het.engine.algorithm import (
    Aggregator,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    model_loss,
    weighted_mean,
)
from fedjax_het.engine.hyper import POSITIVE
from fedjax_het.models import Model
from fedjax_het.typing import Batch, ClientState, Hyper, Params, PRNGKey, PyTree, Update


@struct.dataclass
class ServerState:
    """FedAvg's model and server-optimizer state, the correction ``h`` and ``N``."""

    params: Params
    opt_state: PyTree
    h: Params
    num_clients: jax.Array  # float32 population size N


def dynamic_loss(
    model: Model, params: Params, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """``L_k(θ) - <g_k, θ> + α/2 ||θ - θ^{t-1}||^2`` whose value is ``L_k(θ)`` alone.

    The two added terms enter as their gradient ``α (θ - θ^{t-1}) - g_k``
    (``gradient_term``), so their value is never computed.
    """
    alpha = hyper["feddyn_alpha"]
    direction = jax.tree.map(
        lambda p, g, s: alpha.astype(p.dtype) * (p - s) - g, params, ctx.client_state, ctx.start
    )
    return model_loss(model, params, batch, ctx, hyper, key) + gradient_term(params, direction)


def update_gradient(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[Update, ClientState]:
    """Sends ``θ^{t-1} - θ_k`` and keeps ``g_k - α (θ_k - θ^{t-1})``."""
    delta = jax.tree.map(lambda s, p: s - p, ctx.start, params)
    alpha = hyper["feddyn_alpha"]
    return delta, jax.tree.map(lambda g, d: g + alpha.astype(d.dtype) * d, ctx.client_state, delta)


def dyn_mean(base: Aggregator) -> Aggregator:
    """``base`` over the updates, their plain sum and the count, over clients that count."""

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        counts = weight > 0
        kept = jax.tree.map(lambda d: jnp.where(counts, d, 0), update)
        return base.contribute(update, weight, stats), kept, counts.astype(jnp.float32)

    def finalize(sums: PyTree) -> tuple[Update, Update, jax.Array]:
        base_sums, total, count = sums
        return base.finalize(base_sums), total, count

    return Aggregator(contribute, finalize)


def feddyn(
    *, alpha: float = 0.01, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """FedDyn with regularisation ``alpha`` (traced as ``feddyn_alpha``) over FedAvg's local SGD.

    Args:
      alpha: α, the weight of the dynamic regulariser (traced as ``feddyn_alpha``).
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    Hyperparameters:
      feddyn_alpha: α, the weight of the dynamic regulariser α/2 ||θ - θ^{t-1}||^2 in each
        client's objective, > 0.

    References:
      Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on
      Dynamic Regularization" (ICLR 2021), Algorithm 1.
    """
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=dynamic_loss,
        aggregator=dyn_mean(weighted_mean()),
        extra_hyper=(("feddyn_alpha", float(alpha)),),
        hyper_ranges=(("feddyn_alpha", POSITIVE),),
        client_init=lambda params: jax.tree.map(jnp.zeros_like, params),
        client_finalize=update_gradient,
        name="feddyn",
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        inner = base.server_init(params, hyper, num_clients)
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ServerState(inner.params, inner.opt_state, zeros, jnp.float32(num_clients))

    def server_update(
        state: ServerState, aggregate: tuple[Update, Update, jax.Array], hyper: Hyper,
        key: PRNGKey | None = None,
    ) -> ServerState:
        mean_delta, delta_sum, count = aggregate
        alpha = hyper["feddyn_alpha"]
        scale = alpha / state.num_clients
        h = jax.tree.map(lambda h, s: h + scale.astype(s.dtype) * s, state.h, delta_sum)
        pseudo_gradient = jax.tree.map(lambda d, h: d + h / alpha.astype(h.dtype), mean_delta, h)
        inner = base.server_update(
            ModelState(state.params, state.opt_state), pseudo_gradient, hyper, key
        )
        new = ServerState(inner.params, inner.opt_state, h, state.num_clients)
        return jax.tree.map(lambda n, o: jnp.where(count > 0, n, o), new, state)

    return dataclasses.replace(base, server_init=server_init, server_update=server_update)
