"""FedPer and FedRep: a shared body averaged by the server, a personal head kept by each client.

FedPer: Arivazhagan, Aggarwal, Singh and Choudhary, "Federated Learning with
Personalization Layers" (arXiv:1912.00818, 2019). FedRep: Collins, Hassani, Mokhtari
and Shakkottai, "Exploiting Shared Representations for Personalized Federated
Learning" (ICML 2021), Algorithm 1.

The params are split by layer (top-level modules, in definition order, as
``freezefl.depth_masks`` counts them): the last ``personal_layers`` are the
head ``h_k`` of client ``k``, the rest the body ``φ``. Client ``k`` starts
from ``(φ_t, h_k)`` and trains for its ``τ_k`` local steps

    FedPer:  (φ, h_k) <- (φ, h_k) - lr ∇_(φ,h) f_k(φ, h)                      every step
    FedRep:  h_k <- h_k - lr ∇_h f_k(φ, h_k)   for the first τ_h = ⌊ρ τ_k + 1/2⌋ steps (φ fixed)
             φ   <- φ   - lr ∇_φ f_k(φ, h_k)   for the remaining τ_k - τ_h steps (h_k fixed)

keeps the trained ``h_k`` (its client state) and sends ``φ_t - φ_k`` only; the
server applies FedAvg's step to the body, ``φ_{t+1} = φ_t - η Σ_k n_k (φ_t -
φ_k) / Σ_k n_k``. ``ρ`` is FedRep's traced hyperparameter ``head_share``
(default 0.9: the authors' code trains 9 head epochs and 1 body epoch of 10).
Each client's own model ``(φ_t, h_k)`` is its ``Personalized`` hook's, so a run
reports personalised accuracy.

>>> import jax
>>> from fedjax_het import models
>>> params = models.mlp((4,), 3, hidden=(8,)).init(jax.random.key(0))
>>> list(fedper(personal_layers=1).client_init(params))  # the client keeps the last layer
['Dense_1']
>>> float(fedrep(head_share=0.5).hyper()["head_share"])
0.5

.. warning:: The head never leaves the client: its update is zeros, so the
   server's head keeps its initial value (the server SGD moves it by
   ``η · 0``). ``global_params`` (the run's "global" test accuracy) is the
   averaged body with that untrained head; the meaningful figure is the
   personal accuracy. Every client's head starts from the same initial head.
.. warning:: The server still broadcasts the whole model (the client ignores
   the global head), so payload accounting counts the head both ways.
.. warning:: FedRep's split is a share of the steps the client takes this
   round (``ctx.num_steps``), so a client cut short by a deadline or partial
   work still ends with body steps; the paper fixes ``τ_h`` and ``τ_φ`` in
   epochs and has no partial work. Frozen parameters get a zero gradient,
   which leaves them unchanged under the (plain SGD) client optimizer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState, fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm, LocalContext, model_loss
from fedjax_het.engine.hooks import Personalized, attach
from fedjax_het.engine.hyper import UNIT
from fedjax_het.models import Model
from fedjax_het.typing import Batch, ClientState, Hyper, Params, PRNGKey, Update


def _check_layers(personal_layers: int) -> None:
    if (
        isinstance(personal_layers, bool)
        or not isinstance(personal_layers, int)
        or personal_layers < 1
    ):
        raise ValueError(f"personal_layers must be an int >= 1, got {personal_layers!r}")


def _head_of(personal_layers: int):
    """``params -> head``: the last ``personal_layers`` layers, in definition order."""

    def client_init(params: Params) -> ClientState:
        names = list(params)
        if personal_layers >= len(names):
            raise ValueError(
                f"personal_layers={personal_layers} leaves no shared body: the model has "
                f"{len(names)} layer(s) ({', '.join(names)})"
            )
        return {name: params[name] for name in names[-personal_layers:]}

    return client_init


def start_from_own_head(
    model: Model, broadcast: Params, head: ClientState, batches, hyper: Hyper, key: PRNGKey
) -> tuple[Params, ClientState]:
    """Local training starts from the global body and the client's own head."""
    del model, batches, hyper, key
    return {**broadcast, **head}, head


def send_body(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[Update, ClientState]:
    """Update ``start - params`` on the body and zeros on the head; the state is the trained head."""
    del hyper
    head = ctx.client_state
    update = {
        name: jax.tree.map(jnp.zeros_like, layer)
        if name in head
        else jax.tree.map(lambda s, p: s - p, ctx.start[name], layer)
        for name, layer in params.items()
    }
    return update, {name: params[name] for name in head}


def own_model(state: ServerState, head: ClientState) -> Params:
    """Client ``k``'s model: the global body with its own head."""
    return {**state.params, **head}


def alternating_loss(
    model: Model, params: Params, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """The model's loss, differentiable in the head for the first ``⌊ρ τ_k + 1/2⌋`` steps, in the body after."""
    head_steps = jnp.floor(hyper["head_share"] * ctx.num_steps + 0.5)
    on_head = ctx.step < head_steps

    def gate(layer, trains):
        return jax.tree.map(lambda p: jnp.where(trains, p, jax.lax.stop_gradient(p)), layer)

    gated = {
        name: gate(layer, on_head if name in ctx.client_state else ~on_head)
        for name, layer in params.items()
    }
    return model_loss(model, gated, batch, ctx, hyper, key)


def _personal(name, personal_layers, local_loss, extra_hyper, hyper_ranges, client_lr, server_lr):
    _check_layers(personal_layers)
    algorithm = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=local_loss,
        extra_hyper=extra_hyper,
        hyper_ranges=hyper_ranges,
        client_init=_head_of(personal_layers),
        client_start=start_from_own_head,
        client_finalize=send_body,
        name=name,
    )
    return attach(algorithm, Personalized(own_model))


def fedper(
    *, personal_layers: int = 1, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """FedPer: the last ``personal_layers`` layers are personal; every layer trains every step.

    Args:
      personal_layers: the last layers of the model that stay with each client (its head),
        >= 1; the server averages the others (the body).
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Arivazhagan, Aggarwal, Singh and Choudhary, "Federated Learning with Personalization
      Layers" (arXiv:1912.00818, 2019).
    """
    return _personal("fedper", personal_layers, model_loss, (), (), client_lr, server_lr)


def fedrep(
    *,
    personal_layers: int = 1,
    head_share: float = 0.9,
    client_lr: float = 0.05,
    server_lr: float = 1.0,
) -> FederatedAlgorithm:
    """FedRep: the head trains alone for a ``head_share`` of the local steps, then the body alone.

    Args:
      personal_layers: the last layers of the model that stay with each client (its head),
        >= 1; the server averages the others (the body).
      head_share: ρ, the share of each client's local steps in which the head trains alone
        (traced), in [0, 1]; the body trains alone in the rest.
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Collins, Hassani, Mokhtari and Shakkottai, "Exploiting Shared Representations for
      Personalized Federated Learning" (ICML 2021), Algorithm 1.
    """
    return _personal(
        "fedrep",
        personal_layers,
        alternating_loss,
        (("head_share", float(head_share)),),
        (("head_share", UNIT),),
        client_lr,
        server_lr,
    )
