"""FreezeFL's fair reputation-based client selection, with warm restarts.

Chou, Chang and Chou, "FreezeFL: Accelerating Federated Learning in Heterogeneous
Edge Devices by Layer Freezing" (notes: dace-gandalf-freezefl Appendix B.2), §IV-C,
Eqs. 5-8 and Algorithm 1 (lines 4, 8, 10-11). After a round whose update counted,
client ``k``'s utility moves by an exponential moving average (Eq. 7) towards

    U_sys^k x U_data^k,   U_sys^k = s_k  (Eq. 5: L - n_k, as a share s_k = (L - n_k) / L),
    U_data^k = max(0, sum_{l > n_k} <Delta w^{k,l}, Delta w^l> / dim(w^l))      (Eq. 6)

``s_k`` the share of the model's work it kept (``ClientRecord.work_kept``: its unfrozen
layers over all layers with ``algorithms.freezefl``; its width with a sub-model, the
paper's Table IV; 1 when it trains everything), ``Delta w^l`` the round's change of the
global layer ``l`` and ``Delta w^{k,l}`` the client's (``ClientRecord.alignment``). Every
``Phi`` rounds (Algorithm 1, line 10; Eq. 8), each utility moves towards the mean ``u-bar``
by the confidence bound ``sqrt(2 log Phi / phi_k)``, ``phi_k`` the rounds in the last
``Phi`` in which the client's update counted, without crossing the mean. A round draws its
``K`` clients without replacement with probabilities proportional to utility (§IV-C: "samples
clients with probability proportional to their utility"), among the ready clients.

A ``LearnedSelection`` for ``simulate.run(..., select=...)`` (config ``[selection] name =
"freezefl"``) that asks the engine for ``ClientRecord.alignment``; the utilities and the
participation counted at the last restart are its state.

>>> import jax, jax.numpy as jnp
>>> from fedjax_het.system.sampler import ClientRecord, ClientReport
>>> select = freezefl_selection(6, 2)
>>> report = ClientReport(jnp.ones(6), jnp.zeros(6), jnp.full(6, 10))
>>> ids, valid, state = select.select(
...     jax.random.key(0), 0, jnp.ones(6, bool), ClientRecord.empty(6), select.init(6), report)
>>> valid.tolist(), len(set(ids.tolist()))  # round 0: nobody observed, a uniform draw
([True, True], 2)

.. warning:: Decisions where the paper is silent:

   * ``U_data``'s local update is estimated to first order, ``-tau_k m_k * grad F_k(w_r)``
     (the gradient of the client's mean loss at the round's global model over its examples,
     masked to what it trained, times its local steps ``tau_k``; ``LearnedSelection.
     update_alignment``): the engine sums updates over the cohort and keeps none, and the
     global update is known only after the round. Nguyen et al., whom the paper cites for
     Eq. 6, bound a client's contribution by this gradient's alignment. The learning rate,
     common to all clients, is left out, as is ``L`` from ``U_sys`` (a share): neither
     changes a proportional draw or Eq. 8 below, which is scale-free.
   * The first observation of a client sets its utility (the EMA then weighs the old value
     ``ema``; 0.5, the rate of the soft deadline ``T_r`` here, the paper gives none); a client
     never observed weighs the mean utility of those observed (all weigh alike before any).
   * Eq. 8 runs on the utilities divided by their largest (rewards in [0, 1], which the UCB1
     bound it borrows assumes), then scaled back; the mean is over the observed clients,
     the never-observed keep none; ``phi_k = 0`` moves a client onto the mean.
   * Restarts follow a round ``r`` (1-based) with ``r mod Phi = 0``: before selecting round
     index ``r`` (0-based); observations are those of clients whose update counted (a late
     or dropped client reports nothing).
   * The draw is successive sampling proportional to utility (Plackett-Luce, by Gumbel
     top-k); slots left when fewer ready clients have positive utility go uniformly to the
     other ready clients.

Options:
  restart_every: ``Phi``, rounds between warm restarts, >= 1 (60 for FEMNIST, 30 for
    Shakespeare in the paper's Table I).
  warm_restarts: apply Eq. 8 every ``Phi`` rounds (Table III's "w/ CS,WR"); false: the
    reputation alone ("w/ CS").
  ema: weight of the old utility in Eq. 7's moving average, in [0, 1).

References:
  Chou, Chang and Chou, "FreezeFL: Accelerating Federated Learning in Heterogeneous Edge
  Devices by Layer Freezing", §IV-C, Eqs. 5-8 and Algorithm 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.system.sampler import ClientRecord, LearnedSelection


@struct.dataclass
class FreezeFLState:
    """Utilities ``u [N]`` (NaN: never observed) and each client's counted rounds at the last
    warm restart (``phi_k`` is ``ClientRecord.aggregated`` less these)."""

    utility: jax.Array
    counted_at_restart: jax.Array


def observation(record: ClientRecord) -> jax.Array:
    """``[N]`` ``U_sys x U_data`` of each client's last counted round (Eqs. 5-6; NaN: none)."""
    return record.work_kept * jnp.maximum(record.alignment, 0.0)


