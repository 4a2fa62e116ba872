"""Bytes and virtual time to accuracy of FedAvg with each upload encoder on FLASH-like links.

FedAvg uncompressed and with each encoder of the ``[compression]`` table
(float16, QSGD with 16 levels, TernGrad, signSGD with majority vote, EF-scaled sign, top-1 %
with error feedback, random-10 %) and with a bfloat16 download, on the default experiment
(Fashion-MNIST subset, Dirichlet 0.5 over 100 clients, 784-200-200-10 MLP, 10 clients a round,
one local epoch of batch 20) with FLASH's measured bandwidths (``system.network = "flash"``),
AI-Benchmark devices (``system.devices = "flash"``) and ``wait_all`` rounds, so compression
shows up as shorter rounds. Per run: final and best test accuracy, round, virtual time and
cumulative bytes (up + down, summed over clients) at the first evaluation reaching
``--target``, and the communication survey's Eq. 2 costs (notes §1.2): ``cost_size`` = total
bytes, ``cost_time`` = link seconds summed over rounds and clients (each slot's finish time
less its compute, exact under wait_all with always-available clients and no overhead), plus
the mean round length. signSGD-MV also runs with smaller server learning rates
(``--sign-lrs``). ``--shakespeare`` adds a tiny Shakespeare pair (uncompressed, top-1 % EF).

Usage::

    python experiments/bytes_to_accuracy.py --rounds 150 --seeds 2 --shakespeare
    python experiments/bytes_to_accuracy.py --report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import common
import numpy as np

from fedjax_het.front import config as config_lib
from fedjax_het.front.sweep import Cell, sweep

OUT = common.RESULTS / "bytes_to_accuracy"
UP = "compression.upload="
EF = "compression.error_feedback=true"
VARIANTS: dict[str, list[str]] = {
    "none": [],
    "float16": [UP + '"float16"'],
    "qsgd(16)": [UP + '"qsgd"', "compression.levels=16"],
    "terngrad": [UP + '"terngrad"'],
    "sign+MV": [UP + '"sign"', "compression.majority_vote=true"],
    "scaled_sign+EF": [UP + '"scaled_sign"', EF],
    "top_k(0.01)+EF": [UP + '"top_k"', "compression.fraction=0.01", EF],
    "random_k(0.1)": [UP + '"random_k"', "compression.fraction=0.1"],
    "download bf16": ['compression.download="bfloat16"'],
}
SYSTEM = ['system.network="flash"', 'system.devices="flash"', 'policy.kind="wait_all"']
SHAKESPEARE = [
    'data.name="shakespeare"',
    "data.num_clients=20",
    'model.name="char_lstm"',
    "model.hidden=64",
    "model.layers=1",
    "local.max_steps=10",
    "sampler.clients_per_round=5",
    "algorithm.client_lr=0.5",
]


def run_variant(data: str, name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every seed (and for signSGD-MV every server_lr) of one encoder, as one sweep."""
    extra = SHAKESPEARE if data == "shakespeare" else []
    rounds = args.shakespeare_rounds if extra else args.rounds
    sets = [f"rounds={rounds}", f"eval_every={args.eval_every}", *SYSTEM, *extra, *VARIANTS[name]]
    exp = config_lib.build(config_lib.load(None, sets))
    kwargs = exp.run_kwargs()
    system = kwargs.pop("system")
    for key in ("select", "seed"):
        kwargs.pop(key)
    lrs = args.sign_lrs if name == "sign+MV" else [exp.config["algorithm"]["server_lr"]]
    seeds = range(1 if extra else args.seeds)
    cells = [Cell(seed=s, hyper={"server_lr": lr}, system=system) for lr in lrs for s in seeds]
    histories = sweep(
        exp.data, exp.model, exp.algorithm, exp.sampler, cells=cells, progress=False, **kwargs
    )
    step_time = np.asarray(system.profiles.step_time, np.float64)
    rows = []
    for cell, h in zip(cells, histories):
        s = h.schedule
        valid = np.asarray(s.valid)
        steps = np.asarray(s.steps_done) * step_time[np.asarray(s.selected)]
        link = np.where(valid, np.asarray(s.finish) - steps, 0.0)  # download + upload seconds
        curve = [
            {
                "round": m["round"],
                "acc": m["test_accuracy"],
                "virtual_s": m["virtual_s"],
                "bytes": m["bytes_down"] + m["bytes_up"],
            }
            for m in h.metrics
        ]
        rows.append(
            {
                "data": data,
                "encoder": name,
                "seed": cell.seed,
                "server_lr": cell.hyper["server_lr"],
                "rounds": rounds,
                "clients": exp.data.num_clients,
                "cohort": exp.config["sampler"]["clients_per_round"],
                "up_bytes_client": float(np.asarray(s.bytes_up)[0].max()),
                "down_bytes_client": float(np.asarray(s.bytes_down)[0].max()),
                "final_acc": h.summary["final_test_accuracy"],
                "best_acc": h.summary["best_test_accuracy"],
                "status": h.summary["status"],
                "cost_size": h.summary["bytes_down"] + h.summary["bytes_up"],
                "cost_time_s": float(link.sum()),
                "link_min_s": float(link[valid].min()),
                "mean_round_s": float(np.mean(h.round_metrics["duration_s"])),
                "virtual_s": h.summary["virtual_s"],
                "wall_s_sweep": h.summary["wall_s"],
                "curve": curve,
            }
        )
    return rows


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    path = out / "results.jsonl"
    if not (args.resume and path.exists()):
        path.write_text(json.dumps({"meta": True, **common.record(args)}) + "\n")
    done = {(r["data"], r["encoder"]) for r in load(path)}
    jobs = [("fashion_mnist", v) for v in args.encoders]
    jobs += [("shakespeare", v) for v in ("none", "top_k(0.01)+EF")] if args.shakespeare else []
    for data, name in jobs:
        if (data, name) in done:
            continue
        print(f"== {data} / {name}", flush=True)
        with path.open("a") as f:
            for row in run_variant(data, name, args):
                f.write(json.dumps(row) + "\n")
    report(out, args.target)


