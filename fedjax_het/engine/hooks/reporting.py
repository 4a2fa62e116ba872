"""The reporting hooks: what an algorithm adds to each round's metrics (``ServerMetrics``:
IFCA's cluster sizes, DP-FedAvg's clip norm) and to the run's summary (``RunReport``:
DP-FedAvg's privacy spent)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from fedjax_het.typing import ServerState


@dataclasses.dataclass(frozen=True)
class ServerMetrics:
    """``metrics(server_state) -> {name: array}``: per-round figures of the server state."""

    metrics: Callable[[ServerState], dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class RunReport:
    """``report(hyper, num_clients, rounds) -> dict``: what the algorithm adds to the run's
    summary after ``rounds`` rounds, ``hyper`` as Python floats."""

    report: Callable[[dict[str, float], int, int], dict]
