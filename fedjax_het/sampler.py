"""The interfaces of client selection; implementations live in ``fedjax_het.sampling``.

Two kinds, one home (as ``fedjax_het.algorithm`` is the home of the algorithm
interface, and ``algorithms/`` of the algorithms): the engine calls these
types and never imports ``fedjax_het.sampling``, which imports the engine.

* a :class:`Sampler` selects from the round's key alone, so a whole run's
  cohorts (and schedule) can be computed before training;
* a :data:`LearnedSelect` also reads the server's :class:`ClientRecord` of
  what clients did in earlier rounds (power-of-choice, Oort, HDFL), and runs
  inside the training loop (``fedjax_het.online``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.typing import PRNGKey


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


@struct.dataclass
class ClientRecord:
    """What the server has seen of every client, ``[N]`` each.

    Attributes:
      loss: mean training loss of the client's last round with work (NaN: never).
      seconds: seconds from its last round's start until it finished (NaN: never finished).
      selected: rounds it was selected in.
      aggregated: rounds its update counted (OK).
      lost: rounds it started but did not count (late or dropped).
    """

    loss: jax.Array
    seconds: jax.Array
    selected: jax.Array
    aggregated: jax.Array
    lost: jax.Array

    @classmethod
    def empty(cls, num_clients: int) -> ClientRecord:
        nan, zero = jnp.full((num_clients,), jnp.nan), jnp.zeros((num_clients,), jnp.int32)
        return cls(loss=nan, seconds=nan, selected=zero, aggregated=zero, lost=zero)


# ``(key, round_idx, ready bool [N], record) -> (ids int32 [S], valid bool [S])``: ``key`` is the
# round's "select" stream; ``ready`` is all True unless the policy is availability-aware. Ids of
# valid slots must be distinct.
LearnedSelect = Callable[[PRNGKey, jax.Array, jax.Array, ClientRecord], tuple[jax.Array, jax.Array]]

