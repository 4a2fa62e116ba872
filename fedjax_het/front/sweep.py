"""Many runs as one program: cells of seeds, hyperparameters and systems (docs/design.md §3).

A heterogeneity study trains the same model under many settings (FLHetBench's
4 device x 4 state grid, §5.2.3), learning rates and seeds. ``sweep`` stacks
the runs on a leading *cell* axis: every cell has its own seed, traced
hyperparameters (``FederatedAlgorithm.hyper``) and system. The schedules of
every cell are one ``vmap``-ed ``system.schedule``; every block of rounds of
every cell is one jitted ``lax.scan`` mapped over the cells (``vmap``-ed on
accelerators, so that a GPU sees all cells' clients at once). A grid compiles
once; cells that do not fit at once run in chunks through the same program.

A cell trains what ``simulate.run(..., seed=cell.seed, hyper=cell.hyper,
system=cell.system)`` trains: bitwise when the cells run one at a time inside
the program (``cell_batch=1``, the CPU default), up to float summation order
when they are ``vmap``-ed (batched matrix products round differently).
``fedjax_het.front.grid`` builds the cells from a config and ``--grid`` axes.

>>> from fedjax_het import models
>>> from fedjax_het.algorithms import fedavg
>>> from fedjax_het.data import FederatedData, LocalWork
>>> from fedjax_het.data.synthetic import leaf_synthetic
>>> from fedjax_het.sampling import uniform
>>> c = leaf_synthetic(8, alpha=0.5, beta=0.5, seed=0, num_features=5, num_classes=3)
>>> data = FederatedData.from_client_arrays(c.train_x, c.train_y, test_xs=c.test_x,
...                                         test_ys=c.test_y, num_classes=3)
>>> model = models.logistic_regression((5,), 3)
>>> cells = [Cell(seed=s, hyper={"client_lr": lr}) for lr in (0.03, 0.3) for s in (0, 1)]
>>> runs = sweep(data, model, fedavg(), uniform(8, 4), rounds=4, eval_every=2,
...              work=LocalWork(batch_size=8, epochs=1), cells=cells, progress=False)
>>> len(runs), [h.metrics[-1]["round"] for h in runs]
(4, [4, 4, 4, 4])

Over 400 lines on purpose: the one entry that runs many cells as one program, with the checks
that refuse what a stacked program cannot run and the chunking of cells that do not fit at
once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import rng
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import client_store
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.cohort import client_mesh
from fedjax_het.engine.hooks import Freezing
from fedjax_het.engine.local import hyper_dtype, run_model
from fedjax_het.models import Model
from fedjax_het.system.events import AsyncServer
from fedjax_het.system.sampler import Sampler
from fedjax_het.system.setup import System
from fedjax_het.training import checkpoint, compilation
from fedjax_het.training.interrupt import Interrupted
from fedjax_het.training.loop import train_loop
from fedjax_het.training.metrics import schedule_accounting
from fedjax_het.training.plan import plan_runs, ring_depth, selection_slots
from fedjax_het.training.programs import Setup
from fedjax_het.training.recorder import History, Recorder
from fedjax_het.training.resume import checkpointer, load_checkpoint, restore_state
from fedjax_het.typing import Hyper, PyTree


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of a sweep.

    Attributes:
      seed: the run's root seed.
      hyper: overrides of the algorithm's traced hyperparameters, on top of
        ``sweep``'s ``hyper``.
      system: device and state heterogeneity, or None (every cell of a sweep
        has one, or none has).
      out_dir: where to write the cell's run directory (``recorder.Recorder``), or None.
      config: the resolved config recorded in ``out_dir`` (re-runnable with ``fedjax-het run``).
      on_eval: called with each of the cell's ``metrics.jsonl`` lines (as ``simulate.run``'s).
    """

    seed: int = 0
    hyper: Mapping[str, float] = dataclasses.field(default_factory=dict)
    system: System | None = None
    out_dir: str | Path | None = None
    config: Mapping[str, Any] | None = None
    on_eval: Callable[[dict[str, Any]], None] | None = None


