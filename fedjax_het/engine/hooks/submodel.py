"""The sub-model hook: clients train sub-models of the params (FjORD, HeteroFL, FedRolex:
``algorithms/submodels.py``, ``algorithms/width_fedavg.py``).

``SubModel`` holds the masks of a local step, optionally the dense programs of a few width
levels (``DenseLevels``, run by ``engine.groups``) and each client's share of the full
model's cost on the simulated schedule (``ClientCosts``, applied by ``training.costs``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from fedjax_het.typing import PyTree


@dataclasses.dataclass(frozen=True)
class SubModel:
    """Each client trains a sub-model of the params, as masks (``algorithms/submodels.py``).

    In local step ``s`` the engine (``local.local_update``) asks ``step`` for the step's
    ``(mask, factors)``: the model's forward pass sees ``params * factors`` (so the
    gradient of a masked param is exactly 0), and the step's update is multiplied by
    ``mask`` (so no optimizer state, momentum included, moves a masked param). The
    client reports ``trained`` as ``ClientStats.trained``, which ``masked_mean`` reads:
    each param is averaged over the clients that trained it.

    Attributes:
      step: ``(model, x, ctx, hyper, key) -> (mask, factors)``: ``x`` a batch of the
        client's inputs (for its shapes), ``ctx`` the step's ``LocalContext``, ``key``
        the step's own; ``mask`` 0/1 and ``factors`` (the mask times a scaler, or the
        mask) are pytrees broadcastable to the params.
      trained: ``(model, x, ctx, hyper) -> mask`` the params the client trained this
        round (the union of its steps' masks, or more: FjORD sends its widest sub-model).
      groups: the sub-models as a few fixed width levels that may each train as a smaller
        dense model (``DenseLevels``), or None: masks only.
      costs: ``(num_clients, model, example) -> ClientCosts`` each client's share of a full
        step's FLOPs and of the payload, from the model and an input batch's shape
        (``example``, a ``jax.ShapeDtypeStruct``); None: every client pays the full model.
    """

    step: Callable[..., tuple[PyTree, PyTree]]
    trained: Callable[..., PyTree]
    groups: DenseLevels | None = None
    costs: Callable[..., ClientCosts] | None = None


@dataclasses.dataclass(frozen=True)
class DenseLevels:
    """A sub-model whose clients each train one of ``num_levels`` widths for the whole round
    (HeteroFL, FedRolex): the engine may run the clients of a level as one smaller dense
    program instead of masks on the full model (``engine.groups``), when the model can be
    cut (``Model.at_width``) and one device runs the cohort; the results are the masked
    run's within float rounding. The aggregator's contribution must be a tuple of
    params-shaped trees that are 0 where a client did not train (``masked_mean``): a
    level's sums are added in its own shapes and widened once a chunk.

    Attributes:
      num_levels: the width levels, widest first.
      levels: ``(broadcast, ids [m]) -> [m]`` int32 each slot's level this round.
      client_fn: ``(level, spec, hyper, broadcast, data) -> (client_fn, widen)``: one
        client's round at that level on the dense sub-model, ``(state, task) -> (update,
        state, stats)`` with the update in the level's shapes and ``stats.trained`` the
        level's mask in the full shapes; ``widen`` maps a tree of the level's shapes to the
        full ones (0 at the units it drops).
    """

    num_levels: int
    levels: Callable[[PyTree, jax.Array], jax.Array]
    client_fn: Callable[..., tuple[Callable[..., tuple], Callable[[PyTree], PyTree]]]


@dataclasses.dataclass(frozen=True)
class ClientCosts:
    """Each client's share of the full model's cost on the simulated schedule (1: the full
    model), fixed for the run (a narrower sub-model's saving, ``algorithms/submodels.py``):
    both schedules (``training.plan.plan_runs``, ``training.online.OnlineRound``) multiply
    client ``k``'s step time by ``compute[k]``, its bytes both ways by ``transfer[k]``.

    Attributes:
      compute: ``[N]`` share of a full local step's FLOPs.
      transfer: ``[N]`` share of the full payload's bytes, both ways.
      work_kept: ``[N]`` in (0, 1], what the in-loop round reports as the client's
        ``ClientStats.work_kept`` (FjORD's ``p_max``), or None.
    """

    compute: np.ndarray
    transfer: np.ndarray
    work_kept: np.ndarray | None = None
