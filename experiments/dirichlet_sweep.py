"""Dirichlet label-skew sweep: test accuracy of the default experiment against beta.

The default experiment of ``fedjax-het run`` (Fashion-MNIST subset, 100 clients, 10 per round,
FedAvg, 784-200-200-10 MLP, one local epoch of batch 20) is rerun with the partition's
concentration ``beta`` swept over ``--betas``. The split is NIID-Bench's Dirichlet recipe
(Li, Diao, Chen and He, "Federated Learning on Non-IID Data Silos: An Experimental Study",
ICDE 2022, §III-A; :func:`fedjax_het.data.label_skew.dirichlet_label_skew`): smaller beta gives
each client fewer classes, ``inf`` gives every client the global label distribution.

Every config is built with ``config.load(None, overrides)`` and ``config.build``, so the only
differences from the default experiment are the overrides this script names:

* ``partition.beta``: the swept value;
* ``seed`` and ``data.seed``: seed s sets both the run's root seed (init, selection, batches)
  and the partition's seed, so the spread over seeds covers both sources of randomness;
* ``partition.min_size`` (``--min-size``, default 1) and ``partition.max_tries``
  (``--max-tries``, default 1000), the same for every beta. Why: the default guard
  ``min_size = 10`` (NIID-Bench's) redraws the whole split until every client holds 10
  examples. With 13,200 examples over 100 clients, a single draw at beta = 0.05 met
  ``min_size >= 2`` in 1 of 2,000 draws and ``>= 10`` in none; at beta = 0.1 it met ``>= 10``
  in 0.45 % of draws, so 100 tries fail for some seeds. ``FederatedData`` refuses empty
  clients, so 1 is the lowest possible guard; at beta = 0.05 it still holds in only ~1 % of
  draws, hence the 1,000 tries. For beta >= 0.5 (seeds 0-2 checked) the first draw already
  gives every client more than 10 examples, so those partitions are the ones the default guard
  gives.

Output in ``--out`` (default ``experiments/results/dirichlet_sweep``):

* ``results.jsonl``: one JSON object per (beta, seed), written as each run ends: final and best
  test accuracy, per-client accuracy mean / 10th percentile / worst, the partition's mean
  Jensen-Shannon distance of client label distributions to the global one
  (:func:`fedjax_het.data.diagnostics.describe`), wall time, the accuracy curve, and the
  environment (versions, device, git revision) read by the program;
* ``dirichlet_sweep.png``: test accuracy against rounds for each beta (first seed), and final
  accuracy against beta (log axis, ``inf`` at the right end).

Usage::

    python experiments/dirichlet_sweep.py --rounds 200 --seeds 2 \\
        --betas 0.05,0.1,0.5,1,10,inf
    python experiments/dirichlet_sweep.py --report   # redraw the PNG, print the table
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common
import numpy as np
import provenance

from fedjax_het.data import diagnostics
from fedjax_het.front import config as config_lib
from fedjax_het.training import simulate

DEFAULT_OUT = common.RESULTS / "dirichlet_sweep"
DEFAULT_BETAS = "0.05,0.1,0.5,1,10,inf"
RESULTS_FILE = "results.jsonl"
PLOT_FILE = "dirichlet_sweep.png"
TAIL_EVALS = 5  # evaluations averaged in ``tail_accuracy`` (see ``summarize``)


def parse_betas(text: str) -> list[float]:
    """``"0.05,1,inf"`` -> ``[0.05, 1.0, inf]``; every value must be > 0 (``inf`` allowed).

    >>> parse_betas("0.05, 1,inf")
    [0.05, 1.0, inf]
    """
    try:
        betas = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"--betas must be comma-separated numbers or inf, got {text!r}") from None
    if not betas or not all(beta > 0 for beta in betas):
        raise ValueError(f"--betas must be one or more values > 0 (inf allowed), got {text!r}")
    return betas


def overrides(beta: float, seed: int, rounds: int, min_size: int, max_tries: int) -> list[str]:
    """The ``--set`` overrides of the default experiment for one (beta, seed) run.

    >>> overrides(float("inf"), 1, 200, 1, 1000)[:2]
    ['partition.beta=inf', 'partition.min_size=1']
    """
    return [
        f"partition.beta={'inf' if math.isinf(beta) else repr(beta)}",
        f"partition.min_size={min_size}",
        f"partition.max_tries={max_tries}",
        f"seed={seed}",
        f"data.seed={seed}",
        f"rounds={rounds}",
    ]


def run_one(beta: float, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Builds and runs one config; returns its results line (without the environment)."""
    sets = overrides(beta, seed, args.rounds, args.min_size, args.max_tries)
    experiment = config_lib.build(config_lib.load(None, sets))
    data = diagnostics.describe(experiment.data)
    history = simulate.run(
        experiment.data,
        *experiment.options(progress=True),
    )
    s = history.summary
    return {
        "beta": "inf" if math.isinf(beta) else beta,
        "seed": seed,
        "rounds": s["rounds"],
        "final_test_accuracy": s["final_test_accuracy"],
        "best_test_accuracy": s["best_test_accuracy"],
        "client_accuracy_mean": s["client_accuracy_mean"],
        "client_accuracy_p10": s["client_accuracy_p10"],
        "client_accuracy_min": s["client_accuracy_min"],
        "clients_evaluated": history.metrics[-1]["clients_evaluated"],
        "js_to_global_mean": data["js_to_global"]["mean"],
        "classes_per_client_mean": data["classes_per_client"]["mean"],
        "client_size_min": data["sizes"]["min"],
        "client_size_max": data["sizes"]["max"],
        "wall_s": s["wall_s"],
        "first_block_s_with_compile": s["first_block_s_with_compile"],
        "overrides": sets,
        "curve": [[m["round"], m["test_accuracy"]] for m in history.metrics],
    }


