"""The staleness hook: what a slot that trained from an older model measures its update
against (an asynchronous server, stale tasks; FedAsync, Xie et al. 2019, Eq. 1)."""

from __future__ import annotations

import dataclasses

UPDATE_BASES = ("start", "current")


@dataclasses.dataclass(frozen=True)
class UpdateBase:
    """The reference of a stale slot's update.

    Without this hook a stale slot's update is measured against its own start (FedBuff's
    buffered deltas). ``UpdateBase("current")`` measures it against the server's model when
    the update is applied, ``u + (x_now - x_start)`` (FedAsync's mixing of models; needs a
    broadcast that is the params). Fresh slots are the same either way
    (``engine.round.stale_client_fn``).

    Attributes:
      base: ``"start"`` or ``"current"``.
    """

    base: str = "current"

    def __post_init__(self):
        if self.base not in UPDATE_BASES:
            raise ValueError(f"update base must be one of {UPDATE_BASES}, got {self.base!r}")
