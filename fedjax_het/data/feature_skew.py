"""Feature, label-noise and concept skew: per-client transforms of a partitioned dataset.

A partitioner (:mod:`fedjax_het.data.partitioners`) decides who holds which example; a transform
then changes client k's examples by client k's own rule, so that P_k(x) or P_k(y | x) differ
across clients (the survey of Zhu et al., "Federated Learning on Non-IID Data: A Survey", §3.1.3
and §3.2.2). Every transform is called as ``fn(x, y, parts, seed=seed, **params)`` and returns a
new ``(x, y)``; the inputs are never modified, and examples in no client are left as they are.

By name (:data:`FEATURE_TRANSFORMS`, :func:`transform`):

- ``"gaussian_noise"``: :func:`gaussian_noise`, x + N(0, sigma_k^2), sigma_k = sigma k / (K - 1).
- ``"salt_pepper"``: :func:`salt_pepper`, impulse noise at a rate growing with the client index.
- ``"rotation"``: :func:`rotation`, a fixed rotation angle per client (images).
- ``"label_flip"``: :func:`label_flip`, symmetric label noise at a per-client rate.
- ``"label_permutation"``: :func:`label_permutation`, a per-client cycle of some classes.

Level parameters take a scalar or K per-client values. For the feature transforms a scalar is the
level of the last client, reached by the NIID-Bench ramp level_k = level * k / (K - 1) (client 0
is clean; with K = 1 the one client is clean too); for :func:`label_flip` a scalar is every
client's rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedjax_het.data._partition_base import (
    call_registered,
    check_int,
    check_partition,
)

Level = float | Sequence[float]
"""A scalar, or one value per client."""


def gaussian_noise(
    x: np.ndarray, y: np.ndarray, parts: Sequence[np.ndarray], sigma: Level = 0.1, *, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Additive Gaussian noise growing with the client index (NIID-Bench, Li et al., ICDE 2022).

    Li, Diao, Chen and He, "Federated Learning on Non-IID Data Silos: An Experimental Study",
    §III-B, noise-based feature imbalance: client k's examples become x + e with every entry of
    e ~ N(0, sigma_k^2) independently, sigma_k = sigma * k / (K - 1) (they use sigma = 0.1 on
    inputs scaled to [0, 1]). sigma_k is a standard deviation.

    Warning: the noise is drawn once, a fixed perturbation of the stored data. NIID-Bench's
    released code adds it in the data-loading transform, so there it is redrawn on every read.

    Args:
      x: ``[N, ...]`` floating-point features.
      y: ``[N]`` labels, returned unchanged.
      parts: the partition, one index array into ``x`` per client.
      sigma: the last client's standard deviation (>= 0), or K per-client ones.
      seed: seed of ``np.random.default_rng``.

    Returns:
      ``(x_noisy, y)``, ``x_noisy`` of ``x``'s dtype.

    >>> x, y = np.zeros((4, 2)), np.zeros(4, dtype=int)
    >>> noisy, _ = gaussian_noise(x, y, [np.array([0, 1]), np.array([2, 3])], 0.1, seed=0)
    >>> bool(np.all(noisy[:2] == 0)), bool(np.all(noisy[2:] != 0))
    (True, True)
    """
    x, parts = _check_inputs(x, y, parts)
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"x must be floating point for gaussian_noise, got dtype {x.dtype}")
    levels = _levels(sigma, len(parts), "sigma", ramp=True, maximum=np.inf)
    rng = np.random.default_rng(seed)
    out = x.copy()
    for part, level in zip(parts, levels):
        out[part] += rng.normal(0.0, level, size=x[part].shape).astype(x.dtype)
    return out, y


