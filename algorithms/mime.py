"""Mime and MimeLite: local steps that apply the server's momentum, which only the server updates.

Karimireddy, Jaggi, Kale, Mohri, Reddi, Stich and Suresh, "Mime: Mimicking Centralized
Stochastic Algorithms in Federated Learning" (arXiv:2008.03606, 2020), Algorithm 1 with SGD
with momentum as the base algorithm, ``U(g, m) = (1 - β) g + β m`` for a step and
``V(g, m) = (1 - β) g + β m`` for the statistic it tracks. In a round the
server holds the model ``x`` and the momentum ``m``. It first gathers every selected client's
full-batch gradient at ``x`` (all of its examples once) and averages them over the clients
that count (weights ``w_i``, the round's):

    c = Σ_i w_i ∇f_i(x) / Σ_i w_i.

Client ``i`` starts from ``y_i = x`` and takes its ``K_i`` local steps on minibatches ``ζ``
with ``m`` (and, for Mime, ``c``) held fixed:

    Mime:      y_i <- y_i - η ((1 - β)(∇f_i(y_i; ζ) - ∇f_i(x; ζ) + c) + β m),
    MimeLite:  y_i <- y_i - η ((1 - β) ∇f_i(y_i; ζ) + β m);

the server then averages the models and updates the momentum with the full-batch gradients
only (Algorithm 1's last two lines):

    x <- x - η_g Σ_i w_i (x - y_i) / Σ_i w_i,        m <- (1 - β) c + β m.

``η`` is ``client_lr``, ``η_g`` ``server_lr`` (the paper's plain average is ``η_g = 1``), ``β``
the traced ``mime_momentum``. ``m`` starts at zero. The control variate ``c`` is a statistic
of the cohort that every local step needs, so it is gathered in a round trip of its own
before training (a ``CohortProbe`` hook); MimeLite gathers the same gradients only for
``m``. With ``β = 0`` MimeLite is FedAvg, and Mime is FedAvg with an SVRG correction.

>>> algorithm = mime(momentum=0.5)
>>> sorted(algorithm.hyper())
['client_lr', 'mime_momentum', 'server_lr']

.. warning:: The means are the engine's weighted means: example-weighted by default, as in
   FedJAX's ``mime``; ``weighting="uniform"`` gives the paper's ``1 / |S|``. A client counts in
   ``c`` exactly when its update counts (weight > 0): a client that fails or is late this
   round gives no gradient either. When nobody counts, ``x`` and ``m`` stay as they are.
.. warning:: The momentum is the paper's ``(1 - β) g + β m``. FedJAX's ``mime`` runs an optax
   base optimizer, whose momentum is ``g + β m``: the same steps at ``η / (1 - β)``. Only SGD
   with momentum is offered as the base algorithm (the paper also runs Adam).
.. warning:: The full-batch gradient is taken in training mode (dropout drawn from the
   client's "probe" key), on the run's model, and its round trip is not in the simulated
   time. The payload counts ``x``, ``m`` (and ``c``) down and the update and the gradient up.
   The reported training loss is ``f_i(y)`` alone.
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
from fedjax_het.algorithms.scaffold import start_from_model
from fedjax_het.engine.algorithm import (
    Batches,
    FederatedAlgorithm,
    LocalContext,
    model_loss,
    weighted_mean,
)
from fedjax_het.engine.hooks import CohortProbe, PayloadBytes
from fedjax_het.engine.hyper import DECAY
from fedjax_het.models import Model
from fedjax_het.transforms.compression import bytes_sent, identity
from fedjax_het.typing import Batch, Hyper, Params, PRNGKey, PyTree, Update


@struct.dataclass
class ServerState:
    """The model, the (empty) server SGD state, the momentum ``m`` and this round's ``c``."""

    params: Params
    opt_state: PyTree
    momentum: Params
    gradient: Params  # c: the mean full-batch gradient at params (its CohortProbe hook)
    gathered: jax.Array  # 1 when a client counted in c this round, else 0