def absorb(
    utility: jax.Array, record: ClientRecord, round_idx: jax.Array, *, ema: float
) -> jax.Array:
    """``[N]`` Eq. 7 for the clients whose update counted in round ``round_idx - 1``."""
    x = observation(record)
    fresh = (round_idx > 0) & (record.last_aggregated == round_idx - 1) & ~jnp.isnan(x)
    moved = jnp.where(jnp.isnan(utility), x, ema * utility + (1 - ema) * x)
    return jnp.where(fresh, moved, utility)


def warm_restart(utility: jax.Array, participation: jax.Array, period: int) -> jax.Array:
    """``[N]`` Eq. 8 on the observed utilities (scaled to a largest of 1 and back)."""
    observed = ~jnp.isnan(utility)
    scale = jnp.nanmax(jnp.where(observed, utility, 0.0))
    scale = jnp.where(scale > 0, scale, 1.0)
    u = utility / scale
    mean = jnp.nanmean(u)
    phi = participation.astype(jnp.float32)
    bound = jnp.where(phi > 0, jnp.sqrt(2 * jnp.log(float(period)) / jnp.maximum(phi, 1)), jnp.inf)
    moved = jnp.where(u < mean, jnp.minimum(mean, u + bound), jnp.maximum(mean, u - bound))
    return jnp.where(observed, moved * scale, utility)


def draw_weights(utility: jax.Array) -> jax.Array:
    """``[N]`` the weight of each client in the draw: its utility, or the mean of the
    observed ones if never observed (1 if nobody is)."""
    observed = ~jnp.isnan(utility)
    mean = jnp.sum(jnp.where(observed, utility, 0.0)) / jnp.maximum(jnp.sum(observed), 1)
    return jnp.where(observed, utility, jnp.where(jnp.any(observed), mean, 1.0))


def proportional_draw(key: jax.Array, weights: jax.Array, ready: jax.Array, num_slots: int):
    """``(ids [S], valid [S])``: ``S`` distinct ready clients drawn successively with
    probability proportional to ``weights``; then the ready ones of weight 0, uniformly."""
    noise = jax.random.gumbel(key, weights.shape)
    positive = ready & (weights > 0)
    keys = jnp.where(positive, jnp.log(jnp.where(positive, weights, 1.0)) + noise, noise)
    group = jnp.select([positive, ready], [0, 1], 2)
    ids = jnp.lexsort((-keys, group))[:num_slots].astype(jnp.int32)
    return ids, jnp.arange(num_slots) < jnp.sum(ready)


def freezefl_selection(
    num_clients: int,
    num_slots: int,
    *,
    restart_every: int = 60,
    warm_restarts: bool = True,
    ema: float = 0.5,
) -> LearnedSelection:
    """FreezeFL's selection over ``num_slots`` slots (see the module docstring for the options).

    References:
      Chou, Chang and Chou, "FreezeFL: Accelerating Federated Learning in Heterogeneous Edge
      Devices by Layer Freezing", §IV-C, Eqs. 5-8 and Algorithm 1.
    """
    if not 1 <= num_slots <= num_clients:
        raise ValueError(f"need 1 <= num_slots <= num_clients, got {num_slots}, {num_clients}")
    if restart_every < 1:
        raise ValueError(f"restart_every (Phi) must be >= 1, got {restart_every}")
    if not 0 <= ema < 1:
        raise ValueError(f"ema must be in [0, 1), got {ema}")

    def init(n: int) -> FreezeFLState:
        return FreezeFLState(jnp.full((n,), jnp.nan, jnp.float32), jnp.zeros((n,), jnp.int32))

    def select(key, round_idx, ready, record: ClientRecord, state: FreezeFLState, report):
        del report  # client-oblivious: the selection reads only what the updates tell
        utility = absorb(state.utility, record, round_idx, ema=ema)
        counted = state.counted_at_restart
        if warm_restarts:
            restart = (round_idx > 0) & (round_idx % restart_every == 0)
            restarted = warm_restart(utility, record.aggregated - counted, restart_every)
            utility = jnp.where(restart, restarted, utility)
            counted = jnp.where(restart, record.aggregated, counted)
        ids, valid = proportional_draw(key, draw_weights(utility), ready, num_slots)
        return ids, valid, FreezeFLState(utility, counted)

    return LearnedSelection(select, init, update_alignment=True, name="freezefl")
