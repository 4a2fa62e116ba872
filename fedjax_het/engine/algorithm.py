"""The core contract every federated algorithm implements (docs/design.md §3); its one home.

An algorithm is a frozen dataclass of pure functions built by a factory that
takes its structural options (optax's ``GradientTransformation`` pattern).
Numbers a sweep may vary are not closed over: they arrive as the traced
``hyper`` dict, whose names and defaults the algorithm declares. The engine
never asks an algorithm its name: everything it does differently goes
through these functions.

One round, for the clients of a cohort::

    payload = broadcast(server_state)          # params, and whatever else clients need
    # per client k (local.py), with its persistent client_state_k:
    start, state = local.start(model, payload, client_state_k, batches_k, hyper, key)
    ctx = LocalContext(payload, start, state, step, num_steps)
    params = start; for each step s < num_steps:
        params -= local.optimizer(hyper) applied to grad of local.loss(model, params, batch_s, ctx, hyper, key)
    update_k, client_state_k = local.finalize(params, ctx, hyper)
    # cohort.py: sums = Σ_k aggregator.contribute(update_k, weight_k, stats_k)
    server_state = server_update(server_state, aggregator.finalize(sums), hyper, server_key)

``client_state_k`` is kept only when the client's update counted (weight >
0): a client that failed, was late or was not selected keeps its state.
Client states are stored ``[num_clients, ...]`` on the device or on the host
(``fedjax_het.engine.client_store``); only the cohort's rows enter a round.

What a paper adds beyond this (a probe of the cohort, per-client freezing, sub-models, stale
updates, payload bytes, personal models, reports) is a *hook* (``engine.hooks``), attached
to the algorithm with ``hooks.attach`` and looked up by the round with ``algorithm.hook``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import TypeVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_het.engine.hyper import HyperSpec
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

HookT = TypeVar("HookT")


@struct.dataclass
class ClientStats:
    """What a client reports with its update.

    Attributes:
      loss_sum: Σ of the training loss over the examples it processed.
      examples: examples processed.
      steps: local steps taken (FedNova's tau_k).
      trained: the train mask it used (pytree of 0/1 shaped like, or broadcastable to,
        the params), or None when it trained every parameter.
      finite: whether every value of its update is finite (set by ``cohort.run_cohort``).
      staleness: int32 server versions between the model it trained from and the
        model its update is applied to (0: fresh; set by the engine when a round
        holds stale slots, docs/design.md §6), or None in a synchronous round.
      work_kept: the share of the full model's work the client kept, in (0, 1], or None
        for 1 (all of it). An algorithm that trains part of the model reports it for the
        selections that weigh clients by capability (``ClientRecord.work_kept``): FreezeFL
        its unfrozen layers over all layers (``L - n_k`` over ``L``, set by
        ``training.online``), a sub-model its width ratio (FjORD's ``p``).
    """

    loss_sum: jax.Array
    examples: jax.Array
    steps: jax.Array
    trained: PyTree | None = None
    finite: jax.Array | None = None
    staleness: jax.Array | None = None
    work_kept: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """A named rule for combining client updates, as a sum over clients then a finish.

    Summing lets the cohort run in chunks with a running sum as the only
    carry (docs/design.md §3): memory is ``chunk x params``, not ``cohort x params``.

    Attributes:
      contribute: ``(update, weight, stats) -> pytree`` one client's share of the
        sums. A client of weight 0 must contribute exact zeros, whatever its update
        holds (a diverged client's NaNs included).
      finalize: ``sums -> aggregate``.
    """

    contribute: Callable[[Update, jax.Array, ClientStats], PyTree]
    finalize: Callable[[PyTree], Update]


def weighted_or_zero(weight: jax.Array, value: jax.Array) -> jax.Array:
    """``weight * value``, exactly 0 where the weight is 0 (``where``, so NaN cannot leak)."""
    return jnp.where(weight > 0, weight.astype(value.dtype) * value, 0)


def exact_divide(x: jax.Array, divisor: jax.Array) -> jax.Array:
    """``x / divisor`` correctly rounded in every entry; ``divisor`` is a scalar or has
    ``x``'s leading axes (one divisor per row, e.g. per cluster). XLA rewrites a division by
    a broadcast divisor into a multiply by its reciprocal (1 ulp off in about a third of the
    entries); the barrier on the broadcast keeps the division."""
    divisor = divisor.astype(x.dtype).reshape(*divisor.shape, *[1] * (x.ndim - divisor.ndim))
    return x / jax.lax.optimization_barrier(jnp.broadcast_to(divisor, x.shape))


def _float_dtype(tree: PyTree) -> jnp.dtype:
    """The widest float of ``tree``'s leaves, float32 at least: the run's float width (a
    float64 run's weights are summed in float64)."""
    floats = [x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return functools.reduce(jnp.promote_types, floats, jnp.dtype(jnp.float32))


def weighted_mean() -> Aggregator:
    """``Σ_k w_k u_k / Σ_k w_k`` over clients with ``w_k > 0``; zero when nobody counts."""

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        weighted = jax.tree.map(lambda u: weighted_or_zero(weight, u), update)
        return weighted, weighted_or_zero(weight, jnp.ones((), _float_dtype(update)))

    def finalize(sums: PyTree) -> Update:
        weighted, total = sums
        return jax.tree.map(lambda s: exact_divide(s, jnp.maximum(total, 1e-30)), weighted)

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
        weighted = jax.tree.map(lambda u, m: weighted_or_zero(weight, m * u), update, mask)
        counts = jax.tree.map(lambda u, m: weighted_or_zero(weight, jnp.broadcast_to(m, u.shape)), update, mask)
        return weighted, counts

    def finalize(sums: PyTree) -> Update:
        weighted, counts = sums
        return jax.tree.map(lambda s, c: jnp.where(c > 0, s / jnp.where(c > 0, c, 1), 0), weighted, counts)

    return Aggregator(contribute, finalize)


@struct.dataclass
class LocalContext:
    """What a client's local objective and finalisation may read besides its params.

    Attributes:
      broadcast: what the server sent this round (``broadcast(server_state)``):
        the global params, or more (SCAFFOLD's control variate, IFCA's models).
      start: the params local training started from (``client_start``).
      client_state: this client's persistent state, as ``client_start`` returned it.
      step: int32 index of the local step being taken (in ``local_loss``); in
        ``client_finalize``, equal to ``num_steps``.
      num_steps: int32 steps this client takes this round (its epochs or steps,
        cut by a deadline, partial work or a dropout).
      key: in ``client_finalize``, this client's key for the round's randomised
        encodings (``fedjax_het.transforms.compression``); None in ``local_loss`` (which has its own).
      client_id: int32 id of the client (Agnostic FedAvg looks up its domain), or None
        outside the engine's local training.
    """

    broadcast: PyTree
    start: Params
    client_state: ClientState
    step: jax.Array
    num_steps: jax.Array
    key: PRNGKey | None = None
    client_id: jax.Array | None = None


@struct.dataclass
class Batches:
    """A client's batches of the round, ``[max_steps, batch, ...]``.

    ``mask`` is 0 for padding examples and for every step at or past the
    client's ``num_steps``, so a sum over ``mask`` covers exactly the examples
    it trains on this round.
    """

    x: jax.Array
    y: jax.Array
    mask: jax.Array


def float_dtype(tree: PyTree) -> jnp.dtype:
    """The dtype a pytree's floats promote to (float32 for a tree without floats): float64 in x64 runs."""
    floats = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.result_type(*floats) if floats else jnp.dtype(jnp.float32)


def require_model_delta(update: Update, params: Params, name: str, why: str) -> None:
    """Raises a one-line ValueError unless ``update`` is shaped like ``params`` (a model delta):
    what update transforms (compression, DP clipping) can act on; ``why`` says what they need."""
    if jax.tree.structure(update) != jax.tree.structure(params):
        raise ValueError(f"{name} sends more than a model delta; {why}")


def model_loss(
    model: Model, params: Params, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """The plain local objective: the model's masked mean loss on one batch."""
    del ctx, hyper
    x, y, mask = batch
    return model.loss(model.apply(params, x, train=True, key=key), y, mask)


def mean_loss(model: Model, params: Params, batches: Batches) -> jax.Array:
    """Mean loss of ``params`` (evaluation mode) over the examples ``batches.mask`` keeps; 0 if none.

    What a client measures before training: IFCA's cluster choice, q-FFL's ``F_k(w_t)``.
    """

    def losses(x, y):
        return model.per_example_loss(model.apply(params, x, train=False, key=None), y)

    def one_step(total, batch):
        x, y, mask = batch
        return total + jnp.sum(jnp.where(mask, losses(x, y), 0)), None

    dtype = jax.eval_shape(losses, batches.x[0], batches.y[0]).dtype  # float64 in x64 runs
    total, _ = jax.lax.scan(one_step, jnp.zeros((), dtype), (batches.x, batches.y, batches.mask))
    return total / jnp.maximum(jnp.sum(batches.mask), 1).astype(dtype)


def start_from_broadcast(
    model: Model, broadcast: Params, client_state: ClientState, batches: Batches, hyper: Hyper,
    key: PRNGKey,
) -> tuple[Params, ClientState]:
    """Local training starts from the broadcast params; the client state is unchanged."""
    del model, batches, hyper, key
    return broadcast, client_state


def delta_update(params: Params, ctx: LocalContext, hyper: Hyper) -> tuple[Update, ClientState]:
    """The update ``start - params`` (a pseudo-gradient); the client state is unchanged."""
    del hyper
    return jax.tree.map(lambda s, p: s - p, ctx.start, params), ctx.client_state


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """What a client does with the broadcast (FedJAX's client init / step / final).

    Attributes:
      optimizer: ``hyper -> optax.GradientTransformation`` for local steps.
      loss: ``(model, params, batch, ctx, hyper, key) -> scalar`` the objective of one local
        step; ``ctx`` is the client's ``LocalContext``.
      start: ``(model, payload, client_state, batches, hyper, key) -> (params,
        client_state)`` the params local training starts from; it may read the round's
        ``Batches`` (IFCA picks its cluster by loss, q-FFL measures ``F_k(w_t)``).
      finalize: ``(params, ctx, hyper) -> (update, client_state)`` from the trained params.
    """

    optimizer: Callable[[Hyper], optax.GradientTransformation]
    loss: Callable[..., jax.Array] = model_loss
    start: Callable[..., tuple[Params, ClientState]] = start_from_broadcast
    finalize: Callable[[Params, LocalContext, Hyper], tuple[Update, ClientState]] = delta_update


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
    """A federated algorithm as pure functions; hashable, so static under ``jit``.

    Attributes:
      name: registry name.
      hyperparameters: every traced hyperparameter, its default and allowed values.
      server_init: ``(params, hyper, num_clients) -> server_state``; ``num_clients``
        is the population size N (SCAFFOLD and FedDyn scale by ``1 / N``).
      broadcast: ``server_state -> payload`` what every selected client downloads.
      client_init: ``params -> client_state`` one client's initial persistent
        state (stored ``[num_clients, ...]``; ``()`` for none).
      local: what a client does in the round (``LocalTraining``).
      aggregator: how updates combine.
      server_update: ``(server_state, aggregate, hyper, key) -> server_state``; ``key`` is
        the round's server key (the "server" stream of ``fold_in(seed, round)``) for
        server-side randomness (DP-FedAvg's noise), or None outside a run.
      global_params: ``server_state -> params`` the global model that is evaluated.
      hooks: what papers add to this contract (``engine.hooks``), at most one of each type.
    """

    name: str
    hyperparameters: HyperSpec
    server_init: Callable[[Params, Hyper, int], ServerState]
    broadcast: Callable[[ServerState], PyTree]
    client_init: Callable[[Params], ClientState]
    local: LocalTraining
    aggregator: Aggregator
    server_update: Callable[[ServerState, Update, Hyper, PRNGKey | None], ServerState]
    global_params: Callable[[ServerState], Params]
    hooks: tuple[object, ...] = ()

    def __post_init__(self):
        spec = self.hyperparameters
        stray = sorted({name for name, _ in spec.ranges} - {name for name, _ in spec.defaults})
        if stray:
            raise ValueError(f"{self.name}: hyper_ranges names no hyperparameter {stray[0]!r}")
        for name, value in spec.defaults:
            self.check_hyper(name, value)
        kinds = [type(hook) for hook in self.hooks]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"{self.name}: two hooks of one type in {kinds}")

    def hook(self, kind: type[HookT]) -> HookT | None:
        """The algorithm's hook of type ``kind`` (``engine.hooks``), or None."""
        return next((hook for hook in self.hooks if isinstance(hook, kind)), None)

    def hyper(
        self, overrides: Mapping[str, float] | None = None, *,
        dtype: jax.typing.DTypeLike = jnp.float32,
    ) -> Hyper:
        """The traced hyperparameters: defaults, then ``overrides``; unknown names are an error.

        Values may be Python numbers or arrays (an array with a leading axis
        is how ``jax.vmap`` sweeps one compiled program over settings), held
        as ``dtype`` (float64 in a float64 run).
        """
        return self.hyperparameters.values(overrides, owner=self.name, dtype=dtype)

    def check_hyper(self, name: str, value, *, label: str | None = None) -> None:
        """Raises a one-line ValueError when ``value`` (a number or array) is impossible for ``name``.

        Every hyperparameter must be finite (no inf, no NaN) and lie in its
        ``hyperparameters.ranges`` interval, if it has one. ``label`` names the value in
        the message (default ``"<algorithm>: <name>"``; the config passes its key).
        """
        self.hyperparameters.check(name, value, label=label or f"{self.name}: {name}")
