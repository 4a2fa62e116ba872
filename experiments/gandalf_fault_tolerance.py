"""GANDALF's fault tolerance, as in its Table 2.

Chou, Chang, Chou, "A GAN-based Data Augmentation Framework for Federated Learning on Non-IID
Data" (notes: dace-gandalf-freezefl §B.1, Table 2). On the shipped Fashion-MNIST subset split over
20 clients with 4 major classes each about 10x its 6 minority classes (143 against 14 rows; the
majors of client k are classes ``perm[(k + j) % 10]``, j < 4, ``perm`` a seeded permutation, so
every class is major at 8 clients), three methods:

- ``gandalf``: 2 label groups train one conditional WGAN-GP each (``gan_passes`` sweeps), tau 0.5
  rebalancing, then 2 mediators (``fedjax_het.gandalf.pipeline.run_gandalf``, defaults of §5.1);
- ``mediator``: the same 2 mediators on the raw data, no GAN;
- ``fedavg``: every client its own group of one, one pass: FedAvg's ``sum (n_k / n) w_k`` over the
  clients that trained, on the same virtual clock;

at dropout rates 0.1, 0.4, 0.7, with and without fault tolerance, over 3 seeds.

Failures. Table 2's caption: the dropout rate is "the fraction of client requests exceeding the
max wait T_R without FT"; "delay is injected at random to simulate failures". Here every client
request drops with probability ``rate`` (``profiles.dropout``) at a point uniform over its work;
without fault tolerance the mediator waits ``T_R`` for it, with it the heartbeat notices the
silence ``heartbeat`` seconds after the drop (``fedjax_het.gandalf.mediator``). The measured fraction of
failed requests is reported beside the nominal rate.

Virtual time. One local step takes 1 s (transfers free): a raw client (about 660 rows, batch 32,
one epoch) works about 21 s, an augmented one about 33 s. ``T_R = 120`` s and ``heartbeat = 10`` s
come from Table 2 itself: without FT a 10-client group's round is about
``10 ((1 - p) w + p T_R)``, and the CINIC-10 round lengths 5.66 and 16.20 min at p = 0.1 and 0.7
solve to ``w = 0.39`` min, ``T_R = 2.15`` min, i.e. ``T_R`` about 5.5 ``w``; with FT a failed request
cost about one ``w`` (3.92 and 3.69 min), i.e. ``drop point (w / 2) + heartbeat`` with a heartbeat
about ``w / 2``. Round lengths are therefore calibrated, not predicted; the rounds and time to the
target accuracy, and the accuracy, are what the simulation adds.

Budget (2 shared CPU cores, 30 minutes for the full grid): a 784-100-10 MLP, SGD lr 0.1, one local
epoch of batch 32 (the paper: ResNet-18, batch 128, E = 3), 40 rounds (the paper's R_max), GANs
with hidden widths (128, 128) and ``--gan-passes`` sweeps of each group (the paper trains "until
convergence"). The GANs of a seed are trained once and shared by its 6 gandalf cells.

Usage::

    python experiments/gandalf_fault_tolerance.py --quick
    python experiments/gandalf_fault_tolerance.py
    python experiments/gandalf_fault_tolerance.py --report
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import common
import numpy as np

from fedjax_het import models
from fedjax_het import results as run_results
from fedjax_het.algorithms import fedavg
from fedjax_het.data import LocalWork, fashion_mnist
from fedjax_het.data.federated import FederatedData
from fedjax_het.gandalf import pipeline as gandalf
from fedjax_het.system.profiles import uniform_profiles

OUT = common.RESULTS / "gandalf_fault_tolerance"
NUM_CLIENTS, NUM_CLASSES, MAJORS = 20, 10, 4
MAJOR_ROWS, MINOR_ROWS = 143, 14
STEP_SECONDS, MAX_WAIT, HEARTBEAT = 1.0, 120.0, 10.0
WORK = LocalWork(batch_size=32, epochs=1.0)
HYPER = {"client_lr": 0.1}
METHODS = ("gandalf", "mediator", "fedavg")

# Table 2 of the paper (CINIC-10 | EMNIST): best accuracy (%), round length (min), rounds and
# total time (min) to the target accuracy, at dropout 0.1, 0.4, 0.7.
PAPER = {
    "CINIC-10": {
        True: ([78.17, 77.85, 76.89], [3.92, 3.81, 3.69], [7, 7, 12], [27.44, 16.75, 44.27]),
        False: ([76.80, 74.58, 71.97], [5.66, 10.96, 16.20], [9, 11, 18], [50.91, 120.53, 291.57]),
    },
    "EMNIST": {
        True: ([86.82, 86.20, 85.58], [5.07, 4.81, 4.17], [4, 6, 7], [20.28, 28.89, 29.17]),
        False: ([85.48, 83.93, 81.74], [6.98, 12.08, 16.46], [6, 10, 21], [41.90, 120.83, 345.70]),
    },
}


def partition(seed: int) -> FederatedData:
    """Fashion-MNIST subset: 20 clients, 4 major classes x 143 rows, 6 minor x 14; global test."""
    arrays = fashion_mnist.load_fashion_mnist_subset()
    gen = np.random.default_rng(seed)
    perm = gen.permutation(NUM_CLASSES)
    pools = [list(gen.permutation(np.flatnonzero(arrays["y_train"] == c))) for c in range(10)]
    xs, ys = [], []
    for k in range(NUM_CLIENTS):
        majors = {int(perm[(k + j) % NUM_CLASSES]) for j in range(MAJORS)}
        rows = []
        for c in range(NUM_CLASSES):
            take = MAJOR_ROWS if c in majors else MINOR_ROWS
            rows += [pools[c].pop() for _ in range(take)]
        rows = np.array(rows)[gen.permutation(len(rows))]
        xs.append(arrays["x_train"][rows])
        ys.append(arrays["y_train"][rows])
    test_parts = np.array_split(np.arange(len(arrays["y_test"])), NUM_CLIENTS)
    return FederatedData.from_client_arrays(
        xs, ys,
        test_xs=[arrays["x_test"][p] for p in test_parts],
        test_ys=[arrays["y_test"][p] for p in test_parts],
        num_classes=NUM_CLASSES, name="fashion_mnist_4major",
    )  # fmt: skip


def options(method: str, fault_tolerance: bool, gan_passes: int) -> gandalf.GandalfOptions:
    common = {"max_wait": MAX_WAIT, "heartbeat": HEARTBEAT, "fault_tolerance": fault_tolerance}
    if method == "fedavg":
        return gandalf.gandalf_options(gan=False, group_size=1, **common)
    if method == "mediator":
        return gandalf.gandalf_options(gan=False, **common)
    return gandalf.gandalf_options(
        gan=True, gan_hidden=(128, 128), gan_output="sigmoid", gan_passes=gan_passes, **common
    )


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    env = common.environment(args)
    model = models.mlp((28, 28, 1), NUM_CLASSES, hidden=(100,))
    algorithm = fedavg()
    runs_path = out / ("runs-quick.jsonl" if args.quick else "runs.jsonl")
    runs_path.write_text("")
    began = time.perf_counter()
    for seed in args.seeds:
        data = partition(seed)
        augmented = None
        for method in args.methods:
            for fault_tolerance in (True, False):
                opts = options(method, fault_tolerance, args.gan_passes)
                if method == "gandalf" and augmented is None:
                    tick = time.perf_counter()
                    augmented = gandalf.gandalf_data(data, opts, seed=seed, progress=True)
                    gan_wall = time.perf_counter() - tick
                    print(f"seed {seed}: GANs trained, {int(augmented.synthetic.sum())} rows "
                          f"added in {gan_wall:.0f} s", flush=True)  # fmt: skip
                for rate in args.rates:
                    tick = time.perf_counter()
                    result = gandalf.run_gandalf(
                        data, model, algorithm, opts, rounds=args.rounds, work=WORK, hyper=HYPER,
                        seed=seed, profiles=uniform_profiles(
                            NUM_CLIENTS, step_time=STEP_SECONDS, dropout=rate),
                        targets=args.targets, augmented=augmented if opts.gan else None,
                        progress=False,
                    )  # fmt: skip
                    row = {
                        "method": method, "fault_tolerance": fault_tolerance, "rate": rate,
                        "seed": seed, **result.summary,
                        "gan_wall_s": gan_wall if opts.gan else 0.0,
                        "targets": {str(t): v for t, v in result.targets.items()},
                        "curve": [[e["round"], e["virtual_s"], e["test_accuracy"]]
                                  for e in result.evaluations],
                        "wall_s": time.perf_counter() - tick,
                        "provenance": env["provenance"],
                    }  # fmt: skip
                    with runs_path.open("a") as f:
                        f.write(run_results.strict_json(row) + "\n")
                    print(f"seed {seed} {method:8s} FT={fault_tolerance!s:5s} p={rate}: best "
                          f"{row['best_accuracy']:.4f}, round {row['mean_round_s']:.0f} s, "
                          f"failed {row['failure_rate']:.2f}, {row['wall_s']:.0f} s wall "
                          f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    meta = {
        "rounds": args.rounds, "seeds": args.seeds, "rates": args.rates, "targets": args.targets,
        "gan_passes": args.gan_passes, "quick": args.quick, "environment": env,
        "wall_s": time.perf_counter() - began,
        "setup": {"model": "mlp 784-100-10", "work": "1 epoch, batch 32, SGD lr 0.1",
                  "step_s": STEP_SECONDS, "max_wait_s": MAX_WAIT, "heartbeat_s": HEARTBEAT,
                  "clients": NUM_CLIENTS, "major_rows": MAJOR_ROWS, "minor_rows": MINOR_ROWS},
    }  # fmt: skip
    (out / ("meta-quick.json" if args.quick else "meta.json")).write_text(
        run_results.strict_json(meta, indent=1)
    )
    report(out, quick=args.quick)


def _stats(values: list[float | None]) -> dict[str, Any]:
    """Mean, min and max over seeds; ``reached`` counts the seeds with a value."""
    got = [v for v in values if v is not None]
    if not got:
        return {"mean": None, "min": None, "max": None, "reached": 0}
    return {"mean": float(np.mean(got)), "min": float(min(got)), "max": float(max(got)),
            "reached": len(got)}  # fmt: skip


def summarise(rows: list[dict[str, Any]], target: str) -> list[dict[str, Any]]:
    cells = sorted({(r["method"], r["fault_tolerance"], r["rate"]) for r in rows},
                   key=lambda c: (METHODS.index(c[0]), not c[1], c[2]))  # fmt: skip
    table = []
    for method, ft, rate in cells:
        runs = [
            r for r in rows if (r["method"], r["fault_tolerance"], r["rate"]) == (method, ft, rate)
        ]
        table.append({
            "method": method, "fault_tolerance": ft, "rate": rate, "seeds": len(runs),
            "failure_rate": _stats([r["failure_rate"] for r in runs]),
            "best_accuracy": _stats([r["best_accuracy"] for r in runs]),
            "mean_round_s": _stats([r["mean_round_s"] for r in runs]),
            "rounds_to_target": _stats([r["targets"][target]["round"] for r in runs]),
            "time_to_target_s": _stats([r["targets"][target]["virtual_s"] for r in runs]),
        })  # fmt: skip
    return table


def speedups(rows: list[dict[str, Any]], table: list[dict[str, Any]], target: str):
    """Without-FT over with-FT ratios per method and rate: of the mean time to ``target`` and
    of the mean round length, plus the min-max of the per-seed time ratios (same seed paired)."""
    out = []
    for method in METHODS:
        for rate in sorted({c["rate"] for c in table}):
            cell = {
                ft: next((c for c in table if (c["method"], c["fault_tolerance"], c["rate"])
                          == (method, ft, rate)), None)
                for ft in (True, False)
            }  # fmt: skip
            if None in cell.values():
                continue
            with_ft, without = (cell[ft]["time_to_target_s"]["mean"] for ft in (True, False))
            seconds = {
                (r["seed"], r["fault_tolerance"]): r["targets"][target]["virtual_s"]
                for r in rows if (r["method"], r["rate"]) == (method, rate)
            }  # fmt: skip
            per_seed = [
                seconds[(seed, False)] / seconds[(seed, True)]
                for seed, ft in seconds
                if ft and seconds[(seed, True)] and seconds.get((seed, False))
            ]
            out.append({
                "method": method, "rate": rate, "target": float(target),
                "time_ratio": without / with_ft if with_ft and without else None,
                "time_ratio_per_seed": _stats(per_seed),
                "rounds_ratio": _ratio(cell, "rounds_to_target"),
                "round_length_ratio": _ratio(cell, "mean_round_s"),
            })  # fmt: skip
    return out


def _ratio(cell: dict[bool, dict[str, Any]], name: str) -> float | None:
    with_ft, without = cell[True][name]["mean"], cell[False][name]["mean"]
    return without / with_ft if with_ft and without else None


def report(out: Path, quick: bool = False) -> None:
    """Writes results.json (per-cell mean/min/max over seeds, for every target accuracy), a
    markdown table per target and the plot."""
    suffix = "-quick" if quick else ""
    rows = common.read_rows(out / f"runs{suffix}.jsonl")
    meta = json.loads((out / f"meta{suffix}.json").read_text())
    fmt = lambda s, f="{:.3f}": (
        "-" if s["mean"] is None else common.spread((s["mean"], s["min"], s["max"]), f)
    )
    times = lambda v: "-" if v is None else f"{v:.2f}x"
    results, lines = {}, []
    for target in map(str, meta["targets"]):
        table = summarise(rows, target)
        ratios = speedups(rows, table, target)
        results[target] = {"table": table, "speedups": ratios}
        header = f"| method | FT | rate | failed | best acc | round (s) | rounds to {target} "
        lines += [f"### target accuracy {target}", "",
                  header + f"| time to {target} (s) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in table:
            reached = c["rounds_to_target"]["reached"]
            note = "" if reached == c["seeds"] else f" ({reached}/{c['seeds']} seeds)"
            lines.append(
                f"| {c['method']} | {'with' if c['fault_tolerance'] else 'without'} | "
                f"{c['rate']} | {c['failure_rate']['mean']:.2f} | {fmt(c['best_accuracy'])} | "
                f"{fmt(c['mean_round_s'], '{:.0f}')} | "
                f"{fmt(c['rounds_to_target'], '{:.1f}')}{note} | "
                f"{fmt(c['time_to_target_s'], '{:.0f}')}{note} |"
            )
        ratio_header = "| method | rate | time to target, without/with FT [per-seed min-max] "
        lines += ["", ratio_header + "| rounds to target, without/with | round length, without/with |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in ratios:
            spread = r["time_ratio_per_seed"]
            band = "" if spread["mean"] is None else f" [{spread['min']:.2f}-{spread['max']:.2f}]"
            lines.append(
                f"| {r['method']} | {r['rate']} | {times(r['time_ratio'])}{band} | "
                f"{times(r['rounds_ratio'])} | {times(r['round_length_ratio'])} |"
            )
        lines.append("")
    (out / f"results{suffix}.json").write_text(run_results.strict_json(
        {"meta": meta, "targets": results,
         "paper_table2": {d: {str(ft): v for ft, v in m.items()} for d, m in PAPER.items()}},
        indent=1,
    ))  # fmt: skip
    (out / f"table{suffix}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    plot(rows, meta, out / f"gandalf_fault_tolerance{suffix}.png")


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    rates = meta["rates"]
    size = (4.2 * len(rates), 3.8)
    figure = common.figure(path, ncols=len(rates), figsize=size, sharey=True, squeeze=False)
    with figure as (fig, axes):
        colours = {"gandalf": "tab:red", "mediator": "tab:blue", "fedavg": "tab:gray"}
        for ax, rate in zip(axes[0], rates):
            for method in METHODS:
                for ft in (True, False):
                    runs = [r for r in rows if (r["method"], r["fault_tolerance"], r["rate"])
                            == (method, ft, rate)]  # fmt: skip
                    if not runs:
                        continue
                    clock = np.mean([[c[1] for c in r["curve"]] for r in runs], axis=0) / 60
                    acc = np.mean([[c[2] for c in r["curve"]] for r in runs], axis=0)
                    ax.plot(clock, acc, "-" if ft else "--", color=colours[method], lw=1.2,
                            label=f"{method}, {'with' if ft else 'without'} FT")  # fmt: skip
            for target in meta["targets"]:
                ax.axhline(float(target), color="k", lw=0.6, ls=":")
            ax.set_xscale("log")
            ax.set_title(f"dropout rate {rate}")
            ax.set_xlabel("virtual time (min, log)")
        axes[0][0].set_ylabel(f"test accuracy (mean of {len(meta['seeds'])} seeds)")
        axes[0][0].legend(fontsize=7, loc="lower right")
        fig.suptitle(f"GANDALF fault tolerance, Fashion-MNIST 20 clients 4-major, "
                     f"{meta['rounds']} rounds", fontsize=10)  # fmt: skip


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="every row of Table 2 at tiny size: 1 seed, 4 rounds"
    )
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.1, 0.4, 0.7])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--targets",
        type=float,
        nargs="+",
        default=[0.75, 0.8],
        help="test accuracies to time; the first one goes in the table",
    )
    parser.add_argument("--gan-passes", type=int, default=10)
    common.add_output_flags(parser, OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.rounds, args.gan_passes = [0], 4, 1
    return args


if __name__ == "__main__":
    common.main_or_report(parse, main, report, "quick")
