"""Oort: guided participant selection by statistical and system utility, with a pacer.

Lai, Zhu, Madhyastha and Chowdhury, "Oort: Efficient Federated Learning via
Guided Participant Selection" (OSDI 2021), Algorithm 1 and §4. Every round
(``r = round_idx + 1``, 1-based as in the paper), over the clients that have
reported (explored, ``E``), with ``K`` slots and ``epsilon = max(epsilon_0
d^round_idx, epsilon_min)``:

    U_i    = |B_i| sqrt(mean_{b in B_i} loss_b^2)           (statistical utility, §4.2)
    u_i    = (min(U_i, U_clip) - min_E U) / (U_clip - min_E U)   (U_clip: a quantile over E)
    Util_i = (u_i + sqrt(0.1 log r / L_i)) * (T / t_i)^(alpha [T < t_i])

``B_i`` the examples of its last round with work, ``L_i`` the (1-based) round it
was last selected, ``t_i`` its last measured duration, ``T`` the pacer's
preferred duration. Exploitation: the ``floor((1 - epsilon) K)`` best are
sampled, proportionally to ``Util``, among the explored clients with ``Util >=
c * Util_((1 - epsilon) K)`` (the ``(1 - epsilon) K``-th largest); exploration:
the other slots among never-explored clients, proportionally to their speed
``1 / t_i`` (``t_i`` estimated from the profile, ``ClientReport.seconds``).
Pacer: ``T`` is the ``q``-quantile of every client's duration (measured, else
estimated); every ``W`` rounds, if the statistical utility collected over the
last ``W`` rounds is below that of the ``W`` before, ``q <- min(q + delta, 1)``.

A ``LearnedSelection`` for ``simulate.run(..., select=...)``; it asks the engine
for squared losses (``ClientRecord.loss_sq``) and keeps the pacer as its state.

>>> import jax, jax.numpy as jnp
>>> from fedjax_het.system.sampler import ClientRecord, ClientReport
>>> select = oort(6, 2)
>>> report = ClientReport(jnp.arange(1.0, 7.0), jnp.zeros(6), jnp.full(6, 10))
>>> ids, valid, state = select.select(
...     jax.random.key(0), 0, jnp.ones(6, bool), ClientRecord.empty(6), select.init(6), report)
>>> valid.tolist(), len(set(ids.tolist()))  # round 0: all exploration, by speed
([True, True], 2)

.. warning:: Decisions where the paper leaves room (the authors' selector, SymbioticLab/Oort
   ``oort/oort.py``, followed where it is explicit): ``U`` is clipped at its
   ``clip_quantile`` quantile over the explored clients and min-max scaled, so the
   staleness term is not swamped; the staleness term uses the paper's ``L_i`` (the last
   round selected, not the rounds since); ``T`` is a quantile of all clients' durations
   (the selector's ``round_threshold``), stepped by ``delta`` in quantile units, relaxed on
   a drop (Algorithm 1; the selector relaxes when the change is within 10 %) over
   non-overlapping windows of ``W`` rounds, summing ``U`` of every client that counted in a
   round (the selector averages its exploited ones); the cut-off is the ``(1 - epsilon)
   K``-th utility (the selector: the next one); exploration samples by speed (Algorithm 1;
   the selector by data size and system penalty); slots left when too few unexplored
   clients are ready go to the remaining explored ones by ``Util``; ``epsilon`` decays
   from round 0. No blacklist (the selector's default has none).

.. warning:: ``loss_b`` is the loss of the round's global model (before local training) on
   the examples the client trained (``online.OnlineRound``: one extra forward pass), not the
   running training loss of the paper's clients; ``|B_i|`` counts those examples.

Options:
  exploration: ``epsilon_0``, the share of slots first given to never-explored clients.
  exploration_decay: ``d``: the share is ``epsilon_0 d^round``, in (0, 1].
  exploration_min: ``epsilon_min``, the least share of exploration, <= ``exploration``.
  cut_off: ``c``: exploited clients are drawn among those with utility at least ``c`` times
    the ``(1 - epsilon) K``-th largest, in (0, 1].
  penalty: ``alpha``, the exponent penalising clients slower than the preferred duration
    ``T``, >= 0.
  pacer_window: ``W``, rounds per window of the pacer, >= 1.
  pacer_delta: the pacer's step of the duration quantile, in [0, 1].
  duration_quantile: the pacer's first quantile ``q`` of the clients' durations, ``T``.
  clip_quantile: the quantile over explored clients at which the statistical utility is
    clipped, in (0, 1].
  staleness: the weight of the staleness term ``sqrt(0.1 log r / L_i)`` (0.1 in the paper),
    >= 0.

References:
  Lai, Zhu, Madhyastha and Chowdhury, "Oort: Efficient Federated Learning via Guided
  Participant Selection" (OSDI 2021), Algorithm 1 and §4.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.system.sampler import ClientRecord, ClientReport, LearnedSelection


@struct.dataclass
class OortState:
    """The pacer: ``q`` of the preferred duration and the utility of the current and last window."""

    quantile: jax.Array
    window: jax.Array
    last_window: jax.Array


def statistical_utility(record: ClientRecord) -> jax.Array:
    """``[N]`` ``|B_i| sqrt(mean loss^2)`` of each client's last round with work (NaN: never)."""
    return record.examples * jnp.sqrt(record.loss_sq)


