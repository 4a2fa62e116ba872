"""HDFL: selection by cost-normalised underestimation and dropout, with selection mutualism.

Zawad, Anwar, Baracaldo, Zhou and Yan, "HDFL: A Heterogeneity and Client
Dropout-Aware Federated Learning Framework" (the seed text names no venue or year), §IV,
Eqs. 2-10 and Algorithm 1. Every ``I`` rounds (and at round 0) the global model
is run over every client's training data (``LearnedSelection.profile``):

    UEI_n  = (1/sqrt 2) || sqrt(P_n^pr) - sqrt(P_n^act) ||_2           (Eq. 2, Hellinger)
    CUEI_n = UEI_n / (c_n / mean_m c_m)                                 (Eq. 3, c normalised)
    S_n    = sigma exp(beta CUEI_n) / (1 - min(CDR_n, cap))             (Eqs. 5-7, sum_n S_n = 1)

``P^pr`` the histogram of the model's arg-max predictions, ``P^act`` of the
labels, ``c_n`` the examples of its local task (``ClientReport.examples``),
``CDR_n`` its dropout probability (``ClientReport.dropout``). A round draws an
anchor ``d ~ S``, then the other ``K - 1`` slots without replacement from

    S'_n = theta S_n exp(-|L_n - L_d| / tau)                            (Eqs. 9-10, sign corrected)

``L_n`` the expected round latency (``ClientReport.seconds``), keeping a draw
whose selected clients have mean CDR ``<= CDR_max``. Only ready clients are drawn.
HDFL aggregates the returned updates with an unweighted mean (Algorithm 1, line 14):
run it with ``weighting="uniform"`` (config ``engine.weighting``).

LS-FL (Bonawitz et al. 2019, as HDFL's baseline: over-select 33 %, keep the first
75 % to finish) is a round policy, not a selection: :func:`ls_fl`.

>>> import jax, jax.numpy as jnp
>>> float(underestimation(jnp.array([[2.0, 0.0]]), jnp.array([[0.0, 2.0]]))[0])  # disjoint
1.0
>>> select = hdfl(5, 3, cdr_max=1.0)
>>> from fedjax_het.system.sampler import ClientRecord, ClientReport
>>> report = ClientReport(jnp.arange(5.0), jnp.zeros(5), jnp.full(5, 10))
>>> ids, valid, _ = select.select(jax.random.key(0), 0, jnp.ones(5, bool),
...                               ClientRecord.empty(5), select.init(5), report)
>>> valid.tolist(), len(set(ids.tolist()))
([True, True, True], 3)

.. warning:: Decisions where the paper is ambiguous (notes §6 and its defaults table):
   Eq. 9's sign is corrected to ``exp(-|L_n - L_d| / tau)`` (as printed it favours
   dissimilar latencies), with a temperature ``tau`` (1 s reproduces the paper); the anchor
   is one of the ``K`` slots (``n = K - 1`` others, so Table I's clients per round hold);
   the second stage excludes the anchor; ``P^pr`` counts arg-max predictions (hard) on the
   client's training rows; ``c_n`` is divided by its population mean (raw counts make
   ``exp(CUEI) ~ 1``), with a temperature ``beta``; a client without training rows has
   ``CUEI = 0``; CDR is capped at ``cdr_cap`` (0.95) in Eq. 6 (``cdr_cap = 1`` gives Eq. 6
   exactly, whose ``CDR = 1`` case weighs 1); ``UEI``, ``CDR`` and ``L`` are the values
   the clients report (oracle profile values, as the paper's experiments used), ``UEI = 0``
   until the first profile; all clients are profiled, ready or not, and profiling is not
   charged to cost or time.

.. warning:: CDR_max (no value or method in the paper) bounds the mean CDR over a draw's
   valid slots, anchor included: up to ``max_draws`` independent draws (anchor and rest,
   ``lax.while_loop``) until one has mean ``<= cdr_max``; if none does, the draw with the
   lowest mean is repaired by swapping its highest-CDR clients for the lowest-CDR unselected
   ready ones, the fewest swaps that meet the bound (every useful swap if it cannot be met),
   so the bound holds whenever some selection of ready clients meets it. ``cdr_max >= 1``
   draws once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_het.system import setup
from fedjax_het.system.policy import RoundPolicy
from fedjax_het.system.sampler import ClientRecord, ClientReport, LearnedSelection

LS_FL_OVER_COMMIT = 1.0 / 3.0  # Bonawitz et al. 2019 as HDFL runs it: select 4/3 m, keep m


@struct.dataclass
class HDFLState:
    """The clients' underestimation index ``UEI [N]`` at the last profile."""

    uei: jax.Array