@struct.dataclass
class Payload:
    """What a selected client downloads: ``x``, ``m`` and, for Mime, ``c`` (None for MimeLite)."""

    params: Params
    momentum: Params
    control: Params | None


@jax.custom_jvp
def scaled_gradient(params: Params, scale: jax.Array) -> Params:
    """``params`` itself, whose gradient is multiplied by ``scale`` on its way back.

    >>> grad = jax.grad(lambda w: jnp.sum(scaled_gradient(w, jnp.float32(0.25)) ** 2))
    >>> grad(jnp.ones(2)).tolist()
    [0.5, 0.5]
    """
    return params


@scaled_gradient.defjvp
def _scaled_gradient_jvp(primals, tangents):
    params, scale = primals
    params_dot, _ = tangents
    return params, jax.tree.map(lambda t: t * scale.astype(t.dtype), params_dot)


def full_gradient(
    model: Model,
    payload: Payload,
    client_id: jax.Array,
    examples: Batches,
    hyper: Hyper,
    key: PRNGKey,
) -> tuple[Params, jax.Array]:
    """``(∇f_i(x), 1)``: the mean loss gradient at ``x`` over each of the client's examples.

    The second entry is averaged with it, so the aggregate says whether anyone counted.
    """
    del client_id, hyper
    x = payload.params

    def batch_sum(params, xb, yb, mask, key):
        losses = model.per_example_loss(model.apply(params, xb, train=True, key=key), yb)
        return jnp.sum(jnp.where(mask, losses, 0))

    def one_batch(total, inputs):
        xb, yb, mask, index = inputs
        grads = jax.grad(batch_sum)(x, xb, yb, mask, jax.random.fold_in(key, index))
        return jax.tree.map(jnp.add, total, grads), None

    blocks = jnp.arange(examples.x.shape[0])
    total, _ = jax.lax.scan(
        one_batch, jax.tree.map(jnp.zeros_like, x), (examples.x, examples.y, examples.mask, blocks)
    )
    count = jnp.maximum(jnp.sum(examples.mask), 1)
    return jax.tree.map(lambda t: t / count.astype(t.dtype), total), jnp.ones((), jnp.float32)


def attach_gradient(state: ServerState, aggregate: tuple[Params, jax.Array]) -> ServerState:
    """The server state with this round's ``c`` and whether anyone counted in it."""
    gradient, share = aggregate
    return state.replace(gradient=gradient, gathered=(share > 0).astype(jnp.float32))


def track_momentum(state: ServerState, beta: jax.Array) -> Params:
    """``V(c, m) = (1 - β) c + β m``; ``m`` kept when nobody counted in ``c``."""

    def step(m, c):
        beta_ = beta.astype(m.dtype)
        return jnp.where(state.gathered > 0, (1 - beta_) * c + beta_ * m, m)

    return jax.tree.map(step, state.momentum, state.gradient)


def momentum_steps(control_variate: bool):
    """The local objective whose gradient is Mime's (or MimeLite's) step direction; its value
    is the model's loss."""

    def local_loss(
        model: Model,
        params: Params,
        batch: Batch,
        ctx: LocalContext,
        hyper: Hyper,
        key: PRNGKey,
    ) -> jax.Array:
        beta = hyper["mime_momentum"]
        payload = ctx.broadcast
        fixed = jax.tree.map(lambda m: beta.astype(m.dtype) * m, payload.momentum)
        if control_variate:  # (1 - β)(c - ∇f_i(x; ζ)), constant in y
            at_server = jax.grad(model_loss, argnums=1)(
                model, payload.params, batch, ctx, hyper, key
            )
            fixed = jax.tree.map(
                lambda f, c, g: f + (1 - beta.astype(c.dtype)) * (c - g),
                fixed, payload.control, at_server,
            )  # fmt: skip
        scaled = scaled_gradient(params, 1 - beta)
        return model_loss(model, scaled, batch, ctx, hyper, key) + gradient_term(params, fixed)

    return local_loss


