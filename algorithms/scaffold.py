"""SCAFFOLD: local SGD corrected by control variates, against client drift.

Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning" (ICML 2020), Algorithm 1 with
control variate option II. The server holds the model ``x`` and the control
variate ``c``; client ``i`` holds its own ``c_i`` (zeros at first). A selected
client starts from ``y = x``, takes its ``K`` local steps

    y <- y - η_l (g_i(y) - c_i + c),

then updates its control variate and reports the differences

    c_i+ = c_i - c + (x - y) / (K η_l),     Δy_i = y - x,     Δc_i = c_i+ - c_i;

over the clients that count (weight ``w_i > 0``) the server steps

    x <- x + η_g Σ_i w_i Δy_i / Σ_i w_i,     c <- c + (1 / N) Σ_i Δc_i,

``N`` the population (``server_init``'s ``num_clients``). The correction is
the linear term ``<y, c - c_i>`` added to the local loss (its gradient is
``c - c_i``; ``gradient_term`` adds the gradient without computing the term's
value); the ``x`` step is FedAvg's server SGD on ``x - y`` (traced
``client_lr = η_l``, ``server_lr = η_g``). With ``c = c_i = 0`` a round is
FedAvg's.

>>> import jax.numpy as jnp
>>> algorithm = scaffold(client_lr=0.1)
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr']
>>> state = algorithm.server_init({"w": jnp.ones(2)}, algorithm.hyper(), 10)
>>> algorithm.broadcast(state).control["w"].tolist()
[0.0, 0.0]

.. warning:: ``Δx`` is the engine's weighted mean: example-weighted by default
   (``Round(weighting="examples")``); ``weighting="uniform"`` gives the
   paper's ``1 / |S|``. ``c`` moves by the unweighted ``1 / N`` sum, as in the paper.
.. warning:: ``K`` is the number of steps the client actually took this round
   (``ctx.num_steps``, cut by a deadline or partial work). A client that took
   no step keeps ``c_i`` (``Δc_i = 0``); if it counts, its ``Δy_i = 0`` still
   enters the weighted mean, as in FedAvg.
.. warning:: Option II assumes plain local SGD (the factory offers no other
   client optimizer). The reported training loss is the model's loss alone,
   without the correction term.
.. warning:: Client states hold a whole model per client
   (``[num_clients, ...params]``), and the payload is two models each way:
   the online payload accounting, which counts the broadcast ``(x, c)``, counts both.
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
from fedjax_het.engine.algorithm import (
    Aggregator,
    Batches,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    model_loss,
    weighted_mean,
)
from fedjax_het.models import Model
from fedjax_het.typing import Batch, ClientState, Hyper, Params, PRNGKey, PyTree, Update


@struct.dataclass
class ServerState:
    """FedAvg's model and server-optimizer state, the control variate ``c`` and ``N``."""

    params: Params
    opt_state: PyTree
    control: Params
    num_clients: jax.Array  # float32 population size N


@struct.dataclass
class Payload:
    """What a selected client downloads: the model ``x`` and the control variate ``c``."""

    params: Params
    control: Params


@struct.dataclass
class ClientUpdate:
    """What a client sends: FedAvg's pseudo-gradient ``x - y_i`` and ``Δc_i``."""

    delta: Update
    control_delta: Params


def start_from_model(
    model: Model,
    payload: Payload,
    control: ClientState,
    batches: Batches,
    hyper: Hyper,
    key: PRNGKey,
) -> tuple[Params, ClientState]:
    """Local training starts from ``x``; the client keeps ``c_i``."""
    del model, batches, hyper, key
    return payload.params, control


def corrected_loss(
    model: Model, params: Params, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """The model's loss plus ``<y, c - c_i>`` (as ``gradient_term``: its value is the model's loss)."""
    drift = jax.tree.map(lambda c, ci: c - ci, ctx.broadcast.control, ctx.client_state)
    return model_loss(model, params, batch, ctx, hyper, key) + gradient_term(params, drift)


def option_two(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[ClientUpdate, ClientState]:
    """``c_i+ = c_i - c + (x - y) / (K η_l)`` (``c_i`` kept when ``K = 0``); sends ``(x - y, Δc_i)``."""
    delta = jax.tree.map(lambda x, y: x - y, ctx.start, params)
    took_steps = ctx.num_steps > 0
    steps = jnp.maximum(ctx.num_steps, 1)
    inverse = lambda d: 1 / (steps.astype(d.dtype) * hyper["client_lr"].astype(d.dtype))
    control = jax.tree.map(
        lambda ci, c, d: jnp.where(took_steps, ci - c + d * inverse(d), ci),
        ctx.client_state,
        ctx.broadcast.control,
        delta,
    )
    control_delta = jax.tree.map(lambda new, old: new - old, control, ctx.client_state)
    return ClientUpdate(delta, control_delta), control


def scaffold_mean(base: Aggregator) -> Aggregator:
    """``base`` over the pseudo-gradients, and the plain sum of ``Δc_i`` over clients that count."""

    def contribute(update: ClientUpdate, weight: jax.Array, stats: ClientStats) -> PyTree:
        kept = jax.tree.map(lambda d: jnp.where(weight > 0, d, 0), update.control_delta)
        return base.contribute(update.delta, weight, stats), kept

    def finalize(sums: PyTree) -> tuple[Update, Params]:
        delta_sums, control_sum = sums
        return base.finalize(delta_sums), control_sum

    return Aggregator(contribute, finalize)


def scaffold(*, client_lr: float = 0.05, server_lr: float = 1.0) -> FederatedAlgorithm:
    """SCAFFOLD (option II) with local SGD at ``client_lr`` and server SGD at ``server_lr``.

    Args:
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Karimireddy, Kale, Mohri, Reddi, Stich and Suresh, "SCAFFOLD: Stochastic Controlled
      Averaging for Federated Learning" (ICML 2020), Algorithm 1, option II.
    """
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=corrected_loss,
        aggregator=scaffold_mean(weighted_mean()),
        client_init=lambda params: jax.tree.map(jnp.zeros_like, params),
        client_start=start_from_model,
        client_finalize=option_two,
        name="scaffold",
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        inner = base.server_init(params, hyper, num_clients)
        zeros = jax.tree.map(jnp.zeros_like, params)
        return ServerState(inner.params, inner.opt_state, zeros, jnp.float32(num_clients))

    def server_update(
        state: ServerState, aggregate: tuple[Update, Params], hyper: Hyper,
        key: PRNGKey | None = None,
    ) -> ServerState:
        pseudo_gradient, control_sum = aggregate
        inner = base.server_update(
            ModelState(state.params, state.opt_state), pseudo_gradient, hyper, key
        )
        control = jax.tree.map(
            lambda c, s: c + s / state.num_clients.astype(s.dtype), state.control, control_sum
        )
        return ServerState(inner.params, inner.opt_state, control, state.num_clients)

    return dataclasses.replace(
        base,
        server_init=server_init,
        broadcast=lambda state: Payload(state.params, state.control),
        server_update=server_update,
    )
