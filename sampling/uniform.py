"""Uniform client selection without replacement (McMahan et al. 2017, Algorithm 1).

Each round draws ``cohort_size`` distinct clients from ``num_clients`` with
the key ``fold_in(seed, round)``, so the cohort of round ``t`` never depends on
earlier rounds, on chunking or on how far a resumed run got.

>>> import jax
>>> sampler = uniform(num_clients=10, cohort_size=3)
>>> ids = sampler.select(jax.random.key(0), 0)
>>> ids.shape, len(set(ids.tolist()))
((3,), 3)
"""

from __future__ import annotations

import jax

from fedjax_het.system.sampler import Sampler


def uniform(num_clients: int, cohort_size: int) -> Sampler:
    """Selects ``cohort_size`` of ``num_clients`` clients uniformly, without replacement."""
    if not 1 <= cohort_size <= num_clients:
        raise ValueError(
            f"cohort_size must be between 1 and num_clients={num_clients}, got {cohort_size}"
        )

    def select(key: jax.Array, round_idx: jax.Array) -> jax.Array:
        del round_idx  # the key is already fold_in(seed, round)
        return jax.random.choice(key, num_clients, (cohort_size,), replace=False).astype("int32")

    return Sampler(select=select, num_clients=num_clients, cohort_size=cohort_size, name="uniform")
