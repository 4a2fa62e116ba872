"""FedAvg and its server-optimizer family.

FedAvg (McMahan et al. 2017, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", Algorithm 1) in the form of Reddi et al.
2021 ("Adaptive Federated Optimization", Algorithm 1): each selected client
``k`` runs local SGD from the global model ``x_t`` to ``x_k``; the server
forms the pseudo-gradient as the example-weighted mean

    Δ_t = Σ_k n_k (x_t - x_k) / Σ_k n_k

and applies a server optimizer to it. SGD with server learning rate 1 gives
McMahan's FedAvg exactly (``x_{t+1} = Σ_k n_k x_k / Σ_k n_k``); momentum gives
FedAvgM (Hsu et al. 2019), Adam/Yogi/Adagrad give FedAdam/FedYogi/FedAdagrad
(Reddi et al. 2021, Algorithm 2).

>>> algorithm = fedavg()
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr']

Hyperparameters:
  client_lr: η_l, the learning rate of the clients' local SGD, > 0.
  server_lr: η_g, the server's learning rate on the pseudo-gradient, > 0 (1 with SGD:
    McMahan's FedAvg, the new model the weighted mean of the clients').

References:
  McMahan, Moore, Ramage, Hampson and Agüera y Arcas, "Communication-Efficient Learning of
  Deep Networks from Decentralized Data" (AISTATS 2017), Algorithm 1.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.optimizers import HyperOptimizer
from fedjax_het.engine.algorithm import (
    Aggregator,
    FederatedAlgorithm,
    LocalTraining,
    delta_update,
    model_loss,
    start_from_broadcast,
    weighted_mean,
)
from fedjax_het.engine.hyper import HyperSpec, Interval
from fedjax_het.typing import Hyper, Params, PRNGKey, PyTree


@struct.dataclass
class ServerState:
    """The global model and the server optimizer's state."""

    params: Params
    opt_state: PyTree


def fedavg(
    *,
    client_optimizer: HyperOptimizer | None = None,
    server_optimizer: HyperOptimizer | None = None,
    local_loss: Callable[..., jax.Array] = model_loss,
    aggregator: Aggregator | None = None,
    extra_hyper: tuple[tuple[str, float], ...] = (),
    hyper_ranges: tuple[tuple[str, Interval], ...] = (),
    client_init: Callable[[Params], PyTree] = lambda params: (),
    client_start: Callable[..., tuple[Params, PyTree]] = start_from_broadcast,
    client_finalize: Callable[..., tuple[PyTree, PyTree]] = delta_update,
    name: str = "fedavg",
) -> FederatedAlgorithm:
    """FedAvg with pluggable client and server optimizers, local objective and aggregation.

    Args:
      client_optimizer: local optimizer; default SGD with ``client_lr = 0.05``.
      server_optimizer: optimizer on the pseudo-gradient; default SGD with
        ``server_lr = 1.0`` (plain FedAvg).
      local_loss: the local objective ``(model, params, batch, ctx, hyper, key)``
        (``LocalTraining.loss``; ``ctx`` a ``LocalContext``); FedProx adds its proximal
        term here.
      aggregator: how client updates combine; default the weighted mean.
      extra_hyper: ``((name, default), ...)`` traced hyperparameters that
        ``local_loss``, ``aggregator`` or a hook read.
      hyper_ranges: ``((name, Interval), ...)`` allowed values of those hyperparameters
        (the optimizers bring the ranges of theirs).
      client_init, client_start, client_finalize: the client state and the start and end
        of local training (``FederatedAlgorithm.client_init``, ``LocalTraining``; defaults:
        no client state, start from the global model, send ``start - params``).
      name: registry name reported in logs.

    Hooks (a personal model, freezing, stale updates) are attached to the result with
    ``fedjax_het.engine.hooks.attach``.

    Returns:
      The algorithm. Its traced hyperparameters are those of both optimizers
      and ``extra_hyper``.
    """
    client_optimizer = client_optimizer or optimizers.sgd("client", lr=0.05)
    server_optimizer = server_optimizer or optimizers.sgd("server", lr=1.0)

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        del num_clients
        return ServerState(params, server_optimizer.build(hyper).init(params))

    def server_update(
        state: ServerState, pseudo_gradient, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        del key
        updates, opt_state = server_optimizer.build(hyper).update(
            pseudo_gradient, state.opt_state, state.params
        )
        return ServerState(optax.apply_updates(state.params, updates), opt_state)

    return FederatedAlgorithm(
        name=name,
        hyperparameters=client_optimizer.hyper + server_optimizer.hyper
        + HyperSpec(extra_hyper, hyper_ranges),
        server_init=server_init,
        broadcast=lambda state: state.params,
        client_init=client_init,
        local=LocalTraining(client_optimizer.build, local_loss, client_start, client_finalize),
        aggregator=aggregator or weighted_mean(),
        server_update=server_update,
        global_params=lambda state: state.params,
    )


def fedavgm(*, momentum: float = 0.9, server_lr: float = 1.0) -> FederatedAlgorithm:
    """FedAvgM (Hsu et al. 2019): server SGD with momentum on the pseudo-gradient.

    Args:
      momentum: β, the server's momentum (traced as ``server_momentum``).
      server_lr: η_g, the server's learning rate (traced as ``server_lr``).

    Hyperparameters:
      server_momentum: β, the server's heavy-ball momentum on the pseudo-gradient, in [0, 1).

    References:
      Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for
      Federated Visual Classification" (arXiv:1909.06335, 2019).
    """
    return fedavg(
        server_optimizer=optimizers.sgd("server", lr=server_lr, momentum=momentum), name="fedavgm"
    )


def fedadam(*, server_lr: float = 0.01) -> FederatedAlgorithm:
    """FedAdam (Reddi et al. 2021, Algorithm 2).

    Args:
      server_lr: η, the server's Adam step size (traced as ``server_lr``).

    Hyperparameters:
      server_b1: β_1, the decay of the server's first moment of the pseudo-gradient, in [0, 1).
      server_b2: β_2, the decay of its second moment, in [0, 1).
      server_eps: τ, the adaptivity added to the root of the second moment, > 0 (the paper's
        1e-3).

    References:
      Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated
      Optimization" (ICLR 2021), Algorithm 2.

    .. warning:: The server step is optax's Adam, which applies bias correction
       to both moments; Algorithm 2 of the paper has none. The two differ in the
       first rounds only (the corrections tend to 1).
    """
    return fedavg(server_optimizer=optimizers.adam("server", lr=server_lr), name="fedadam")


def fedyogi(*, server_lr: float = 0.01) -> FederatedAlgorithm:
    """FedYogi (Reddi et al. 2021, Algorithm 2).

    Args:
      server_lr: η, the server's Yogi step size (traced as ``server_lr``).

    References:
      Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated
      Optimization" (ICLR 2021), Algorithm 2.
    """
    return fedavg(server_optimizer=optimizers.yogi("server", lr=server_lr), name="fedyogi")


def fedadagrad(*, server_lr: float = 0.01) -> FederatedAlgorithm:
    """FedAdagrad (Reddi et al. 2021, Algorithm 2).

    Args:
      server_lr: η, the server's Adagrad step size (traced as ``server_lr``).

    References:
      Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan, "Adaptive Federated
      Optimization" (ICLR 2021), Algorithm 2.
    """
    return fedavg(server_optimizer=optimizers.adagrad("server", lr=server_lr), name="fedadagrad")
