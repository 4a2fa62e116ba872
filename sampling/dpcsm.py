"""DPCSM: state-heterogeneity sampler of FLHetBench (Zhang et al., CVPR 2024, §3.2).

The Dirichlet-process-based client-state sampler gives each of ``n`` clients
an availability trace from a baseline database of ``T`` traces. The traces are
ranked by a score (higher = better: more, longer ready periods), the ranks
above ``start_rank`` are discarded, and a stick-breaking process with
concentration ``alpha`` spreads the clients over the remaining ranks: a small
``alpha`` puts most clients on the few best remaining traces, a large ``alpha``
spreads them over many; a larger ``start_rank`` shifts everything to worse traces.

Two variants (FLHetBench notes §2.3, §2.4, §8 item 5):

- ``"paper"``: the process as printed. Over ranks ``s = start_rank, ..., T-1``,
  ``b_k ~ Beta(1, alpha)`` iid, ``pi_s = b_s``,
  ``pi_k = b_k * prod_{s <= j < k} (1 - b_j)``, truncated at the last rank (its
  ``b`` is 1, so the weights sum to one); every client draws its rank from ``pi``.
- ``"release"``: the authors' released ``DPCSM_sampling``, a *lazy*
  stick-breaking. Client 0 takes rank ``start_rank`` and that stick gets weight
  ``b ~ Beta(1, alpha)``; each later client picks "new" with the probability of
  the unbroken remainder or an existing stick with its weight; "new" breaks a
  fresh stick ``Beta(1, alpha) * remainder`` and the client goes to the *next*
  rank deterministically. Used ranks are therefore always consecutive. With
  ``n = 100`` and ``seed = 2022`` (the release hard-codes that seed) it
  reproduces the released state cases (notes §2.4).

.. warning:: The paper's score (its "single state metric", App. V) is not
   published. :func:`ready_fraction_score` (the share of a trace's cycle that
   is ready) is the default proxy offered here (notes §2.2, §8 item 1).

The released state case 1 (``alpha = 1``; notes §2.4) over 710 traces:

>>> import numpy as np
>>> sample = dpcsm(np.arange(710, 0, -1.0), num_clients=100, alpha=1.0, seed=2022)
>>> sample.num_distinct, np.bincount(sample.ranks).tolist()
(6, [71, 22, 4, 1, 1, 1])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

VARIANTS = ("paper", "release")


@dataclasses.dataclass(frozen=True)
class StateSample:
    """Result of :func:`dpcsm`.

    Attributes:
      indices: ``[n]`` int32 trace index of each client (into the ``scores`` database).
      ranks: ``[n]`` int32 rank of that trace, 0 = best score.
      num_distinct: number of distinct traces used.
      mean_score: mean score over clients.
    """

    indices: np.ndarray
    ranks: np.ndarray
    num_distinct: int
    mean_score: float


def ready_fraction_score(
    intervals: Sequence[np.ndarray], period: float | Sequence[float]
) -> np.ndarray:
    """The share of each trace's cycle that is ready: ``|union of intervals| / period``.

    A cheap proxy for FLHetBench's single-trace score (notes §2.2). Intervals
    are ``[n_k, 2]`` arrays of ``(start, end)`` seconds, clipped to
    ``[0, period)`` and counted once where they overlap, as in
    ``Availability.from_intervals`` (for an ``Availability`` already built, the
    same score is ``ready_per_period / period``).

    >>> ready_fraction_score([np.array([[0, 10], [5, 20]]), np.zeros((0, 2))], 40.0)
    array([0.5, 0. ])

    Raises:
      ValueError: a period <= 0 or an interval that ends before it starts.
    """
    periods = np.broadcast_to(np.asarray(period, np.float64), (len(intervals),))
    if np.any(~(periods > 0)):
        raise ValueError(f"period must be > 0 seconds for every trace, got min {periods.min()}")
    scores = np.zeros(len(intervals))
    for k, (pairs, length) in enumerate(zip(intervals, periods)):
        pairs = np.asarray(pairs, np.float64).reshape(-1, 2)
        if np.any(pairs[:, 1] < pairs[:, 0]):
            raise ValueError(f"intervals[{k}] has an interval that ends before it starts")
        pairs = np.clip(pairs[np.argsort(pairs[:, 0], kind="stable")], 0.0, length)
        # Union length: each interval counts from where the earlier ones reached.
        reached = np.concatenate([[0.0], np.maximum.accumulate(pairs[:, 1])[:-1]])
        scores[k] = np.maximum(pairs[:, 1] - np.maximum(pairs[:, 0], reached), 0).sum() / length
    return scores


def dpcsm(
    scores: np.ndarray,
    *,
    num_clients: int,
    alpha: float,
    start_rank: int = 0,
    seed: int = 2022,
    variant: str = "release",
) -> StateSample:
    """Assigns each client a trace by Dirichlet-process stick-breaking over score ranks.

    Args:
      scores: ``[T]`` score of each trace in the database, higher = better.
      num_clients: ``n``, the number of clients to give a trace (the paper's
        ``K_n`` in §3.2, a reused symbol).
      alpha: concentration > 0; smaller puts more clients on the top ranks.
      start_rank: 0-based rank of the best trace that may be used (the paper's
        1-based ``startRank`` minus one); ``0 <= start_rank < T``.
      seed: ``numpy.random.default_rng`` seed (the release hard-codes 2022).
      variant: ``"paper"`` (true stick-breaking) or ``"release"`` (lazy), see the module doc.

    Returns:
      A :class:`StateSample`. Ties in ``scores`` keep database order.

    Raises:
      ValueError: empty or non-finite scores, ``alpha <= 0``, ``num_clients < 1``,
        ``start_rank`` out of range, or an unknown variant.
    """
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 1 or scores.size == 0 or not np.all(np.isfinite(scores)):
        raise ValueError(
            f"scores must be a non-empty 1-D array of finite values, got {scores.shape}"
        )
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 0 <= start_rank < scores.size:
        raise ValueError(f"start_rank must be in [0, {scores.size - 1}], got {start_rank}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    rng = np.random.default_rng(seed)
    available = scores.size - start_rank
    if variant == "paper":
        offsets = _stick_breaking(rng, alpha, num_clients, available)
    else:
        offsets = np.minimum(_lazy_stick_breaking(rng, alpha, num_clients), available - 1)
    ranks = (start_rank + offsets).astype(np.int32)
    order = np.argsort(-scores, kind="stable")
    indices = order[ranks].astype(np.int32)
    return StateSample(
        indices=indices,
        ranks=ranks,
        num_distinct=int(np.unique(indices).size),
        mean_score=float(scores[indices].mean()),
    )


def _stick_breaking(rng: np.random.Generator, alpha: float, n: int, size: int) -> np.ndarray:
    """``n`` iid draws from truncated GEM(alpha) weights over ``size`` ranks (paper §3.2)."""
    b = rng.beta(1.0, alpha, size=size)
    b[-1] = 1.0  # truncation: the last rank takes the rest of the stick
    weights = b * np.concatenate([[1.0], np.cumprod(1.0 - b)[:-1]])
    return rng.choice(size, size=n, p=weights / weights.sum())


def _lazy_stick_breaking(rng: np.random.Generator, alpha: float, n: int) -> np.ndarray:
    """Rank offsets of the released lazy process (notes §2.4), in its RNG call order."""
    b = rng.beta(1.0, alpha)
    weights = [1.0 - b, b]  # entry 0 is "break a new stick": the unbroken remainder
    offsets = [0]
    for _ in range(1, n):
        pick = rng.choice(len(weights), p=weights)
        if pick == 0:
            piece = rng.beta(1.0, alpha) * weights[0]
            weights[0] -= piece
            weights.append(piece)
            offsets.append(len(weights) - 2)
        else:
            offsets.append(pick - 1)
    return np.asarray(offsets)
