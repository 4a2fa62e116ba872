"""Agnostic FedAvg: FedAvg for the worst mixture of the clients' domains.

Mohri, Sivek and Suresh, "Agnostic Federated Learning" (ICML 2019), Eq. (2) and its
Stochastic-AFL (Algorithm 1), run with FedAvg's local steps as in FedJAX's
``agnostic_fed_avg`` (Ro, Chen, Mathews, Mohri and Suresh, "Communication-Efficient Agnostic
Federated Averaging", Interspeech 2021). The clients fall into ``D`` domains; the objective is

    min_w max_{λ ∈ Δ_D} Σ_d λ_d L_d(w),

``L_d`` the mean loss over domain ``d``'s examples and ``Δ_D`` the probability simplex. In a
round with model ``w`` and weights ``λ``, the server first gathers, over the clients that count
(weights ``n_i``, the round's), each domain's mean loss at ``w`` on each of its clients'
examples, ``L_d``, and its share ``M_d = Σ_{i ∈ d} n_i``; client ``i`` of domain ``d(i)``
runs local SGD from ``w`` to ``w_i``; the server steps along the λ-weighted mean

    Δ = Σ_i β_i (w - w_i) / Σ_i β_i,    β_i = λ_d(i) n_i / M_d(i),

so that the clients of a domain together weigh ``λ_d``, and moves ``λ`` up the domain losses:

    projected (Mohri et al.):  λ <- Π_Δ(λ + γ L),
    eg (FedJAX, Ro et al.):    λ <- λ exp(γ L) / Σ_d λ_d exp(γ L_d),

``γ`` the traced ``domain_lr``, ``Π_Δ`` the Euclidean projection onto the simplex, ``L_d = 0``
for a domain with no client this round; ``λ`` starts uniform. The server's step on ``w`` is
FedAvg's (``server_lr``).

**Domains.** ``domains`` gives each client's domain id, ``domains[k]`` for client ``k``
(``0 .. D-1``, every id used, one entry per client of the population). Left empty, each
client is its own domain (``D = N``), the setting of Mohri et al.'s experiments on
clients: then ``β_i = λ_i``.

>>> algorithm = agnostic_fedavg(domains=(0, 1, 1), domain_lr=0.1)
>>> sorted(algorithm.hyper())
['client_lr', 'domain_lr', 'server_lr']

.. warning:: ``L`` and ``M`` are gathered in a round trip before training
   (a ``CohortProbe`` hook; FedJAX's first pass), so ``M`` is this round's: FedJAX
   estimates it from a window of earlier rounds to save the round trip, which fails when a
   domain's clients were absent from it (``λ_d / 0``). No window here.
.. warning:: Domains are per client (FedJAX's are per example, a ``domain_id`` feature); the
   losses are taken in evaluation mode on the run's model. The stochastic ascent direction
   is the observed ``L``, not Mohri et al.'s importance-weighted estimate. When nobody
   counts, neither ``w`` nor ``λ`` moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct
from optax.projections import projection_simplex

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState as ModelState
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.scaffold import start_from_model
from fedjax_het.engine.algorithm import (
    Aggregator,
    Batches,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    weighted_or_zero,
)
from fedjax_het.engine.hooks import CohortProbe, attach
from fedjax_het.engine.hyper import NON_NEGATIVE
from fedjax_het.models import Model
from fedjax_het.typing import ClientState, Hyper, Params, PRNGKey, PyTree, Update

DOMAIN_UPDATES = ("projected", "eg")


@struct.dataclass
class ServerState:
    """The model and server-optimizer state, ``λ``, and this round's ``L`` and ``M`` ([D] each)."""

    params: Params
    opt_state: PyTree
    weights: jax.Array
    losses: jax.Array
    mass: jax.Array


@struct.dataclass
class Payload:
    """What a client downloads: the model and ``α_d = λ_d / M_d`` of every domain (0 if absent)."""

    params: Params
    alpha: jax.Array


