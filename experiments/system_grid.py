"""FedAvg over FLHetBench's 4 device x 4 state grid, as one batched program.

The default experiment of ``fedjax-het run`` (Fashion-MNIST subset, 100 clients, Dirichlet 0.5,
784-200-200-10 MLP, FedAvg, 10 clients a round, one local epoch of batch 20) is trained in the 16
settings of FLHetBench's interplay grid (Zhang et al., CVPR 2024, §5.2.3):

* devices (rows): the four released device cases, DPGMM over the AI-Benchmark scores
  (``device_sampler = "dpgmm"``, ``device_level = caseI``), the median device taking
  ``--step-time`` seconds a local step; spread grows from case1 to case4;
* states (columns): the four released state cases, DPCSM over the FLASH strict traces
  (``state_sampler = "dpcsm"``, ``state_level = caseJ``); case1 is the most severe;
* network: the 19 FLASH profiles; payload: the model's float32 parameters both ways;
* rounds start at trace time ``--start`` (86,400 s, the second midnight; at 0 only ~2 % of the
  traces are ready), pause while a device is not ready, and select among the ready clients.

Two round policies, each a grid of 16 cells run by ``fedjax_het.front.sweep.sweep`` as one
``vmap``-ed program: a ``--deadline`` (late work dropped) and readiness ``r = 0.2`` (the round
ends at the 80th percentile of finish times; the slowest clients are stragglers left out).

Per cell: final test accuracy, the 10th percentile and standard deviation of per-client test
accuracy (HDFL's good-intent fairness), rounds and virtual hours to ``--target`` accuracy, the share of
selected clients whose work was lost, participation Gini and clients never aggregated, and
InterMC-R (FLHetBench Eq. 1) at this workload: cohort 10, the run's deadline, overhead and
start, the model's payload and every client's local steps, ``--mc-rounds`` rounds (1,000).

Cost: the 16 deadline cells are also run one after another with ``simulate.run``; both wall
times (compilation included, as a user pays it) are reported, measured in the same invocation.

Usage::

    python experiments/system_grid.py --rounds 200 --deadline 10  # the README table (target 0.8)
    python experiments/system_grid.py --report                # redraw the plot, print the tables
    python experiments/system_grid.py --quick --out /tmp/g    # every cell at 2 rounds
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import common
import jax
import numpy as np

from fedjax_het.front import config as config_lib
from fedjax_het.front.sweep import sweep
from fedjax_het.system import flhetbench, setup
from fedjax_het.system.schedule import OK
from fedjax_het.training import simulate
from fedjax_het.training.freeze_pricing import upload_bytes
from fedjax_het.training.options import run_options

CASES = ("case1", "case2", "case3", "case4")
OUT = common.RESULTS / "system_grid"


def systems(num_clients: int, args: argparse.Namespace, policy) -> list[setup.System]:
    """The 16 systems, row by row (device case), then column (state case)."""
    return [
        setup.System(
            setup.profiles_from_options(
                num_clients,
                devices="flash",
                device_sampler="dpgmm",
                device_level=device,
                step_time=args.step_time,
                network="flash",
                availability="strict",
                state_sampler="dpcsm",
                state_level=state,
            ),
            policy,
        )
        for device in CASES
        for state in CASES
    ]


def policies(args: argparse.Namespace) -> dict[str, Any]:
    common = {"overhead": args.overhead, "start": args.start}
    return {
        "deadline": setup.policy_from_options(kind="deadline", deadline=args.deadline, **common),
        "readiness": setup.policy_from_options(kind="readiness", readiness=0.2, **common),
    }


def cell_row(history: simulate.History, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one cell."""
    s = jax.device_get(history.schedule)
    valid = np.asarray(s.valid)
    hit = history.summary["to_accuracy"].get(f"{args.target:g}")
    return {
        "final_accuracy": history.summary["final_test_accuracy"],
        "client_accuracy_p10": history.summary["client_accuracy_p10"],
        "client_accuracy_std": history.summary["client_accuracy_std"],
        "rounds_to_target": None if hit is None else hit["round"],
        "hours_to_target": None if hit is None else hit["virtual_s"] / 3600,
        "virtual_hours": history.summary["virtual_s"] / 3600,
        "mean_round_s": float(np.mean(s.duration)),
        "lost_share": float(np.sum(valid & (np.asarray(s.outcome) != OK)) / max(valid.sum(), 1)),
        "participation_gini": history.summary["participation_gini"],
        "never_aggregated": history.summary["clients_never_participated"],
        "to_accuracy": history.summary["to_accuracy"],
        "curve": [[e["round"], e["test_accuracy"]] for e in history.metrics],
    }


