"""q-FFL by q-FedAvg: fairer accuracy across clients by re-weighting towards clients of high loss.

Li, Sanjabi, Beirami and Smith, "Fair Resource Allocation in Federated
Learning" (ICLR 2020), Algorithm 3 (q-FedAvg), which minimises the q-FFL
objective ``Σ_k p_k F_k^{q+1}(w) / (q + 1)`` (Eq. 2). With ``L = 1 / η``
(``η`` the client learning rate), client ``k`` measures ``F_k(w_t)``,
runs local SGD from ``w_t`` to ``w_k`` and reports

    Δw_k = L (w_t - w_k),
    Δ_k  = F_k^q(w_t) Δw_k,
    h_k  = q F_k^{q-1}(w_t) ||Δw_k||^2 + L F_k^q(w_t);

the server steps along ``Σ_k Δ_k / Σ_k h_k`` over the clients that count
(weight > 0; the weights do not enter otherwise):

    w_{t+1} = w_t - η_s Σ_k Δ_k / Σ_k h_k,   η_s = server_lr (1 in the paper).

``q`` is the traced hyperparameter ``qffl_q``; ``q = 0`` is FedAvg with uniform
client weights (``Δ_k = Δw_k``, ``h_k = L``). The term ``q F^{q-1} ||Δw||^2``
is exactly 0 when ``q = 0`` or when the client did not move (no ``0 · inf``).

>>> algorithm = qffl(q=2.0)
>>> float(algorithm.hyper()["qffl_q"])
2.0

.. warning:: ``F_k(w_t)`` is the mean loss of the global model over the
   examples the client trains on this round (``client_start``'s ``Batches``:
   repeats in a second epoch count twice; a client cut short by a deadline
   measures on the examples it trains), in evaluation mode; the paper's code
   evaluates it on the client's whole training set. It travels from
   ``client_start`` to ``client_finalize`` as the client state, so each
   client's stored state is the ``F_k(w_t)`` of the last round it counted in
   (read by nothing; 0 before).
.. warning:: ``L = 1 / client_lr`` assumes plain local SGD, the paper's
   setting (the factory offers no other client optimizer).
.. warning:: A client that counts but trained on no examples reports
   ``F = 0``: ``Δ_k = 0`` and ``h_k = L · 0^q`` (``L`` at ``q = 0``, as in
   uniform FedAvg; 0 for ``q > 0``). When no client counts (``Σ h = 0``) the
   model does not move.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import (
    Aggregator,
    Batches,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    float_dtype,
    mean_loss,
)
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.models import Model
from fedjax_het.typing import ClientState, Hyper, Params, PRNGKey, PyTree, Update


@struct.dataclass
class FairUpdate:
    """What a q-FedAvg client sends: ``Δ_k = F_k^q Δw_k`` and the scalar ``h_k``."""

    delta: Update
    h: jax.Array


def measure_loss(
    model: Model,
    broadcast: Params,
    client_state: ClientState,
    batches: Batches,
    hyper: Hyper,
    key: PRNGKey,
) -> tuple[Params, ClientState]:
    """Starts from ``w_t``; the client state becomes ``F_k(w_t)`` on the round's examples."""
    del client_state, hyper, key
    return broadcast, mean_loss(model, broadcast, batches)


def fair_update(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[FairUpdate, ClientState]:
    """``(Δ_k, h_k)`` of Algorithm 3 from the trained params; the state keeps ``F_k(w_t)``."""
    loss, q = ctx.client_state, hyper["qffl_q"]
    lipschitz = 1 / hyper["client_lr"].astype(float_dtype(params))
    moved = jax.tree.map(lambda s, p: lipschitz * (s - p), ctx.start, params)
    norm = sum(jnp.sum(jnp.square(d)) for d in jax.tree.leaves(moved))
    scale = jnp.power(loss, q)  # F^q, with 0^0 = 1
    live = (q > 0) & (norm > 0)
    curvature = jnp.where(live, q * jnp.power(jnp.where(live, loss, 1.0), q - 1) * norm, 0.0)
    delta = jax.tree.map(lambda d: scale.astype(d.dtype) * d, moved)
    return FairUpdate(delta, curvature + lipschitz * scale), loss


def fair_sum() -> Aggregator:
    """``Σ_k Δ_k / Σ_k h_k`` over clients with weight > 0; zero when ``Σ_k h_k = 0``."""

    def contribute(update: FairUpdate, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        keep = weight > 0
        delta = jax.tree.map(lambda d: jnp.where(keep, d, 0), update.delta)
        return delta, jnp.where(keep, update.h, 0.0)

    def finalize(sums: PyTree) -> Update:
        delta, h = sums
        positive = h > 0
        safe = jnp.where(positive, h, 1.0)
        return jax.tree.map(lambda s: jnp.where(positive, s / safe.astype(s.dtype), 0), delta)

    return Aggregator(contribute, finalize)


def qffl(*, q: float = 1.0, client_lr: float = 0.05, server_lr: float = 1.0) -> FederatedAlgorithm:
    """q-FedAvg with fairness ``q`` (traced as ``qffl_q``); ``q = 0`` is uniform FedAvg.

    Args:
      q: the fairness exponent (traced as ``qffl_q``).
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    Hyperparameters:
      qffl_q: q, how much more clients of high loss weigh (the objective Σ_k p_k F_k^{q+1} /
        (q + 1), Eq. 2), >= 0; 0 is FedAvg with uniform weights.

    References:
      Li, Sanjabi, Beirami and Smith, "Fair Resource Allocation in Federated Learning" (ICLR
      2020), Algorithm 3 (q-FedAvg).
    """
    return fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=fair_sum(),
        extra_hyper=(("qffl_q", float(q)),),
        hyper_ranges=(("qffl_q", NON_NEGATIVE),),
        client_init=lambda params: jnp.zeros((), float_dtype(params)),
        client_start=measure_loss,
        client_finalize=fair_update,
        name="qffl",
    )
