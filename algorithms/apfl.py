"""APFL: each client mixes a personal model with the global one, and learns the mixture.

Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning" (arXiv:2003.13461,
2020), Algorithm 1 with the adaptive mixing weight. Client ``i`` keeps a personal model
``v_i`` and a weight ``α_i`` in ``[0, 1]``; its personalised model is

    v̄_i = α_i v_i + (1 - α_i) w.

In a round with global model ``w_t`` the client starts ``w`` from ``w_t`` and takes its
``K_i`` local steps on minibatches ``ζ``, each from the values before the step:

    w   <- w   - η ∇f_i(w; ζ)
    v_i <- v_i - η ∇_v f_i(v̄_i; ζ)          = v_i - η α_i ∇f_i(v̄_i; ζ)
    α_i <- Π_[0,1](α_i - η_α ∇_α f_i(v̄_i; ζ)),  ∇_α f_i(v̄_i; ζ) = <v_i - w, ∇f_i(v̄_i; ζ)>

then keeps ``(v_i, α_i)`` and sends ``w_t - w``; the server steps along their weighted mean
as FedAvg does. ``η`` is ``client_lr``, ``η_α`` the traced ``apfl_alpha_lr`` (the paper uses
``η``; 0 keeps every ``α_i`` at its initial ``alpha``, the paper's fixed-α variant).
the ``Personalized`` hook gives ``α_i v_i + (1 - α_i) w`` with the current global model ``w``, so a run
reports each client's personalised accuracy.

Mechanics: the trained pytree is ``APFLParams(w, v, alpha)``; the local objective
``f_i(w) + f_i(α v + (1 - α) sg(w))`` (``sg``: no gradient to ``w``) has exactly the three
gradients above, and the client optimizer is SGD whose ``α`` step is clipped to ``[0, 1]``.

>>> algorithm = apfl(alpha=0.25)
>>> sorted(algorithm.hyper())
['apfl_alpha_lr', 'client_lr', 'server_lr']

.. warning:: ``v_i`` starts from the global model of the client's first counted round
   (FedJAX's ``apfl`` does the same), not from the initial model; until then the client is
   evaluated with the global model. ``α_i`` is one number per client, as in the paper
   (FedJAX learns one per layer).
.. warning:: FedJAX's ``apfl`` steps ``v`` along ``∇f_i(v̄)``, without the chain rule's
   ``α_i``; this follows the paper. Both clip ``α`` to ``[0, 1]`` after each step.
.. warning:: ``v`` and ``α`` take exactly the steps ``w`` takes (same count and batches), so
   partial work and deadlines cut all three alike. The reported training loss is
   ``f_i(w)`` alone. Client states hold a whole model per client.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState, fedavg
from fedjax_het.engine.algorithm import (
    Batches,
    FederatedAlgorithm,
    LocalContext,
    float_dtype,
    model_loss,
)
from fedjax_het.engine.hooks import Personalized, attach
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.models import Model
from fedjax_het.typing import Batch, Hyper, Params, PRNGKey, Update


@struct.dataclass
class APFLParams:
    """What an APFL client trains: its copy ``w`` of the global model, ``v_i`` and ``α_i``."""

    w: Params
    v: Params
    alpha: jax.Array


@struct.dataclass
class APFLState:
    """A client's own ``v_i`` and ``α_i``, and whether it has counted in a round yet."""

    v: Params
    alpha: jax.Array
    started: jax.Array  # bool


def mix(alpha: jax.Array, v: Params, w: Params) -> Params:
    """The personalised model ``α v + (1 - α) w``."""
    return jax.tree.map(lambda a, b: alpha.astype(a.dtype) * a + (1 - alpha.astype(a.dtype)) * b,
                        v, w)  # fmt: skip


def start_triple(
    model: Model,
    broadcast: Params,
    state: APFLState,
    batches: Batches,
    hyper: Hyper,
    key: PRNGKey,
) -> tuple[APFLParams, APFLState]:
    """Local training starts from ``(w_t, v_i, α_i)``; ``v_i = w_t`` in the client's first round."""
    del model, batches, hyper, key
    v = jax.tree.map(lambda own, w: jnp.where(state.started, own, w), state.v, broadcast)
    return APFLParams(broadcast, v, state.alpha), state


