"""RBCS-F: client selection by estimated exchange time, with a fairness guarantee.

Huang, Lin, Wu, He, Li and Zomaya, "An Efficiency-Boosting Client Selection Scheme for
Federated Learning With Fairness Guarantee", IEEE TPDS 32(7), 2021 (arXiv 2011.01783, 2020).
A round's length is its slowest selected client's model exchange time; the long-run
selection rate of client ``i`` must be at least ``beta_i``. Lyapunov optimisation turns the
rate constraints into virtual queues and each round into a drift-plus-penalty problem:

    Z_i(t + 1) = max(Z_i(t) + beta_i - x_i(t), 0)                        (virtual queue)
    S_t = argmin_{|S| = K} V max_{i in S} tau-hat_i(t) - sum_{i in S} Z_i(t)

``x_i(t) = 1`` if ``i`` is selected in round ``t``, ``V`` the trade-off between a round's
length and fairness. The exchange times are learnt by a contextual combinatorial bandit
(C^2MAB, LinUCB-like): ``tau_i = theta^T c_i`` plus noise, a shared ``theta``, with the
optimistic (lower-confidence) estimate

    tau-hat_i = theta-hat^T c_i - alpha sqrt(c_i^T H^{-1} c_i),   theta-hat = H^{-1} b
    H <- H + sum_i c_i c_i^T,  b <- b + sum_i tau_i c_i    (over the clients observed)

``H`` starting at ``lambda I`` and ``b`` at 0. The per-round problem is solved exactly: for
each ready client ``j`` as the slowest (in order of ``tau-hat``), the best set holds ``j`` and
the ``K - 1`` largest queues among the clients no slower; the best ``j`` wins.

As FreezeFL ran it, "with the clients' status known": the context is the status each client
reports, ``c_i = (1, s_i / s-bar)``, ``s_i`` its expected round seconds at its mean speeds
(``ClientReport.seconds``: download at its bandwidth, its local steps at its step time,
upload) and ``s-bar`` their mean; times are in units of ``s-bar`` (so ``V`` is unitless).

>>> import jax, jax.numpy as jnp
>>> from fedjax_het.system.sampler import ClientRecord, ClientReport
>>> select = rbcs_f(5, 2, fairness=0.0, confidence=0.0)
>>> report = ClientReport(jnp.array([5.0, 1.0, 4.0, 2.0, 3.0]), jnp.zeros(5), jnp.full(5, 10))
>>> ids, valid, state = select.select(
...     jax.random.key(0), 0, jnp.ones(5, bool), ClientRecord.empty(5), select.init(5), report)
>>> sorted(ids.tolist()), valid.tolist()  # no estimate yet: the two first ids
([0, 1], [True, True])

.. warning:: Decisions where the paper leaves room: the context (above) is FreezeFL's
   "status known" setting, so the bandit learns only how the measured times scale with the
   reported ones; an observation is the measured seconds of a client whose update counted
   in the last round (a late or dropped client's time is censored and left out); every
   ``beta_i`` is ``fairness`` times the uniform rate ``K / N`` (feasible for any fairness in
   [0, 1]); only ready clients are selected, and when fewer than ``K`` are ready all of them
   are; the queues count selections (not completions); ties in the per-round problem go to
   the faster threshold and then to the lower position in ``tau-hat`` order. The selection
   is deterministic: the round's key is unused.

Options:
  tradeoff: ``V``, the weight of a round's estimated length against the queues, >= 0.
  fairness: each client's minimum long-run selection rate as a share of the uniform rate
    ``K / N`` (``beta_i = fairness K / N``), in [0, 1].
  confidence: ``alpha``, the weight of the confidence width in the time estimate, >= 0.
  ridge: ``lambda``, the ridge prior of the time regression (``H`` starts at ``lambda I``), > 0.

References:
  Huang, Lin, Wu, He, Li and Zomaya, "An Efficiency-Boosting Client Selection Scheme for
  Federated Learning With Fairness Guarantee", IEEE TPDS 32(7):1552-1564, 2021.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.system.sampler import ClientRecord, ClientReport, LearnedSelection


@struct.dataclass
class RBCSFState:
    """The virtual queues ``Z [N]`` and the bandit's ``H [d, d]`` and ``b [d]``."""

    queue: jax.Array
    gram: jax.Array
    moment: jax.Array


def contexts(report: ClientReport) -> tuple[jax.Array, jax.Array]:
    """``(c [N, 2], s-bar)``: each client's context ``(1, s_i / s-bar)`` and the time unit."""
    unit = jnp.maximum(jnp.mean(report.seconds), 1e-12)
    c = jnp.stack([jnp.ones_like(report.seconds), report.seconds / unit], axis=1)
    return c, unit


