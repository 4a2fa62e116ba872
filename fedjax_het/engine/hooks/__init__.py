"""Hooks: what a paper adds to the core algorithm contract, one small module each.

The core ``FederatedAlgorithm`` (``engine.algorithm``) says what the server holds, what a
client does in its local steps, how updates combine and how the server applies them. A
hook is a frozen dataclass that the round looks up by its type
(``algorithm.hook(Freezing)``); an algorithm carries at most one hook of each type, and
``attach`` adds hooks to any algorithm, so they compose::

    freezefl = attach(fedavg(), Freezing(probe_share, depth_masks, choose))

| hook | what the engine does with it | used by |
|---|---|---|
| ``Freezing`` | per-client freeze depth after a probe, priced on the in-loop schedule | FreezeFL, TimelyFL |
| ``CohortProbe`` | a statistic of the cohort at the current model before training | Mime, Agnostic FedAvg |
| ``SubModel`` | masks per local step, dense width levels, per-client costs | FjORD, HeteroFL, FedRolex |
| ``UpdateBase`` | a stale slot's update measured against the current model | FedAsync |
| ``PayloadBytes`` | the bytes each way on the simulated network | compression, FetchSGD, Mime |
| ``Personalized`` | each client's own model for personalised evaluation | Ditto, FedPer/FedRep, IFCA, APFL |
| ``ServerMetrics`` | per-round figures of the server state | IFCA, DP-FedAvg |
| ``RunReport`` | what the run's summary adds | DP-FedAvg |
"""

from __future__ import annotations

import dataclasses

from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.hooks.freezing import Freezing
from fedjax_het.engine.hooks.payload import PayloadBytes
from fedjax_het.engine.hooks.personal import Personalized
from fedjax_het.engine.hooks.probe import CohortProbe
from fedjax_het.engine.hooks.reporting import RunReport, ServerMetrics
from fedjax_het.engine.hooks.staleness import UpdateBase
from fedjax_het.engine.hooks.submodel import ClientCosts, DenseLevels, SubModel

__all__ = [
    "ClientCosts",
    "CohortProbe",
    "DenseLevels",
    "Freezing",
    "PayloadBytes",
    "Personalized",
    "RunReport",
    "ServerMetrics",
    "SubModel",
    "UpdateBase",
    "attach",
]


def attach(algorithm: FederatedAlgorithm, *hooks: object) -> FederatedAlgorithm:
    """``algorithm`` with ``hooks`` added, each replacing a hook of its own type.

    >>> from fedjax_het.algorithms import fedavg
    >>> asynchronous = attach(fedavg(), UpdateBase("current"))
    >>> asynchronous.hook(UpdateBase).base, fedavg().hook(UpdateBase) is None
    ('current', True)
    """
    kinds = [type(hook) for hook in hooks]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"{algorithm.name}: two hooks of one type in {kinds}")
    kept = tuple(h for h in algorithm.hooks if type(h) not in kinds)
    return dataclasses.replace(algorithm, hooks=kept + tuple(hooks))
