"""DPGMM: device-heterogeneity sampler of FLHetBench (Zhang et al., CVPR 2024, §3.1).

The Dirichlet-process Gaussian-mixture sampler gives each of ``n`` clients a
real device from a baseline database (one speed or score per device: e.g.
the AI-Benchmark score of each phone, or each device's mean network speed).
``K`` Gaussian components with means ``mu_k ~ N(mu0, (sigma * sigma0)^2)`` are
snapped to the database device whose speed is nearest, mixing weights come
from a Dirichlet with concentration ``alpha``, and each client draws its
component. ``K`` sets how many distinct devices appear, ``sigma`` (a multiple
of the database's spread ``sigma0``) how far their speeds spread, and the
mean stays near ``mu0`` (notes §1.2).

Two variants (FLHetBench notes §1.2, §1.3, §8 item 4):

- ``"paper"``: the process as printed (§3.1): draw ``mu_1..mu_K``, snap each to
  its nearest device (two components may snap to the same device), draw
  ``pi ~ Dir(alpha/K, ..., alpha/K)``, then ``c_i ~ Discrete(pi)`` per client.
- ``"release"``: the authors' released ``DPGMM_sampling``: ``pi ~ Dir(alpha, ...,
  alpha)`` (``alpha`` per component, not ``alpha/K``), the assignments are drawn
  first, then for each *used* component in increasing index order (the order
  in which the release's Python ``set`` of small ints iterates) a mean is
  drawn and snapped to the nearest device *not taken yet*, so the number of
  distinct devices equals the number of non-empty components.

In both, ``sigma0`` is the standard deviation of the database's per-device
speeds (``numpy.std``, ddof 0). A component's own spread ``sigma_k`` does not
appear here: the output is a device per client, whose measured speeds the
caller turns into a profile (``fedjax_het.system.sources``).

>>> import numpy as np
>>> speeds = np.linspace(1.0, 100.0, 200)
>>> sample = dpgmm(speeds, num_clients=50, num_devices=10, sigma=0.0, mu0=50.0)
>>> sample.num_distinct <= 10, bool(abs(sample.mean - 50.0) < 3.0)
(True, True)
"""

from __future__ import annotations

import dataclasses

import numpy as np

VARIANTS = ("paper", "release")


@dataclasses.dataclass(frozen=True)
class DeviceSample:
    """Result of :func:`dpgmm`.

    Attributes:
      indices: ``[n]`` int32 device index of each client (into the database).
      components: ``[n]`` int32 mixture component ``c_i`` of each client.
      num_distinct: number of distinct devices used.
      mean, std: mean and standard deviation (ddof 0) of the clients' speeds,
        the diagnostics the release returns.
    """

    indices: np.ndarray
    components: np.ndarray
    num_distinct: int
    mean: float
    std: float


def dpgmm(
    device_speeds: np.ndarray,
    *,
    num_clients: int,
    num_devices: int,
    sigma: float,
    mu0: float | None = None,
    alpha: float = 1000.0,
    seed: int = 42,
    variant: str = "release",
) -> DeviceSample:
    """Assigns each client a device from the database by DPGMM sampling.

    Args:
      device_speeds: ``[D]`` one speed or score per device in the database.
      num_clients: ``n``, clients to give a device.
      num_devices: ``K`` (the paper's ``K_n``), the number of mixture
        components, an upper bound on the distinct devices used; the release
        variant needs ``K <= D``.
      sigma: spread multiplier >= 0; component means are ``N(mu0, (sigma * sigma0)^2)``.
      mu0: target mean speed; defaults to the database mean (paper: "mean ...
        speed of D", and "can be set to any reasonable value").
      alpha: Dirichlet concentration > 0 (the paper fixes 1000).
      seed: ``numpy.random.default_rng`` seed (the release's default is 42).
      variant: ``"paper"`` or ``"release"``, see the module doc.

    Returns:
      A :class:`DeviceSample`.

    Raises:
      ValueError: an empty or non-finite database, ``num_clients < 1``,
        ``num_devices < 1`` (or ``> D`` for the release variant), ``sigma < 0``,
        ``alpha <= 0``, a non-finite ``mu0`` or an unknown variant.
    """
    speeds = np.asarray(device_speeds, np.float64)
    if speeds.ndim != 1 or speeds.size == 0 or not np.all(np.isfinite(speeds)):
        raise ValueError(
            f"device_speeds must be a non-empty 1-D array of finite values, got {speeds.shape}"
        )
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    most = speeds.size if variant == "release" else None
    if num_devices < 1 or (most is not None and num_devices > most):
        allowed = f"in [1, {most}] (the database size)" if most else ">= 1"
        raise ValueError(f"num_devices must be {allowed}, got {num_devices}")
    if not sigma >= 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    mu0 = float(speeds.mean()) if mu0 is None else float(mu0)
    if not np.isfinite(mu0):
        raise ValueError(f"mu0 must be finite, got {mu0}")
    rng = np.random.default_rng(seed)
    scale = sigma * speeds.std()
    if variant == "paper":
        means = rng.normal(mu0, scale, size=num_devices)
        none_taken = np.zeros(speeds.size, bool)  # components may share a device
        device = np.array([_nearest(speeds, mu, none_taken) for mu in means])
        weights = rng.dirichlet(np.full(num_devices, alpha / num_devices))
        component = rng.choice(num_devices, size=num_clients, p=weights)
    else:
        weights = rng.dirichlet(np.full(num_devices, alpha))
        component = rng.choice(num_devices, size=num_clients, p=weights)
        taken = np.zeros(speeds.size, bool)
        device = np.zeros(num_devices, np.int64)
        for k in np.unique(component):
            device[k] = _nearest(speeds, rng.normal(mu0, scale), taken)
            taken[device[k]] = True
    indices = device[component]
    chosen = speeds[indices]
    return DeviceSample(
        indices=indices.astype(np.int32),
        components=component.astype(np.int32),
        num_distinct=int(np.unique(indices).size),
        mean=float(chosen.mean()),
        std=float(chosen.std()),
    )


def _nearest(speeds: np.ndarray, target: float, taken: np.ndarray) -> int:
    """Index of the device not ``taken`` whose speed is nearest ``target`` (lowest on ties)."""
    return int(np.argmin(np.where(taken, np.inf, np.abs(speeds - target))))