@compilation.engine_options
def sweep(
    data: FederatedData, model: Model, algorithm: FederatedAlgorithm, sampler: Sampler, *,
    rounds: int, work: LocalWork, cells: Sequence[Cell] | None = None,
    systems: Sequence[System] | None = None, seeds: Sequence[int] = (0,),
    hyper: Mapping[str, float] | None = None, cells_at_once: int | None = None,
    cell_batch: int | None = None, eval_every: int = 10, chunk: int | None = None,
    unroll: int = 1, weighting: str = "examples", eval_batch_size: int = 1024,
    progress: bool = True, targets: Sequence[float] = (0.5, 0.6, 0.7, 0.8),
    client_state: str = "auto", devices: int | None = None, precision: str = "float32",
    nonfinite: str = "stop", checkpoints: str | Path | None = None, checkpoint_every: int = 0,
    resume: bool = False, overwrite: bool = False, server: AsyncServer | None = None,
    matmul_precision: str = compilation.DEFAULT_MATMUL_PRECISION, compile_cache: bool = True,
    conv: str = "auto",
) -> list[History]:  # fmt: skip
    """Runs every cell in one compiled simulation; one ``History`` per cell, in order.

    Arguments are those of ``simulate.run``, and:

    Args:
      cells: the runs, each with its own seed, hyperparameters and system. Their systems
        must share the availability store, the policy's kind and switches, and the way
        clients are selected (``plan.plan_runs``; ``stack_key`` tells which can).
      systems, seeds: without ``cells``, the cells ``(systems[i // len(seeds)],
        seeds[i % len(seeds)])`` (``systems`` None: no system heterogeneity).
      hyper: hyperparameter overrides every cell shares (a cell's own win).
      client_state: "auto" or "device": every cell's client states stay on the device
        ("host" is refused: its ordered callbacks cannot be ``vmap``-ed over cells).
      nonfinite: as in ``simulate.run``, except that a diverged cell does not stop
        the others: it is marked (``summary["status"]`` "diverged") and runs on.
      cells_at_once: cells per program call; more cells run in chunks through the
        same compiled program (the last chunk padded with copies of its last cell,
        whose results are dropped; a cell's wall times are its chunk's). None: every
        cell, unless their client states do not fit on the device together
        (``client_store.plan_client_state``); then as many as fit.
      cell_batch: cells ``vmap``-ed together inside a program call, the batches one
        after another (``lax.map``); 1: no ``vmap``, each cell computes bitwise what
        ``simulate.run`` computes. None: 1 on CPU (XLA:CPU gains nothing from
        batching small matrix products, as ``cohort.auto_chunk`` finds for clients;
        see ``experiments/sweep_vs_sequential.py``), every cell at once on accelerators.
      checkpoints: a directory for the checkpoints (``chunk-NNN/checkpoint.npz``, one per
        chunk of cells, NNN its first cell), written as ``simulate.run`` writes its
        own (``checkpoint_every``); with ``resume`` a chunk continues from its
        checkpoint (a finished chunk's is its last, so it does not train again) and a
        chunk without one starts afresh. ``overwrite``: cells may write into
        directories that already hold files.
      server: must be None (taken so that ``Experiment.run_kwargs`` passes through): an
        asynchronous server runs with ``simulate.run``, one setting at a time.
      matmul_precision, compile_cache: as in ``simulate.run``: applied around the whole
        sweep, every program of every chunk of cells.
    """
    cells = _cells(cells, systems, seeds)
    _check_options(
        algorithm, server=server, client_state=client_state, resume=resume,
        checkpoints=checkpoints, cells_at_once=cells_at_once, cell_batch=cell_batch,
    )  # fmt: skip
    hypers = _cell_hypers(algorithm, hyper, cells, hyper_dtype(precision))
    at_once, batch = _cells_per_call(
        algorithm, run_model(model, precision), data, len(cells), rounds=rounds,
        cohort=sampler.cohort_size, devices=devices, at_once=cells_at_once, batch=cell_batch,
    )  # fmt: skip
    setup = Setup.build(
        data, model, algorithm, sampler, rounds=rounds, work=work, hyper=hyper,
        eval_every=eval_every, chunk=chunk, unroll=unroll, weighting=weighting,
        eval_batch_size=eval_batch_size, client_state="device", runs=at_once,
        precision=precision, devices=devices, nonfinite=nonfinite,
        ring_depth=ring_depth(cells[0].system, None), conv=conv,
    )  # fmt: skip
    keys = jnp.stack([rng.seed_key(cell.seed) for cell in cells])
    plans, accountings = _plans(cells, data, setup, sampler, rounds=rounds, keys=keys)
    shared = _Chunks(setup, cells, keys, hypers, plans, accountings, at_once, batch)
    histories = []
    for first in range(0, len(cells), at_once):
        _run_chunk(
            shared, first, histories, data=data, rounds=rounds, eval_every=eval_every,
            progress=progress, targets=targets, nonfinite=nonfinite, checkpoints=checkpoints,
            checkpoint_every=checkpoint_every, resume=resume, overwrite=overwrite,
        )  # fmt: skip
    return histories


@dataclasses.dataclass(frozen=True)
class _Chunks:
    """What every chunk of a sweep's cells shares: the program setup, the cells with their
    stacked keys, hyperparameters and plans, and the cells per call and per ``vmap``."""

    setup: Setup
    cells: list[Cell]
    keys: jax.Array
    hypers: Hyper
    plans: PyTree | None  # the stacked schedules; None without systems
    accountings: list  # each cell's schedule_accounting, or None
    at_once: int
    batch: int | None  # cells per vmap; None: all at once


