"""The probe hook: a statistic of the round's cohort at the current model, gathered before
anyone trains (Mime's control variate, Agnostic FedAvg's domain losses)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fedjax_het.engine.algorithm import Aggregator
from fedjax_het.typing import PyTree, ServerState


@dataclasses.dataclass(frozen=True)
class CohortProbe:
    """A statistic of the cohort at the current model.

    Mime's control variate is one (Karimireddy et al. 2020, Algorithm 1): every local step of
    every client uses ``c``, the cohort's mean full-batch gradient at the server model, so the
    server must have it before training starts (a round trip of its own). The round
    (``engine.round.Round.probed``) first runs ``measure`` for every slot of the cohort, sums
    ``aggregator.contribute(value, weight, stats)`` at the round's weights (a slot of weight 0
    adds nothing) and trains from ``attach(server_state, aggregator.finalize(sums))``, which
    ``broadcast`` and ``server_update`` then read. Synchronous rounds only: slots that train
    from older models (an asynchronous server, stale tasks) are refused.

    Attributes:
      measure: ``(model, payload, client_id, examples, hyper, key) -> value``, one client's
        (no client axis): ``payload`` is ``broadcast(server_state)``, ``examples`` a
        ``Batches`` of each of the client's examples once (in store order, in batches of the
        run's batch size, ``[ceil(max_count / batch), batch, ...]``), ``key`` its own.
      aggregator: how the values combine (``stats.examples``: the client's example count).
      attach: ``(server_state, aggregate) -> server_state``.
    """

    measure: Callable[..., PyTree]
    aggregator: Aggregator
    attach: Callable[[ServerState, PyTree], ServerState]
