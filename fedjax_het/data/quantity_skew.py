"""Quantity skew: clients of different sizes n_k, as an axis of its own.

IID content with equal sizes (:func:`iid`) or with sizes from a rule: log-normal
(:func:`lognormal_sizes`, Acar et al. 2021) or Dirichlet (:func:`dirichlet_sizes`, NIID-Bench).
The size rules are public so that they compose with any partitioner taking ``sizes`` (``iid``,
:func:`fedjax_het.data.label_skew.dirichlet_client_skew`); :func:`quantity_lognormal` and
:func:`quantity_dirichlet` are the IID-content partitioners of the registry. The survey of Zhu et
al. (§3.4.2) names quantity skew but gives no recipe. Use these through
:mod:`fedjax_het.data.partitioners`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedjax_het.data._partition_base import (
    Partition,
    check_concentration,
    check_min_size,
    check_num_clients,
    check_sizes,
    count_examples,
    cut,
    min_size_error,
    sizes_from_proportions,
)

DrawWeights = Callable[[np.random.Generator, int], np.ndarray]
"""``(rng, K) -> [K]`` positive weights, to be normalised into client proportions."""


def iid(
    labels: np.ndarray | int, num_clients: int, *, seed: int, sizes: np.ndarray | None = None
) -> Partition:
    """A uniformly random split: client k takes the next n_k examples of a random permutation.

    The IID baseline of McMahan et al. (AISTATS 2017, §3), with equal sizes by default.

    Args:
      labels: ``[N]`` labels (only their number is used), or N itself.
      num_clients: K, at most N.
      seed: seed of ``np.random.default_rng``.
      sizes: ``[K]`` client sizes summing to at most N, e.g. from :func:`lognormal_sizes`; by
        default N split into K sizes that differ by at most one.

    Returns:
      K int64 index arrays, in random order; every example is in exactly one of them when the
      sizes sum to N (the default), otherwise the rest are left out.

    >>> [part.size for part in iid(10, 3, seed=0)]
    [3, 3, 4]
    """
    num_examples = count_examples(labels)
    check_num_clients(num_clients, num_examples)
    sizes = check_sizes(sizes, num_clients, num_examples)
    return cut(np.random.default_rng(seed).permutation(num_examples), sizes)


def lognormal_sizes(
    num_examples: int,
    num_clients: int,
    sigma: float = 0.3,
    *,
    seed: int,
    min_size: int = 1,
    max_tries: int = 100,
) -> np.ndarray:
    """Log-normal client sizes, the unbalanced setting of FedDyn (Acar et al., ICLR 2021, §5).

    Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on Dynamic
    Regularization": w_k ~ LogNormal(0, sigma^2) (they use sigma = 0.3), and n_k are the pieces of
    N between ``floor(cumsum(w / sum(w)) * N)``. The log-normal mean cancels in the normalisation.
    Redrawn, up to ``max_tries`` times, until every n_k >= ``min_size``.

    Args:
      num_examples: N.
      num_clients: K.
      sigma: log-normal sigma, >= 0; 0 gives equal sizes (up to rounding), larger is more skewed.
      seed: seed of ``np.random.default_rng``.
      min_size: fewest examples any client may hold.
      max_tries: how many times the sizes are drawn before giving up.

    Returns:
      ``[K]`` int64 sizes summing to N.

    >>> int(lognormal_sizes(1000, 10, 0.3, seed=0).sum())
    1000
    """
    _check_sigma(sigma)
    rng = np.random.default_rng(seed)
    name = f"lognormal_sizes (sigma={sigma})"
    return _draw_sizes(_lognormal(sigma), num_examples, num_clients, min_size, max_tries, rng, name)


def dirichlet_sizes(
    num_examples: int,
    num_clients: int,
    beta: float = 0.5,
    *,
    seed: int,
    min_size: int = 10,
    max_tries: int = 100,
) -> np.ndarray:
    """Dirichlet client sizes, NIID-Bench's quantity skew (Li et al., ICDE 2022, §III-C).

    Li, Diao, Chen and He, "Federated Learning on Non-IID Data Silos: An Experimental Study":
    q ~ Dir_K(beta) (they use beta = 0.5), n_k the pieces of N between ``floor(cumsum(q) * N)``,
    redrawn until every n_k >= ``min_size`` (NIID-Bench: 10, without a limit on tries).

    Args:
      num_examples: N.
      num_clients: K.
      beta: concentration, > 0; smaller is more skewed, ``float('inf')`` gives equal sizes.
      seed: seed of ``np.random.default_rng``.
      min_size: fewest examples any client may hold.
      max_tries: how many times the sizes are drawn before giving up.

    Returns:
      ``[K]`` int64 sizes summing to N.

    >>> int(dirichlet_sizes(1000, 10, 0.5, seed=0).sum())
    1000
    """
    check_concentration(beta)
    rng = np.random.default_rng(seed)
    name = f"dirichlet_sizes (beta={beta})"
    return _draw_sizes(_dirichlet(beta), num_examples, num_clients, min_size, max_tries, rng, name)


def quantity_lognormal(
    labels: np.ndarray | int,
    num_clients: int,
    sigma: float = 0.3,
    *,
    seed: int,
    min_size: int = 1,
    max_tries: int = 100,
) -> Partition:
    """IID content with log-normal sizes (:func:`lognormal_sizes`; Acar et al., ICLR 2021).

    ``labels`` is ``[N]`` labels (only their number is used) or N; the other arguments are those of
    :func:`lognormal_sizes`, and the client sizes are ``lognormal_sizes(N, K, sigma, seed=seed,
    ...)``. Every example is in exactly one of the K returned index arrays.

    Args:
      labels, num_clients, seed: the data's (the config takes them from [data]).
      sigma: log-normal sigma of the sizes, >= 0; 0 gives equal sizes, larger is more skewed.
      min_size: fewest examples any client may hold.
      max_tries: how many times the sizes are drawn before giving up.

    References:
      Acar, Zhao, Matas, Mattina, Whatmough and Saligrama, "Federated Learning Based on
      Dynamic Regularization" (ICLR 2021).

    >>> sum(part.size for part in quantity_lognormal(100, 5, 1.0, seed=0))
    100
    """
    _check_sigma(sigma)
    name = f"quantity_lognormal (sigma={sigma})"
    return _quantity_skew(labels, num_clients, _lognormal(sigma), name, seed, min_size, max_tries)


def quantity_dirichlet(
    labels: np.ndarray | int,
    num_clients: int,
    beta: float = 0.5,
    *,
    seed: int,
    min_size: int = 10,
    max_tries: int = 100,
) -> Partition:
    """IID content with Dirichlet sizes, NIID-Bench's ``iid-diff-quantity`` (Li et al., ICDE 2022).

    ``labels`` is ``[N]`` labels (only their number is used) or N; the other arguments are those of
    :func:`dirichlet_sizes`, and the client sizes are ``dirichlet_sizes(N, K, beta, seed=seed,
    ...)``. Every example is in exactly one of the K returned index arrays.

    Args:
      labels, num_clients, seed: the data's (the config takes them from [data]).
      beta: Dirichlet concentration of the sizes, > 0; smaller is more skewed, ``inf`` gives
        equal sizes.
      min_size: fewest examples any client may hold.
      max_tries: how many times the sizes are drawn before giving up.

    References:
      Li, Diao, Chen and He, "Federated Learning on Non-IID Data Silos: An Experimental Study"
      (ICDE 2022), NIID-Bench.

    >>> sum(part.size for part in quantity_dirichlet(100, 5, 1.0, seed=0, min_size=1))
    100
    """
    check_concentration(beta)
    name = f"quantity_dirichlet (beta={beta})"
    return _quantity_skew(labels, num_clients, _dirichlet(beta), name, seed, min_size, max_tries)


def _quantity_skew(
    labels: np.ndarray | int,
    num_clients: int,
    draw_weights: DrawWeights,
    name: str,
    seed: int,
    min_size: int,
    max_tries: int,
) -> Partition:
    """Sizes from ``draw_weights`` (guarded), then a random permutation cut into those sizes."""
    num_examples = count_examples(labels)
    rng = np.random.default_rng(seed)
    sizes = _draw_sizes(draw_weights, num_examples, num_clients, min_size, max_tries, rng, name)
    return cut(rng.permutation(num_examples), sizes)


def _draw_sizes(
    draw_weights: DrawWeights,
    num_examples: int,
    num_clients: int,
    min_size: int,
    max_tries: int,
    rng: np.random.Generator,
    name: str,
) -> np.ndarray:
    """Sizes in proportion to ``draw_weights``, redrawn until all are >= ``min_size``."""
    check_num_clients(num_clients, num_examples)
    check_min_size(min_size, max_tries, num_clients, num_examples)
    for _ in range(max_tries):
        sizes = sizes_from_proportions(draw_weights(rng, num_clients), num_examples)
        if sizes.min() >= min_size:
            return sizes
    raise min_size_error(name, num_clients, min_size, max_tries)


def _lognormal(sigma: float) -> DrawWeights:
    return lambda rng, num_clients: rng.lognormal(0.0, sigma, num_clients)


def _dirichlet(beta: float) -> DrawWeights:
    if np.isinf(beta):
        return lambda rng, num_clients: np.ones(num_clients)
    return lambda rng, num_clients: rng.dirichlet(np.full(num_clients, beta))


def _check_sigma(sigma: float) -> None:
    if not 0.0 <= sigma < np.inf:
        raise ValueError(f"sigma (log-normal spread) must be finite and >= 0, got {sigma}")