def underestimation(predicted: jax.Array, actual: jax.Array) -> jax.Array:
    """``[N]`` Eq. 2: Hellinger distance between each row's normalised histograms (0 if empty)."""

    def normalised(counts):
        total = jnp.sum(counts, axis=-1, keepdims=True)
        return counts / jnp.where(total > 0, total, 1.0)

    p, q = normalised(predicted), normalised(actual)
    affinity = jnp.sum(jnp.sqrt(p * q), axis=-1)
    empty = (jnp.sum(predicted, axis=-1) == 0) | (jnp.sum(actual, axis=-1) == 0)
    return jnp.where(empty, 0.0, jnp.sqrt(jnp.maximum(1.0 - affinity, 0.0)))


def log_weights(
    uei: jax.Array, examples: jax.Array, cdr: jax.Array, *, beta: float = 1.0,
    cdr_cap: float = 0.95,
) -> jax.Array:
    """``[N]`` ``log(exp(beta CUEI_n) / (1 - min(CDR_n, cdr_cap)))``: Eqs. 3, 5, 6 before sigma."""
    cost = examples.astype(jnp.float32)
    relative = cost / jnp.maximum(jnp.mean(cost), 1e-12)
    cuei = jnp.where(cost > 0, uei / jnp.where(cost > 0, relative, 1.0), 0.0)
    capped = jnp.minimum(cdr, cdr_cap)
    keep = jnp.where(capped < 1, 1.0 - capped, 1.0)
    return beta * cuei - jnp.log(keep)


def selection_probabilities(log_weight: jax.Array, ready: jax.Array) -> jax.Array:
    """``[N]`` ``S`` over the ready clients (Eq. 7: sigma normalises to 1)."""
    return jax.nn.softmax(jnp.where(ready, log_weight, -jnp.inf))


def mutualism_probabilities(
    s: jax.Array, latency: jax.Array, anchor: jax.Array, *, tau: float = 1.0
) -> jax.Array:
    """``[N]`` ``S'`` of Eqs. 9-10 with the sign corrected: ``S_n exp(-|L_n - L_anchor| / tau)``."""
    weight = s * jnp.exp(-jnp.abs(latency - latency[anchor]) / tau)
    return weight / jnp.sum(weight)


def _draw(key, log_s, latency, cdr, tau: float, num_slots: int):
    """One draw: the anchor from ``S``, the rest without replacement from ``S'`` (Gumbel top-k)."""
    k_anchor, k_rest = jax.random.split(key)
    anchor = jax.random.categorical(k_anchor, log_s).astype(jnp.int32)
    rest = log_s - jnp.abs(latency - latency[anchor]) / tau
    rest = rest.at[anchor].set(-jnp.inf) + jax.random.gumbel(k_rest, log_s.shape)
    ids, valid = anchor[None], jnp.isfinite(log_s[anchor])[None]
    if num_slots > 1:
        top, others = jax.lax.top_k(rest, num_slots - 1)
        ids = jnp.concatenate([ids, others.astype(jnp.int32)])
        valid = jnp.concatenate([valid, jnp.isfinite(top)])
    mean_cdr = jnp.sum(jnp.where(valid, cdr[ids], 0.0)) / jnp.maximum(jnp.sum(valid), 1)
    return ids, valid, mean_cdr


def _repair(ids, valid, cdr, ready, cdr_max: float):
    """The fewest swaps of the highest-CDR selected clients for the lowest-CDR unselected ready
    ones that bring the mean CDR to ``<= cdr_max`` (every useful swap if none does)."""
    slots = ids.shape[0]
    chosen = jnp.zeros(cdr.shape, bool).at[ids].max(valid)
    out_slots = jnp.argsort(-jnp.where(valid, cdr[ids], -jnp.inf))  # selected, highest CDR first
    spare = ready & ~chosen
    incoming = jnp.argsort(jnp.where(spare, cdr, jnp.inf))[:slots].astype(jnp.int32)
    leaving = jnp.where(valid[out_slots], cdr[ids[out_slots]], -jnp.inf)
    arriving = jnp.where(spare[incoming], cdr[incoming], jnp.inf)
    useful = leaving > arriving  # a prefix: leaving falls and arriving rises
    saved = jnp.concatenate([jnp.zeros(1), jnp.cumsum(jnp.where(useful, leaving - arriving, 0.0))])
    means = (jnp.sum(jnp.where(valid, cdr[ids], 0.0)) - saved) / jnp.maximum(jnp.sum(valid), 1)
    swaps = jnp.where(jnp.any(means <= cdr_max), jnp.argmax(means <= cdr_max), jnp.sum(useful))
    swap = useful & (jnp.arange(slots) < swaps)
    return ids.at[out_slots].set(jnp.where(swap, incoming, ids[out_slots]))


