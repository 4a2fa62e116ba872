"""Differentially private federated averaging (DP-FedAvg) and the privacy it spends.

McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent
Language Models" (ICLR 2018), Algorithm 1 with the fixed-denominator
estimator: every client's update is clipped to L2 norm ``C``,
``π(Δ, C) = Δ · min(1, C / ||Δ||)`` (the norm over the whole update), and the
server adds Gaussian noise of standard deviation ``z C`` to the sum over the
clients that count, then divides by the cohort size ``m`` (not by how many
counted):

    Δ = (Σ_k π(Δ_k, C) + N(0, z² C² I)) / m.

Every client weighs the same (the paper's ``w_k = 1``). Clipping runs in each
client's program and the noise in the server's, from the round's server key
(``round.server_stream``), so a run stays reproducible to the bit. ``C``
(``dp_clip``) and ``z`` (``dp_noise``) are traced hyperparameters.

The privacy spent comes from ``dp-accounting``'s Rényi-DP accountant (Mironov,
Talwar and Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian
Mechanism"): each round is the Gaussian mechanism of noise multiplier ``z``
on a cohort Poisson-sampled at rate ``q = m / N``, as in McMahan et al.'s
analysis (§3), composed over the rounds run. The engine's uniform sampler
draws exactly ``m`` of ``N`` without replacement; ``epsilon_fixed_size`` is
that mechanism's ε (replace-one neighbours, Wang, Balle and Kasiviswanathan
2019), which is larger. Deadlines and dropouts only remove contributions, so
both are upper bounds for runs with a ``[system]``; selections that learn
(Oort, power-of-choice) or select among the ready are not uniform, and
neither figure covers them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het import rng
from fedjax_het.engine.algorithm import (
    Aggregator,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    LocalTraining,
    require_model_delta,
)
from fedjax_het.engine.hooks import CohortProbe, Personalized, RunReport, ServerMetrics, attach
from fedjax_het.engine.hyper import POSITIVE, UNIT, HyperSpec, Interval
from fedjax_het.transforms.compressor import at_least_float32, pairwise_sum
from fedjax_het.typing import Hyper, Params, PRNGKey, PyTree, ServerState, Update

ORDERS = tuple(range(2, 257))  # integer Rényi orders: exact for both sampling events
# The largest noise multiplier accepted. Above it dp-accounting's RDP computation loses
# precision (negative divergences from about 1e4 at q = 1e-7, exceptions from about 1e9),
# and noise of 1000 clip norms on the sum already swamps any cohort's updates.
MAX_NOISE_MULTIPLIER = 1e3


@struct.dataclass
class PrivateState:
    """The wrapped algorithm's server state and the clip norm ``C`` it broadcasts."""

    inner: ServerState
    clip: jax.Array


@struct.dataclass
class ClippedUpdate:
    """A client's clipped update and whether it was within the clip norm (``b_k``)."""

    delta: Update
    within: jax.Array