def inter_mc_r(system: setup.System, steps: np.ndarray, args, payload: float) -> float:
    mc = flhetbench.MonteCarlo(
        cohort_size=args.clients_per_round,
        rounds=args.mc_rounds,
        deadline=args.deadline,
        overhead=args.overhead,
        payload=payload,
        start=args.start,
    )
    return float(
        flhetbench.inter_mc_r(system.profiles, key=jax.random.key(0), mc=mc, steps_needed=steps)
    )


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    exp = config_lib.build(config_lib.load(None, [f"rounds={args.rounds}", *args.set]))
    kwargs = {k: v for k, v in exp.run_kwargs().items() if k not in ("system", "seed", "select")}
    spec = simulate.local_spec(exp.model, exp.algorithm, exp.data, exp.work)
    steps = simulate.steps_needed(spec, exp.data.train.count)
    shapes = jax.eval_shape(exp.model.init, jax.random.key(0))
    payload = float(upload_bytes(shapes))
    args.clients_per_round = exp.sampler.cohort_size
    record = common.record(args)
    for name, policy in policies(args).items():
        grid = systems(exp.data.num_clients, args, policy)
        t0 = time.perf_counter()
        cells = sweep(
            exp.data,
            exp.model,
            exp.algorithm,
            exp.sampler,
            systems=grid,
            seeds=(args.seed,),
            progress=True,
            targets=(0.7, 0.75, 0.8, args.target),
            **kwargs,
        )
        batched_s = time.perf_counter() - t0
        rows = [cell_row(h, args) for h in cells]
        for row, system in zip(rows, grid):
            row["inter_mc_r"] = inter_mc_r(system, steps, args, payload)
        record[name] = {"cells": rows, "batched_wall_s": batched_s}
        print(f"{name}: 16 cells batched in {batched_s:.1f} s")
        if name == "deadline" and args.sequential:
            t0 = time.perf_counter()
            for system in grid:
                simulate.run(
                    exp.data,
                    *run_options(
                        model=exp.model,
                        algorithm=exp.algorithm,
                        sampler=exp.sampler,
                        system=system,
                        seed=args.seed,
                        progress=False,
                        **kwargs,
                    ),
                )
            record[name]["sequential_wall_s"] = time.perf_counter() - t0
            print(
                f"{name}: 16 cells one after another in {record[name]['sequential_wall_s']:.1f} s"
            )
        common.write_json(out / "results.json", record)
    report(out)


TABLE_FIELDS = (
    ("final_accuracy", "final acc", "{:.3f}"),
    ("client_accuracy_p10", "client acc p10", "{:.3f}"),
    ("client_accuracy_std", "client acc std", "{:.3f}"),
    ("rounds_to_target", "rounds to target", "{}"),
    ("hours_to_target", "virtual h to target", "{:.1f}"),
    ("lost_share", "lost share", "{:.2f}"),
    ("participation_gini", "participation Gini", "{:.2f}"),
    ("never_aggregated", "never aggregated", "{}"),
    ("mean_round_s", "mean round s", "{:.1f}"),
    ("inter_mc_r", "InterMC-R", "{:.3f}"),
)

TITLES = {field: title for field, title, _ in TABLE_FIELDS}


