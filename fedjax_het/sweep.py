"""Many runs as one program: a grid of systems and seeds ``vmap``-ed together (DESIGN.md §8).

A heterogeneity study trains the same model under many settings (FLHetBench's
4 device x 4 state grid, §5.2.3) and seeds. ``sweep`` stacks the runs on a
leading *cell* axis: the schedules of every cell are one ``vmap``-ed
``system.schedule``, and every block of rounds of every cell is one
``vmap``-ed, jitted ``lax.scan``, so a grid compiles once and a GPU sees all
cells' clients at once.

Cell ``i`` is ``(systems[i // len(seeds)], seeds[i % len(seeds)])`` and
trains what ``simulate.run(..., system=systems[i // len(seeds)], seed=...)``
trains, up to float summation order (the cells' matrix products are batched).

>>> from fedjax_het import models
>>> from fedjax_het.algorithms import fedavg
>>> from fedjax_het.data import FederatedData, LocalWork
>>> from fedjax_het.data.synthetic import leaf_synthetic
>>> from fedjax_het.sampling import uniform
>>> c = leaf_synthetic(8, alpha=0.5, beta=0.5, seed=0, num_features=5, num_classes=3)
>>> data = FederatedData.from_client_arrays(c.train_x, c.train_y, test_xs=c.test_x,
...                                         test_ys=c.test_y, num_classes=3)
>>> model = models.logistic_regression((5,), 3)
>>> runs = sweep(data, model, fedavg(), uniform(8, 4), rounds=4, eval_every=2,
...              work=LocalWork(batch_size=8, epochs=1), seeds=(0, 1), progress=False)
>>> len(runs), [h.metrics[-1]["round"] for h in runs]
(2, [4, 4])
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from fedjax_het import rng
from fedjax_het.algorithm import FederatedAlgorithm
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.metrics import schedule_accounting
from fedjax_het.models import Model
from fedjax_het.sampler import Sampler
from fedjax_het.simulate import History, Recorder, Setup, plan_runs, train_loop
from fedjax_het.system.setup import System


def sweep(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    sampler: Sampler,
    *,
    rounds: int,
    work: LocalWork,
    systems: Sequence[System] | None = None,
    seeds: Sequence[int] = (0,),
    hyper: dict[str, float] | None = None,
    eval_every: int = 10,
    chunk: int | None = None,
    unroll: int = 1,
    weighting: str = "examples",
    eval_batch_size: int = 1024,
    progress: bool = True,
    targets: Sequence[float] = (0.5, 0.6, 0.7, 0.8),
    client_state: str = "auto",
) -> list[History]:
    """Runs every (system, seed) cell as one batched simulation; one ``History`` per cell.

    Arguments are those of ``simulate.run``; ``systems`` (None: no system
    heterogeneity) and ``seeds`` span the cells. The systems must share the
    availability store, the policy's kind and switches, and the way clients
    are selected (see ``simulate.plan_runs``). Wall times in the histories are
    the sweep's, shared by all cells.

    Client states stay on the device, every cell's (``client_state`` "auto" or
    "device"); "host" is refused: its ordered callbacks cannot be ``vmap``-ed
    over cells.
    """
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if algorithm.freezing is not None:
        raise ValueError(
            f"{algorithm.name} chooses its freezing inside the loop; sweep runs precomputed "
            "schedules: use simulate.run for each setting"
        )
    if systems is not None and not systems:
        raise ValueError("systems must hold at least one System, or be None")
    if client_state == "host":
        raise ValueError(
            "sweep keeps client states on the device (host states cannot be vmap-ed over "
            "cells); use client_state='device' or 'auto', or simulate.run for each cell"
        )
    cells = list(itertools.product(systems or [None], seeds))
    setup = Setup.build(
        data, model, algorithm, sampler, rounds=rounds, work=work, hyper=hyper,
        eval_every=eval_every, chunk=chunk, unroll=unroll, weighting=weighting,
        eval_batch_size=eval_batch_size,
        client_state="device" if client_state == "auto" else client_state, runs=len(cells),
    )
    keys = jnp.stack([rng.seed_key(seed) for _, seed in cells])
    plans, accountings = None, [None] * len(cells)
    if systems is not None:
        plans = plan_runs(
            [system for system, _ in cells], data, setup.round.spec, sampler, rounds=rounds,
            keys=keys,
        )
        accountings = [
            schedule_accounting(_cell(plans, i), setup.round.spec, data.train.count,
                                data.num_clients)
            for i in range(len(cells))
        ]
    start = time.perf_counter()
    recorders = [Recorder(start, accounting) for accounting in accountings]

    def record(done, block_metrics, ev):
        for i, recorder in enumerate(recorders):
            recorder.record(done, _cell(block_metrics, i), _cell(ev, i))

    block, evaluate = setup.programs(keys, cells=True)
    state, ev, compile_s = train_loop(
        setup.init(keys, cells=True), rounds=rounds, eval_every=eval_every, block=block,
        evaluate=evaluate, plans=plans, on_eval=record, progress=progress, round_axis=1,
    )
    timing = {
        "wall_s": round(time.perf_counter() - start, 3),
        "first_block_s_with_compile": round(compile_s, 3),
        "cells": len(cells),
    }
    return [
        recorder.history(
            _cell(state, i), _cell(ev, i), setup, targets=targets, timing=timing,
            plans=None if plans is None else _cell(plans, i),
        )
        for i, recorder in enumerate(recorders)
    ]


def _cell(tree, i: int):
    """Cell ``i`` of a tree with a leading cell axis (None stays None)."""
    return None if tree is None else jax.tree.map(lambda a: a[i], tree)
