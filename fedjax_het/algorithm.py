"""The interface every federated algorithm implements (DESIGN.md §5).

An algorithm is a frozen dataclass of pure functions built by a factory that
takes its structural options (optax's ``GradientTransformation`` pattern).
Numbers a sweep may vary are not closed over: they arrive as the traced
``hyper`` dict, whose names and defaults the algorithm declares.

One round, for the clients of a cohort::

    payload = broadcast(server_state)
    # per client, in local.py: optimise local_loss from payload with client_optimizer(hyper)
    update, client_state = client_finalize(payload, local_params, client_state, hyper)
    # cohort.py: sums = Σ_k aggregator.contribute(update_k, weight_k, stats_k)
    server_state = server_update(server_state, aggregator.finalize(sums), hyper)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_het.models import Model
from fedjax_het.typing import (
    Batch,
    ClientState,
    Hyper,
    Params,
    PRNGKey,
    PyTree,
    ServerState,
    Update,
)


@struct.dataclass
class ClientStats:
    """What a client reports with its update.

    Attributes:
      loss_sum: Σ of the training loss over the examples it processed.
      examples: examples processed.
      steps: local steps taken (FedNova's tau_k).
      trained: the train mask it used (pytree of 0/1 shaped like, or broadcastable to,
        the params), or None when it trained every parameter.
    """

    loss_sum: jax.Array
    examples: jax.Array
    steps: jax.Array
    trained: PyTree | None = None


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """A named rule for combining client updates, as a sum over clients then a finish.

    Summing lets the cohort run in chunks with a running sum as the only
    carry (DESIGN.md §6): memory is ``chunk x params``, not ``cohort x params``.

    Attributes:
      contribute: ``(update, weight, stats) -> pytree`` one client's share of the
        sums. A client of weight 0 must contribute exact zeros, whatever its update
        holds (a diverged client's NaNs included).
      finalize: ``sums -> aggregate``.
    """

    contribute: Callable[[Update, jax.Array, ClientStats], PyTree]
    finalize: Callable[[PyTree], Update]


def _kept(weight: jax.Array, value: jax.Array) -> jax.Array:
    """``weight * value``, exactly 0 where the weight is 0 (``where``, so NaN cannot leak)."""
    return jnp.where(weight > 0, weight.astype(value.dtype) * value, 0)


def weighted_mean() -> Aggregator:
    """``Σ_k w_k u_k / Σ_k w_k`` over clients with ``w_k > 0``; zero when nobody counts."""

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        return jax.tree.map(lambda u: _kept(weight, u), update), _kept(weight, jnp.float32(1))

    def finalize(sums: PyTree) -> Update:
        weighted, total = sums
        return jax.tree.map(lambda s: s / jnp.maximum(total, 1e-30).astype(s.dtype), weighted)

    return Aggregator(contribute, finalize)


def masked_mean() -> Aggregator:
    """Per coordinate, ``Σ_k w_k m_k u_k / Σ_k w_k m_k`` over the clients that trained it.

    ``m_k`` is client k's train mask (``stats.trained``; all ones when None).
    A coordinate nobody trained gets 0. This is FreezeFL's layer-wise
    aggregation (Chou et al., "FreezeFL", 2023, §III-C) and the usual rule for
    sub-model training (HeteroFL, FjORD): a frozen or absent coordinate does
    not pull the average towards zero.
    """

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        mask = stats.trained
        if mask is None:
            mask = jax.tree.map(lambda u: jnp.ones((), u.dtype), update)
        weighted = jax.tree.map(lambda u, m: _kept(weight, m * u), update, mask)
        counts = jax.tree.map(lambda u, m: _kept(weight, jnp.broadcast_to(m, u.shape)), update, mask)
        return weighted, counts

    def finalize(sums: PyTree) -> Update:
        weighted, counts = sums
        return jax.tree.map(lambda s, c: jnp.where(c > 0, s / jnp.where(c > 0, c, 1), 0), weighted, counts)

    return Aggregator(contribute, finalize)


def model_loss(
    model: Model, params: Params, broadcast: Params, batch: Batch, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """The plain local objective: the model's masked mean loss on one batch."""
    del broadcast, hyper
    x, y, mask = batch
    return model.loss(model.apply(params, x, train=True, key=key), y, mask)


@dataclasses.dataclass(frozen=True)
class Freezing:
    """Per-client freezing chosen in the round, after a probe (FreezeFL, Chou et al. 2023, §III).

    Each selected client first trains ``ceil(probe_share * steps)`` of its
    local steps with every parameter, then picks a freeze *depth* ``d`` (its first ``d`` layers stop
    training and are not uploaded) from what the probe changed and what each
    depth would cost. The engine (``fedjax_het.online``) runs the probe,
    prices every depth with the client's profile, schedules the round with
    each client's upload bytes, and trains with the chosen mask from the end
    of its probe on.

    Attributes:
      probe_share: share of a client's local steps trained unfrozen before the choice.
      depth_masks: ``params -> pytree`` whose leaves are ``[D]`` 0/1 arrays:
        entry ``d`` says whether the leaf trains at freeze depth ``d``
        (depth 0 trains everything).
      choose: ``(probe_update, seconds [D], soft_deadline, hyper) -> depth``
        (int32), from the client's update after the probe and its expected
        round time at each depth; ``soft_deadline`` is the server's running
        estimate of a round's length (NaN before the first round).
    """

    probe_share: float
    depth_masks: Callable[[Params], PyTree]
    choose: Callable[[Update, jax.Array, jax.Array, Hyper], jax.Array]


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
    """A federated algorithm as pure functions; hashable, so static under ``jit``.

    Attributes:
      name: registry name.
      hyper_defaults: ``((name, default), ...)`` every traced hyperparameter.
      server_init: ``(params, hyper) -> server_state``.
      broadcast: ``server_state -> params`` the clients start from.
      client_init: ``params -> client_state`` (persistent, stored ``[num_clients, ...]``).
      client_optimizer: ``hyper -> optax.GradientTransformation`` for local steps.
      local_loss: ``(model, params, broadcast, batch, hyper, key) -> scalar``.
      client_finalize: ``(broadcast, local_params, client_state, hyper) -> (update, client_state)``.
      aggregator: how updates combine.
      server_update: ``(server_state, aggregate, hyper) -> server_state``.
      global_params: ``server_state -> params`` the model that is evaluated.
      freezing: per-client freezing chosen in the round (FreezeFL), or None.
    """

    name: str
    hyper_defaults: tuple[tuple[str, float], ...]
    server_init: Callable[[Params, Hyper], ServerState]
    broadcast: Callable[[ServerState], Params]
    client_init: Callable[[Params], ClientState]
    client_optimizer: Callable[[Hyper], optax.GradientTransformation]
    local_loss: Callable[..., jax.Array]
    client_finalize: Callable[..., tuple[Update, ClientState]]
    aggregator: Aggregator
    server_update: Callable[[ServerState, Update, Hyper], ServerState]
    global_params: Callable[[ServerState], Params]
    freezing: Freezing | None = None

    def hyper(self, overrides: Mapping[str, float] | None = None) -> Hyper:
        """The traced hyperparameters: defaults, then ``overrides``; unknown names are an error.

        Values may be Python numbers or arrays (an array with a leading axis
        is how ``jax.vmap`` sweeps one compiled program over settings).
        """
        defaults = dict(self.hyper_defaults)
        unknown = sorted(set(overrides or {}) - set(defaults))
        if unknown:
            raise ValueError(
                f"{self.name} has no hyperparameter {', '.join(map(repr, unknown))}; "
                f"it takes {', '.join(sorted(defaults)) or 'none'}"
            )
        merged = {**defaults, **(overrides or {})}
        return {k: jnp.asarray(v, jnp.float32) for k, v in merged.items()}
