"""Synthetic system profiles: log-normal step times, Bernoulli and window availability, dropout.

Stand-ins for the real sources (``fedjax_het.system.sources``) when a study wants a knob
instead of a data set. Every generator is a pure JAX function of a PRNG key and array
hyperparameters, so a sweep can ``jit`` and ``vmap`` it over seeds and heterogeneity levels;
only the client count and the number of availability slots are static. Combine the pieces
with ``sources.assemble_profiles``:

>>> import jax
>>> from fedjax_het.system.sources import assemble_profiles
>>> k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
>>> n = 8
>>> profiles = assemble_profiles(
...     lognormal_step_times(k1, n, median=0.5, sigma=0.8),
...     down_mean=2e6, down_std=5e5, up_mean=1e6, up_std=2e5,
...     trace=jax.numpy.arange(n),
...     availability=bernoulli_availability(k2, n, p=0.3, slots=24, period=86_400.0),
...     dropout=exponential_dropout(k3, n, mean=0.4),
... )
>>> profiles.num_clients, profiles.availability.num_traces
(8, 8)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.system.availability import Availability
from fedjax_het.typing import PRNGKey


def _check(name: str, value, ok, allowed: str) -> None:
    """Raises ValueError when a concrete ``value`` fails ``ok``; traced values pass."""
    if not isinstance(value, jax.core.Tracer) and not np.all(ok(np.asarray(value))):
        raise ValueError(f"{name} must be {allowed}, got {value}")


def _per_client(name: str, value, num_clients: int) -> jax.Array:
    value = jnp.asarray(value, jnp.float32)
    if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != num_clients):
        raise ValueError(
            f"{name} must be a scalar or a [{num_clients}] array, got shape {value.shape}"
        )
    return jnp.broadcast_to(value, (num_clients,))


def lognormal_step_times(key: PRNGKey, num_clients: int, *, median, sigma) -> jax.Array:
    """``[N]`` seconds per step, ``median * exp(sigma * z)`` with ``z ~ N(0, 1)`` per client.

    Log-normal speeds are the usual synthetic model of heavy-tailed device heterogeneity;
    ``sigma`` is the heterogeneity level (0: identical devices; the mean is
    ``median * exp(sigma**2 / 2)``, the ratio of the 90th to the 10th percentile
    ``exp(2.563 * sigma)``). A median of 0 makes every step free (only the network takes
    time), as ``step_time = 0`` does for identical devices.
    """
    _check("median", median, lambda v: v >= 0, ">= 0 seconds")
    _check("sigma", sigma, lambda v: v >= 0, ">= 0")
    z = jax.random.normal(key, (num_clients,), jnp.float32)
    return _per_client("median", median, num_clients) * jnp.exp(sigma * z)


def exponential_dropout(key: PRNGKey, num_clients: int, *, mean=0.4) -> jax.Array:
    """``[N]`` per-round dropout probabilities: ``min(Exp(mean), 1)`` per client.

    HDFL's Client Dropout Ratio (Zawad et al., §III-C): each client draws a CDR from an
    exponential distribution with mean 0.4 and drops out of each round it joins with that
    probability. The clip to 1 is ours (the paper does not state it; with mean 0.4, 8.2 % of
    clients reach 1 and never finish).
    """
    _check("mean", mean, lambda v: v >= 0, ">= 0")
    return jnp.minimum(mean * jax.random.exponential(key, (num_clients,), jnp.float32), 1.0)


def _padded_availability(start, end, count, period) -> Availability:
    """An ``Availability`` over ``[N, J]`` padded interval rows (row ``j < count[k]`` valid).

    Trace ``k`` owns rows ``k * J : k * J + count[k]``; the rows after them are never read by
    the queries, which search only the first ``count`` rows of a trace.
    """
    n, width = start.shape
    valid = jnp.arange(width)[None, :] < count[:, None]
    period = jnp.broadcast_to(jnp.asarray(period, start.dtype), (n,))
    start = jnp.where(valid, start, period[:, None])
    end = jnp.where(valid, jnp.minimum(end, period[:, None]), period[:, None])
    length = end - start
    before = jnp.cumsum(length, axis=1) - length
    return Availability(
        start=start.reshape(-1),
        end=end.reshape(-1),
        ready_before=before.reshape(-1),
        offset=jnp.arange(n, dtype=jnp.int32) * width,
        count=count.astype(jnp.int32),
        period=period,
        ready_per_period=length.sum(axis=1),
        longest=width,
    )


def bernoulli_availability(
    key: PRNGKey, num_clients: int, *, p, slots: int, period
) -> Availability:
    """Each client is ready in each of ``slots`` equal slots of a period with probability ``p``.

    Slot ``h`` covers ``[h, h + 1) * period / slots``; slot states are independent across
    clients and slots, drawn once and replayed every period. Runs of ready slots are merged
    into one interval (a run ending at the period's end is not joined with one opening the
    next cycle, as in ``Availability.from_intervals``), so ``finish_time_or_lost`` sees whole
    runs. The expected ready fraction of a client is ``p``.

    Args:
      p: probability, a scalar or one per client ``[N]``.
      slots: H, static.
      period: cycle length in seconds (e.g. 86,400 for one day).

    Returns:
      ``num_clients`` traces; client ``i`` has trace ``i``.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    _check("p", p, lambda v: (v >= 0) & (v <= 1), "a probability in [0, 1]")
    _check("period", period, lambda v: v > 0, "> 0 seconds")
    return _bernoulli(key, num_clients, slots, p, period)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _bernoulli(key, num_clients, slots, p, period) -> Availability:
    prob = _per_client("p", p, num_clients)
    # Drawn flat then reshaped: XLA:CPU compiles a 2-D draw with a short last axis slowly.
    uniform = jax.random.uniform(key, (num_clients * slots,)).reshape(num_clients, slots)
    ready = uniform < prob[:, None]
    off = jnp.zeros((num_clients, 1), bool)
    opens = ready & ~jnp.concatenate([off, ready[:, :-1]], axis=1)
    closes = ready & ~jnp.concatenate([ready[:, 1:], off], axis=1)
    # Slot indices of the run openings (closings), compacted to the front in order.
    first_open = jnp.argsort(~opens, axis=1, stable=True)
    last_close = jnp.argsort(~closes, axis=1, stable=True)
    period = jnp.asarray(period, jnp.float32)
    return _padded_availability(
        period * first_open / slots, period * (last_close + 1) / slots, opens.sum(axis=1), period
    )