def exploration_share(
    round_idx: jax.Array, start: float = 0.9, decay: float = 0.98, floor: float = 0.2
) -> jax.Array:
    """``max(start * decay^round_idx, floor)``."""
    return jnp.maximum(start * decay ** jnp.asarray(round_idx, jnp.float32), floor)


def durations(record: ClientRecord, report: ClientReport) -> jax.Array:
    """``[N]`` last measured duration, or the profile's estimate if never measured."""
    return jnp.where(jnp.isnan(record.seconds), report.seconds, record.seconds)


def utility(
    record: ClientRecord, duration: jax.Array, preferred: jax.Array, round_idx: jax.Array, *,
    clip_quantile: float = 0.95, staleness: float = 0.1, penalty: float = 2.0,
) -> jax.Array:
    """``[N]`` Oort's ``Util`` of every explored client (NaN for the others)."""
    raw = statistical_utility(record)
    explored = ~jnp.isnan(raw) & ~jnp.isnan(record.seconds)
    raw = jnp.where(explored, raw, jnp.nan)
    clipped = jnp.minimum(raw, jnp.nanquantile(raw, clip_quantile))
    low = jnp.nanmin(clipped)
    scaled = (clipped - low) / jnp.maximum(jnp.nanmax(clipped) - low, 1e-4)
    r = jnp.asarray(round_idx, jnp.float32) + 1.0
    last = jnp.maximum(record.last_selected + 1, 1).astype(jnp.float32)
    bonus = jnp.sqrt(staleness * jnp.log(r) / last)
    slow = duration > preferred
    system = jnp.where(slow, (preferred / jnp.where(slow, duration, 1.0)) ** penalty, 1.0)
    return jnp.where(explored, (scaled + bonus) * system, jnp.nan)


def pace(
    state: OortState, record: ClientRecord, round_idx: jax.Array, *, window: int, delta: float
) -> OortState:
    """The pacer before round ``round_idx``: add last round's utility; every ``window`` rounds,
    relax ``q`` by ``delta`` if the window collected less than the one before."""
    fresh = (round_idx > 0) & (record.last_aggregated == round_idx - 1)
    raw = statistical_utility(record)
    collected = state.window + jnp.sum(jnp.where(fresh & ~jnp.isnan(raw), raw, 0.0))
    boundary = (round_idx > 0) & (round_idx % window == 0)
    relax = boundary & (collected < state.last_window)
    return OortState(
        quantile=jnp.where(relax, jnp.minimum(state.quantile + delta, 1.0), state.quantile),
        window=jnp.where(boundary, 0.0, collected),
        last_window=jnp.where(boundary, collected, state.last_window),
    )


def _ranks(keys: jax.Array) -> jax.Array:
    """Rank of each entry in descending order of ``keys`` (0 = largest; ties by index)."""
    return jnp.argsort(jnp.argsort(-keys, stable=True), stable=True)


