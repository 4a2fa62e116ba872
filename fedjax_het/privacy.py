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

import jax
import jax.numpy as jnp

from fedjax_het.algorithm import (
    NON_NEGATIVE,
    POSITIVE,
    Aggregator,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
)
from fedjax_het.compression import pairwise_sum
from fedjax_het.typing import Hyper, Params, PRNGKey, PyTree, ServerState, Update

ORDERS = tuple(range(2, 257))  # integer Rényi orders: exact for both sampling events


def private(
    algorithm: FederatedAlgorithm,
    *,
    cohort_size: int,
    clip_norm: float = 1.0,
    noise_multiplier: float = 1.0,
    delta: float = 1e-5,
) -> FederatedAlgorithm:
    """``algorithm`` trained as DP-FedAvg: clipped updates, a noised mean over ``cohort_size``.

    The algorithm's aggregator is replaced by DP-FedAvg's; its local training
    and its server optimizer (the noised mean is the pseudo-gradient) stay. It
    applies to algorithms whose update is a model delta (the FedAvg family,
    FedProx); others are refused when the round is traced. The run's summary
    gets a ``privacy`` entry (``report``) at ``delta``.
    """
    if isinstance(cohort_size, bool) or not isinstance(cohort_size, int) or cohort_size < 1:
        raise ValueError(f"cohort_size must be an int >= 1, got {cohort_size!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")

    def client_finalize(params: Params, ctx: LocalContext, hyper: Hyper):
        update, state = algorithm.client_finalize(params, ctx, hyper)
        if jax.tree.structure(update) != jax.tree.structure(ctx.start):
            raise ValueError(
                f"{algorithm.name} sends more than a model delta; DP-FedAvg clips the model "
                "delta of the FedAvg family and FedProx"
            )
        return clip(update, hyper["dp_clip"]), state

    def server_update(
        state: ServerState, total: Update, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        if key is None:
            raise ValueError("DP-FedAvg's noise needs the round's server key (Round.step gives it)")
        noised = add_noise(total, hyper["dp_noise"] * hyper["dp_clip"], key)
        mean = jax.tree.map(lambda s: s / cohort_size, noised)
        return algorithm.server_update(state, mean, hyper, key)

    def report(hyper: dict[str, float], num_clients: int, rounds: int) -> dict:
        z = hyper["dp_noise"]
        spent = {
            "epsilon": epsilon(z, rounds, cohort_size, num_clients, delta),
            "epsilon_fixed_size": epsilon(z, rounds, cohort_size, num_clients, delta,
                                          fixed_size=True),
        }  # fmt: skip
        return {"privacy": {**spent, "delta": delta, "noise_multiplier": z,
                            "clip_norm": hyper["dp_clip"], "rounds": rounds,
                            "sampling_rate": cohort_size / num_clients}}  # fmt: skip

    return dataclasses.replace(
        algorithm,
        name=f"dp({algorithm.name})",
        hyper_defaults=(*algorithm.hyper_defaults, ("dp_clip", float(clip_norm)),
                        ("dp_noise", float(noise_multiplier))),
        hyper_ranges=(*algorithm.hyper_ranges, ("dp_clip", POSITIVE), ("dp_noise", NON_NEGATIVE)),
        client_finalize=client_finalize,
        aggregator=clipped_sum(),
        server_update=server_update,
        report=report,
    )  # fmt: skip


def options(
    *,
    clip_norm: float = 1.0,
    noise_multiplier: float = 1.0,
    delta: float = 1e-5,
    target_epsilon: float = 0.0,
) -> dict[str, float]:
    """The ``[privacy]`` table, checked: ``private``'s options and an optional budget.

    Args:
      clip_norm: ``C``, the L2 norm every client's update is clipped to (> 0).
      noise_multiplier: ``z``: the noise on the sum has standard deviation ``z C`` (>= 0).
      delta: the δ at which ε is reported, in (0, 1).
      target_epsilon: stop the run at the last round whose ε stays within this
        (``rounds_within``); 0: no budget.
    """
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
    if not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if not target_epsilon >= 0:
        raise ValueError(f"target_epsilon must be >= 0 (0: no budget), got {target_epsilon}")
    return {"clip_norm": clip_norm, "noise_multiplier": noise_multiplier, "delta": delta,
            "target_epsilon": target_epsilon}  # fmt: skip


def clip(update: Update, clip_norm: jax.Array) -> Update:
    """``update · min(1, C / ||update||)``, the norm over every leaf (a zero update stays zero).

    The norm is a fixed pairwise sum, so a client's clipping does not depend on ``vmap``.
    """
    wide = lambda u: u.astype(jnp.promote_types(u.dtype, jnp.float32))
    norm = jnp.sqrt(sum(pairwise_sum(jnp.square(wide(u))) for u in jax.tree.leaves(update)))
    scale = jnp.minimum(1, clip_norm / jnp.where(norm > 0, norm, 1))
    return jax.tree.map(lambda u: (u * scale.astype(u.dtype)).astype(u.dtype), update)


def clipped_sum() -> Aggregator:
    """``Σ_k u_k`` over the clients that count (weight > 0), each counted once; finalize keeps it."""

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        return jax.tree.map(lambda u: jnp.where(weight > 0, u, 0), update)

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


def _accounting():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError:
        raise ImportError(
            "privacy accounting needs dp-accounting: pip install 'fedjax_het[privacy]'"
        ) from None
    return dp_accounting, rdp
