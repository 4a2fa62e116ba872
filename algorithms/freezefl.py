"""FreezeFL: per-client layer freezing against slow devices, with layer-wise aggregation.

Chou, Chang and Chou, "FreezeFL: Accelerating Federated Learning in
Heterogeneous Edge Devices by Layer Freezing" (notes: dace-gandalf-freezefl
Appendix B.2). Each selected client trains a probe (its first local epoch of
``E``) with every layer, scores layer ``l`` by the mean absolute change

    P_l = ||w^l - w^{k,l}||_1 / dim(w^l)

and freezes its first ``n`` layers (input side), ``n`` maximising

    sum_{l > n} P_l * (T_r / tau_n) ** (beta * 1[T_r < tau_n])

where ``tau_n`` is the client's expected round time with ``n`` layers frozen
and ``T_r`` the soft deadline, a running mean of the round's exchange time.
At least one layer stays unfrozen; ``beta = 0`` never freezes (FedAvg).
Frozen layers are neither trained after the probe nor uploaded, and the
server averages each layer over the clients that sent it, weighted by
``|D_k|`` (``algorithm.masked_mean``).

Here: a *layer* is a top-level module of the params (``Dense_0``,
``Conv_1``, ...), in the order the forward pass uses them (``models.layer_order``; the
engine hands the hooks the layers in that order, since a pytree's dict comes back
sorted: ``Dense_0``, the output, before ``Embed_0``); ``tau_n`` uses the client's mean
speeds (``online.OnlineRound``); ``T_r`` is an EMA with weight 0.5 on the old
value (the paper gives no rate) and starts at the first round's value (no
freezing in round 0). FreezeFL's utility-based client selection and warm
restarts (Table III's "w/ CS" and "w/ CS,WR" rows) are a selection,
``[selection] name = "freezefl"`` (``sampling/freezefl_selection.py``); the plain
"Freezing" row is this algorithm. After its probe a client at depth ``n`` pays
``step_costs[n]`` of a full step in the schedule, the FLOPs XLA counts for the gradient of
the layers still training (see ``fedjax_het.training.online``).

>>> import jax.numpy as jnp
>>> params = {"Dense_0": {"kernel": jnp.ones((3, 2))}, "Dense_1": {"kernel": jnp.ones((2, 1))}}
>>> depth_masks(params)["Dense_0"]["kernel"].tolist()  # trained at depth 0, frozen at depth 1
[1.0, 0.0]
>>> update = {"Dense_0": {"kernel": jnp.full((3, 2), 0.5)}, "Dense_1": {"kernel": jnp.ones((2, 1))}}
>>> layer_importance(update).tolist()
[0.5, 1.0]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm, masked_mean
from fedjax_het.engine.hooks import Freezing, attach
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.typing import Hyper, Params, PyTree, Update


def depth_masks(params: Params) -> PyTree:
    """Per leaf, ``[L]`` 0/1: whether it trains when the first ``d`` of the ``L`` layers freeze."""
    depths = jnp.arange(len(params))
    return {
        name: jax.tree.map(lambda _, i=i: (depths <= i).astype(jnp.float32), layer)
        for i, (name, layer) in enumerate(params.items())
    }


def layer_importance(update: Update) -> jax.Array:
    """``[L]`` mean absolute change of each layer, ``P_l`` of FreezeFL."""
    def mean_abs(layer):
        leaves = jax.tree.leaves(layer)
        return sum(jnp.sum(jnp.abs(x)) for x in leaves) / sum(x.size for x in leaves)

    return jnp.stack([mean_abs(layer) for layer in update.values()])


def freeze_objective(
    importance: jax.Array, seconds: jax.Array, soft_deadline: jax.Array, beta: jax.Array
) -> jax.Array:
    """``[L]`` objective of each freeze depth; ``soft_deadline`` NaN: no time penalty."""
    kept = jnp.cumsum(importance[::-1])[::-1]  # sum over the layers from depth d on
    late = jnp.isfinite(soft_deadline) & (soft_deadline < seconds)
    ratio = jnp.where(late, soft_deadline / seconds, 1.0)
    return kept * ratio ** jnp.where(late, beta, 0.0)


def choose_depth(update: Update, seconds: jax.Array, soft_deadline: jax.Array, hyper: Hyper):
    """The depth maximising ``freeze_objective`` (the shallowest among ties)."""
    objective = freeze_objective(layer_importance(update), seconds, soft_deadline, hyper["beta"])
    return jnp.argmax(objective).astype(jnp.int32)


def freezefl(
    *, beta: float = 4.0, epochs: int = 3, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """FreezeFL with time exponent ``beta`` (traced; 4 for FEMNIST in the paper's Table I).

    ``epochs`` is the local work ``E`` the run gives each client (``LocalWork``):
    the probe is its first epoch, ``1 / epochs`` of the steps.

    Args:
      beta: β, the exponent of the time penalty in the freezing objective (traced), >= 0.
      epochs: E, the local epochs the run gives each client, >= 1: the probe, which scores
        the layers, is the first of them.
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Chou, Chang and Chou, "FreezeFL: Accelerating Federated Learning in Heterogeneous Edge
      Devices by Layer Freezing".
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    algorithm = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=masked_mean(),
        extra_hyper=(("beta", float(beta)),),
        hyper_ranges=(("beta", NON_NEGATIVE),),
        name="freezefl",
    )
    return attach(algorithm, Freezing(1.0 / epochs, depth_masks, choose_depth))