def report(out: Path) -> None:
    """Prints a markdown table per policy and draws ``system_grid.png``."""
    record = json.loads((out / "results.json").read_text())
    names = [n for n in ("deadline", "readiness") if n in record]
    for name in names:
        print(f"\n### {name}\n")
        print("| device | state | " + " | ".join(t for _, t, _ in TABLE_FIELDS) + " |")
        print("|---|---|" + "---|" * len(TABLE_FIELDS))
        for k, row in enumerate(record[name]["cells"]):
            shown = [("-" if row[f] is None else fmt.format(row[f])) for f, _, fmt in TABLE_FIELDS]
            print(f"| {CASES[k // 4]} | {CASES[k % 4]} | " + " | ".join(shown) + " |")
        timing = record[name]
        line = f"\nbatched: {timing['batched_wall_s']:.0f} s"
        if "sequential_wall_s" in timing:
            line += (
                f"; sequential: {timing['sequential_wall_s']:.0f} s "
                f"({timing['sequential_wall_s'] / timing['batched_wall_s']:.2f}x)"
            )
        print(line)
        print(correlations(record[name]["cells"]))
    plot(record, names, out / "system_grid.png")


def pearson(x: list[float | None], y: list[float | None]) -> tuple[float, int]:
    """Pearson r over the pairs where both are known, and how many pairs."""
    pairs = np.array([(a, b) for a, b in zip(x, y) if a is not None and b is not None], float)
    if len(pairs) < 3 or np.ptp(pairs[:, 0]) == 0 or np.ptp(pairs[:, 1]) == 0:
        return float("nan"), len(pairs)
    return float(np.corrcoef(pairs.T)[0, 1]), len(pairs)


CORRELATED = (  # (x, y): what FLHetBench's Figs. 6-7 and the investigation read
    ("inter_mc_r", "final_accuracy"),
    ("inter_mc_r", "hours_to_target"),
    ("inter_mc_r", "never_aggregated"),
    ("never_aggregated", "final_accuracy"),
    ("inter_mc_r", "client_accuracy_p10"),
)


def correlations(cells: list[dict[str, Any]]) -> str:
    """Pearson r between the cells' InterMC-R and their outcomes (FLHetBench §5.2.3)."""
    parts = []
    for x, y in CORRELATED:
        r, n = pearson([c[x] for c in cells], [c[y] for c in cells])
        parts.append(f"r({x}, {y}) = {r:+.2f} (n={n})")
    return "Pearson " + "; ".join(parts)


PANELS = (
    "final_accuracy",
    "client_accuracy_p10",
    "participation_gini",
    "mean_round_s",
    "inter_mc_r",
)


def plot(record: dict[str, Any], names: list[str], path: Path) -> None:
    """A 4 x 4 heat map (device x state case) per policy and figure of ``PANELS``."""
    size = (4 * len(PANELS), 3.6 * len(names))
    figure = common.figure(
        path, dpi=110, nrows=len(names), ncols=len(PANELS), figsize=size, squeeze=False
    )
    with figure as (fig, axes):
        for i, name in enumerate(names):
            for j, field in enumerate(PANELS):
                values = np.array(
                    [np.nan if c[field] is None else c[field] for c in record[name]["cells"]], float
                ).reshape(4, 4)
                ax = axes[i, j]
                image = ax.imshow(values, cmap="viridis")
                for (r, c), v in np.ndenumerate(values):
                    ax.text(
                        c,
                        r,
                        "-" if np.isnan(v) else f"{v:.2f}",
                        ha="center",
                        va="center",
                        color="w",
                        fontsize=8,
                    )
                ax.set_xticks(range(4), [f"S{k + 1}" for k in range(4)])
                ax.set_yticks(range(4), [f"D{k + 1}" for k in range(4)])
                ax.set_title(f"{name}: {TITLES[field]}", fontsize=9)
                fig.colorbar(image, ax=ax, fraction=0.046)
        fig.supxlabel("state case (S1 most severe)")
        fig.supylabel("device case (D4 widest spread)")


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-time", type=float, default=0.5, help="median device, s/step")
    parser.add_argument("--deadline", type=float, default=20.0, help="seconds after overhead")
    parser.add_argument("--overhead", type=float, default=5.0)
    parser.add_argument("--start", type=float, default=86_400.0, help="trace time of round 0")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument(
        "--no-sequential",
        dest="sequential",
        action="store_false",
        help="skip the 16 one-after-another runs",
    )
    parser.add_argument("--mc-rounds", type=int, default=1000, help="InterMC-R's rounds")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="a config override, e.g. --set partition.beta=0.1 (repeatable)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="all 16 cells of both policies: 2 rounds, 50 MC rounds"
    )
    common.add_output_flags(parser, OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.mc_rounds, args.sequential = 2, 50, False
    return args


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
