"""FedNova: normalised averaging for clients that take different numbers of local steps.

Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem
in Heterogeneous Federated Optimization" (NeurIPS 2020), Eq. (6)-(7) with
plain local SGD (``a_k = [1, ..., 1]``, ``||a_k||_1 = tau_k``): client ``k``
reports ``Delta_k = x_t - x_k`` after ``tau_k`` steps; the server forms

    d_k = Delta_k / tau_k,    tau_eff = sum_k p_k tau_k,
    pseudo-gradient = tau_eff * sum_k p_k d_k,   p_k = n_k / sum_j n_j

and applies the server optimizer (SGD at rate 1: ``x_{t+1} = x_t - pseudo-gradient``).
With equal ``tau_k`` this is FedAvg. Without it, FedAvg's weighted mean of
``Delta_k`` over-weights clients that took more steps and converges to a
different objective; deadlines and partial work (``steps_done`` of the
schedule) are exactly this case.

.. warning:: The normalisation assumes plain SGD locally (the default client
   optimizer). With local momentum the paper's ``||a_k||_1`` differs; this
   implementation does not model it.

>>> fednova().aggregator is not None
True
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import Aggregator, ClientStats, FederatedAlgorithm
from fedjax_het.typing import PyTree, Update


def normalized_mean() -> Aggregator:
    """FedNova's aggregate ``tau_eff * sum_k p_k Delta_k / tau_k`` over clients with weight > 0."""

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        keep = weight > 0
        tau = jnp.maximum(stats.steps, 1).astype(jnp.float32)
        normalised = jax.tree.map(lambda u: jnp.where(keep, weight * u / tau, 0), update)
        return normalised, jnp.where(keep, weight, 0.0), jnp.where(keep, weight * tau, 0.0)

    def finalize(sums: PyTree) -> Update:
        normalised, total, tau_total = sums
        safe = jnp.maximum(total, 1e-30)
        tau_eff = tau_total / safe
        return jax.tree.map(lambda s: tau_eff * s / safe, normalised)

    return Aggregator(contribute, finalize)


def fednova(*, client_lr: float = 0.05, server_lr: float = 1.0) -> FederatedAlgorithm:
    """FedNova with local SGD and a server SGD step on the normalised pseudo-gradient.

    Args:
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in
      Heterogeneous Federated Optimization" (NeurIPS 2020), Eqs. (6)-(7).
    """
    return fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=normalized_mean(),
        name="fednova",
    )