def _check_options(
    algorithm: FederatedAlgorithm,
    *,
    server: AsyncServer | None,
    client_state: str,
    resume: bool,
    checkpoints: str | Path | None,
    cells_at_once: int | None,
    cell_batch: int | None,
) -> None:
    """One-line errors for what a sweep cannot run."""
    if server is not None:
        raise ValueError(
            "sweep runs synchronous servers; run each setting of an asynchronous server with "
            "simulate.run (fedjax-het sweep does so for configs with [server] mode = 'async')"
        )
    if algorithm.hook(Freezing) is not None:
        raise ValueError(
            f"{algorithm.name} chooses its freezing inside the loop; sweep runs precomputed "
            "schedules: use simulate.run for each setting"
        )
    if client_state == "host":
        raise ValueError(
            "sweep keeps client states on the device (host states cannot be vmap-ed over "
            "cells); use client_state='device' or 'auto', or simulate.run for each cell"
        )
    for name, value in (("cells_at_once", cells_at_once), ("cell_batch", cell_batch)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if resume and checkpoints is None:
        raise ValueError("resume continues from the checkpoints; give sweep its checkpoints")


def _cells_per_call(
    algorithm: FederatedAlgorithm,
    model: Model,
    data: FederatedData,
    cells: int,
    *,
    rounds: int,
    cohort: int,
    devices: int | None,
    at_once: int | None,
    batch: int | None,
) -> tuple[int, int | None]:
    """Cells per program call (``cells_at_once``, else as many as fit) and per ``vmap``
    (``cell_batch``, else 1 on CPU and every cell elsewhere; None: all of the call's)."""
    at_once = at_once or _cells_that_fit(
        algorithm, model, data, cells, rounds=rounds, cohort=cohort, devices=devices
    )
    at_once = min(at_once, cells)
    batch = batch or (1 if jax.default_backend() == "cpu" else at_once)
    return at_once, None if batch >= at_once else batch


def _plans(
    cells: list[Cell],
    data: FederatedData,
    setup: Setup,
    sampler: Sampler,
    *,
    rounds: int,
    keys: jax.Array,
) -> tuple[PyTree | None, list]:
    """Every cell's schedule, stacked (``plan_runs``), and each cell's accounting of it;
    ``(None, [None, ...])`` without systems."""
    if cells[0].system is None:
        return None, [None] * len(cells)
    plans = plan_runs(
        [cell.system for cell in cells],
        data,
        setup.round.spec,
        sampler,
        rounds=rounds,
        keys=keys,
    )
    accountings = [
        schedule_accounting(_take(plans, i), setup.round.spec, data.train.count, data.num_clients,
                            float(cell.system.policy.start),
                            readiness=(cell.system.profiles, cell.system.policy))
        for i, cell in enumerate(cells)
    ]
    return plans, accountings


def _run_chunk(
    shared: _Chunks,
    first: int,
    histories: list[History],
    *,
    data: FederatedData,
    rounds: int,
    eval_every: int,
    progress: bool,
    targets: Sequence[float],
    nonfinite: str,
    checkpoints: str | Path | None,
    checkpoint_every: int,
    resume: bool,
    overwrite: bool,
) -> None:
    """Trains the chunk of cells from ``first`` (``shared.at_once`` cells, the last chunk
    padded with copies of its last cell) and appends their histories to ``histories``;
    raises ``Interrupted`` with every history so far when a signal stopped it."""
    cells, setup, at_once = shared.cells, shared.setup, shared.at_once
    real = list(range(first, min(first + at_once, len(cells))))
    rows = np.asarray(real + real[-1:] * (at_once - len(real)))
    start = time.perf_counter()
    where = None if checkpoints is None else Path(checkpoints) / f"chunk-{first:03d}"
    resumed = resume and (where / checkpoint.FILE).is_file()
    if resumed:  # before the recorders rewrite the cells' config.toml
        checkpoint.check_config(where, cells[first].config or {})
    recorders = [
        Recorder(start, shared.accountings[i], out_dir=cells[i].out_dir, config=cells[i].config,
                 data=data, on_eval=cells[i].on_eval, drop_nonfinite=nonfinite == "drop",
                 resume=resumed, overwrite=overwrite or resume)
        for i in real
    ]  # fmt: skip

    def record(done, block_metrics, ev):
        for j, recorder in enumerate(recorders):
            recorder.record(done, _take(block_metrics, j), _take(ev, j))

    chunk_keys, chunk_hyper = shared.keys[rows], _take(shared.hypers, rows)
    block, evaluate = setup.programs(
        chunk_keys, cells=True, hyper=chunk_hyper, cell_batch=shared.batch
    )
    state, done = setup.init(chunk_keys, cells=True, hyper=chunk_hyper), 0
    if resumed:
        loaded = load_checkpoint(where, recorders)
        state, done = restore_state(loaded, state, setup.round.store), loaded.done
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    end = train_loop(
        state, rounds=rounds, eval_every=eval_every, block=block, evaluate=evaluate,
        plans=_take(shared.plans, rows), on_eval=record, progress=progress, round_axis=1,
        done=done, checkpoint_every=checkpoint_every,
        save=checkpointer(where, cells[first].config, recorders, setup.round.store, dict),
    )  # fmt: skip
    timing = {
        "wall_s": round(recorders[0].wall_before + time.perf_counter() - start, 3),
        "first_block_s_with_compile": None if end.compile_s is None
        else round(end.compile_s, 3),
        "cells": len(cells),
        "cells_at_once": at_once,
        "cell_batch": at_once if shared.batch is None else shared.batch,
    }  # fmt: skip
    for j, (i, recorder) in enumerate(zip(real, recorders)):
        recorder.interrupted = end.interrupted
        histories.append(recorder.history(
            _take(end.state, j), _take(end.ev, j), setup, targets=targets, timing=timing,
            plans=_take(shared.plans, i), hyper=_take(shared.hypers, i),
        ))  # fmt: skip
    if end.interrupted is not None:
        raise Interrupted(end.interrupted, end.done, histories)


def stack_key(system: System, sampler: Sampler, num_clients: int) -> tuple:
    """Equal for systems that ``plan_runs`` can stack into one sweep.

    Such systems share the availability store (compared by content), the
    policy's kind and switches, the profiles' array shapes, and the way
    clients are selected; every per-client and policy number may differ.
    """
    profiles = system.profiles.replace(availability=None)
    store = jax.tree.leaves(system.profiles.availability)
    return (
        jax.tree.structure(profiles),
        tuple((np.shape(a), str(np.asarray(a).dtype)) for a in jax.tree.leaves(profiles)),
        jax.tree.structure(system.policy),
        tuple(
            (np.shape(a), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
            for a in store
        ),
        selection_slots(system, sampler, num_clients),
    )


def _cells(
    cells: Sequence[Cell] | None, systems: Sequence[System] | None, seeds: Sequence[int]
) -> list[Cell]:
    """The explicit ``cells``, or those of ``systems x seeds``; checked."""
    if cells is not None:
        if systems is not None or tuple(seeds) != (0,):
            raise ValueError("give cells, or systems and seeds, not both")
        if not cells:
            raise ValueError("cells must hold at least one Cell")
    else:
        if not seeds:
            raise ValueError("seeds must name at least one seed")
        if systems is not None and not systems:
            raise ValueError("systems must hold at least one System, or be None")
        cells = [
            Cell(seed=seed, system=system)
            for system, seed in itertools.product(systems or [None], seeds)
        ]
    if len({cell.system is None for cell in cells}) > 1:
        raise ValueError("every cell needs a system, or none may have one")
    return list(cells)


def _cell_hypers(
    algorithm: FederatedAlgorithm,
    shared: Mapping[str, float] | None,
    cells: Sequence[Cell],
    dtype: jnp.dtype,
) -> Hyper:
    """Every cell's traced hyperparameters (``shared``, then the cell's own), stacked."""
    hypers = []
    for i, cell in enumerate(cells):
        try:
            hypers.append(algorithm.hyper({**(shared or {}), **cell.hyper}, dtype=dtype))
        except ValueError as error:
            raise ValueError(f"cell {i}: {error}") from None
    return _stack(hypers)


def _cells_that_fit(
    algorithm: FederatedAlgorithm,
    model: Model,
    data: FederatedData,
    cells: int,
    *,
    rounds: int,
    cohort: int,
    devices: int | None,
) -> int:
    """The most cells, halving from ``cells``, whose client states fit on the device together."""
    mesh = client_mesh(devices)
    plan = lambda runs: client_store.plan_client_state(
        algorithm,
        model,
        num_clients=data.num_clients,
        rounds=rounds,
        slots=cohort,
        placement="device",
        runs=runs,
        devices=1 if mesh is None else mesh.size,
    )
    while cells > 1:
        try:
            plan(cells)
            break
        except ValueError:
            cells = -(-cells // 2)
    return cells


def _stack(trees: Sequence[PyTree]) -> PyTree:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _take(tree: PyTree | None, rows) -> PyTree | None:
    """Rows ``rows`` (an index or an index array) of a tree's leading cell axis; None stays None."""
    return None if tree is None else jax.tree.map(lambda a: a[rows], tree)