def learn(state: RBCSFState, record: ClientRecord, c, unit, round_idx) -> RBCSFState:
    """``H`` and ``b`` after the measured times of last round's counted clients."""
    fresh = (round_idx > 0) & (record.last_aggregated == round_idx - 1)
    fresh = fresh & jnp.isfinite(record.seconds)
    weight = fresh.astype(c.dtype)[:, None]
    tau = jnp.where(fresh, record.seconds / unit, 0.0)
    gram = state.gram + (weight * c).T @ c
    return state.replace(gram=gram, moment=state.moment + (weight * c).T @ tau)


def estimate(state: RBCSFState, c: jax.Array, *, confidence: float) -> jax.Array:
    """``[N]`` the optimistic exchange times ``theta-hat^T c_i - alpha ||c_i||_{H^-1}``."""
    theta = jnp.linalg.solve(state.gram, state.moment)
    width = jnp.sqrt(jnp.maximum(jnp.sum(c * jnp.linalg.solve(state.gram, c.T).T, axis=1), 0))
    return c @ theta - confidence * width


def solve(tau: jax.Array, queue: jax.Array, ready: jax.Array, slots: int, tradeoff: float):
    """``(ids [K], valid [K])`` minimising ``V max tau - sum Z`` over ``K`` ready clients."""
    order = jnp.lexsort((tau, ~ready))  # ready clients by estimated time, then the others
    t, z, n_ready = tau[order], queue[order], jnp.sum(ready)
    if slots > 1:  # the sum of the K - 1 largest queues strictly before each position

        def step(best, zi):
            return jax.lax.top_k(jnp.append(best, zi), slots - 1)[0], jnp.sum(best)

        _, before = jax.lax.scan(step, jnp.full((slots - 1,), -jnp.inf, z.dtype), z)
    else:
        before = jnp.zeros_like(z)
    cost = tradeoff * t - z - before  # +inf where fewer than K - 1 come before
    position = jnp.arange(tau.shape[0])
    cost = jnp.where(position < n_ready, cost, jnp.inf)
    slowest = jnp.argmin(cost)
    if slots > 1:
        _, others = jax.lax.top_k(jnp.where(position < slowest, z, -jnp.inf), slots - 1)
        chosen = jnp.concatenate([slowest[None], others])
    else:
        chosen = slowest[None]
    every_ready = n_ready <= slots  # nothing to choose: all the ready clients
    chosen = jnp.where(every_ready, position[:slots], chosen)
    return order[chosen].astype(jnp.int32), jnp.arange(slots) < n_ready


def rbcs_f(
    num_clients: int,
    num_slots: int,
    *,
    tradeoff: float = 10.0,
    fairness: float = 0.5,
    confidence: float = 0.1,
    ridge: float = 1.0,
) -> LearnedSelection:
    """RBCS-F over ``num_slots`` slots (see the module docstring for the options).

    References:
      Huang, Lin, Wu, He, Li and Zomaya, "An Efficiency-Boosting Client Selection Scheme for
      Federated Learning With Fairness Guarantee", IEEE TPDS 32(7):1552-1564, 2021.
    """
    if not 1 <= num_slots <= num_clients:
        raise ValueError(f"need 1 <= num_slots <= num_clients, got {num_slots}, {num_clients}")
    if not 0 <= fairness <= 1:
        raise ValueError(f"fairness must be in [0, 1], got {fairness}")
    if tradeoff < 0 or confidence < 0 or not ridge > 0:
        raise ValueError(
            f"need tradeoff >= 0, confidence >= 0 and ridge > 0, got {tradeoff}, "
            f"{confidence}, {ridge}"
        )
    beta = fairness * num_slots / num_clients

    def init(n: int) -> RBCSFState:
        return RBCSFState(
            jnp.zeros((n,), jnp.float32),
            ridge * jnp.eye(2, dtype=jnp.float32),
            jnp.zeros((2,), jnp.float32),
        )

    def select(key, round_idx, ready, record: ClientRecord, state: RBCSFState, report):
        del key  # deterministic given the queues and the estimates
        c, unit = contexts(report)
        state = learn(state, record, c, unit, round_idx)
        tau = estimate(state, c, confidence=confidence)
        ids, valid = solve(tau, state.queue, ready, num_slots, tradeoff)
        chosen = jnp.zeros_like(state.queue).at[ids].max(valid.astype(state.queue.dtype))
        queue = jnp.maximum(state.queue + beta - chosen, 0.0)
        return ids, valid, state.replace(queue=queue)

    return LearnedSelection(select, init, name="rbcs_f")
