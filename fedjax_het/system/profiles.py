"""Per-client system profiles: compute speed, network, availability, dropout (docs/design.md §5).

Everything is an array with a leading client axis ``[N]``, so a schedule can
be computed inside jit and ``vmap``-ed over seeds and heterogeneity levels.
Units are fixed here, once: seconds, and bytes per second. Sources that
publish other units (FLASH's network speeds, AI-Benchmark scores) are
converted where they are loaded (``fedjax_het.system.sources``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_het.system.availability import ALWAYS, Availability
from fedjax_het.typing import PRNGKey


@struct.dataclass
class ClientProfiles:
    """System profile of every client.

    Attributes:
      step_time: ``[N]`` seconds one local training step (one minibatch) takes.
      down_mean, down_std: ``[N]`` download throughput in bytes/s; each
        transfer draws a fresh speed from a normal distribution truncated at 0
        (FLASH's rule, which resamples negative draws).
      up_mean, up_std: ``[N]`` upload throughput in bytes/s, the same way.
      trace: ``[N]`` int32 availability trace of each client, ``-1`` = always available.
      dropout: ``[N]`` probability that a client drops out during a round it
        started (device failure, user interrupt), independent across rounds.
      availability: the traces that ``trace`` indexes.
    """

    step_time: jax.Array
    down_mean: jax.Array
    down_std: jax.Array
    up_mean: jax.Array
    up_std: jax.Array
    trace: jax.Array
    dropout: jax.Array
    availability: Availability

    @property
    def num_clients(self) -> int:
        return int(self.step_time.shape[0])


def no_traces() -> Availability:
    """An empty trace store, for populations whose clients are all always available."""
    return Availability.from_intervals([], 1.0)


def uniform_profiles(
    num_clients: int,
    *,
    step_time: float = 0.0,
    bandwidth: float = float("inf"),
    dropout: float = 0.0,
) -> ClientProfiles:
    """Identical, always-available clients: the homogeneous baseline.

    With the defaults, communication and compute take no time (``bandwidth = inf``),
    so any policy reduces to plain synchronous FedAvg.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 0 <= step_time < np.inf or not bandwidth > 0:
        raise ValueError(
            f"need a finite step_time >= 0 and bandwidth > 0 (inf: transfers take no time), got "
            f"{step_time}, {bandwidth}"
        )
    if not 0 <= dropout < 1:
        raise ValueError(
            f"dropout is a probability in [0, 1) (at 1 nobody would ever train), got {dropout}"
        )
    full = lambda v: jnp.full((num_clients,), v, jnp.float32)
    return ClientProfiles(
        step_time=full(step_time),
        down_mean=full(bandwidth),
        down_std=full(0.0),
        up_mean=full(bandwidth),
        up_std=full(0.0),
        trace=jnp.full((num_clients,), ALWAYS, jnp.int32),
        dropout=full(dropout),
        availability=no_traces(),
    )


def draw_speed(key: PRNGKey, mean: jax.Array, std: jax.Array) -> jax.Array:
    """One transfer's throughput: ``N(mean, std)`` truncated to positive values."""
    safe_std = jnp.where(std > 0, std, 1.0)
    z = jax.random.truncated_normal(key, -mean / safe_std, jnp.inf, dtype=mean.dtype)
    return jnp.where(std > 0, mean + safe_std * z, mean)


def transfer_time(key: PRNGKey, num_bytes: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
    """Seconds to move ``num_bytes`` at a freshly drawn speed (0 bytes take 0 s)."""
    speed = draw_speed(key, mean, std)
    return jnp.where(num_bytes > 0, num_bytes / speed, 0.0)


def validate(profiles: ClientProfiles) -> None:
    """Checks shapes and ranges on the host; raises ValueError naming the field."""
    n = profiles.num_clients
    for name in ("step_time", "down_mean", "down_std", "up_mean", "up_std", "trace", "dropout"):
        value = np.asarray(getattr(profiles, name))
        if value.shape != (n,):
            raise ValueError(f"profiles.{name} must have shape ({n},), got {value.shape}")
    for name in ("step_time", "down_std", "up_std"):
        value = np.asarray(getattr(profiles, name))
        if np.any(~((value >= 0) & (value < np.inf))):
            raise ValueError(f"profiles.{name} must be finite and >= 0")
    for name in ("down_mean", "up_mean"):
        if np.any(~(np.asarray(getattr(profiles, name)) > 0)):
            raise ValueError(f"profiles.{name} (bytes/s) must be > 0")
    dropout = np.asarray(profiles.dropout)
    if np.any(~((dropout >= 0) & (dropout <= 1))):
        raise ValueError("profiles.dropout holds probabilities, which must lie in [0, 1]")
    trace = np.asarray(profiles.trace)
    if np.any((trace < ALWAYS) | (trace >= profiles.availability.num_traces)):
        raise ValueError(
            f"profiles.trace must be -1 (always available) or a trace id below "
            f"{profiles.availability.num_traces}"
        )
