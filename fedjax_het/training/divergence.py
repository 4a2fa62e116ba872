"""Catching a run that diverges: the first round whose training stopped being finite.

After each block of rounds the host reads the block's per-round metrics and
the evaluation of the global model. A round diverged when its training loss
is not finite, or when a client's update held a NaN or an infinity (unless
such updates are dropped: ``[engine] nonfinite = "drop"``, where they enter
the aggregate at weight 0 and are counted in ``nonfinite_updates``). A global
model that evaluates to a non-finite loss diverged by the end of the block.
Rounds in which every update was dropped are named at the end (``dropped_warnings``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

NONFINITE = ("stop", "drop")


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where a run diverged: ``round`` (rounds done, as in ``metrics.jsonl``) and why."""

    round: int
    clients: int
    reason: str

    def describe(self) -> str:
        return f"diverged in round {self.round}: {self.reason}"


class Diverged(FloatingPointError):
    """A run stopped because it diverged; ``history`` holds what it computed until then."""

    def __init__(self, divergence: Divergence, history: Any = None):
        super().__init__(divergence.describe())
        self.divergence, self.history = divergence, history


def first_divergence(
    done: int, block_metrics: dict[str, np.ndarray], ev: dict[str, Any], *, drop_nonfinite: bool
) -> Divergence | None:
    """The first diverged round of the block that ended after ``done`` rounds, or None."""
    loss = np.asarray(block_metrics["train_loss"])
    clients = np.asarray(block_metrics.get("nonfinite_updates", np.zeros(loss.shape, int)))
    bad = ~np.isfinite(loss) | (clients > 0 if not drop_nonfinite else False)
    if np.any(bad):
        i = int(np.argmax(bad))
        at = done - loss.shape[0] + i + 1
        if clients[i] > 0 and not drop_nonfinite:
            reason = f"{int(clients[i])} client(s) sent non-finite updates"
        else:
            reason = "the training loss is not finite"
        return Divergence(at, int(clients[i]), reason)
    if not np.isfinite(ev["loss"]):
        return Divergence(done, 0, "the global model's test loss is not finite")
    return None


def dropped_warnings(round_metrics: dict[str, np.ndarray]) -> list[str]:
    """The run-end warning for rounds in which every update was non-finite and dropped
    (``nonfinite = "drop"``): nobody trained in them, and the model did not move."""
    counted = np.asarray(round_metrics.get("participants", ()))
    dropped = np.asarray(round_metrics.get("nonfinite_updates", np.zeros_like(counted)))
    empty = int(np.sum((dropped > 0) & (counted == 0)))
    if not empty:
        return []
    return [
        (
            f"{empty} of {counted.size} rounds trained nobody: every update was non-finite and "
            'dropped (engine.nonfinite = "drop"), so the model did not move in them; lower '
            'algorithm.client_lr, or set engine.nonfinite = "stop" to stop at the first one'
        )
    ]