def load(path: Path) -> list[dict[str, Any]]:
    """The run rows of ``results.jsonl`` (the first line is the run's arguments and environment)."""
    return [r for r in common.read_rows(path) if not r.get("meta")]


def report(out: Path, target: float) -> None:
    """Prints the Markdown table (means over seeds) and draws ``bytes.png``."""
    cells = common.group_by(
        load(out / "results.jsonl"), lambda r: (r["data"], r["encoder"], r["server_lr"])
    )
    print(
        f"| data | encoder | server_lr | seeds | upload B/client | final acc | best acc "
        f"| rounds to {target} | hours to {target} | GB to {target} | cost_size GB "
        f"| cost_time (client-h) | mean round (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (data, encoder, lr), runs in cells.items():
        mean = {
            key: float(np.mean([r[key] for r in runs]))
            for key in (
                "up_bytes_client",
                "final_acc",
                "best_acc",
                "cost_size",
                "cost_time_s",
                "mean_round_s",
            )
        }
        hits = [common.first_hit(r, target) for r in runs]
        hits = [h for h in hits if h is not None]
        if hits:
            part = "" if len(hits) == len(runs) else f" ({len(hits)}/{len(runs)} seeds)"
            to = (
                "/".join(str(h["round"]) for h in hits) + part,
                f"{np.mean([h['virtual_s'] for h in hits]) / 3600:.2f}",
                f"{np.mean([h['bytes'] for h in hits]) / 1e9:.3f}",
            )
        else:
            to = ("not reached",) * 3
        print(
            f"| {data} | {encoder} | {lr:g} | {len(runs)} | {mean['up_bytes_client']:,.0f} "
            f"| {mean['final_acc']:.3f} | {mean['best_acc']:.3f} | {' | '.join(to)} "
            f"| {mean['cost_size'] / 1e9:.3f} | {mean['cost_time_s'] / 3600:.2f} "
            f"| {mean['mean_round_s']:.1f} |"
        )
    plot(cells, out / "bytes.png")


def mean_curve(runs: list[dict[str, Any]], field: str) -> np.ndarray:
    """``field`` at each evaluation, averaged over the runs (their evaluations share rounds)."""
    return np.mean([[c[field] for c in r["curve"]] for r in runs], axis=0)


def plot(cells: dict[tuple, list[dict[str, Any]]], path: Path) -> None:
    with common.figure(path, ncols=2, figsize=(12, 4.2)) as (fig, axes):
        fmnist = {k: v for k, v in cells.items() if k[0] == "fashion_mnist"}
        signs = [k for k in fmnist if k[1] == "sign+MV"]
        best_sign = max(
            signs, key=lambda k: np.mean([r["best_acc"] for r in fmnist[k]]), default=None
        )
        for key, runs in fmnist.items():
            if key[1] == "sign+MV" and key != best_sign:
                continue
            label = key[1] + (f" (server_lr {key[2]:g})" if key[1] == "sign+MV" else "")
            acc = mean_curve(runs, "acc")
            style = "--" if "bf16" in key[1] else "-"
            axes[0].plot(mean_curve(runs, "bytes")[1:], acc[1:], style, label=label)
            axes[1].plot(mean_curve(runs, "virtual_s") / 3600, acc, style, label=label)
        axes[0].set_xscale("log")
        axes[0].set_xlabel("cumulative bytes, up + down, all clients")
        axes[1].set_xlabel("virtual time (hours)")
        for ax in axes:
            ax.set_ylabel("test accuracy (mean over seeds)")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7)
        fig.suptitle("FedAvg on Fashion-MNIST, FLASH links and devices, wait_all")


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument(
        "--target",
        type=float,
        default=0.75,
        help="test accuracy of the to-target columns (computed by --report)",
    )
    parser.add_argument(
        "--sign-lrs",
        type=float,
        nargs="+",
        default=[1.0, 0.01, 0.001],
        help="server_lr values of signSGD-MV (1.0: FedAvg's default)",
    )
    parser.add_argument("--encoders", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--shakespeare", action="store_true", help="add the tiny Shakespeare pair")
    parser.add_argument("--shakespeare-rounds", type=int, default=40)
    common.add_output_flags(parser, OUT, resume=True)
    return parser.parse_args(argv)


if __name__ == "__main__":
    common.main_or_report(parse, main, report, "target")
