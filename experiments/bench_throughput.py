"""Throughput of one fedjax_het round against a per-client loop and a bare ``vmap``.

The implementations (``engine``, ``loop``, ``bare_vmap``), the heterogeneous
round (``--systems flash-deadline``), the validation gate and the timing are
``bench_harness``'s; this script holds the workloads, the suites and the
targets. Each cell (workload, cohort) draws its own synthetic data: N(0, 1)
inputs, uniform labels, every client the same size, the cohort drawn from
twice as many clients.

Suites (``--suite``; flags given on the command line override a suite's):

* ``cpu`` (the default on CPU): W1 at 10 and 100 clients, W2 at 10; the
  homogeneous round, and at W1/100 the heterogeneous one too; the loop timed
  on the whole cohort. Targets (judged on a CPU): the FedAvg round at most
  1.0x the per-client loop at W1/10, W1/100 and W2/10; the flash-deadline
  round at most 0.75x the homogeneous round at W1/100.
* ``gpu`` (the default on accelerators): W1 at 100, 1,000 and 10,000 clients,
  W2 at 10, 100 and 1,000; every cell has the homogeneous engine round, the
  full heterogeneous round (``flash-deadline``: FLASH devices, deadline with
  partial work, 10 % dropouts), both loops, the bare ``vmap`` and SCAFFOLD's
  homogeneous round. A loop is timed on at most LOOP_CLIENTS = 1,000 clients
  of its cohort and its seconds scaled linearly to the cohort (rows marked
  ``extrapolated``); its first rounds always run the whole cohort, their
  seconds are ``first_round_s`` (``gate_round_s`` for the gate's). Targets (PASS
  or FAIL on an H100 or H200, "not an H100/H200" elsewhere): the heterogeneous
  round at most 1.25x the bare ``vmap`` (the homogeneous lower bound) at
  W1/1,000, W1/10,000 and W2/100, and at most 0.75x the same engine's
  homogeneous round at those cells; the engine at most 0.5x the per-client
  loop in every cell and system; the homogeneous round at most 1.25x the bare
  ``vmap`` at W1/10,000; SCAFFOLD at most 1.3x FedAvg at W1/1,000, W1/10,000 and
  W2/100; FedAvg and SCAFFOLD at W2/1,000 (a population of 2,000) run without an
  error (the note: the plan's chunk and bytes); HeteroFL's mixed-width round (dense
  levels) at W2/100 at most 1.25x its widths' FLOP share of FedAvg's round
  (``width_share.py``: the limit scales with the cohort's widths, about 0.42).
  The engine rows of ``--chunk auto`` (the default) are the round ``fedjax-het
  run`` builds (``bench_harness.run_setup``: its chunk plan, whose line each row
  records as ``chunk_plan``), so the figure published is the figure a user gets.

Targets are judged on the lowest value over the chunks and unrollings run,
"quick" for ``--quick``, and written as the last JSON line (``--no-targets``:
not at all; ``--evaluate FILE`` judges the rows of a results file, several
runs of one suite or a run cut short, rows of another benchmark left out
(those with a ``benchmark`` field: ``bench_conv.py``'s), and appends the
line). They are reported, never asserted.

``--matmul-precision`` (default "highest"; "default" is TF32 on NVIDIA GPUs)
sets ``jax.default_matmul_precision`` of the timed programs. Every gate round
runs a program compiled under "highest", a separate compilation when the
precisions differ: under TF32 a bare ``vmap`` differed from the loop by
rel-L2 0.04-0.14 on an H200 and never passed the gate. Rows record both
precisions and the timed program's own distance to the gate reference
(``timed_rel_l2_to_reference``, not a gate).

``--quick`` is a smoke run of a suite's machinery at small sizes: ``cpu``: W1
at 10 clients; ``gpu``: W1 at 4, 16, 64 and W2 at 1, 2, 4 clients, the loop
timed on 8 (so the extrapolation runs), 3 timed rounds. Its figures are not
results. ``--suite scale`` hands every other flag to ``bench_scale.py`` (the
100,000-client scale test), so ``make bench ARGS="--suite scale"`` runs it.

``--algorithms fedavg,scaffold`` adds an engine round of SCAFFOLD (Karimireddy
et al. 2020, ``algorithms/scaffold.py``) beside FedAvg's for each chunk,
unrolling and system of ``--algorithm-systems`` (default: the homogeneous
round only), on the same setup; its rows carry ``ratio_to_fedavg``.
Its control variates start at zero, so its round equals FedAvg's and passes
the same gate. ``--baselines`` keeps only some of ``loop`` and ``bare_vmap``
(``none``: the first engine row of each system is its gate reference).

The baselines unroll their local steps (XLA:CPU runs convolution gradients
inside a ``while`` loop several times slower); the engine's unrolling is
``--unroll`` (default 1, as in ``simulate.run``). One JSON line per (workload,
cohort, implementation) holds median and min-max, the ratios engine/loop,
engine/bare, SCAFFOLD/FedAvg and heterogeneous/homogeneous of this run, the gate, the 1-minute load average before each timed
round, the system's schedule summary, and the environment read by the program;
a last line holds the targets.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_harness as harness
import bench_scale
import common
import jax
import jax.numpy as jnp
import numpy as np
import width_share

from fedjax_het import models, results
from fedjax_het.algorithms.heterofl import heterofl
from fedjax_het.algorithms.scaffold import scaffold
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.engine.client_store import format_bytes

POPULATION_PER_COHORT = 2  # the sampler draws the cohort from twice as many clients
# Engine algorithms (None: the setup's FedAvg); heterofl: widths 1, 1/2, 1/4, 1/8 dealt
# round-robin (mean 0.47), each level's clients a dense program of the cut model
# (engine.groups); heterofl_masks: the same round as masks on the full model (every client
# at full cost). Their ratio_to_fedavg is a mixed-width round's against full-width FedAvg's.
HETEROFL_WIDTHS = (1.0, 0.5, 0.25, 0.125)
ALGORITHMS = {
    "fedavg": None, "scaffold": scaffold,
    "heterofl": functools.partial(heterofl, widths=HETEROFL_WIDTHS),
    "heterofl_masks": functools.partial(heterofl, widths=HETEROFL_WIDTHS, dense_groups=False),
}
OWN_ROUND = ("heterofl", "heterofl_masks")  # not FedAvg's rounds: their own gate reference
BASELINES = ("loop", "bare_vmap")
PLANNED = "run's plan (simulate's Setup, memory.plan_memory)"  # chunk_from of --chunk auto
LOOP_CLIENTS = 1000  # gpu suite: loops timed on at most this many clients, then scaled


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and one local epoch over ``examples_per_client`` rows (every client equal)."""

    name: str
    make_model: Callable[[], models.Model]
    example_shape: tuple[int, ...]
    examples_per_client: int
    batch_size: int
    num_classes: int = 62


