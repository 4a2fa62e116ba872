"""The interface of a client-selection rule (implementations live in ``fedjax_het.sampling``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax


@dataclasses.dataclass(frozen=True)
class Sampler:
    """Chooses the cohort of a round.

    Attributes:
      select: ``(key, round_idx) -> int32 [cohort_size]`` client ids, where
        ``key`` is already ``fold_in(seed, round)`` on the selection stream.
      num_clients: population size.
      cohort_size: clients selected per round (static).
      name: registry name.
    """

    select: Callable[[jax.Array, jax.Array], jax.Array]
    num_clients: int
    cohort_size: int
    name: str = "sampler"
