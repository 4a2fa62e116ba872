"""Throughput of one fedjax_het round against a per-client loop and a bare ``vmap``.

The implementations (``engine``, ``loop``, ``bare_vmap``), the heterogeneous
round (``--systems flash-deadline``), the validation gate and the timing are
``bench_harness``'s; this script holds the workloads, the suites and the
targets. Each cell (workload, cohort) draws its own synthetic data: N(0, 1)
inputs, uniform labels, every client the same size, the cohort drawn from
twice as many clients.

Suites (``--suite``; flags given on the command line override a suite's):

* ``cpu`` (the default on CPU): W1 at 10 and 100 clients, W2 at 10; the
  homogeneous round only; the loop timed on the whole cohort.
* ``gpu`` (the default on accelerators), issue 11 item 6: W1 at 100, 1,000 and
  10,000 clients, W2 at 10, 100 and 1,000; every cell has the homogeneous
  engine round, the full heterogeneous round (``flash-deadline``: FLASH
  devices, deadline with partial work, 10 % dropouts), both loops and the bare
  ``vmap``. A loop is timed on at most LOOP_CLIENTS = 1,000 clients of its
  cohort and its seconds scaled linearly to the cohort (rows marked
  ``extrapolated``); its gate round always runs the whole cohort and its
  seconds are ``first_round_s``. The table at the end checks TARGETS: PASS or
  FAIL on an H100, "not an H100" elsewhere, "quick" for ``--quick``.

``--quick`` is a smoke run of a suite's machinery at small sizes: ``cpu``: W1
at 10 clients; ``gpu``: W1 at 4, 16, 64 and W2 at 2, 4, 8 clients, the loop
timed on 8 (so the extrapolation runs), 3 timed rounds. Its figures are not
results. ``--suite scale`` hands every other flag to ``bench_scale.py`` (the
100,000-client scale test), so ``make bench ARGS="--suite scale"`` runs it.

``--algorithms fedavg,scaffold`` adds an engine round of SCAFFOLD (Karimireddy
et al. 2020, ``algorithms/scaffold.py``) beside FedAvg's for each chunk,
unrolling and system, on the same setup; its rows carry ``ratio_to_fedavg``.
Its control variates start at zero, so its round equals FedAvg's and passes
the same gate. ``--baselines`` keeps only some of ``loop`` and ``bare_vmap``
(``none``: the first engine row of each system is its gate reference).

The baselines unroll their local steps (XLA:CPU runs convolution gradients
inside a ``while`` loop several times slower); the engine's unrolling is
``--unroll`` (default 1, as in ``simulate.run``). One JSON line per (workload,
cohort, implementation) holds median and min-max, the ratios engine/loop and
engine/bare of this run, the gate, the 1-minute load average before each timed
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
from typing import Any

import bench_harness as harness
import bench_scale
import jax
import numpy as np

from fedjax_het import models, results
from fedjax_het.algorithms.scaffold import scaffold
from fedjax_het.cohort import auto_chunk
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays

POPULATION_PER_COHORT = 2  # the sampler draws the cohort from twice as many clients
ALGORITHMS = {"fedavg": None, "scaffold": scaffold}  # engine algorithms (None: the setup's)
BASELINES = ("loop", "bare_vmap")
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
    """``metric`` of the full heterogeneous FedAvg engine round at a suite's ``position``-th
    cohort of ``workload`` must be at most ``limit`` (issue 11, item 6)."""

    workload: str
    position: int
    metric: str  # "ratio_to_bare_vmap" or "median_s"
    limit: float
    system: str = "flash-deadline"


@dataclasses.dataclass(frozen=True)
class Suite:
    """Cells, systems and loop cap of a preset, and their ``--quick`` counterparts."""

    cohorts: dict[str, tuple[int, ...]]
    systems: tuple[str, ...]
    loop_clients: int | None
    quick_cohorts: dict[str, tuple[int, ...]]
    quick_loop_clients: int | None
    max_timing_s: float
    targets: tuple[Target, ...] = ()


SUITES = {  # cpu: a full run stays near 8 minutes on 2 shared cores
    "cpu": Suite({"W1": (10, 100), "W2": (10,)}, ("none",), None, {"W1": (10,)}, None, 60.0),
    "gpu": Suite(
        {"W1": (100, 1000, 10000), "W2": (10, 100, 1000)},
        harness.SYSTEMS,
        LOOP_CLIENTS,
        {"W1": (4, 16, 64), "W2": (2, 4, 8)},
        8,
        30.0,
        (
            Target("W1", 1, "ratio_to_bare_vmap", 1.25),  # W1, 1,000 clients
            Target("W2", 1, "ratio_to_bare_vmap", 1.25),  # W2, 100 clients
            Target("W2", 2, "median_s", 0.75),  # W2, 1,000 clients, seconds a round
        ),
    ),
}
TARGET_DEVICE = "H100"


def make_setup(workload: Workload, cohort: int) -> harness.Setup:
    """Synthetic N(0, 1) inputs and uniform labels for twice ``cohort`` equal clients."""
    population, n = POPULATION_PER_COHORT * cohort, workload.examples_per_client
    data_rng = np.random.default_rng(harness.SEED)
    x = data_rng.standard_normal((population * n, *workload.example_shape), dtype=np.float32)
    y = data_rng.integers(0, workload.num_classes, population * n, dtype=np.int32)
    offset = np.arange(population, dtype=np.int32) * n
    train = ClientArrays(x, y, offset, np.full(population, n, np.int32))
    work = LocalWork(workload.batch_size, epochs=1.0)
    return harness.make_setup(workload.make_model(), train, work, cohort)


def variants(
    setup: harness.Setup,
    *,
    systems: list[str],
    baselines: list[str],
    chunks: list[int | str],
    unrolls: tuple[int, ...],
    algorithms: list[str],
    loop_clients: int | None,
) -> tuple[list[harness.Variant], Callable[[], tuple[Any, dict]]]:
    """The cell's variants, each system's baselines first (its gate reference), and the
    memoised builder of the heterogeneous schedule row (built by the first variant needing it,
    so that its failure is recorded in the rows)."""
    plan = functools.cache(functools.partial(harness.flash_deadline_plan, setup))
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
            size = auto_chunk(setup.cohort) if chunk == "auto" else chunk
            for unroll in unrolls:
                for algorithm in algorithms:
                    settings = {
                        "system": system,
                        "algorithm": algorithm,
                        "chunk": size,
                        "chunk_from": "auto_chunk" if chunk == "auto" else "--chunk",
                        "unroll": unroll,
                    }
                    factory = ALGORITHMS[algorithm]

                    def build(size=size, unroll=unroll, factory=factory, p=row_plan):
                        made = None if factory is None else factory()
                        return harness.engine(setup, size, unroll, made, p())

                    out.append(harness.Variant("engine", settings, build))
    return out, plan


def run_cell(
    workload: Workload, cohort: int, *, warmup: int, reps: int, max_s: float, **options
) -> list[dict[str, Any]]:
    """Measures one (workload, cohort); a failure to set it up (memory) gives one error row."""
    try:
        setup = make_setup(workload, cohort)
        cell, plan = variants(setup, **options)
        rows = harness.measure(setup.params, cell, warmup=warmup, reps=reps, max_s=max_s)
    except Exception as error:  # noqa: BLE001 - recorded, the suite goes on
        error = f"{type(error).__name__}: {error}"[:500]
        print(f"  cell failed: {error[:200]}", flush=True)
        return [{"implementation": None, "error": error}]
    if plan.cache_info().currsize:
        summary = plan()[1]
        print(f"  flash-deadline: {json.dumps(summary)}", flush=True)
        for row in rows:
            if row.get("system") != "none":
                row["system_summary"] = summary
    return rows


def best_engine_row(
    rows: list[dict[str, Any]], workload: str, cohort: int | None, system: str, metric: str
) -> dict[str, Any] | None:
    """The FedAvg engine row of the cell and system with the lowest ``metric``, else the row of
    its error (or of the whole cell's), else None."""
    cell = [row for row in rows if (row.get("workload"), row.get("cohort")) == (workload, cohort)]
    found = [
        row
        for row in cell
        if (row["implementation"], row.get("algorithm"), row.get("system"))
        == ("engine", "fedavg", system)
    ]
    timed = [row for row in found if metric in row]
    if timed:
        return min(timed, key=lambda row: row[metric])
    failed = [
        row for row in cell if "error" in row and (row in found or row["implementation"] is None)
    ]
    return failed[0] if failed else None


def evaluate_targets(
    rows: list[dict[str, Any]], suite: Suite, *, quick: bool, device: str
) -> list[dict[str, Any]]:
    """Each target's measured value (the best FedAvg engine row of the target's system at its
    cell), the homogeneous engine's for comparison, and PASS / FAIL / why not judged."""
    cohorts = suite.quick_cohorts if quick else suite.cohorts
    out = []
    for target in suite.targets:
        sizes = cohorts.get(target.workload, ())
        cohort = sizes[target.position] if target.position < len(sizes) else None

        row = best_engine_row(rows, target.workload, cohort, target.system, target.metric)
        homogeneous = best_engine_row(rows, target.workload, cohort, "none", target.metric)
        value = None if row is None else row.get(target.metric)
        if value is None:
            status = "error" if row is not None else "not measured"
        elif quick:
            status = "quick (not the target size)"
        elif TARGET_DEVICE not in device:
            status = f"not an {TARGET_DEVICE}"
        else:
            status = "PASS" if value <= target.limit else "FAIL"
        out.append(
            {
                "workload": target.workload,
                "cohort": cohort,
                "system": target.system,
                "metric": target.metric,
                "limit": target.limit,
                "value": value,
                "chunk": None if row is None else row.get("chunk"),
                "homogeneous_value": None
                if homogeneous is None
                else homogeneous.get(target.metric),
                "status": status,
            }
        )
    return out


def print_targets(targets: list[dict[str, Any]], device: str) -> None:
    print(f"\nTargets (issue 11, item 6) on {device}:")
    print(f"  {'cell':12s} {'metric':20s} {'limit':>6s} {'het round':>10s} {'homog.':>8s}  status")
    for t in targets:

        def fmt(value):
            return "-" if value is None else f"{value:.3f}"

        print(
            f"  {t['workload']}/{t['cohort']!s:8s} {t['metric']:20s} {t['limit']:6.2f} "
            f"{fmt(t['value']):>10s} {fmt(t['homogeneous_value']):>8s}  {t['status']}"
        )


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
        help="engine chunk sizes, comma list; 'auto' is cohort.auto_chunk",
    )
    parser.add_argument("--unroll", default="1", help="engine local-step unrolling, comma list")
    parser.add_argument(
        "--algorithms",
        default="fedavg",
        help=f"engine algorithms, comma list of {', '.join(ALGORITHMS)}",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma list of {', '.join(BASELINES)}, or none",
    )
    parser.add_argument("--out", help="JSONL path (default: experiments/bench_results/...)")
    parser.add_argument("--quick", action="store_true", help="smoke run at small sizes")
    args = parser.parse_args(argv)

    backend = jax.default_backend()
    suite_name = args.suite or ("cpu" if backend == "cpu" else "gpu")
    suite = SUITES[suite_name]
    cohorts_of = suite.quick_cohorts if args.quick else suite.cohorts
    workloads = (
        choices(args.workloads, "--workloads", WORKLOADS) if args.workloads else list(cohorts_of)
    )
    cohorts = int_list(args.cohorts, "--cohorts") if args.cohorts else None
    systems = choices(args.systems, "--systems", harness.SYSTEMS) if args.systems else suite.systems
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
    algorithms = choices(args.algorithms, "--algorithms", ALGORITHMS)
    baselines = (
        [] if args.baselines == "none" else choices(args.baselines, "--baselines", BASELINES)
    )

    stamp = datetime.datetime.now(datetime.UTC)
    out = harness.results_path(args.out, f"throughput-{backend}-{suite_name}", quick=args.quick)
    quick = "-quick" if args.quick else ""
    env = results.environment()
    print(f"{env['device']}  jax {env['versions']['jax']}  suite {suite_name}{quick} -> {out}")

    all_rows = []
    for name in workloads:
        workload = WORKLOADS[name]
        for cohort in cohorts or cohorts_of.get(name, ()):
            print(f"{name}, cohort {cohort}", flush=True)
            common = {
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
                "timestamp": stamp.isoformat(timespec="seconds"),
            }
            rows = run_cell(
                workload,
                cohort,
                systems=systems,
                baselines=baselines,
                chunks=chunks,
                unrolls=unrolls,
                algorithms=algorithms,
                loop_clients=loop_clients,
                warmup=warmup,
                reps=reps,
                max_s=max_s,
            )
            rows = [{**common, **row} for row in rows]
            all_rows += rows
            with out.open("a") as f:
                for row in rows:
                    f.write(json.dumps({**row, "env": env}) + "\n")

    if suite.targets:
        targets = evaluate_targets(all_rows, suite, quick=args.quick, device=env["device"])
        print_targets(targets, env["device"])
        with out.open("a") as f:
            f.write(json.dumps({"targets": targets, "suite": suite_name, "env": env}) + "\n")


if __name__ == "__main__":
    main()
