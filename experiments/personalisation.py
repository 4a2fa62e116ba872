"""Personalisation and clustering under label and feature skew: global vs each client's own model.

The non-IID survey's personalisation and clustering families (notes: noniid-survey §5) against
the global-model baselines, on the default experiment's data and model (Fashion-MNIST subset,
100 clients, 784-200-200-10 MLP, 10 clients a round, one local epoch of batch 20), under two
partitions:

* ``dirichlet``: label skew, Dirichlet beta = 0.1 over clients (NIID-Bench; at least one
  example per client: NIID-Bench's 10 is never met at this beta, see ``dirichlet_sweep.py``);
* ``rotation``: feature skew, an IID split whose clients see their images rotated by 0, 90,
  180 or 270 degrees (four groups of 25, IFCA's rotated-MNIST set-up, Ghosh et al. 2020 §5).

Algorithms: FedAvg, FedProx, SCAFFOLD, FedDyn, q-FFL (global models) and Ditto, FedPer, IFCA
(each client also has its own model), each with its factory defaults except IFCA, which gets
``--clusters`` cluster models. Per (partition, algorithm), over ``--seeds`` seeds (the seeds of
one cell run as one ``vmap``-ed program, ``fedjax_het.sweep``): the global model's test
accuracy, and per client the accuracy of the model it would use (its own model where the
algorithm has one, else the global model) on its own test split: mean, 10th percentile (worst
decile) and worst client.

Usage::

    python experiments/personalisation.py --rounds 100 --seeds 2
    python experiments/personalisation.py --report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import common

from fedjax_het.front import config as config_lib
from fedjax_het.front.sweep import sweep

OUT = common.RESULTS / "personalisation"
ALGORITHMS = ("fedavg", "fedprox", "scaffold", "feddyn", "qffl", "ditto", "fedper", "ifca")
PARTITIONS = ("dirichlet", "rotation")


def overrides(partition: str, algorithm: str, args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides of one cell on top of the default experiment."""
    sets = [
        f"rounds={args.rounds}",
        f"eval_every={args.eval_every}",
        f"algorithm.name={algorithm!r}",
    ]
    if algorithm == "ifca":
        sets.append(f"algorithm.num_clusters={args.clusters}")
    if partition == "dirichlet":
        sets += ['partition.kind="dirichlet"', "partition.beta=0.1", "partition.min_size=1"]
    else:
        angles = [90.0 * (k % 4) for k in range(100)]
        sets += [
            'partition.kind="iid"',
            'feature_skew.kind="rotation"',
            f"feature_skew.angle={angles}",
        ]
    return sets


def run_cell(partition: str, algorithm: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    exp = config_lib.build(config_lib.load(None, overrides(partition, algorithm, args)))
    kwargs = exp.run_kwargs()
    for key in ("system", "select", "seed"):
        kwargs.pop(key)
    histories = sweep(
        exp.data, exp.model, exp.algorithm, exp.sampler, seeds=tuple(range(args.seeds)), **kwargs
    )
    rows = []
    for seed, history in enumerate(histories):
        s = history.summary
        prefix = "personal_accuracy" if history.personal_accuracy is not None else "client_accuracy"
        rows.append(
            {
                "partition": partition,
                "algorithm": algorithm,
                "seed": seed,
                "global_accuracy": s["final_test_accuracy"],
                "personal": history.personal_accuracy is not None,
                "own_mean": s[f"{prefix}_mean"],
                "own_p10": s[f"{prefix}_p10"],
                "own_min": s[f"{prefix}_min"],
                "global_client_p10": s["client_accuracy_p10"],
                "wall_s_cell": s["wall_s"],
            }
        )
    return rows


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    path = out / "results.json"
    rows = common.earlier_runs(path, args.resume)
    done = {(r["partition"], r["algorithm"]) for r in rows}
    for partition in args.partitions:
        for algorithm in args.algorithms:
            if (partition, algorithm) in done:
                continue
            print(f"== {partition} / {algorithm}", flush=True)
            rows += run_cell(partition, algorithm, args)
            common.write_json(path, common.record(args, runs=rows))
    report(out)


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and spread (min-max over seeds) of each figure per (partition, algorithm)."""
    cells = common.group_by(rows, lambda r: (r["partition"], r["algorithm"]))
    table = []
    for (partition, algorithm), runs in cells.items():
        entry = {
            "partition": partition,
            "algorithm": algorithm,
            "seeds": len(runs),
            "personal": runs[0]["personal"],
        }
        for key in ("global_accuracy", "own_mean", "own_p10", "own_min"):
            entry[key] = common.mean_min_max(r[key] for r in runs)
        table.append(entry)
    return table


def report(out: Path) -> None:
    """Prints the table (mean [min-max] over seeds) and draws ``personalisation.png``."""
    table = summarise(json.loads((out / "results.json").read_text())["runs"])
    fmt = common.spread
    print(
        "| partition | algorithm | own model | global acc | per-client mean | worst decile (p10) "
        "| worst client |"
    )
    print("|---|---|---|---|---|---|---|")
    for e in table:
        print(
            f"| {e['partition']} | {e['algorithm']} | {'yes' if e['personal'] else 'no'} "
            f"| {fmt(e['global_accuracy'])} | {fmt(e['own_mean'])} | {fmt(e['own_p10'])} "
            f"| {fmt(e['own_min'])} |"
        )
    plot(table, out / "personalisation.png")


def plot(table: list[dict[str, Any]], path: Path) -> None:
    partitions = sorted({e["partition"] for e in table})
    size = (6 * len(partitions), 3.8)
    with common.figure(path, ncols=len(partitions), figsize=size, squeeze=False) as (_, axes):
        for ax, partition in zip(axes[0], partitions):
            rows = [e for e in table if e["partition"] == partition]
            series = (
                ("global_accuracy", "global model"),
                ("own_mean", "own model, mean"),
                ("own_p10", "own model, worst decile"),
            )
            x = common.spread_bars(ax, rows, series)
            ax.set_xticks(x, [e["algorithm"] for e in rows], rotation=30)
            ax.set_ylim(0, 1)
            ax.set_title(partition)
            ax.set_ylabel("test accuracy")
        axes[0][0].legend(fontsize=8)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--clusters", type=int, default=4, help="IFCA's cluster models")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=PARTITIONS)
    common.add_output_flags(parser, OUT, resume=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