WORKLOADS = {
    "W1": Workload("W1", lambda: models.mlp((784,), 62, hidden=(200, 200)), (784,), 64, 16),
    "W2": Workload("W2", lambda: models.femnist_cnn((28, 28, 1), 62), (28, 28, 1), 128, 32),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """``claim``: at the suite's ``position``-th cohort of ``workload``, ``metric`` of the best
    engine row of ``algorithm`` under ``system`` (the lowest over the chunks and unrollings
    run) is at most ``limit`` (with ``scale``: ``limit`` times that row's ``scale`` field,
    e.g. ``width_share``'s); ``metric`` "runs": that row exists without an error."""

    claim: str
    workload: str
    position: int
    metric: str  # median_s, an engine row's ratio_to_* (bench_harness._ratios), or "runs"
    limit: float | None = None
    system: str = "flash-deadline"
    algorithm: str = "fedavg"
    scale: str | None = None


@dataclasses.dataclass(frozen=True)
class Suite:
    """Cells, systems and loop cap of a preset, their ``--quick`` counterparts, and the
    targets, judged only on a device whose name holds one of ``target_devices``.
    ``cell_systems`` adds systems at some cells (by workload and position)."""

    cohorts: dict[str, tuple[int, ...]]
    systems: tuple[str, ...]
    loop_clients: int | None
    quick_cohorts: dict[str, tuple[int, ...]]
    quick_loop_clients: int | None
    max_timing_s: float
    targets: tuple[Target, ...] = ()
    target_devices: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ("fedavg",)
    cell_systems: dict[tuple[str, int], tuple[str, ...]] = dataclasses.field(default_factory=dict)


def loop_targets(
    cohorts: dict[str, tuple[int, ...]], limit: float, systems: tuple[str, ...]
) -> tuple[Target, ...]:
    """The FedAvg engine round at most ``limit`` times the per-client loop of its system, in
    every cell and system."""
    return tuple(
        Target(
            f"engine <= {limit}x per-client loop",
            workload,
            position,
            "ratio_to_loop",
            limit,
            system,
        )
        for workload, sizes in cohorts.items()
        for position in range(len(sizes))
        for system in systems
    )


HETEROGENEOUS = "heterogeneous (flash-deadline) round"
HETEROFL_TARGET = Target(  # issue item 3; the share and why FLOPs: width_share.py
    "HeteroFL round (dense levels) <= 1.25x its widths' FLOP share of FedAvg's round",
    "W2",
    1,
    "ratio_to_fedavg",
    width_share.SLACK,
    "none",
    "heterofl",
    scale="width_flop_share",
)
GPU_COHORTS = {"W1": (100, 1000, 10000), "W2": (10, 100, 1000)}
GPU_HET_CELLS = (("W1", 1), ("W1", 2), ("W2", 1))  # W1/1,000, W1/10,000, W2/100
CPU_COHORTS = {"W1": (10, 100), "W2": (10,)}
SUITES = {  # cpu: a full run stays near 8 minutes on 2 shared cores
    "cpu": Suite(
        CPU_COHORTS,
        ("none",),
        None,
        {"W1": (10,)},
        None,
        60.0,
        (
            *loop_targets(CPU_COHORTS, 1.0, ("none",)),
            Target(
                f"{HETEROGENEOUS} <= 0.75x homogeneous round", "W1", 1, "ratio_to_homogeneous", 0.75
            ),
        ),
        ("cpu:",),
        cell_systems={("W1", 1): harness.SYSTEMS},
    ),
    "gpu": Suite(
        GPU_COHORTS,
        harness.SYSTEMS,
        LOOP_CLIENTS,
        {"W1": (4, 16, 64), "W2": (1, 2, 4)},
        8,
        30.0,
        (
            *(
                Target(
                    f"{HETEROGENEOUS} <= 1.25x bare vmap",
                    workload,
                    position,
                    "ratio_to_bare_vmap",
                    1.25,
                )
                for workload, position in GPU_HET_CELLS
            ),
            *(
                Target(
                    f"{HETEROGENEOUS} <= 0.75x homogeneous round",
                    workload,
                    position,
                    "ratio_to_homogeneous",
                    0.75,
                )
                for workload, position in GPU_HET_CELLS
            ),
            HETEROFL_TARGET,
            *loop_targets(GPU_COHORTS, 0.5, harness.SYSTEMS),
            Target(
                "homogeneous round <= 1.25x bare vmap", "W1", 2, "ratio_to_bare_vmap", 1.25, "none"
            ),
            Target("SCAFFOLD <= 1.3x FedAvg", "W1", 1, "ratio_to_fedavg", 1.3, "none", "scaffold"),
            Target("SCAFFOLD <= 1.3x FedAvg", "W1", 2, "ratio_to_fedavg", 1.3, "none", "scaffold"),
            Target("SCAFFOLD <= 1.3x FedAvg", "W2", 1, "ratio_to_fedavg", 1.3, "none", "scaffold"),
            Target("FedAvg runs (population 2,000)", "W2", 2, "runs", None, "none"),
            Target("SCAFFOLD runs (population 2,000)", "W2", 2, "runs", None, "none", "scaffold"),
        ),
        ("H100", "H200"),
        ("fedavg", "scaffold"),
    ),
}


def cell_systems(
    suite: Suite, workload: str, cohort: int, *, quick: bool, systems: list[str] | None
) -> list[str]:
    """``systems`` (``--systems``) if given, else the suite's, with the cell's extra ones."""
    if systems is not None:
        return systems
    sizes = (suite.quick_cohorts if quick else suite.cohorts).get(workload, ())
    extra = suite.cell_systems.get((workload, sizes.index(cohort)), ()) if cohort in sizes else ()
    return [*suite.systems, *(system for system in extra if system not in suite.systems)]


def make_data(workload: Workload, cohort: int) -> FederatedData:
    """Synthetic N(0, 1) inputs and uniform labels for twice ``cohort`` equal clients; a test
    split of one row per client (what ``run`` needs to evaluate, and holds on the device)."""
    population, n = POPULATION_PER_COHORT * cohort, workload.examples_per_client
    data_rng = np.random.default_rng(harness.SEED)
    x = data_rng.standard_normal((population * n, *workload.example_shape), dtype=np.float32)
    y = data_rng.integers(0, workload.num_classes, population * n, dtype=np.int32)
    offset = np.arange(population, dtype=np.int32) * n
    train = ClientArrays(x, y, offset, np.full(population, n, np.int32))
    first = np.arange(population, dtype=np.int32)
    test = ClientArrays(x[offset], y[offset], first, np.ones(population, np.int32))
    return FederatedData(train, test, workload.num_classes, f"synthetic-{workload.name}")


def make_setup(workload: Workload, cohort: int, data: FederatedData | None = None) -> harness.Setup:
    """The harness's cell on ``data`` (default: ``make_data``'s)."""
    data = make_data(workload, cohort) if data is None else data
    work = LocalWork(workload.batch_size, epochs=1.0)
    return harness.make_setup(workload.make_model(), data.train, work, cohort)


def variants(
    setup: harness.Setup,
    data: FederatedData,
    *,
    systems: list[str],
    baselines: list[str],
    chunks: list[int | str],
    unrolls: tuple[int, ...],
    algorithms: list[str],
    algorithm_systems: list[str],
    loop_clients: int | None,
    masked: bool = False,
    splits: tuple[int, ...] = (),
) -> tuple[list[harness.Variant], Callable[[], tuple[Any, dict]]]:
    """The cell's variants, each system's baselines first (its gate reference), and the
    memoised builder of the heterogeneous schedule row (built by the first variant needing it,
    so that its failure is recorded in the rows). FedAvg's engine runs under every system,
    the other ``algorithms`` under those of ``algorithm_systems``; with ``masked`` FedAvg's
    engine also runs every masked step (``proportional=False``) beside each of its rows; each
    of ``splits`` adds a FedAvg engine row of every heterogeneous system with its cohort run
    in that many sorted chunks (``split_chunk``). An engine row of chunk "auto" is built as
    ``fedjax-het run`` builds its round for ``data`` (``harness.run_setup``, one round): its
    chunk plan, store and initial state; the row records the plan's chunk and line."""
    plan = functools.cache(functools.partial(harness.flash_deadline_plan, setup))
    system_of = functools.cache(functools.partial(harness.flash_deadline_system, setup))
    out = []
    for system in systems:
        row_plan = (lambda: None) if system == "none" else (lambda: plan()[0])
        for baseline in baselines:
            if baseline == "loop":
                build = lambda p=row_plan: harness.per_client_loop(setup, p(), loop_clients)
            elif system == "none":
                build = functools.partial(harness.bare_vmap, setup)
            else:
                continue  # the bare vmap has no masks: it is the homogeneous lower bound
            out.append(harness.Variant(baseline, {"system": system, "algorithm": "fedavg"}, build))
        for chunk in chunks:
            for unroll in unrolls:
                for algorithm in algorithms:
                    if algorithm != "fedavg" and system not in algorithm_systems:
                        continue
                    factory = ALGORITHMS[algorithm]
                    planned = None
                    if chunk == "auto":  # run's own plan, built with the row (its errors too)
                        planned = functools.partial(
                            harness.run_setup, data, setup.round_.model,
                            setup.round_.algorithm if factory is None else factory(),
                            setup.round_.sampler, rounds=1, work=setup.round_.spec.work,
                            system=None if system == "none" else system_of(), devices=1,
                        )  # fmt: skip
                    for proportional in (True, False) if masked and factory is None else (True,):
                        settings = {
                            "system": system,
                            "algorithm": algorithm,
                            **({"gate_group": algorithm} if algorithm in OWN_ROUND else {}),
                            "chunk": chunk,
                            "chunk_from": PLANNED if chunk == "auto" else "--chunk",
                            "unroll": unroll,
                            "proportional": proportional,
                        }

                        def build(
                            size=chunk,
                            unroll=unroll,
                            factory=factory,
                            p=row_plan,
                            proportional=proportional,
                            planned=planned,
                        ):
                            made = None if factory is None else factory()
                            return harness.engine(
                                setup, size, unroll, made, p(), proportional, planned
                            )

                        out.append(harness.Variant("engine", settings, build))
        for split in splits if system != "none" else ():
            size = split_chunk(setup.cohort, split)
            settings = {
                "system": system,
                "algorithm": "fedavg",
                "chunk": size,
                "chunk_from": f"--sorted-chunks {split}",
                "unroll": 1,
                "proportional": True,
            }
            build = lambda size=size, p=row_plan: harness.engine(setup, size, 1, None, p())
            out.append(harness.Variant("engine", settings, build))
    return out, plan


def split_chunk(cohort: int, split: int) -> int:
    """The chunk that runs ``cohort`` slots in about ``split`` chunks: the smallest power of
    two holding ``cohort / split`` slots (``cohort.effective_chunk`` keeps it)."""
    return min(cohort, 1 << (-(-cohort // split) - 1).bit_length())


def cohort_ids(setup: harness.Setup) -> np.ndarray:
    """The clients of the cell's round (``harness.ROUND``), as every implementation draws them."""
    round_idx = jnp.int32(harness.ROUND)
    return np.asarray(setup.round_.cohort(round_idx, setup.train, setup.key)[0])


def run_cell(
    workload: Workload,
    cohort: int,
    *,
    warmup: int,
    reps: int,
    max_s: float,
    matmul_precision: str = harness.GATE_PRECISION,
    **options,
) -> list[dict[str, Any]]:
    """Measures one (workload, cohort); a failure to set it up (memory) gives one error row."""
    try:
        data = make_data(workload, cohort)
        setup = make_setup(workload, cohort, data)
        cell, plan = variants(setup, data, **options)
        rows = harness.measure(
            setup.params,
            cell,
            warmup=warmup,
            reps=reps,
            max_s=max_s,
            matmul_precision=matmul_precision,
        )
    except Exception as error:  # noqa: BLE001 - recorded, the suite goes on
        error = f"{type(error).__name__}: {error}"[:500]
        print(f"  cell failed: {error[:200]}", flush=True)
        return [{"implementation": None, "error": error}]
    if any(row.get("algorithm") in OWN_ROUND for row in rows):
        share = width_share.cohort_share(
            setup.round_.model, workload.example_shape, HETEROFL_WIDTHS, cohort_ids(setup)
        )
        for row in rows:
            if row.get("algorithm") in OWN_ROUND:
                row.update(share)
    if plan.cache_info().currsize:
        summary = plan()[1]
        print(f"  flash-deadline: {json.dumps(summary)}", flush=True)
        for row in rows:
            if row.get("system") != "none":
                row["system_summary"] = summary
    return rows


def best_engine_row(
    rows: list[dict[str, Any]],
    workload: str,
    cohort: int | None,
    system: str,
    metric: str,
    algorithm: str = "fedavg",
) -> dict[str, Any] | None:
    """The engine row of ``algorithm`` at the cell and system with the lowest ``metric`` (for
    "runs": one without an error), else another of its rows (an error, a failed gate), else
    the row of the whole cell's error, else None."""
    cell = [row for row in rows if (row.get("workload"), row.get("cohort")) == (workload, cohort)]
    found = [
        row
        for row in cell
        if (row["implementation"], row.get("algorithm"), row.get("system"))
        == ("engine", algorithm, system)
        and row.get("proportional", True)  # a --masked row is the comparison, not the engine
    ]
    if metric == "runs":
        ran = [row for row in found if "error" not in row]
        if ran:
            return ran[0]
    timed = [row for row in found if metric in row]
    if timed:
        return min(timed, key=lambda row: row[metric])
    failed = [row for row in cell if row["implementation"] is None]
    return (found or failed or [None])[0]


def target_limit(target: Target, row: dict[str, Any] | None) -> float | None:
    """``target.limit``, times the row's ``target.scale`` field where it has one (None where
    the row lacks that field)."""
    if target.scale is None:
        return target.limit
    scale = None if row is None else row.get(target.scale)
    return None if scale is None else target.limit * scale


def target_note(target: Target, row: dict[str, Any] | None) -> str | None:
    """What the value depends on: a "runs" row's chunk plan (its chunk, and the bytes it
    needs of the free ones), a scaled limit's basis (``width_share``'s three readings)."""
    if row is None or "error" in row:
        return None
    if target.metric == "runs" and "plan_bytes" in row:
        need = row["plan_bytes"]
        return (
            f"chunk {row.get('chunk')}: needs {format_bytes(need['needed'])} of "
            f"{format_bytes(need['free'])} free ({need['source']})"
        )
    if target.scale == "width_flop_share" and target.scale in row:
        return (
            f"limit {target.limit} x {row['width_flop_share']:.3f}, the FLOP share of its "
            f"widths (mean width {row['mean_width']:.3f}; the mean width's model "
            f"{row['mean_width_model_flop_share']:.3f})"
        )
    return None


def evaluate_targets(
    rows: list[dict[str, Any]], suite: Suite, *, quick: bool, device: str
) -> list[dict[str, Any]]:
    """Each target's measured value, the homogeneous FedAvg engine's for comparison where it
    has the metric, and PASS / FAIL, or why it was not judged: "not measured" (no row),
    "error" / "no value" (the row failed, or has no time or baseline to compare with),
    "quick", or the device is not one the suite targets."""
    cohorts = suite.quick_cohorts if quick else suite.cohorts
    on_target = any(name in device for name in suite.target_devices)
    wanted = "/".join(name.rstrip(":") for name in suite.target_devices) or "target"
    out = []
    for target in suite.targets:
        sizes = cohorts.get(target.workload, ())
        cohort = sizes[target.position] if target.position < len(sizes) else None
        row = best_engine_row(
            rows, target.workload, cohort, target.system, target.metric, target.algorithm
        )
        homogeneous = best_engine_row(rows, target.workload, cohort, "none", target.metric)
        if row is None or target.metric == "runs":
            value = None if row is None or "error" in row else row.get("median_s")
        else:
            value = row.get(target.metric)
        limit = target_limit(target, row)
        if row is None:
            status = "not measured"
        elif target.metric != "runs" and (value is None or limit is None):
            status = "error" if "error" in row else "no value"
        elif quick:
            status = "quick (not the target size)"
        elif not on_target:
            status = f"not {'a' if wanted[0] in 'bcdgjkpqtuvwxyz' else 'an'} {wanted}"
        elif target.metric == "runs":
            status = "FAIL" if "error" in row else "PASS"
        else:
            status = "PASS" if value <= limit else "FAIL"
        out.append(
            {
                "claim": target.claim,
                "workload": target.workload,
                "cohort": cohort,
                "system": target.system,
                "algorithm": target.algorithm,
                "metric": target.metric,
                "limit": limit,
                "value": value,
                "note": target_note(target, row),
                "median_s": None if row is None else row.get("median_s"),
                "chunk": None if row is None else row.get("chunk"),
                "matmul_precision": None if row is None else row.get("matmul_precision"),
                "error": None if row is None else row.get("error"),
                "homogeneous_value": None
                if homogeneous is None or target.system == "none"
                else homogeneous.get(target.metric),
                "status": status,
            }
        )
    return out


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_targets(targets: list[dict[str, Any]], device: str) -> None:
    print(f"\nTargets on {device}:")
    print(f"  {'claim':62s} {'cell':9s} {'system':14s} {'value':>7s} {'limit':>6s}  status")
    for t in targets:
        print(
            f"  {t['claim']:62s} {t['workload']}/{t['cohort']!s:6s} {t['system']:14s} "
            f"{_fmt(t['value']):>7s} {_fmt(t['limit']):>6s}  {t['status']}"
        )


def targets_markdown(targets: list[dict[str, Any]], device: str) -> str:
    """The targets as a Markdown table; those not measured (cells not run) in one line after."""
    lines = [
        f"Targets on {device}:",
        "",
        "| claim | cell | system | algorithm | value | limit | median s | status | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    missing = []
    for t in targets:
        cell = f"{t['workload']}/{t['cohort']}"
        if t["status"] == "not measured":
            missing.append(f"{t['claim']} at {cell} ({t['system']}, {t['algorithm']})")
            continue
        status = t["status"] + (f" ({t['error'][:80]})" if t.get("error") else "")
        lines.append(
            f"| {t['claim']} | {cell} | {t['system']} | {t['algorithm']} "
            f"| {_fmt(t['value'])} | {_fmt(t['limit'])} | {_fmt(t['median_s'])} | {status} "
            f"| {t.get('note') or ''} |"
        )
    if missing:
        lines += ["", f"Not measured (cells not run): {'; '.join(missing)}."]
    return "\n".join(lines) + "\n"


def evaluate_file(path: str, markdown: str | None) -> None:
    """Judges the targets over every row of the results file ``path`` (rows of several runs
    of one suite, e.g. one run per workload, or a run cut short), prints them, appends a
    targets line to ``path`` and, with ``markdown``, appends the table there."""
    rows = [  # not the targets lines, nor another benchmark's rows (bench_conv's)
        line
        for line in common.read_rows(Path(path))
        if "targets" not in line and "benchmark" not in line
    ]
    if not rows:
        raise ValueError(f"{path} holds no result rows")
    suites = {row.get("suite") for row in rows}
    quick = {row.get("quick") for row in rows}
    if len(suites) != 1 or len(quick) != 1:
        raise ValueError(f"{path} mixes suites {suites} or quick and full runs {quick}")
    suite_name, env = suites.pop(), rows[-1].get("env", {})
    device = env.get("device", "unknown device")
    targets = evaluate_targets(rows, SUITES[suite_name], quick=quick.pop(), device=device)
    print_targets(targets, device)
    line = {"targets": targets, "suite": suite_name, "evaluated_rows": len(rows)}
    common.write_rows(Path(path), [line], env)
    if markdown:
        with open(markdown, "a") as f:
            f.write(targets_markdown(targets, device))


def int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{flag} values must be >= 1, got {text!r}")
    return values


def choices(text: str, flag: str, allowed) -> list[str]:
    values = text.split(",")
    if set(values) - set(allowed):
        raise ValueError(f"{flag} takes a comma list of {', '.join(allowed)}, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> None:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--suite")
    known, rest = first.parse_known_args(argv)
    if known.suite == "scale":
        bench_scale.main(rest)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        choices=[*sorted(SUITES), "scale"],
        help="preset (default: per backend); scale runs bench_scale.py with the other flags",
    )
    parser.add_argument("--workloads", help="comma list of W1, W2 (default: the suite's)")
    parser.add_argument("--cohorts", help="comma list of cohort sizes (default: the suite's)")
    parser.add_argument(
        "--systems", help=f"comma list of {', '.join(harness.SYSTEMS)} (default: the suite's)"
    )
    parser.add_argument(
        "--loop-clients",
        type=int,
        help="time loops on at most this many clients, scaled to the cohort (default: suite's)",
    )
    parser.add_argument("--reps", type=int, help="timed rounds, >= 10 for results (default 10)")
    parser.add_argument("--warmup", type=int, help="untimed rounds after the gate's (default 1)")
    parser.add_argument(
        "--max-timing-s",
        type=float,
        help=f"stop timing (after {harness.MIN_REPS} rounds) past this many seconds",
    )
    parser.add_argument(
        "--chunk",
        default="auto",
        help="engine chunk sizes, comma list; 'auto': the round fedjax-het run builds, its plan's",
    )
    parser.add_argument(
        "--masked",
        action="store_true",
        help="also time FedAvg's engine running every masked step (before work-proportional rounds)",
    )
    parser.add_argument(
        "--sorted-chunks",
        default="",
        help="comma list of n: also time each heterogeneous system's FedAvg engine with its "
        "cohort in about n chunks, sorted by work (split_chunk)",
    )
    parser.add_argument("--unroll", default="1", help="engine local-step unrolling, comma list")
    parser.add_argument(
        "--algorithms",
        help=f"engine algorithms, comma list of {', '.join(ALGORITHMS)} (default: the suite's)",
    )
    parser.add_argument(
        "--algorithm-systems",
        default="none",
        help="systems on which algorithms other than FedAvg run, comma list (default none)",
    )
    parser.add_argument(
        "--matmul-precision",
        choices=harness.PRECISIONS,
        default=harness.GATE_PRECISION,
        help="jax.default_matmul_precision of the timed programs ('default' is TF32 on NVIDIA "
        f"GPUs); gate rounds always run under {harness.GATE_PRECISION!r} (default)",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma list of {', '.join(BASELINES)}, or none",
    )
    parser.add_argument("--out", help="JSONL path (default: experiments/bench_results/...)")
    parser.add_argument("--quick", action="store_true", help="smoke run at small sizes")
    parser.add_argument(
        "--no-targets", action="store_true", help="no targets table or line at the end"
    )
    parser.add_argument(
        "--evaluate",
        metavar="JSONL",
        help="run nothing: judge the targets over every row of this results file (several "
        "runs of one suite, or one cut short) and append the targets line to it",
    )
    parser.add_argument("--markdown", help="with --evaluate: append the targets table here")
    args = parser.parse_args(argv)
    if args.evaluate:
        evaluate_file(args.evaluate, args.markdown)
        return

    backend = jax.default_backend()
    suite_name = args.suite or ("cpu" if backend == "cpu" else "gpu")
    suite = SUITES[suite_name]
    cohorts_of = suite.quick_cohorts if args.quick else suite.cohorts
    workloads = (
        choices(args.workloads, "--workloads", WORKLOADS) if args.workloads else list(cohorts_of)
    )
    cohorts = int_list(args.cohorts, "--cohorts") if args.cohorts else None
    systems = choices(args.systems, "--systems", harness.SYSTEMS) if args.systems else None
    loop_clients = args.loop_clients or (
        suite.quick_loop_clients if args.quick else suite.loop_clients
    )
    reps = args.reps or (3 if args.quick else 10)
    warmup = (0 if args.quick else 1) if args.warmup is None else args.warmup
    max_s = args.max_timing_s or (10.0 if args.quick else suite.max_timing_s)
    if reps < 1 or warmup < 0 or (loop_clients is not None and loop_clients < 1):
        raise ValueError(
            f"--reps and --loop-clients must be >= 1 and --warmup >= 0, got {reps}, "
            f"{loop_clients}, {warmup}"
        )
    chunks = [c if c == "auto" else int_list(c, "--chunk")[0] for c in args.chunk.split(",")]
    unrolls = int_list(args.unroll, "--unroll")
    algorithms = (
        choices(args.algorithms, "--algorithms", ALGORITHMS)
        if args.algorithms
        else list(suite.algorithms)
    )
    algorithm_systems = choices(args.algorithm_systems, "--algorithm-systems", harness.SYSTEMS)
    baselines = (
        [] if args.baselines == "none" else choices(args.baselines, "--baselines", BASELINES)
    )

    stamp = datetime.datetime.now(datetime.UTC)
    out = common.results_path(args.out, f"throughput-{backend}-{suite_name}", quick=args.quick)
    quick = "-quick" if args.quick else ""
    env = results.environment()
    print(
        f"{env['device']}  jax {env['versions']['jax']}  suite {suite_name}{quick}  matmul "
        f"precision {args.matmul_precision} (gates {harness.GATE_PRECISION}) -> {out}"
    )

    all_rows = []
    for name in workloads:
        workload = WORKLOADS[name]
        for cohort in cohorts or cohorts_of.get(name, ()):
            print(f"{name}, cohort {cohort}", flush=True)
            shared = {
                "workload": name,
                "model": workload.make_model().name,
                "examples_per_client": workload.examples_per_client,
                "batch_size": workload.batch_size,
                "epochs": 1.0,
                "local_steps": -(-workload.examples_per_client // workload.batch_size),
                "cohort": cohort,
                "population": POPULATION_PER_COHORT * cohort,
                "suite": suite_name,
                "loop_clients": loop_clients,
                "warmup": warmup,
                "reps_requested": reps,
                "quick": args.quick,
                "matmul_precision": args.matmul_precision,
                "gate_matmul_precision": harness.GATE_PRECISION,
                "timestamp": stamp.isoformat(timespec="seconds"),
            }
            rows = run_cell(
                workload,
                cohort,
                systems=cell_systems(suite, name, cohort, quick=args.quick, systems=systems),
                baselines=baselines,
                chunks=chunks,
                unrolls=unrolls,
                algorithms=algorithms,
                algorithm_systems=algorithm_systems,
                masked=args.masked,
                splits=tuple(int_list(args.sorted_chunks, "--sorted-chunks"))
                if args.sorted_chunks
                else (),
                loop_clients=loop_clients,
                warmup=warmup,
                reps=reps,
                max_s=max_s,
                matmul_precision=args.matmul_precision,
            )
            rows = [{**shared, **row} for row in rows]
            all_rows += rows
            common.write_rows(out, rows, env)

    if suite.targets and not args.no_targets:
        targets = evaluate_targets(all_rows, suite, quick=args.quick, device=env["device"])
        print_targets(targets, env["device"])
        common.write_rows(out, [{"targets": targets, "suite": suite_name}], env)


if __name__ == "__main__":
    main()
