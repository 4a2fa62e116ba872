"""Where every random number comes from: ``fold_in(seed, round, client_id)``.

Keys never depend on cohort order, chunking or sharding, so a run is
reproducible to the bit on one machine and resumable from any round.
Independent uses of randomness in the same round (client selection, local
training) draw from named streams so that adding one never shifts another.
"""

import zlib

import jax

from fedjax_het.typing import PRNGKey


def seed_key(seed: int) -> PRNGKey:
    """The root key of a run."""
    return jax.random.key(seed)


def stream(key: PRNGKey, name: str) -> PRNGKey:
    """A key for one named use of randomness, e.g. ``"select"`` or ``"train"``."""
    return jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def round_key(key: PRNGKey, round_idx: jax.Array) -> PRNGKey:
    return jax.random.fold_in(key, round_idx)


def client_key(key: PRNGKey, client_id: jax.Array) -> PRNGKey:
    return jax.random.fold_in(key, client_id)


def client_keys(key: PRNGKey, round_idx: jax.Array, name: str, ids: jax.Array) -> PRNGKey:
    """``[S]`` keys ``fold_in(stream(fold_in(key, round_idx), name), id)`` of clients ``ids``."""
    stream_key = stream(round_key(key, round_idx), name)
    return jax.vmap(client_key, in_axes=(None, 0))(stream_key, ids)
