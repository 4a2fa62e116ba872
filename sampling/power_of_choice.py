"""Power-of-choice selection: the highest-loss clients among random candidates.

Cho, Wang and Joshi, "Towards Understanding Biased Client Selection in
Federated Learning" (AISTATS 2022; arXiv 2010.01243 "Client Selection in
Federated Learning: Convergence Analysis and Power-of-Choice Selection
Strategies"), Algorithm 1: draw ``d`` candidates (here uniformly among the
ready clients), then keep the ``m`` with the highest local loss. The loss is
the server's last observation (``ClientRecord.loss``, the mean training loss
of the client's last round with work: the paper's cheaper ``pow-d`` variant
that reuses losses reported during training rather than a fresh evaluation,
§5 "cpow-d"); a client never observed ranks first, so every candidate is
eventually measured.

A ``LearnedSelect`` for ``simulate.run(..., select=...)``.

>>> import jax, jax.numpy as jnp
>>> from fedjax_het.system.sampler import ClientRecord
>>> record = ClientRecord.empty(6).replace(loss=jnp.array([0.1, 5.0, 0.2, 3.0, 0.3, 0.4]))
>>> select = power_of_choice(6, 2, candidates=6)  # every client is a candidate
>>> ids, valid = select(jax.random.key(0), 0, jnp.ones(6, bool), record)
>>> sorted(ids.tolist()), valid.tolist()
([1, 3], [True, True])
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.system.sampler import ClientRecord, LearnedSelect


def power_of_choice(num_clients: int, num_slots: int, *, candidates: int) -> LearnedSelect:
    """``num_slots`` of ``candidates`` ready clients drawn uniformly, highest last loss first.

    Args:
      num_clients, num_slots: the population and the round's slots (the config takes them
        from the data and the cohort).
      candidates: ``d``, the ready clients drawn uniformly each round, among which the
        ``num_slots`` of highest last loss are kept; ``num_slots <= d <= num_clients``.

    References:
      Cho, Wang and Joshi, "Towards Understanding Biased Client Selection in Federated
      Learning" (AISTATS 2022), Algorithm 1.
    """
    if not 1 <= num_slots <= candidates <= num_clients:
        raise ValueError(
            f"need 1 <= num_slots <= candidates <= num_clients, got {num_slots}, {candidates}, "
            f"{num_clients}"
        )

    def select(key, round_idx, ready: jax.Array, record: ClientRecord):
        del round_idx  # the key is already the round's
        draw = jnp.where(ready, jax.random.uniform(key, (num_clients,)), 2.0)
        candidate = jnp.zeros((num_clients,), bool).at[jnp.argsort(draw)[:candidates]].set(True)
        candidate &= ready
        loss = jnp.where(jnp.isnan(record.loss), jnp.inf, record.loss)
        # Candidates by loss (descending), ties by the draw; others after every candidate.
        order = jnp.lexsort((draw, -jnp.where(candidate, loss, -jnp.inf), ~candidate))
        ids = order[:num_slots].astype(jnp.int32)
        return ids, jnp.arange(num_slots) < jnp.sum(candidate)

    return select