@struct.dataclass
class AgnosticUpdate:
    """What a client sends: FedAvg's ``w - w_i`` and its domain's ``α_d``."""

    delta: Update
    alpha: jax.Array


def domain_step(
    weights: jax.Array, losses: jax.Array, lr: jax.Array, rule: str = "projected"
) -> jax.Array:
    """``λ`` moved up the domain ``losses``: projected gradient ascent or exponentiated gradient.

    >>> moved = domain_step(jnp.array([0.5, 0.5]), jnp.array([1.0, 0.0]), jnp.float32(0.2))
    >>> [round(w, 6) for w in moved.tolist()]
    [0.6, 0.4]
    """
    if rule == "projected":
        return projection_simplex(weights + lr * losses)
    return jax.nn.softmax(jnp.log(weights) + lr * losses)


def _domain_losses(
    domain_of: Callable[[jax.Array], jax.Array],
) -> Callable[..., tuple[jax.Array, jax.Array, jax.Array]]:
    """The probe's ``measure``: the client's loss sum and example count at ``w``, and a 1, each
    in its domain's entry of a ``[D]`` vector (``D`` from the payload)."""

    def measure(model: Model, payload: Payload, client_id: jax.Array, examples: Batches,
                hyper: Hyper, key: PRNGKey) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
        del hyper, key

        def one_batch(total, batch):
            xb, yb, mask = batch
            outputs = model.apply(payload.params, xb, train=False, key=None)
            return total + jnp.sum(jnp.where(mask, model.per_example_loss(outputs, yb), 0)), None

        dtype = payload.alpha.dtype
        total, _ = jax.lax.scan(one_batch, jnp.zeros((), dtype), (examples.x, examples.y,
                                                                   examples.mask))  # fmt: skip
        slot = jax.nn.one_hot(domain_of(client_id), payload.alpha.shape[0], dtype=dtype)
        return total * slot, jnp.sum(examples.mask).astype(dtype) * slot, slot

    return measure