def salt_pepper(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    rate: Level,
    *,
    seed: int,
    low: float = 0.0,
    high: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Impulse (salt-and-pepper) noise growing with the client index (Zhu et al., §3.1.3, Fig. 4b).

    The survey illustrates feature skew by "different degrees of impulse noise across clients"
    without values; the degrees here follow NIID-Bench's ramp, rate_k = rate * k / (K - 1). Every
    entry of client k's examples is, independently, set to ``low`` (pepper) with probability
    rate_k / 2, to ``high`` (salt) with probability rate_k / 2, and kept otherwise.

    Args:
      x: ``[N, ...]`` features.
      y: ``[N]`` labels, returned unchanged.
      parts: the partition, one index array into ``x`` per client.
      rate: the last client's fraction of corrupted entries, in [0, 1], or K per-client ones.
      seed: seed of ``np.random.default_rng``.
      low: the pepper value (0 for images in [0, 1]).
      high: the salt value (1 for images in [0, 1]; 255 for uint8 images).

    Returns:
      ``(x_noisy, y)``, ``x_noisy`` of ``x``'s dtype.
    """
    x, parts = _check_inputs(x, y, parts)
    levels = _levels(rate, len(parts), "rate", ramp=True, maximum=1.0)
    rng = np.random.default_rng(seed)
    out = x.copy()
    for part, level in zip(parts, levels):
        block = out[part]
        u = rng.random(block.shape)
        block[u < level / 2] = low
        block[(u >= level / 2) & (u < level)] = high
        out[part] = block
    return out, y


def rotation(
    x: np.ndarray, y: np.ndarray, parts: Sequence[np.ndarray], angle: Level, *, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A fixed rotation per client, as in IFCA's rotated MNIST (Ghosh et al., NeurIPS 2020, §5).

    Ghosh, Chung, Yin and Ramchandran, "An Efficient Framework for Clustered Federated Learning":
    every client's images are rotated by the same angle, different clients by different angles
    (they use 0, 90, 180 and 270 degrees for four groups: pass those as per-client angles). A
    scalar ``angle`` gives the NIID-Bench-style ramp angle_k = angle * k / (K - 1). The rotation
    is about the image centre, counter-clockwise for a positive angle (``np.rot90`` at 90), with
    bilinear interpolation (``scipy.ndimage.rotate``, ``order=1``, shape kept) and zeros filled in
    at the corners.

    Args:
      x: ``[N, H, W]`` or ``[N, H, W, C]`` images.
      y: ``[N]`` labels, returned unchanged.
      parts: the partition, one index array into ``x`` per client.
      angle: the last client's angle in degrees, or K per-client angles.
      seed: unused (the rotation is deterministic); kept for the common transform signature.

    Returns:
      ``(x_rotated, y)``, ``x_rotated`` of ``x``'s dtype and shape.
    """
    del seed
    x, parts = _check_inputs(x, y, parts)
    if x.ndim not in (3, 4):
        raise ValueError(f"x must hold images [N, H, W] or [N, H, W, C], got shape {x.shape}")
    angles = _levels(angle, len(parts), "angle", ramp=True, minimum=-np.inf, maximum=np.inf)
    import scipy.ndimage  # here, not at the top: 0.24 s of every run's start-up otherwise

    out = x.copy()
    for part, client_angle in zip(parts, angles):
        if part.size and client_angle % 360 != 0:
            out[part] = scipy.ndimage.rotate(
                x[part], client_angle, axes=(1, 2), reshape=False, order=1, mode="constant"
            )
    return out, y


def label_flip(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    rate: Level,
    *,
    seed: int,
    num_classes: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric label noise at a per-client rate (Zhu et al., §3.2.2: noisy crowdsourced labels).

    Each of client k's labels is, independently with probability rate_k, replaced by a class drawn
    uniformly from the other ``num_classes - 1``: y' = (y + u) mod C with u uniform on 1..C-1.

    Args:
      x: ``[N, ...]`` features, returned unchanged.
      y: ``[N]`` integer labels in ``[0, num_classes)``.
      parts: the partition, one index array into ``y`` per client.
      rate: every client's flip probability in [0, 1], or K per-client ones.
      seed: seed of ``np.random.default_rng``.
      num_classes: C, >= 2; by default ``max(y) + 1``.

    Returns:
      ``(x, y_noisy)``.

    >>> y = np.zeros(6, dtype=int)
    >>> _, noisy = label_flip(None, y, [np.arange(6)], 1.0, seed=0, num_classes=2)
    >>> bool(np.all(noisy == 1))
    True
    """
    y, parts, num_classes = _check_label_inputs(x, y, parts, num_classes)
    rates = _levels(rate, len(parts), "rate", ramp=False, maximum=1.0)
    rng = np.random.default_rng(seed)
    out = y.copy()
    for part, client_rate in zip(parts, rates):
        flipped = part[rng.random(part.size) < client_rate]
        out[flipped] = (y[flipped] + rng.integers(1, num_classes, flipped.size)) % num_classes
    return x, out


def label_permutation(
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    num_permuted: int,
    *,
    seed: int,
    num_classes: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Label-preference (concept) skew: each client relabels some classes (Zhu et al., §3.2.2).

    The survey's "same features, different label" skew, with no recipe given. Here client k draws
    ``num_permuted`` distinct classes s_1, ..., s_m uniformly at random and relabels them along the
    cycle s_1 -> s_2 -> ... -> s_m -> s_1, so exactly those m classes change their label and
    P_k(y | x) differs between clients while P_k(x) does not.

    Args:
      x: ``[N, ...]`` features, returned unchanged.
      y: ``[N]`` integer labels in ``[0, num_classes)``.
      parts: the partition, one index array into ``y`` per client.
      num_permuted: m, 0 (no change) or between 2 and ``num_classes``.
      seed: seed of ``np.random.default_rng``.
      num_classes: C; by default ``max(y) + 1``.

    Returns:
      ``(x, y_relabelled)``.
    """
    y, parts, num_classes = _check_label_inputs(x, y, parts, num_classes)
    check_int(num_permuted, "num_permuted", 0, num_classes)
    if num_permuted == 1:
        raise ValueError("num_permuted must be 0 or at least 2: one class cannot be permuted")
    rng = np.random.default_rng(seed)
    out = y.copy()
    for part in parts:
        cycle = rng.choice(num_classes, num_permuted, replace=False)
        mapping = np.arange(num_classes)
        mapping[cycle] = np.roll(cycle, -1)
        out[part] = mapping[y[part]]
    return x, out


FEATURE_TRANSFORMS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "gaussian_noise": gaussian_noise,
    "salt_pepper": salt_pepper,
    "rotation": rotation,
    "label_flip": label_flip,
    "label_permutation": label_permutation,
}
"""Config name -> transform, each called as ``fn(x, y, parts, seed=seed, **params)``."""


def transform(
    kind: str,
    x: np.ndarray,
    y: np.ndarray,
    parts: Sequence[np.ndarray],
    *,
    seed: int,
    **params,
) -> tuple[np.ndarray, np.ndarray]:
    """Runs the transform registered as ``kind``, after checking the parameter names.

    Raises:
      ValueError: for an unknown ``kind`` (listing the choices), an unknown parameter (naming it
        and listing the allowed ones), a missing required one, or a bad value.

    >>> _, y = transform("label_flip", None, np.zeros(4, dtype=int), [np.arange(4)], seed=0,
    ...                  rate=0.0, num_classes=3)
    >>> y.tolist()
    [0, 0, 0, 0]
    """
    return call_registered(
        FEATURE_TRANSFORMS, "feature transform", kind, (x, y, parts), seed, params
    )


def _levels(
    value: Level,
    num_clients: int,
    name: str,
    *,
    ramp: bool,
    maximum: float,
    minimum: float = 0.0,
) -> np.ndarray:
    """``[K]`` per-client levels from a scalar (ramped from 0 or constant) or K values."""
    levels = np.asarray(value, dtype=np.float64)
    if levels.ndim == 0 and ramp:
        levels = levels * np.arange(num_clients) / max(num_clients - 1, 1)
    elif levels.ndim == 0:
        levels = np.full(num_clients, levels)
    if levels.shape != (num_clients,):
        raise ValueError(f"{name} must be a scalar or {num_clients} values, one per client")
    if not np.all((levels >= minimum) & (levels <= maximum)):
        raise ValueError(f"{name} must lie in [{minimum}, {maximum}], got {value}")
    return levels


def _check_inputs(
    x: np.ndarray, y: np.ndarray, parts: Sequence[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    x = np.asarray(x)
    if x.ndim < 1 or np.shape(y)[:1] != x.shape[:1]:
        raise ValueError(f"x and y must hold the same N examples, got {x.shape} and {np.shape(y)}")
    return x, check_partition(parts, x.shape[0], "parts")


def _check_label_inputs(
    x: np.ndarray | None, y: np.ndarray, parts: Sequence[np.ndarray], num_classes: int | None
) -> tuple[np.ndarray, list[np.ndarray], int]:
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be 1-D integer labels, got shape {y.shape}, dtype {y.dtype}")
    if x is not None and np.shape(x)[:1] != y.shape:
        raise ValueError(f"x and y must hold the same N examples, got {np.shape(x)} and {y.shape}")
    num_classes = int(y.max(initial=0)) + 1 if num_classes is None else num_classes
    check_int(num_classes, "num_classes", 2)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"y must lie in [0, num_classes={num_classes}), got [{y.min()}, {y.max()}]"
        )
    return y, check_partition(parts, y.size, "parts"), num_classes
