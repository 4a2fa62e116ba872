"""The interfaces of client selection; implementations live in ``fedjax_het.sampling``.

Two kinds, one home (as ``fedjax_het.engine.algorithm`` is the home of the algorithm
interface, and ``algorithms/`` of the algorithms): the engine calls these
types and never imports ``fedjax_het.sampling``, which imports the engine.

* a :class:`Sampler` selects from the round's key alone, so a whole run's
  cohorts (and schedule) can be computed before training;
* a :data:`LearnedSelect` also reads the server's :class:`ClientRecord` of
  what clients did in earlier rounds (power-of-choice), and runs inside the
  training loop (``fedjax_het.training.online``);
* a :class:`LearnedSelection` is a learned selection with its own state (Oort's
  pacer, HDFL's underestimation index), the clients' :class:`ClientReport` of
  their profiles, and measurements it asks the engine for: a profile of the
  global model's predictions over every client's training data every
  ``profile_every`` rounds, squared per-example training losses, and how each
  client's update aligns with the round's global update (FreezeFL's selection).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.typing import PRNGKey, PyTree


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
      loss_sq: mean squared per-example loss of the global model on the examples it
        trained in its last round with work (NaN: never, or not measured: the engine
        measures it only for a ``LearnedSelection`` with ``loss_squares``).
      examples: examples it processed in its last round with work (0: never).
      last_selected: the last round it was selected in (-1: never).
      last_aggregated: the last round its update counted (-1: never).
      work_kept: the share of the full model's work it kept in the last round its update
        counted (NaN: never): ``ClientStats.work_kept``, 1 when it trained everything
        (FreezeFL: its unfrozen layers over all layers; a sub-model: its width).
      alignment: how its update of the last round its update counted aligned with that
        round's global update, ``layer_alignment`` (NaN: never, or not measured: the engine
        measures it only for a ``LearnedSelection`` with ``update_alignment``).
    """

    loss: jax.Array
    seconds: jax.Array
    selected: jax.Array
    aggregated: jax.Array
    lost: jax.Array
    loss_sq: jax.Array
    examples: jax.Array
    last_selected: jax.Array
    last_aggregated: jax.Array
    work_kept: jax.Array
    alignment: jax.Array

    @classmethod
    def empty(cls, num_clients: int) -> ClientRecord:
        # Fields share arrays: the in-loop block, which donates its state, copies every leaf
        # of it first (``strategies._owned``).
        nan, zero = jnp.full((num_clients,), jnp.nan), jnp.zeros((num_clients,), jnp.int32)
        never = jnp.full((num_clients,), -1, jnp.int32)
        return cls(
            loss=nan, seconds=nan, selected=zero, aggregated=zero, lost=zero, loss_sq=nan,
            examples=zero, last_selected=never, last_aggregated=never, work_kept=nan,
            alignment=nan,
        )


@struct.dataclass
class ClientReport:
    """What every client declares about itself, ``[N]`` each: its profile as the server is told.

    Attributes:
      seconds: expected seconds of a full round's work at its mean speeds (download,
        every local step, upload; no server overhead, no waiting for availability).
      dropout: probability that it drops out of a round it started.
      examples: examples its full local task processes (local data times epochs).
    """

    seconds: jax.Array
    dropout: jax.Array
    examples: jax.Array


def layer_alignment(update: PyTree, reference: PyTree) -> jax.Array:
    """``sum_l <update^l, reference^l> / dim(w^l)`` over the layers ``l``: the top-level entries
    of the params (the modules FreezeFL freezes, ``algorithms.freezefl``), or one layer when
    the params are not a mapping (FreezeFL's Eq. 6 over the layers a client trained)."""
    layers = lambda tree: list(tree.values()) if isinstance(tree, Mapping) else [tree]
    total = jnp.float32(0)
    for a, b in zip(layers(update), layers(reference)):
        leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
        dot = sum(jnp.vdot(x, y) for x, y in zip(leaves_a, leaves_b))
        total = total + dot / max(1, sum(x.size for x in leaves_a))
    return total


# ``(key, round_idx, ready bool [N], record) -> (ids int32 [S], valid bool [S])``: ``key`` is the
# round's "select" stream; ``ready`` is all True unless the policy is availability-aware. Ids of
# valid slots must be distinct.
LearnedSelect = Callable[[PRNGKey, jax.Array, jax.Array, ClientRecord], tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class LearnedSelection:
    """A learned selection with state, the clients' reports and measurements it asks for.

    Attributes:
      select: ``(key, round_idx, ready, record, state, report) -> (ids, valid, state)``,
        as a ``LearnedSelect`` (same key, ``ready``, slots and distinct valid ids) that
        also reads and returns its own ``state`` and reads the ``ClientReport``.
      init: ``num_clients -> state``, the state before round 0 (a pytree of arrays).
      profile: ``(state, predicted, actual) -> state`` or None. Every ``profile_every``
        rounds (round 0 included), before selecting, the engine runs the global model
        over every client's training rows and passes ``predicted [N, C]`` (rows whose
        arg-max output is each class) and ``actual [N, C]`` (rows with each label).
      profile_every: rounds between profiles (0: none; required with ``profile``).
      loss_squares: measure ``ClientRecord.loss_sq`` (one forward pass of the global
        model over the examples each selected client trained).
      update_alignment: measure ``ClientRecord.alignment`` after each round: per selected
        client, ``layer_alignment(-steps_k m_k * grad F_k(w_r), w_{r+1} - w_r)``, the gradient
        of its mean loss at the round's global model ``w_r`` over each of its examples once
        (one forward and backward pass), masked to what it trained (``m_k``), times its
        local steps: the first-order estimate of its update against the global update.
      name: a short name for logs.
    """

    select: Callable[..., tuple[jax.Array, jax.Array, PyTree]]
    init: Callable[[int], PyTree] = lambda num_clients: ()
    profile: Callable[[PyTree, jax.Array, jax.Array], PyTree] | None = None
    profile_every: int = 0
    loss_squares: bool = False
    update_alignment: bool = False
    name: str = "selection"

    def __post_init__(self):
        if (self.profile is None) != (self.profile_every == 0) or self.profile_every < 0:
            raise ValueError(
                f"a profile needs profile_every >= 1 and profile_every needs a profile, got "
                f"{self.profile_every} with profile {self.profile!r}"
            )


def as_selection(select: LearnedSelect | LearnedSelection) -> LearnedSelection:
    """A ``LearnedSelection`` as it is; a ``LearnedSelect`` with no state, asking for nothing."""
    if isinstance(select, LearnedSelection):
        return select

    def stateless(key, round_idx, ready, record, state, report):
        del report
        return (*select(key, round_idx, ready, record), state)

    return LearnedSelection(stateless, name=getattr(select, "__name__", "selection"))