def _mime(name: str, control_variate: bool, momentum: float, client_lr: float,
          server_lr: float) -> FederatedAlgorithm:  # fmt: skip
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=momentum_steps(control_variate),
        extra_hyper=(("mime_momentum", float(momentum)),),
        hyper_ranges=(("mime_momentum", DECAY),),
        client_start=start_from_model,
        name=name,
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        inner = base.server_init(params, hyper, num_clients)
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ServerState(inner.params, inner.opt_state, zeros, zeros, jnp.float32(0))

    def server_update(
        state: ServerState, mean_delta: Update, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        inner = base.server_update(
            ModelState(state.params, state.opt_state), mean_delta, hyper, key
        )
        momentum = track_momentum(state, hyper["mime_momentum"])
        return state.replace(params=inner.params, opt_state=inner.opt_state, momentum=momentum)

    def broadcast(state: ServerState) -> Payload:
        return Payload(state.params, state.momentum, state.gradient if control_variate else None)

    def payload(sent: Params | Payload) -> tuple[int, int]:
        """``(x, m[, c])`` down, the update and the full-batch gradient up, each the model's
        float32 bytes; ``sent`` is the params (a planned schedule) or the broadcast (online)."""
        model = bytes_sent(identity(), sent.params if isinstance(sent, Payload) else sent)
        return (3 if control_variate else 2) * model, 2 * model

    return dataclasses.replace(
        base,
        server_init=server_init,
        broadcast=broadcast,
        server_update=server_update,
        hooks=(PayloadBytes(payload), CohortProbe(full_gradient, weighted_mean(), attach_gradient)),
    )


def mime(
    *, momentum: float = 0.9, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """Mime with SGD with momentum as its base: server momentum and the control variate ``c``
    in every local step.

    Args:
      momentum: β, the decay of the server's momentum, in [0, 1) (traced as ``mime_momentum``).
      client_lr: η, the local learning rate (traced as ``client_lr``).
      server_lr: η_g, the server's step along the mean of x - y_i (traced as ``server_lr``; 1:
        the mean of the models, the paper's).

    Hyperparameters:
      mime_momentum: β, in [0, 1): every local step moves along (1 - β) g + β m with the
        server's momentum m held fixed, and the server sets m <- (1 - β) c + β m from the
        clients' full-batch gradients c.

    References:
      Karimireddy, Jaggi, Kale, Mohri, Reddi, Stich and Suresh, "Mime: Mimicking Centralized
      Stochastic Algorithms in Federated Learning" (arXiv:2008.03606, 2020), Algorithm 1.
    """
    return _mime("mime", True, momentum, client_lr, server_lr)


def mimelite(
    *, momentum: float = 0.9, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """MimeLite with SGD with momentum as its base: server momentum in every local step, no
    control variate.

    Args:
      momentum: β, the decay of the server's momentum, in [0, 1) (traced as ``mime_momentum``).
      client_lr: η, the local learning rate (traced as ``client_lr``).
      server_lr: η_g, the server's step along the mean of x - y_i (traced as ``server_lr``; 1:
        the mean of the models, the paper's).

    Hyperparameters:
      mime_momentum: β, in [0, 1): every local step moves along (1 - β) g + β m with the
        server's momentum m held fixed, and the server sets m <- (1 - β) c + β m from the
        clients' full-batch gradients c.

    References:
      Karimireddy, Jaggi, Kale, Mohri, Reddi, Stich and Suresh, "Mime: Mimicking Centralized
      Stochastic Algorithms in Federated Learning" (arXiv:2008.03606, 2020), Algorithm 1
      (MimeLite).
    """
    return _mime("mimelite", False, momentum, client_lr, server_lr)
