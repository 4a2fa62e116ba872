"""IFCA: clustered federated learning, each client joining the model that fits its data best.

Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered
Federated Learning" (NeurIPS 2020), Algorithm 2 with model averaging. The
server keeps ``k`` models ``θ_0..θ_{k-1}`` and broadcasts all of them; client
``i`` estimates its cluster

    ĵ_i = argmin_j F_i(θ_j)            (ties: the lowest j)

from its loss on this round's examples, trains ``θ_ĵ`` locally to ``θ̃_i``
and sends ``θ_ĵ - θ̃_i`` with ``ĵ``. The server averages per cluster over the
members ``S_j`` that count (weight ``w_i > 0``),

    θ_j <- θ_j - η Σ_{i∈S_j} w_i (θ_j - θ̃_i) / Σ_{i∈S_j} w_i,

and a cluster without members keeps its model (zero pseudo-gradient). With
``η = 1`` and uniform weighting this is the paper's ``θ_j = mean_{i∈S_j}
θ̃_i``; with example weighting, its FedAvg form. The client stores ``ĵ``;
its ``ServerMetrics`` hook reports the round's ``cluster_sizes`` (int32 ``[k]``).
With ``k = 1`` IFCA is FedAvg.

>>> import jax, jax.numpy as jnp
>>> algorithm = ifca(num_clusters=3)
>>> state = algorithm.server_init({"w": jnp.ones(2)}, algorithm.hyper(), 4)
>>> algorithm.broadcast(state)["w"].shape, algorithm.hook(ServerMetrics).metrics(state)["cluster_sizes"].tolist()
((3, 2), [0, 0, 0])

.. warning:: The paper initialises the ``k`` models at random and separately;
   ``server_init`` receives one initial model ``θ``, so here ``θ_0 = θ`` and
   ``θ_j = θ + σ · rms(θ_leaf) · ε_j`` for ``j > 0``, leaf by leaf, with
   ``ε_j ~ N(0, I)`` drawn from a fixed key folded with ``j`` (the same
   directions for every seed; only ``θ`` changes with it) and ``σ`` the
   traced hyperparameter ``init_noise``. Leaves that start at zero (biases)
   start equal in every cluster. ``init_noise = 0`` puts every client in
   cluster 0.
.. warning:: ``F_i`` is the mean loss over the examples of this round's
   batches (repeats in a second epoch count twice; a client cut short by a
   deadline judges on the examples it trains), not over its whole dataset.
   A client with no examples this round keeps its stored cluster.
.. warning:: A client never selected has no cluster: ``personal_params``
   gives it ``global_params``, the model of the largest cluster of the last
   round (ties: the lowest index; cluster 0 before any round).
.. warning:: Clients download ``k`` models; payload accounting counts one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState as ModelsState
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import (
    Aggregator,
    Batches,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    delta_update,
    exact_divide,
    mean_loss,
)
from fedjax_het.engine.hooks import Personalized, ServerMetrics
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.models import Model
from fedjax_het.typing import ClientState, Hyper, Params, PRNGKey, PyTree, Update

_INIT_KEY = 0  # seed of the fixed key the cluster perturbations are drawn from


@struct.dataclass
class ServerState:
    """The ``k`` models (params ``[k, ...]``) with the server optimizer's state, and the last sizes."""

    models: ModelsState
    cluster_sizes: jax.Array  # int32 [k]: members that counted in the last round


@struct.dataclass
class ClusterUpdate:
    """A client's pseudo-gradient ``θ_ĵ - θ̃`` and the cluster ``ĵ`` it trained."""

    delta: Update
    cluster: jax.Array


def cluster_models(params: Params, clusters: int, noise: jax.Array) -> Params:
    """``[k, ...]`` models: ``params`` first, then perturbations scaled by ``noise · rms(leaf)``."""
    leaves, treedef = jax.tree.flatten(params)
    models = [leaves]
    for j in range(1, clusters):
        key = jax.random.fold_in(jax.random.key(_INIT_KEY), j)
        models.append(
            [
                leaf
                + noise
                * jnp.sqrt(jnp.mean(jnp.square(leaf)))
                * jax.random.normal(jax.random.fold_in(key, i), leaf.shape, leaf.dtype)
                for i, leaf in enumerate(leaves)
            ]
        )
    return jax.tree.unflatten(treedef, [jnp.stack(column) for column in zip(*models)])