def _domain_sums() -> Aggregator:
    """Sums over the clients that count: loss sums and example counts (unweighted), and the
    round's weights ``n_i`` (``M``), by domain."""

    def contribute(value, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        losses, counts, slot = value
        keep = lambda x: jnp.where(weight > 0, x, 0)
        return keep(losses), keep(counts), weighted_or_zero(weight, slot)

    return Aggregator(contribute, lambda sums: sums)


def attach_domains(state: ServerState, sums: tuple[jax.Array, ...]) -> ServerState:
    """The server state with this round's mean domain losses ``L`` and masses ``M``."""
    losses, counts, mass = sums
    mean = jnp.where(counts > 0, losses / jnp.where(counts > 0, counts, 1), 0)
    return state.replace(losses=mean, mass=mass)


def lambda_weighted_mean() -> Aggregator:
    """``Σ_i β_i Δ_i / Σ_i β_i`` with ``β_i = n_i α_d(i)`` over the clients with ``β_i > 0``;
    zero when there are none. Sums in the update's dtype (float64 in a float64 run)."""

    def contribute(update: AgnosticUpdate, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        beta = weight * update.alpha
        weighted = jax.tree.map(lambda d: weighted_or_zero(beta, d), update.delta)
        return weighted, weighted_or_zero(beta, jnp.ones((), update.alpha.dtype))

    def finalize(sums: PyTree) -> Update:
        weighted, total = sums
        return jax.tree.map(lambda s: s / jnp.maximum(total, 1e-30).astype(s.dtype), weighted)

    return Aggregator(contribute, finalize)


def share_weights(state: ServerState) -> Payload:
    """The model and ``α_d = λ_d / M_d`` (0 for a domain absent this round)."""
    present = state.mass > 0
    alpha = state.weights / jnp.where(present, state.mass, 1)
    return Payload(state.params, jnp.where(present, alpha, 0))


def _sender(domain_of: Callable[[jax.Array], jax.Array]) -> Callable:
    """``client_finalize``: FedAvg's ``w - w_i`` with the client's ``α_d``; no client state."""

    def send(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[AgnosticUpdate, ClientState]:
        delta = jax.tree.map(lambda s, p: s - p, ctx.start, params)
        return AgnosticUpdate(
            delta, ctx.broadcast.alpha[domain_of(ctx.client_id)]
        ), ctx.client_state

    return send


def _check_domains(domains: tuple[int, ...]) -> int:
    """``D`` for a valid ``domains`` (0 when empty: one domain per client)."""
    if not domains:
        return 0
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in domains):
        raise ValueError(f"domains must be integers >= 0, got {list(domains)}")
    count = max(domains) + 1
    if set(domains) != set(range(count)):
        raise ValueError(f"domains must use every id 0..{count - 1}, got {sorted(set(domains))}")
    return count


def agnostic_fedavg(
    *, domains: tuple[int, ...] = (), domain_lr: float = 0.01, domain_update: str = "projected",
    client_lr: float = 0.05, server_lr: float = 1.0,
) -> FederatedAlgorithm:  # fmt: skip
    """Agnostic FedAvg: the clients' updates weighted by the domain weights ``λ``, which the
    server moves up the domains' losses.

    Args:
      domains: client k's domain id at domains[k] (ids 0 .. D-1, each used, one entry per
        client of the population); empty: every client its own domain.
      domain_lr: γ, the step size of λ (traced as ``domain_lr``).
      domain_update: how λ moves: "projected", projected gradient ascent (Mohri et al. 2019),
        or "eg", exponentiated gradient (FedJAX's agnostic_fed_avg).
      client_lr: the local learning rate (traced as ``client_lr``).
      server_lr: the server's step along the λ-weighted mean update (traced as ``server_lr``;
        1: the mean of the models).

    Hyperparameters:
      domain_lr: γ >= 0, the step size of the domain weights λ up the domains' mean losses
        at the round's model; 0 keeps λ uniform.

    References:
      Mohri, Sivek and Suresh, "Agnostic Federated Learning" (ICML 2019), Eq. (2) and
      Algorithm 1; Ro, Chen, Mathews, Mohri and Suresh, "Communication-Efficient Agnostic
      Federated Averaging" (Interspeech 2021).
    """
    num_domains = _check_domains(tuple(domains))
    if domain_update not in DOMAIN_UPDATES:
        raise ValueError(f"domain_update must be one of {DOMAIN_UPDATES}, got {domain_update!r}")
    table = jnp.asarray(domains, jnp.int32)
    domain_of = (lambda k: table[k]) if num_domains else (lambda k: k)

    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        aggregator=lambda_weighted_mean(),
        extra_hyper=(("domain_lr", float(domain_lr)),),
        hyper_ranges=(("domain_lr", NON_NEGATIVE),),
        client_start=start_from_model,
        client_finalize=_sender(domain_of),
        name="agnostic_fedavg",
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        if num_domains and len(domains) != num_clients:
            raise ValueError(f"domains names {len(domains)} clients, the data has {num_clients}")
        count = num_domains or num_clients
        inner = base.server_init(params, hyper, num_clients)
        dtype = hyper["domain_lr"].dtype
        zeros = jnp.zeros(count, dtype)
        return ServerState(inner.params, inner.opt_state, jnp.full(count, 1 / count, dtype),
                           zeros, zeros)  # fmt: skip

    def server_update(
        state: ServerState, mean_delta: Update, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        inner = base.server_update(
            ModelState(state.params, state.opt_state), mean_delta, hyper, key
        )
        moved = domain_step(state.weights, state.losses, hyper["domain_lr"], domain_update)
        weights = jnp.where(jnp.sum(state.mass) > 0, moved, state.weights)
        return state.replace(params=inner.params, opt_state=inner.opt_state, weights=weights)

    algorithm = dataclasses.replace(
        base, server_init=server_init, broadcast=share_weights, server_update=server_update
    )
    return attach(algorithm, CohortProbe(_domain_losses(domain_of), _domain_sums(), attach_domains))
