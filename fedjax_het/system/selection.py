"""How a round's clients are chosen: the ``SelectFn`` a schedule calls, and its two makers.

A ``SelectFn`` draws a round's slots from the round's ``"select"`` stream and
the readiness of every client (all True unless the policy is
availability-aware): FLHetBench's uniform choice among the ready clients
(``select_among_ready``), or any ``Sampler`` (``sampler_select``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_het.system.sampler import Sampler
from fedjax_het.typing import PRNGKey

# ``(key, round_idx, ready bool [N]) -> (ids int32 [S], valid bool [S])``. ``key`` is already
# the round's "select" stream; ``ready`` is all True unless the policy is availability-aware.
SelectFn = Callable[[PRNGKey, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def select_among_ready(num_clients: int, num_slots: int) -> SelectFn:
    """Uniform selection of ``min(num_slots, #ready)`` clients among the ready ones.

    FLHetBench's selection (notes §3.2, §4.2): every ready client is equally
    likely; slots beyond the number of ready clients are EMPTY.
    """
    if not 1 <= num_slots <= num_clients:
        raise ValueError(f"num_slots must be in [1, num_clients={num_clients}], got {num_slots}")

    def select(key: PRNGKey, round_idx: jax.Array, ready: jax.Array):
        del round_idx  # the key is already fold_in(seed, round)
        priority = jnp.where(ready, jax.random.uniform(key, (num_clients,)), 2.0)
        ids = jnp.argsort(priority)[:num_slots].astype(jnp.int32)
        return ids, jnp.arange(num_slots) < jnp.sum(ready)

    return select


def sampler_select(sampler: Sampler) -> SelectFn:
    """A ``Sampler`` as a ``SelectFn``.

    A sampler does not see readiness: under availability-aware selection the
    clients it draws that are not ready are left out (EMPTY slots), so a round
    may have fewer than ``cohort_size`` clients. For FLHetBench's "pick among
    the ready" use ``select_among_ready``.
    """

    def select(key: PRNGKey, round_idx: jax.Array, ready: jax.Array):
        ids = sampler.select(key, round_idx).astype(jnp.int32)
        return ids, ready[ids]

    return select


def as_select_fn(select: Sampler | SelectFn) -> SelectFn:
    """A ``Sampler`` through ``sampler_select``; a ``SelectFn`` as it is."""
    return sampler_select(select) if isinstance(select, Sampler) else select