def private(
    algorithm: FederatedAlgorithm,
    *,
    cohort_size: int,
    clip_norm: float = 1.0,
    noise_multiplier: float = 1.0,
    delta: float = 1e-5,
    adaptive: bool = False,
    target_quantile: float = 0.5,
    clip_lr: float = 0.2,
    count_noise: float | None = None,
) -> FederatedAlgorithm:
    """``algorithm`` trained as DP-FedAvg: clipped updates, a noised mean over ``cohort_size``.

    The algorithm's aggregator is replaced by DP-FedAvg's; its local training
    and its server optimizer (the noised mean is the pseudo-gradient) stay. It
    applies to algorithms whose update is a model delta (the FedAvg family,
    FedProx); others are refused when the round is traced. The run's summary
    gets a ``privacy`` entry (``report``) at ``delta``.

    With ``adaptive``, the clip norm follows the ``target_quantile`` of the
    update norms (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially
    Private Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1 with
    the geometric update): ``clip_norm`` is the first ``C``; clients also send
    ``b_k = [||Δ_k|| <= C]``, the server noises their count with standard
    deviation ``σ_b = count_noise`` (default ``cohort_size / 20``, the paper's)
    and sets ``C <- C exp(-η_C (b̄ - γ))``. The update's noise multiplier becomes
    ``z_Δ = (z^-2 - (2 σ_b)^-2)^(-1/2)``, so that both releases together are the
    Gaussian mechanism of multiplier ``z`` (their Theorem 1) and the accountant is
    unchanged; ``z`` must stay below ``2 σ_b``. ``γ`` (``dp_quantile``) and
    ``η_C`` (``dp_clip_lr``) are traced.
    """
    if isinstance(cohort_size, bool) or not isinstance(cohort_size, int) or cohort_size < 1:
        raise ValueError(f"cohort_size must be an int >= 1, got {cohort_size!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if algorithm.hook(CohortProbe) is not None:
        raise ValueError(f"{algorithm.name} sends its clients' statistics before training "
                         "(a CohortProbe), which DP-FedAvg neither clips nor noises")
    require_accounting()  # before training: the privacy spent is computed after it
    sigma_b = cohort_size / 20 if count_noise is None else count_noise
    if adaptive and not sigma_b > 0:
        raise ValueError(f"count_noise must be > 0, got {count_noise}")
    noise_range = (
        Interval(0.0, 2 * sigma_b, closed_high=False)
        if adaptive and 2 * sigma_b <= MAX_NOISE_MULTIPLIER
        else Interval(0.0, MAX_NOISE_MULTIPLIER)
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> PrivateState:
        return PrivateState(algorithm.server_init(params, hyper, num_clients), hyper["dp_clip"])

    adaptive_hyper = (("dp_quantile", float(target_quantile)), ("dp_clip_lr", float(clip_lr)))
    dp_hyper = HyperSpec(
        (("dp_clip", float(clip_norm)), ("dp_noise", float(noise_multiplier)),
         *(adaptive_hyper if adaptive else ())),
        (("dp_clip", POSITIVE), ("dp_noise", noise_range),
         *((("dp_quantile", UNIT), ("dp_clip_lr", POSITIVE)) if adaptive else ())),
    )
    private = dataclasses.replace(
        algorithm,
        name=f"dp({algorithm.name})",
        hyperparameters=algorithm.hyperparameters + dp_hyper,
        server_init=server_init,
        broadcast=lambda state: (algorithm.broadcast(state.inner), state.clip),
        local=_clipping_clients(algorithm.local, algorithm.name),
        aggregator=clipped_sum(),
        server_update=_noised_server_update(
            algorithm, cohort_size=cohort_size, sigma_b=sigma_b, adaptive=adaptive
        ),
        global_params=lambda state: algorithm.global_params(state.inner),
    )
    return attach(private, *_private_hooks(algorithm, cohort_size, delta, adaptive))


def _private_hooks(
    algorithm: FederatedAlgorithm, cohort_size: int, delta: float, adaptive: bool
) -> list:
    """The hooks of the DP-wrapped ``algorithm``: the clip norm beside its own per-round
    metrics, the privacy report, and its personal models read through the wrapped state."""
    inner = algorithm.hook(ServerMetrics)

    def metrics(state: PrivateState) -> dict[str, jax.Array]:
        return {"clip_norm": state.clip, **(inner.metrics(state.inner) if inner else {})}

    hooks = [
        ServerMetrics(metrics),
        RunReport(_privacy_report(cohort_size=cohort_size, delta=delta, adaptive=adaptive)),
    ]
    if (personal := algorithm.hook(Personalized)) is not None:
        hooks.append(Personalized(lambda state, client: personal.params(state.inner, client)))
    return hooks


def _clipping_clients(local: LocalTraining, name: str) -> LocalTraining:
    """DP-FedAvg's client side: the algorithm's own (``local``, the algorithm ``name``) on the
    broadcast model, its update clipped to the broadcast clip norm."""

    def inner(ctx: LocalContext) -> LocalContext:
        return ctx.replace(broadcast=ctx.broadcast[0])

    def client_start(model, payload, client_state, batches, hyper, key):
        return local.start(model, payload[0], client_state, batches, hyper, key)

    def local_loss(model, params, batch, ctx, hyper, key):
        return local.loss(model, params, batch, inner(ctx), hyper, key)

    def client_finalize(params: Params, ctx: LocalContext, hyper: Hyper):
        update, state = local.finalize(params, inner(ctx), hyper)
        require_model_delta(
            update, ctx.start, name,
            "DP-FedAvg clips the model delta of the FedAvg family and FedProx",
        )  # fmt: skip
        bound = ctx.broadcast[1]
        return ClippedUpdate(clip(update, bound), norm(update) <= bound), state

    return LocalTraining(local.optimizer, local_loss, client_start, client_finalize)


def _noised_server_update(
    algorithm: FederatedAlgorithm, *, cohort_size: int, sigma_b: float, adaptive: bool
) -> Callable:
    """DP-FedAvg's server update: ``algorithm``'s on the noised mean of the clipped sum; with
    ``adaptive``, then the clip norm's geometric step towards the target quantile."""

    def server_update(
        state: PrivateState, total: ClippedUpdate, hyper: Hyper, key: PRNGKey | None = None
    ) -> PrivateState:
        if key is None:
            raise ValueError("DP-FedAvg's noise needs the round's server key (Round.step gives it)")
        z = hyper["dp_noise"]
        bound = state.clip if adaptive else hyper["dp_clip"]
        z_delta = 1 / jnp.sqrt(1 / z**2 - 1 / (2 * sigma_b) ** 2) if adaptive else z
        noised = add_noise(total.delta, z_delta * bound, key)
        mean = jax.tree.map(lambda s: s / cohort_size, noised)
        inner_state = algorithm.server_update(state.inner, mean, hyper, key)
        if not adaptive:
            return PrivateState(inner_state, bound)
        count_std = jnp.where(z > 0, sigma_b, 0.0)
        count = total.within + count_std * jax.random.normal(rng.stream(key, "count"))
        step = hyper["dp_clip_lr"] * (count / cohort_size - hyper["dp_quantile"])
        return PrivateState(inner_state, bound * jnp.exp(-step))

    return server_update


def _privacy_report(*, cohort_size: int, delta: float, adaptive: bool) -> Callable:
    """The ``report`` of a run: the privacy its ``rounds`` spent, and the settings assumed."""

    def report(hyper: dict[str, float], num_clients: int, rounds: int) -> dict:
        z = hyper["dp_noise"]
        spent = {
            "epsilon": epsilon(z, rounds, cohort_size, num_clients, delta),
            "epsilon_fixed_size": epsilon(z, rounds, cohort_size, num_clients, delta,
                                          fixed_size=True),
        }  # fmt: skip
        return {"privacy": {**spent, "delta": delta, "noise_multiplier": z,
                            "clip_norm": hyper["dp_clip"], "adaptive": adaptive,
                            "rounds": rounds, "sampling_rate": cohort_size / num_clients}}  # fmt: skip

    return report


def options(
    *,
    clip_norm: float = 1.0,
    noise_multiplier: float = 1.0,
    delta: float = 1e-5,
    target_epsilon: float = 0.0,
    adaptive: bool = False,
    target_quantile: float = 0.5,
    clip_lr: float = 0.2,
    count_noise: float = 0.0,
) -> dict[str, float]:
    """The ``[privacy]`` table, checked: ``private``'s options and an optional budget.

    Args:
      clip_norm: ``C``, the L2 norm every client's update is clipped to (> 0).
      noise_multiplier: ``z``: the noise on the sum has standard deviation ``z C``, in
        ``[0, MAX_NOISE_MULTIPLIER]``.
      delta: the δ at which ε is reported, in (0, 1).
      target_epsilon: stop the run at the last round whose ε stays within this
        (``rounds_within``); 0: no budget.
      adaptive: adaptive clipping (``private``): the clip norm follows a quantile of the
        clients' update norms, ``clip_norm`` being its first value (Andrew et al. 2021,
        Algorithm 1).
      target_quantile: ``γ``, the quantile of the update norms the clip norm tracks, in
        [0, 1] (the paper's default 0.5: the median); read with ``adaptive`` only.
      clip_lr: ``η_C``, the step of the geometric update ``C <- C exp(-η_C (b̄ - γ))``, > 0
        (the paper's 0.2); read with ``adaptive`` only.
      count_noise: ``σ_b``, the standard deviation of the noise on the count of clipped
        updates, >= 0; 0: the cohort size / 20 (the paper's); read with ``adaptive`` only.

    References:
      McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language
      Models", ICLR 2018 (DP-FedAvg, Algorithm 1). Andrew, Thakkar, McMahan and Ramaswamy,
      "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021 (adaptive,
      target_quantile, clip_lr, count_noise).
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if not 0 <= noise_multiplier <= MAX_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise_multiplier must lie in [0, {MAX_NOISE_MULTIPLIER:g}], got {noise_multiplier:g} "
            "(the privacy accountant loses precision above it, and such noise swamps any update)"
        )
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if not target_epsilon >= 0:
        raise ValueError(f"target_epsilon must be >= 0 (0: no budget), got {target_epsilon}")
    if not 0 <= target_quantile <= 1 or not clip_lr > 0 or not count_noise >= 0:
        raise ValueError(
            "adaptive clipping needs target_quantile in [0, 1], clip_lr > 0 and count_noise >= 0; "
            f"got {target_quantile}, {clip_lr} and {count_noise}"
        )
    return {"clip_norm": clip_norm, "noise_multiplier": noise_multiplier, "delta": delta,
            "target_epsilon": target_epsilon, "adaptive": adaptive,
            "target_quantile": target_quantile, "clip_lr": clip_lr,
            "count_noise": count_noise or None}  # fmt: skip


def norm(update: Update) -> jax.Array:
    """``||update||_2`` over every leaf, as a fixed pairwise sum (the same bits under ``vmap``)."""
    squares = (pairwise_sum(jnp.square(at_least_float32(u))) for u in jax.tree.leaves(update))
    return jnp.sqrt(sum(squares))


def clip(update: Update, clip_norm: jax.Array) -> Update:
    """``update · min(1, C / ||update||)`` (a zero update stays zero)."""
    size = norm(update)
    scale = jnp.minimum(1, clip_norm / jnp.where(size > 0, size, 1))
    return jax.tree.map(lambda u: (u * scale.astype(u.dtype)).astype(u.dtype), update)


def clipped_sum() -> Aggregator:
    """``Σ_k`` of the clipped updates and of ``b_k`` over the clients that count (weight > 0),
    each counted once; finalize keeps the sums."""

    def contribute(update: ClippedUpdate, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        kept = weight > 0
        return ClippedUpdate(
            jax.tree.map(lambda u: jnp.where(kept, u, 0), update.delta),
            jnp.where(kept, update.within, False).astype(jnp.float32),
        )

    return Aggregator(contribute, lambda total: total)


def add_noise(total: Update, std: jax.Array, key: PRNGKey) -> Update:
    """``total + N(0, std² I)``, leaf ``i`` from ``fold_in(key, i)``."""
    leaves, treedef = jax.tree.flatten(total)
    noised = [
        x + (std * jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype)).astype(x.dtype)
        for i, x in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, noised)


def epsilon(
    noise_multiplier: float, rounds: int, cohort_size: int, num_clients: int, delta: float, *,
    fixed_size: bool = False,
) -> float:
    """ε spent by ``rounds`` rounds of DP-FedAvg at ``delta`` (RDP accountant, ``ORDERS``).

    Poisson sampling at ``q = cohort_size / num_clients`` (add/remove
    neighbours), or with ``fixed_size`` exactly ``cohort_size`` of
    ``num_clients`` without replacement (replace-one neighbours). A noise
    multiplier of 0 spends ``inf``; no rounds spend 0.
    """
    dp, rdp = _accounting()
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    gaussian = dp.GaussianDpEvent(noise_multiplier)
    if fixed_size:
        accountant = rdp.RdpAccountant(ORDERS, dp.NeighboringRelation.REPLACE_ONE)
        event = dp.SampledWithoutReplacementDpEvent(num_clients, cohort_size, gaussian)
    else:
        accountant = rdp.RdpAccountant(ORDERS)
        event = dp.PoissonSampledDpEvent(cohort_size / num_clients, gaussian)
    accountant.compose(event, rounds)
    return float(accountant.get_epsilon(delta))


def rounds_within(
    target_epsilon: float, noise_multiplier: float, cohort_size: int, num_clients: int,
    delta: float, *, most: int,
) -> int:
    """The most rounds (up to ``most``) whose ``epsilon`` stays within ``target_epsilon``."""
    low, high = 0, most  # epsilon grows with rounds: bisect for the last round within target
    while low < high:
        mid = (low + high + 1) // 2
        if epsilon(noise_multiplier, mid, cohort_size, num_clients, delta) <= target_epsilon:
            low = mid
        else:
            high = mid - 1
    return low


def require_accounting() -> None:
    """Refuses (ValueError naming the extra to install) an install without dp-accounting, so
    that a private run stops before it trains rather than at its report."""
    try:
        _accounting()
    except ImportError as err:
        raise ValueError(str(err)) from None


def _accounting():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError:
        raise ImportError(
            "privacy accounting needs dp-accounting, which this install lacks: "
            "pip install 'fedjax_het[privacy]'"
        ) from None
    return dp_accounting, rdp