def beta_value(line: dict[str, Any]) -> float:
    """The beta of a results line as a float (JSON has no inf, so it is stored as "inf")."""
    return float(line["beta"])


def format_beta(beta: float) -> str:
    """``inf`` -> ``"inf"``, ``0.5`` -> ``"0.5"``, ``10.0`` -> ``"10"``."""
    return "inf" if math.isinf(beta) else f"{beta:g}"


def summarize(beta: float, lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregates over the seeds of one beta: means, and min / max of the final accuracy.

    ``tail_accuracy`` is each run's mean test accuracy over its last ``TAIL_EVALS``
    evaluations (rounds 160-200 of a 200-round run), averaged over seeds: at small beta the
    accuracy swings by several points from one evaluation to the next, so the final value alone
    is noisy.

    >>> line = {"final_test_accuracy": 0.5, "js_to_global_mean": 0.1, "client_accuracy_p10": 0.2,
    ...         "best_test_accuracy": 0.6, "wall_s": 3.0, "curve": [[0, 0.1], [10, 0.5]]}
    >>> summarize(1.0, [line, {**line, "final_test_accuracy": 0.7}])["final_max"]
    0.7
    """
    final = np.array([line["final_test_accuracy"] for line in lines])
    tails = [np.mean([acc for _, acc in line["curve"][1:][-TAIL_EVALS:]]) for line in lines]

    def mean(key: str) -> float:
        return float(np.mean([line[key] for line in lines]))

    return {
        "beta": beta,
        "seeds": len(lines),
        "js_to_global_mean": mean("js_to_global_mean"),
        "final_mean": float(final.mean()),
        "final_min": float(final.min()),
        "final_max": float(final.max()),
        "tail_accuracy": float(np.mean(tails)),
        "best_mean": mean("best_test_accuracy"),
        "client_p10_mean": mean("client_accuracy_p10"),
        "wall_s": sum(line["wall_s"] for line in lines),
    }


def by_beta(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`summarize` of every beta in ``lines``, in increasing beta."""
    betas = sorted({beta_value(line) for line in lines})
    return [summarize(b, [line for line in lines if beta_value(line) == b]) for b in betas]


def beta_line(summary: dict[str, Any]) -> str:
    """One printed line summarising every seed of one beta."""
    return (
        f"beta={format_beta(summary['beta']):>5}  JS={summary['js_to_global_mean']:.3f}  "
        f"final acc {summary['final_mean']:.4f} (min {summary['final_min']:.4f}, "
        f"max {summary['final_max']:.4f}, {summary['seeds']} seeds)  "
        f"last-{TAIL_EVALS} mean {summary['tail_accuracy']:.4f}  "
        f"client p10 {summary['client_p10_mean']:.4f}  wall {summary['wall_s']:.0f} s"
    )


def markdown_table(lines: Sequence[dict[str, Any]]) -> str:
    """The README table: one row per beta, means over seeds (final accuracy also min-max)."""
    rows = [
        (
            "| beta | mean JS distance to global | final test accuracy, mean (min-max) "
            f"| mean of last {TAIL_EVALS} evaluations | best test accuracy "
            "| per-client 10th percentile |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for s in by_beta(lines):
        rows.append(
            f"| {format_beta(s['beta'])} | {s['js_to_global_mean']:.3f} "
            f"| {s['final_mean']:.3f} ({s['final_min']:.3f}-{s['final_max']:.3f}) "
            f"| {s['tail_accuracy']:.3f} | {s['best_mean']:.3f} | {s['client_p10_mean']:.3f} |"
        )
    return "\n".join(rows)


def plot(lines: Sequence[dict[str, Any]], path: Path) -> None:
    """Left: test accuracy against rounds per beta (first seed); right: final accuracy vs beta.

    The right panel has a log x axis; ``inf`` sits one decade right of the largest finite beta
    and its tick is labelled. Dots are single seeds, the solid line joins their means, the
    dashed one the means of the last evaluations (:func:`summarize`).
    """
    betas = sorted({beta_value(line) for line in lines})
    finite = [b for b in betas if not math.isinf(b)]
    inf_x = 10 * max(finite) if finite else 1.0
    x_of = {b: (inf_x if math.isinf(b) else b) for b in betas}
    first_seed = min(line["seed"] for line in lines)
    colors = common.pyplot().get_cmap("viridis")(np.linspace(0, 0.9, len(betas)))
    with common.figure(path, dpi=110, ncols=2, figsize=(11, 4.2)) as (_, (ax_curve, ax_beta)):
        for beta, color in zip(betas, colors):
            for line in lines:
                if beta_value(line) == beta and line["seed"] == first_seed:
                    rounds, acc = zip(*line["curve"])
                    ax_curve.plot(rounds, acc, color=color, label=f"beta = {format_beta(beta)}")
        ax_curve.set(
            xlabel="round",
            ylabel="test accuracy",
            ylim=(0, 1),
            title=f"test accuracy against rounds (seed {first_seed})",
        )
        ax_curve.legend(loc="lower right")

        summaries = by_beta(lines)
        for s, color in zip(summaries, colors):
            final = [line["final_test_accuracy"] for line in lines if beta_value(line) == s["beta"]]
            ax_beta.scatter([x_of[s["beta"]]] * len(final), final, color=color, s=18, zorder=3)
        xs = [x_of[s["beta"]] for s in summaries]
        ax_beta.plot(
            xs,
            [s["final_mean"] for s in summaries],
            color="gray",
            zorder=2,
            label="final, mean over seeds (dots: seeds)",
        )
        ax_beta.plot(
            xs,
            [s["tail_accuracy"] for s in summaries],
            color="gray",
            ls="--",
            zorder=2,
            label=f"mean of the last {TAIL_EVALS} evaluations",
        )
        ax_beta.set_xscale("log")
        ax_beta.set_xticks([x_of[b] for b in betas], [format_beta(b) for b in betas])
        ax_beta.minorticks_off()
        num_seeds = len({line["seed"] for line in lines})
        ax_beta.set(
            xlabel="Dirichlet beta (log scale; inf = IID by class)",
            ylabel="test accuracy",
            title=f"accuracy at round {lines[0]['rounds']} against beta ({num_seeds} seeds)",
        )
        ax_beta.legend(loc="lower right")
        for ax in (ax_curve, ax_beta):
            ax.grid(alpha=0.3)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_rounds = config_lib.DEFAULTS["rounds"]
    p.add_argument(
        "--rounds",
        type=int,
        default=default_rounds,
        help=f"rounds per run (default: the default experiment's {default_rounds})",
    )
    p.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per beta (default 2)")
    p.add_argument("--betas", default=DEFAULT_BETAS, help=f"default {DEFAULT_BETAS}")
    p.add_argument(
        "--min-size",
        type=int,
        default=1,
        help="partition.min_size for every beta (default 1; see the docstring)",
    )
    p.add_argument(
        "--max-tries",
        type=int,
        default=1000,
        help="partition.max_tries for every beta (default 1000)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    provenance.add_flag(p)
    p.add_argument(
        "--report",
        action="store_true",
        help="run nothing: redraw the plot and print the table from the results.jsonl in --out",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results_path, plot_path = args.out / RESULTS_FILE, args.out / PLOT_FILE
    if args.report:
        report(common.read_rows(results_path), plot_path)
        return 0
    betas = parse_betas(args.betas)
    if args.seeds < 1 or args.rounds < 1:
        raise ValueError(f"--seeds and --rounds must be >= 1, got {args.seeds} and {args.rounds}")
    provenance.guard(args.out, args.allow_dirty)
    args.out.mkdir(parents=True, exist_ok=True)
    env = common.environment(args)
    results_path.write_text("")
    lines = []
    for beta in betas:
        beta_lines = []
        for seed in range(args.seeds):
            line = run_one(beta, seed, args)
            common.write_rows(results_path, [line], env, key="environment")
            beta_lines.append(line)
        print(beta_line(summarize(beta, beta_lines)), flush=True)
        lines += beta_lines
    print(f"wrote {results_path}")
    report(lines, plot_path)
    return 0


def report(lines: Sequence[dict[str, Any]], plot_path: Path) -> None:
    """Draws the plot and prints the Markdown table of the README."""
    plot(lines, plot_path)
    print(f"wrote {plot_path}\n\n{markdown_table(lines)}")


if __name__ == "__main__":
    sys.exit(main())