def oort(
    num_clients: int,
    num_slots: int,
    *,
    exploration: float = 0.9,
    exploration_decay: float = 0.98,
    exploration_min: float = 0.2,
    cut_off: float = 0.95,
    penalty: float = 2.0,
    pacer_window: int = 20,
    pacer_delta: float = 0.05,
    duration_quantile: float = 0.3,
    clip_quantile: float = 0.95,
    staleness: float = 0.1,
) -> LearnedSelection:
    """Oort over ``num_slots`` slots (see the module docstring for the options' roles)."""
    if not 1 <= num_slots <= num_clients:
        raise ValueError(f"need 1 <= num_slots <= num_clients, got {num_slots}, {num_clients}")
    if not 0 <= exploration_min <= exploration <= 1 or not 0 < exploration_decay <= 1:
        raise ValueError(
            f"need 0 <= exploration_min <= exploration <= 1 and 0 < exploration_decay <= 1, got "
            f"{exploration_min}, {exploration}, {exploration_decay}"
        )
    if not (0 < cut_off <= 1 and 0 < clip_quantile <= 1 and 0 <= duration_quantile <= 1):
        raise ValueError(
            f"cut_off, clip_quantile must be in (0, 1] and duration_quantile in [0, 1], got "
            f"{cut_off}, {clip_quantile}, {duration_quantile}"
        )
    if penalty < 0 or staleness < 0 or pacer_window < 1 or not 0 <= pacer_delta <= 1:
        raise ValueError(
            f"need penalty >= 0, staleness >= 0, pacer_window >= 1, pacer_delta in [0, 1], got "
            f"{penalty}, {staleness}, {pacer_window}, {pacer_delta}"
        )

    def init(n: int) -> OortState:
        del n
        return OortState(jnp.float32(duration_quantile), jnp.float32(0), jnp.float32(jnp.nan))

    def select(key, round_idx, ready, record: ClientRecord, state: OortState, report):
        state = pace(state, record, round_idx, window=pacer_window, delta=pacer_delta)
        duration = durations(record, report)
        preferred = jnp.where(state.quantile >= 1, jnp.inf, jnp.quantile(duration, state.quantile))
        util = utility(
            record, duration, preferred, round_idx, clip_quantile=clip_quantile,
            staleness=staleness, penalty=penalty,
        )
        explored = ~jnp.isnan(util)
        epsilon = exploration_share(round_idx, exploration, exploration_decay, exploration_min)
        pool, fresh = explored & ready, ~explored & ready
        n_exploit = jnp.minimum(jnp.floor(num_slots * (1 - epsilon) + 1e-4), jnp.sum(pool))
        n_exploit = n_exploit.astype(jnp.int32)
        ordered = jnp.sort(jnp.where(pool, util, -jnp.inf))[::-1]
        candidate = pool & (util >= cut_off * ordered[jnp.maximum(n_exploit - 1, 0)])
        k_exploit, k_explore = jax.random.split(key)
        # Gumbel top-k on log-weights: sampling without replacement proportionally to them.
        exploit_key = jnp.log(jnp.maximum(jnp.where(pool, util, 0.0), 1e-30))
        exploit_key += jax.random.gumbel(k_exploit, (num_clients,))
        explore_key = -jnp.log(jnp.maximum(duration, 1e-30))
        explore_key += jax.random.gumbel(k_explore, (num_clients,))
        exploit = candidate & (_ranks(jnp.where(candidate, exploit_key, -jnp.inf)) < n_exploit)
        n_explore = jnp.minimum(num_slots - n_exploit, jnp.sum(fresh))
        explore = fresh & (_ranks(jnp.where(fresh, explore_key, -jnp.inf)) < n_explore)
        # Exploited, explored, then the rest of the ready explored ones (filling), then others.
        group = jnp.select([exploit, explore, pool, fresh], [0, 1, 2, 3], 4)
        within = jnp.where(explored, exploit_key, explore_key)
        order = jnp.lexsort((-within, group))
        ids = order[:num_slots].astype(jnp.int32)
        return ids, jnp.arange(num_slots) < jnp.sum(ready), state

    return LearnedSelection(select, init, loss_squares=True, name="oort")
