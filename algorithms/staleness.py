"""Staleness weights ``s(tau)`` and the staleness-weighted mean of client updates.

FedAsync (Xie et al. 2019, "Asynchronous Federated Optimization", §5.2)
scales the mixing weight of an update computed ``tau`` server versions ago by
a staleness function:

- constant: ``s(tau) = 1``;
- polynomial: ``s_a(tau) = (tau + 1)^(-a)``;
- hinge: ``s_{a,b}(tau) = 1`` if ``tau <= b``, else ``1 / (a (tau - b) + 1)``.

FedBuff (Nguyen et al. 2022, §5) weighs each buffered update by
``1 / sqrt(1 + tau)``, the polynomial with ``a = 1/2``.

The shape of ``s`` (its kind, ``a`` and ``b``) is static: changing it
recompiles; the learning rates around it are traced. ``s`` computes in the
floating dtype of ``tau`` (float32 for integer ``tau``); the aggregator passes
``tau`` in the dtype of the updates, so a float64 run weighs in float64.

>>> import jax.numpy as jnp
>>> [round(s, 4) for s in staleness_fn("hinge", a=10.0, b=4.0)(jnp.arange(7)).tolist()]
[1.0, 1.0, 1.0, 1.0, 1.0, 0.0909, 0.0476]
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.engine.algorithm import Aggregator, ClientStats, weighted_mean, weighted_or_zero
from fedjax_het.typing import PyTree, Update

KINDS = ("constant", "polynomial", "hinge")

StalenessFn = Callable[[jax.Array], jax.Array]


def staleness_fn(kind: str, *, a: float = 0.5, b: float = 4.0) -> StalenessFn:
    """``s(tau)`` of ``kind`` with exponent or slope ``a`` and hinge point ``b`` (one-line errors)."""
    if kind not in KINDS:
        raise ValueError(f"staleness must be one of {KINDS}, got {kind!r}")
    if not (np.isfinite(a) and a >= 0):
        raise ValueError(f"staleness a must be a finite number >= 0, got {a}")
    if not (np.isfinite(b) and b >= 0):
        raise ValueError(f"staleness b must be a finite number >= 0, got {b}")
    if kind == "constant":
        return lambda tau: jnp.ones_like(_floating(tau))
    if kind == "polynomial":
        return lambda tau: (_floating(tau) + 1.0) ** -a
    return lambda tau: _hinge(_floating(tau), a, b)


def _floating(tau: jax.Array) -> jax.Array:
    tau = jnp.asarray(tau)
    return tau if jnp.issubdtype(tau.dtype, jnp.floating) else tau.astype(jnp.float32)


def _hinge(tau: jax.Array, a: float, b: float) -> jax.Array:
    return jnp.where(tau <= b, jnp.ones_like(tau), 1.0 / (a * (tau - b) + 1.0))


def staleness_weighted_mean(weight: StalenessFn) -> Aggregator:
    """``Σ_k w_k s(tau_k) u_k / Σ_k w_k`` over clients with ``w_k > 0``; zero when nobody counts.

    With uniform weights this is FedBuff's ``(1/K) Σ_k s(tau_k) Δ_k`` (Nguyen et
    al. 2022, Algorithm 1, divided by the buffer size, not by the staleness
    weights); with K = 1 it is ``s(tau) u``, FedAsync's scaled update. A slot
    without ``stats.staleness`` (a synchronous round) is fresh.
    """

    def contribute(update: Update, w: jax.Array, stats: ClientStats) -> PyTree:
        tau = jnp.zeros((), jnp.int32) if stats.staleness is None else stats.staleness
        dtype = jnp.result_type(*jax.tree.leaves(update))  # the run's: float64 in a float64 run
        scaled = w.astype(dtype) * weight(tau.astype(dtype))
        scaled_updates = jax.tree.map(lambda u: weighted_or_zero(scaled, u), update)
        return scaled_updates, weighted_or_zero(w, jnp.float32(1))

    return Aggregator(contribute, weighted_mean().finalize)