def cluster_losses(model: Model, models: Params, batches: Batches) -> jax.Array:
    """``[k]`` mean loss of each model over the examples ``batches.mask`` keeps (0 if none)."""
    return jax.vmap(lambda params: mean_loss(model, params, batches))(models)


def join_best_cluster(
    model: Model,
    broadcast: Params,
    cluster: ClientState,
    batches: Batches,
    hyper: Hyper,
    key: PRNGKey,
) -> tuple[Params, ClientState]:
    """Starts from the model of lowest loss (the stored cluster when there are no examples)."""
    del hyper, key
    best = jnp.argmin(cluster_losses(model, broadcast, batches))
    cluster = jnp.where(jnp.any(batches.mask), best, jnp.maximum(cluster, 0)).astype(jnp.int32)
    return jax.tree.map(lambda m: m[cluster], broadcast), cluster


def send_to_cluster(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[Update, ClientState]:
    delta, cluster = delta_update(params, ctx, hyper)
    return ClusterUpdate(delta, cluster), cluster


def cluster_mean(clusters: int) -> Aggregator:
    """Per cluster, the weighted mean of its counted members' deltas, and the member counts."""

    def contribute(update: ClusterUpdate, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        member = (jnp.arange(clusters) == update.cluster) & (weight > 0)

        def spread(u):
            where = member.reshape(clusters, *[1] * u.ndim)
            return jnp.where(where, (weight.astype(u.dtype) * u)[None], 0)

        return (
            jax.tree.map(spread, update.delta),
            jnp.where(member, weight, 0.0),
            member.astype(jnp.int32),
        )

    def finalize(sums: PyTree) -> tuple[Update, jax.Array]:
        weighted, total, members = sums
        scale = jnp.maximum(total, 1e-30)
        # Divided exactly, as FedAvg's mean is: k = 1 is FedAvg bit for bit.
        mean = jax.tree.map(lambda s: exact_divide(s, scale), weighted)
        return mean, members

    return Aggregator(contribute, finalize)


def ifca(
    *,
    num_clusters: int = 2,
    init_noise: float = 1.0,
    client_lr: float = 0.05,
    server_lr: float = 1.0,
) -> FederatedAlgorithm:
    """IFCA with ``num_clusters`` models, initialised ``init_noise`` apart (traced; see the warning).

    Args:
      num_clusters: k, the cluster models the server keeps and every client chooses among.
      init_noise: how far apart the k initial models are: each is the initial model plus a
        perturbation of ``init_noise`` times each leaf's root mean square (traced), >= 0.
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered Federated
      Learning" (NeurIPS 2020), Algorithm 2.
    """
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
        raise ValueError(f"num_clusters must be an int >= 1, got {num_clusters!r}")
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=cluster_mean(num_clusters),
        extra_hyper=(("init_noise", float(init_noise)),),
        hyper_ranges=(("init_noise", NON_NEGATIVE),),
        client_init=lambda params: jnp.int32(-1),
        client_start=join_best_cluster,
        client_finalize=send_to_cluster,
        name="ifca",
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        models = cluster_models(params, num_clusters, hyper["init_noise"])
        return ServerState(
            base.server_init(models, hyper, num_clients), jnp.zeros((num_clusters,), jnp.int32)
        )

    def server_update(
        state: ServerState, aggregate, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        mean, members = aggregate
        return ServerState(base.server_update(state.models, mean, hyper, key), members)

    def global_params(state: ServerState) -> Params:
        largest = jnp.argmax(state.cluster_sizes)
        return jax.tree.map(lambda m: m[largest], state.models.params)

    def personal_params(state: ServerState, cluster: ClientState) -> Params:
        chosen = jnp.where(cluster >= 0, cluster, jnp.argmax(state.cluster_sizes))
        return jax.tree.map(lambda m: m[chosen], state.models.params)

    return dataclasses.replace(
        base,
        server_init=server_init,
        broadcast=lambda state: state.models.params,
        server_update=server_update,
        global_params=global_params,
        hooks=(
            Personalized(personal_params),
            ServerMetrics(lambda state: {"cluster_sizes": state.cluster_sizes}),
        ),
    )
