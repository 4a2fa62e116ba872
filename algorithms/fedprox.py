"""FedProx: FedAvg with a proximal term in the local objective.

Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in
Heterogeneous Networks" (MLSys 2020), Algorithm 2 and Eq. (2): client ``k``
minimises

    h_k(w; w_t) = F_k(w) + (mu / 2) * ||w - w_t||^2

from the global model ``w_t``; aggregation is FedAvg's. ``mu`` is the traced
hyperparameter ``prox_mu``, so a sweep over it compiles once. FedProx's
tolerance to partial work (the paper's gamma-inexact solutions) needs
nothing extra here: a client that finishes fewer steps is a step mask.

>>> algorithm = fedprox(mu=0.5)
>>> float(algorithm.hyper()["prox_mu"])
0.5
"""

from __future__ import annotations

import jax

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.loss_terms import squared_distance
from fedjax_het.engine.algorithm import FederatedAlgorithm, LocalContext, model_loss
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.models import Model
from fedjax_het.typing import Batch, Hyper, Params, PRNGKey


def proximal_loss(
    model: Model, params: Params, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """The model's loss plus ``prox_mu / 2 * ||params - w_t||^2`` (Eq. 2), ``w_t`` the start."""
    distance = squared_distance(params, ctx.start)
    return model_loss(model, params, batch, ctx, hyper, key) + hyper["prox_mu"] / 2 * distance


def fedprox(*, mu: float = 0.01, client_lr: float = 0.05, server_lr: float = 1.0) -> FederatedAlgorithm:
    """FedProx with proximal weight ``mu`` (traced as ``prox_mu``); ``mu = 0`` is FedAvg.

    Args:
      mu: μ, the proximal weight (traced as ``prox_mu``).
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    Hyperparameters:
      prox_mu: μ, the weight of the proximal term (μ/2) ||w - w_t||^2 each client adds to its
        local loss (Eq. 2), >= 0; 0 is FedAvg.

    References:
      Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous
      Networks" (MLSys 2020), Algorithm 2 and Eq. (2).
    """
    return fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=proximal_loss,
        extra_hyper=(("prox_mu", float(mu)),),
        hyper_ranges=(("prox_mu", NON_NEGATIVE),),
        name="fedprox",
    )