def window_availability(key: PRNGKey, num_clients: int, *, fraction, period) -> Availability:
    """Each client is ready for one window of ``fraction * period`` at a uniform random phase.

    The window starts at ``phase ~ U(0, period)`` and wraps around the period's end (then it
    is two intervals, ``[0, phase + length - period)`` and ``[phase, period)``). Every client
    is ready exactly ``fraction`` of the time, at a time of day that is uniform across clients:
    the "uniform" counterpart of ``bernoulli_availability``.

    Args:
      fraction: ready share in [0, 1], a scalar or ``[N]``.
      period: cycle length in seconds.
    """
    _check("fraction", fraction, lambda v: (v >= 0) & (v <= 1), "a share in [0, 1]")
    _check("period", period, lambda v: v > 0, "> 0 seconds")
    return _window(key, num_clients, fraction, period)


@functools.partial(jax.jit, static_argnums=(1,))
def _window(key, num_clients, fraction, period) -> Availability:
    period = jnp.asarray(period, jnp.float32)
    length = _per_client("fraction", fraction, num_clients) * period
    phase = jax.random.uniform(key, (num_clients,)) * period
    full = length >= period
    wraps = ~full & (phase + length > period)
    spill = phase + length - period
    first_end = jnp.where(full, period, jnp.where(wraps, spill, phase + length))
    start = jnp.stack([jnp.where(wraps | full, 0.0, phase), jnp.where(wraps, phase, period)], 1)
    end = jnp.stack([first_end, jnp.full_like(phase, period)], 1)
    count = jnp.where(wraps, 2, jnp.where(length > 0, 1, 0))
    return _padded_availability(start, end, count, period)