def apfl_loss(
    model: Model,
    params: APFLParams,
    batch: Batch,
    ctx: LocalContext,
    hyper: Hyper,
    key: PRNGKey,
) -> jax.Array:
    """``f_i(w) + f_i(α v + (1 - α) sg(w))``, whose value is ``f_i(w)`` alone."""
    global_loss = model_loss(model, params.w, batch, ctx, hyper, key)
    mixed = mix(params.alpha, params.v, jax.lax.stop_gradient(params.w))
    personal = model_loss(model, mixed, batch, ctx, hyper, key)
    return global_loss + (personal - jax.lax.stop_gradient(personal))


def clipped_sgd(hyper: Hyper) -> optax.GradientTransformation:
    """SGD at ``client_lr`` on ``w`` and ``v``, at ``apfl_alpha_lr`` on ``α``, which stays in ``[0, 1]``."""

    def update(grads: APFLParams, state, params: APFLParams):
        lr = hyper["client_lr"]
        step = jax.tree.map(lambda g: -lr.astype(g.dtype) * g, (grads.w, grads.v))
        alpha = params.alpha - hyper["apfl_alpha_lr"].astype(grads.alpha.dtype) * grads.alpha
        return APFLParams(*step, jnp.clip(alpha, 0, 1) - params.alpha), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def send_global(params: APFLParams, ctx: LocalContext, hyper: Hyper) -> tuple[Update, APFLState]:
    """The update ``w_t - w``; the client keeps ``(v_i, α_i)``."""
    del hyper
    update = jax.tree.map(lambda s, p: s - p, ctx.start.w, params.w)
    return update, APFLState(params.v, params.alpha, jnp.ones((), bool))


def personalised(state: ServerState, own: APFLState) -> Params:
    """Client ``i``'s model ``α_i v_i + (1 - α_i) w``, or ``w`` before its first round."""
    mixed = mix(own.alpha, own.v, state.params)
    return jax.tree.map(lambda m, w: jnp.where(own.started, m, w), mixed, state.params)


def apfl(
    *, alpha: float = 0.5, alpha_lr: float = 0.05, client_lr: float = 0.05,
    server_lr: float = 1.0,
) -> FederatedAlgorithm:  # fmt: skip
    """APFL with every client's mixing weight starting at ``alpha`` and learned at ``alpha_lr``.

    Args:
      alpha: each client's initial mixing weight α_i, in [0, 1] (1: its own model alone).
      alpha_lr: η_α, the step size of α_i (traced as ``apfl_alpha_lr``).
      client_lr: η, the local learning rate of w and v_i (traced as ``client_lr``).
      server_lr: the server's step along the mean update (traced as ``server_lr``; 1: FedAvg's
        mean of the models).

    Hyperparameters:
      apfl_alpha_lr: η_α >= 0, the step size of each client's mixing weight α_i along
        -<v_i - w, ∇f_i(v̄_i)>, clipped to [0, 1]; 0 keeps α_i at ``alpha``.

    References:
      Deng, Kamani and Mahdavi, "Adaptive Personalized Federated Learning" (arXiv:2003.13461,
      2020), Algorithm 1.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    sgd = optimizers.sgd("client", lr=client_lr)

    def client_init(params: Params) -> APFLState:
        return APFLState(params, jnp.asarray(alpha, float_dtype(params)), jnp.zeros((), bool))

    algorithm = fedavg(
        client_optimizer=optimizers.HyperOptimizer(clipped_sgd, sgd.hyper),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=apfl_loss,
        extra_hyper=(("apfl_alpha_lr", float(alpha_lr)),),
        hyper_ranges=(("apfl_alpha_lr", NON_NEGATIVE),),
        client_init=client_init,
        client_start=start_triple,
        client_finalize=send_global,
        name="apfl",
    )
    return attach(algorithm, Personalized(personalised))