def _per_client(name: str, value, num_clients: int) -> jax.Array | None:
    if value is None:
        return None
    array = np.asarray(value, np.float32)
    if array.shape != (num_clients,) or not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be {num_clients} finite numbers, got shape {array.shape}")
    return jnp.asarray(array)


def hdfl(
    num_clients: int,
    num_slots: int,
    *,
    profile_every: int = 10,
    beta: float = 1.0,
    tau: float = 1.0,
    cdr_max: float = 0.5,
    cdr_cap: float = 0.95,
    max_draws: int = 10,
    latency: np.ndarray | None = None,
    cdr: np.ndarray | None = None,
) -> LearnedSelection:
    """HDFL's selection over ``num_slots`` slots (see the module docstring).

    Args:
      profile_every: ``I``, rounds between profiles of every client's UEI.
      beta: temperature of ``CUEI`` in Eq. 5.
      tau: latency scale of the mutualism weight, seconds.
      cdr_max: bound on the mean CDR of a round's selection (``>= 1``: none).
      cdr_cap: CDR cap in Eq. 6 (1: Eq. 6 as printed).
      max_draws: draws tried to meet ``cdr_max``.
      latency, cdr: ``[N]`` what the server believes of each client's round latency and
        dropout ratio, instead of the profiles' expected seconds and dropout (None).

    References:
      Zawad, Anwar, Baracaldo, Zhou and Yan, "HDFL: A Heterogeneity and Client Dropout-Aware
      Federated Learning Framework", §IV, Eqs. 2-10 and Algorithm 1.
    """
    if not 1 <= num_slots <= num_clients:
        raise ValueError(f"need 1 <= num_slots <= num_clients, got {num_slots}, {num_clients}")
    if profile_every < 1 or max_draws < 1:
        raise ValueError(
            f"profile_every and max_draws must be >= 1, got {profile_every}, {max_draws}"
        )
    if beta < 0 or not tau > 0 or not 0 < cdr_max or not 0 <= cdr_cap <= 1:
        raise ValueError(
            f"need beta >= 0, tau > 0, cdr_max > 0 and cdr_cap in [0, 1], got {beta}, {tau}, "
            f"{cdr_max}, {cdr_cap}"
        )
    latency = _per_client("latency", latency, num_clients)
    cdr = _per_client("cdr", cdr, num_clients)
    cdr = None if cdr is None else jnp.clip(cdr, 0.0, 1.0)

    def profile(state: HDFLState, predicted: jax.Array, actual: jax.Array) -> HDFLState:
        return HDFLState(underestimation(predicted, actual))

    def select(key, round_idx, ready, record: ClientRecord, state: HDFLState, report: ClientReport):
        del round_idx, record  # the key is the round's; HDFL reads the profile and the reports
        dropout = report.dropout if cdr is None else cdr
        seconds = report.seconds if latency is None else latency
        weights = log_weights(state.uei, report.examples, dropout, beta=beta, cdr_cap=cdr_cap)
        log_s = jnp.where(ready, weights, -jnp.inf)
        draw = lambda k: _draw(k, log_s, seconds, dropout, tau, num_slots)
        best = draw(jax.random.fold_in(key, 0))
        if cdr_max < 1:

            def redraw(carry):
                i, best = carry
                new = draw(jax.random.fold_in(key, i))
                better = new[2] < best[2]
                return i + 1, jax.tree.map(lambda a, b: jnp.where(better, a, b), new, best)

            _, best = jax.lax.while_loop(
                lambda c: (c[0] < max_draws) & (c[1][2] > cdr_max), redraw, (1, best)
            )
            best = (_repair(best[0], best[1], dropout, ready, cdr_max), *best[1:])
        ids, valid, _ = best
        return ids, valid, state

    def init(n: int) -> HDFLState:
        return HDFLState(jnp.zeros((n,), jnp.float32))

    return LearnedSelection(
        select, init, profile=profile, profile_every=profile_every, name="hdfl"
    )


def ls_fl(kind: str = "wait_all", **options) -> RoundPolicy:
    """LS-FL's round policy: ``ceil(4m/3)`` clients selected, the first ``m`` to finish kept.

    Bonawitz et al. 2019, "Towards Federated Learning at Scale: System Design", as HDFL
    runs it (over-select 33 %, aggregate the first 75 %): ``over_commit = 1/3`` with the
    engine's rounding (14 selected for m = 10, 4 for m = 3). ``options`` are those of
    ``system.setup.policy_from_options`` (config: ``[policy] over_commit = 0.3333333``).

    >>> policy = ls_fl(overhead=1.0)
    >>> policy.kind, round(float(policy.over_commit), 4)
    ('wait_all', 0.3333)
    """
    if "over_commit" in options:
        raise ValueError("ls_fl fixes over_commit at 1/3; use policy_from_options for another")
    return setup.policy_from_options(kind=kind, over_commit=LS_FL_OVER_COMMIT, **options)
