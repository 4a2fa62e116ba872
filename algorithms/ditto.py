"""Ditto: FedAvg for the global model, plus a personal model per client pulled towards it.

Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization" (ICML 2021), Algorithm 1 with FedAvg as the global solver.
Client ``k`` keeps a personal model ``v_k`` (initialised to the initial global
model) and, in a round with global model ``w_t``, takes its local steps on both

    w <- w - η ∇F_k(w)                                  (from w_t: FedAvg)
    v <- v - η (∇F_k(v) + λ (v - w_t))                  (from v_k: min F_k(v) + λ/2 ||v - w_t||^2)

on the same batches; it keeps the trained ``v`` and sends ``w_t - w``, which
the server averages and steps along as FedAvg does. ``λ`` is the traced
hyperparameter ``ditto_lambda``: ``λ = 0`` trains ``v`` purely locally, a large
``λ`` keeps it near ``w_t``. the ``Personalized`` hook gives ``v_k``, so a run reports
each client's personalised accuracy.

Mechanics: the trained pytree is the pair ``DittoParams(w, v)``; the local
objective ``F_k(w) + F_k(v) + λ/2 ||v - w_t||^2`` has separate gradients in
``w`` and ``v``.

>>> algorithm = ditto(lam=0.5)
>>> float(algorithm.hyper()["ditto_lambda"])
0.5

.. warning:: The paper allows ``s`` personal steps at their own learning rate;
   here ``v`` takes exactly the steps ``w`` takes (the same count, batches and
   ``client_lr``), so partial work and deadlines cut both alike. The personal
   step is explicit, as in the paper: it is stable only for
   ``client_lr · ditto_lambda < 2``.
.. warning:: The reported training loss is ``F_k(w)`` of the global part
   alone (as FedAvg reports), not the sum of both objectives.
.. warning:: A client never counted in a round keeps its initial ``v_k``, the
   initial global model, and is evaluated with it.
.. warning:: Client states hold a whole model per client (``[num_clients, ...params]``).
"""

from __future__ import annotations

import jax
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState, fedavg
from fedjax_het.algorithms.loss_terms import squared_distance
from fedjax_het.engine.algorithm import Batches, FederatedAlgorithm, LocalContext, model_loss
from fedjax_het.engine.hooks import Personalized, attach
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.models import Model
from fedjax_het.typing import Batch, ClientState, Hyper, Params, PRNGKey, Update


@struct.dataclass
class DittoParams:
    """What a Ditto client trains: the global model's copy ``w`` and its personal model ``v``."""

    w: Params
    v: Params


def start_pair(
    model: Model,
    broadcast: Params,
    personal: ClientState,
    batches: Batches,
    hyper: Hyper,
    key: PRNGKey,
) -> tuple[DittoParams, ClientState]:
    """Local training starts from ``(w_t, v_k)``."""
    del model, batches, hyper, key
    return DittoParams(broadcast, personal), personal


def ditto_loss(
    model: Model, params: DittoParams, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """``F_k(w) + F_k(v) + λ/2 ||v - w_t||^2``, whose value is ``F_k(w)`` alone (see the warning)."""
    global_loss = model_loss(model, params.w, batch, ctx, hyper, key)
    pull = hyper["ditto_lambda"] / 2 * squared_distance(params.v, ctx.start.w)
    personal = model_loss(model, params.v, batch, ctx, hyper, key) + pull
    return global_loss + (personal - jax.lax.stop_gradient(personal))


def send_global(params: DittoParams, ctx: LocalContext, hyper: Hyper) -> tuple[Update, ClientState]:
    """The update ``w_t - w``; the client keeps ``v``."""
    del hyper
    return jax.tree.map(lambda s, p: s - p, ctx.start.w, params.w), params.v


def own_model(state: ServerState, personal: ClientState) -> Params:
    """Client ``k``'s personal model ``v_k``."""
    del state
    return personal


def ditto(
    *, lam: float = 0.1, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """Ditto with personalisation weight ``lam`` (traced as ``ditto_lambda``) over FedAvg.

    Args:
      lam: λ, the personalisation weight (traced as ``ditto_lambda``).
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    Hyperparameters:
      ditto_lambda: λ, how strongly each client's personal model ``v`` is pulled towards the
        global model (λ/2 ||v - w_t||^2), >= 0; 0 trains it purely locally.

    References:
      Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through
      Personalization" (ICML 2021), Algorithm 1.
    """
    algorithm = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=ditto_loss,
        extra_hyper=(("ditto_lambda", float(lam)),),
        hyper_ranges=(("ditto_lambda", NON_NEGATIVE),),
        client_init=lambda params: params,
        client_start=start_pair,
        client_finalize=send_global,
        name="ditto",
    )
    return attach(algorithm, Personalized(own_model))
