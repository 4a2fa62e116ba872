"""Privacy against utility: DP-FedAvg's test accuracy as its epsilon grows.

McMahan et al. 2018 ("Learning Differentially Private Recurrent Language Models", Algorithm 1,
``fedjax_het.transforms.privacy.private``) on the default experiment (Fashion-MNIST subset, 100 clients,
Dirichlet 0.5, 784-200-200-10 MLP, one local epoch of batch 20 at lr 0.05): noise multipliers
``--noises`` at cohort sizes ``--cohorts``, one clip norm ``--clip``, against non-private FedAvg
at the same cohorts. Every ``--eval-every`` rounds the test accuracy is paired with the epsilon
spent so far at delta 1e-5 (``privacy.epsilon``, Poisson accounting; the summary adds the
fixed-size figure at the end). The cells of one cohort (noise multiplier x seed) share one
compiled program (``fedjax_het.sweep``: ``dp_noise`` and ``dp_clip`` are traced).

``--probe`` picks the clip norm first: the no-noise case (clipping only) and z = 1 at each of
``--clips`` for ``--probe-rounds`` rounds at 10 clients a round (seed 0), beside the norms of
20 clients' first local updates. ``results.jsonl`` holds one line per run (``kind``: norms,
probe or main; the accuracy-epsilon curve; the environment); an infinite epsilon is null.

Usage::

    python experiments/privacy_utility.py --probe --clips 0.1 0.5 --probe-rounds 30
    python experiments/privacy_utility.py --clip 0.1 --rounds 100 --seeds 0 1 2
    python experiments/privacy_utility.py --clip 0.1 --rounds 100 --noises 0 --skip-baseline
    python experiments/privacy_utility.py --report
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path
from typing import Any

import common
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.front import config as config_lib
from fedjax_het.front.sweep import Cell, sweep
from fedjax_het.transforms import privacy

OUT = common.RESULTS / "privacy_utility"
TARGETS = (2.0, 4.0, 8.0)
NUM_CLIENTS, DELTA = 100, 1e-5


def run_cells(
    cohort: int, rounds: int, eval_every: int, dp: bool, cells: list[tuple[int, float, float]]
) -> list[dict[str, Any]]:
    """One program: cells of (seed, noise multiplier, clip); plain FedAvg when not ``dp``."""
    sets = [f"rounds={rounds}", f"eval_every={eval_every}", f"sampler.clients_per_round={cohort}"]
    if dp:
        sets.append("privacy.noise_multiplier=1.0")  # any: each cell sets dp_noise and dp_clip
    exp = config_lib.build(config_lib.load(None, sets))
    kwargs = {**exp.run_kwargs(), "progress": False}
    for key in ("system", "select", "seed"):
        kwargs.pop(key)
    hyper = lambda z, c: {"dp_noise": z, "dp_clip": c} if dp else {}
    cells_ = [Cell(seed=s, hyper=hyper(z, c)) for s, z, c in cells]
    histories = sweep(exp.data, exp.model, exp.algorithm, exp.sampler, cells=cells_, **kwargs)
    rows = []
    for (seed, z, clip), h in zip(cells, histories):
        rounds_at = [m["round"] for m in h.metrics]
        spent = [
            privacy.epsilon(z, r, cohort, NUM_CLIENTS, DELTA) if dp else None for r in rounds_at
        ]
        curve = [[r, m["test_accuracy"], e] for r, m, e in zip(rounds_at, h.metrics, spent)]
        p = h.summary.get("privacy", {})
        rows.append({
            "cohort": cohort, "private": dp, "noise": z if dp else None,
            "clip": clip if dp else None, "seed": seed, "rounds": rounds,
            "final_accuracy": h.summary["final_test_accuracy"],
            "best_accuracy": max(m["test_accuracy"] for m in h.metrics),
            "epsilon": p.get("epsilon"), "epsilon_fixed_size": p.get("epsilon_fixed_size"),
            "curve": curve, "wall_s": h.summary["wall_s"],
        })  # fmt: skip
    return rows


def first_update_norms(clients: int = 20) -> list[float]:
    """L2 norms of one local epoch (batch 20, lr 0.05) from the initial model, ``clients`` clients."""
    exp = config_lib.build(config_lib.load(None, []))
    model, start = exp.model, exp.model.init(jax.random.key(0))
    loss = lambda p, x, y: model.loss(model.apply(p, x, train=True, key=None), y, jnp.ones(len(y)))
    step = jax.jit(
        lambda p, x, y: jax.tree.map(lambda a, g: a - 0.05 * g, p, jax.grad(loss)(p, x, y))
    )
    norms = []
    for k in range(0, NUM_CLIENTS, NUM_CLIENTS // clients):
        x, y = exp.data.train.client(k)
        params = start
        for i in range(0, len(y), 20):
            params = step(params, jnp.asarray(x[i : i + 20]), jnp.asarray(y[i : i + 20]))
        diff = jax.tree.map(lambda a, b: jnp.sum((a - b) ** 2), params, start)
        norms.append(float(jnp.sqrt(sum(jax.tree.leaves(diff)))))
    return norms


def main(args: argparse.Namespace) -> None:
    out = common.out_dir(args.out)
    env = common.environment(args)

    def write(rows: list[dict[str, Any]], kind: str) -> None:
        lines = [finite({"kind": kind, **r}) for r in rows]
        common.write_rows(out / "results.jsonl", lines, env, key="environment")

    if args.probe:
        norms = first_update_norms()
        quartiles = np.percentile(norms, [0, 25, 50, 75, 100])
        print("first-update norms, quartiles:", np.round(quartiles, 3))
        write([{"update_norms": norms}], "norms")
        cells = [(0, z, c) for c in args.clips for z in (0.0, 1.0)]
        write(run_cells(10, args.probe_rounds, args.eval_every, True, cells), "probe")
    for cohort in [] if args.probe else args.cohorts:
        print(f"== cohort {cohort}", flush=True)
        run = functools.partial(run_cells, cohort, args.rounds, args.eval_every)
        if not args.skip_baseline:
            write(run(False, [(s, 0.0, 0.0) for s in args.seeds]), "main")
        write(run(True, [(s, z, args.clip) for z in args.noises for s in args.seeds]), "main")
    report(out)


def finite(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with an infinite epsilon (z = 0 or no privacy) written as null: strict JSON."""
    inf = lambda v: None if isinstance(v, float) and math.isinf(v) else v
    return {k: [list(map(inf, c)) for c in v] if k == "curve" else inf(v) for k, v in row.items()}


def within(curve: list[list[float]], target: float) -> float | None:
    """Accuracy at the last evaluation whose epsilon is within ``target`` (None: none after 0)."""
    inside = [acc for r, acc, eps in curve if r > 0 and eps is not None and eps <= target]
    return inside[-1] if inside else None


def report(out: Path) -> None:
    """Prints the probe and main tables (means over seeds) and draws ``privacy_utility.png``."""
    lines = common.read_rows(out / "results.jsonl")
    mean = lambda xs: None if None in xs else float(np.mean(xs))
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if v < 1 else f"{v:.1f}"
    for kind, title in (("probe", "clip probe, 10 clients a round"), ("main", "DP-FedAvg")):
        groups = common.group_by(
            (r for r in lines if r["kind"] == kind),
            lambda r: (r["cohort"], r["private"], r["noise"] or 0, r["clip"]),
        )
        head = [
            "cohort",
            "z",
            "C",
            "seeds",
            "rounds",
            "final acc [min-max]",
            "best acc",
            "eps (Poisson)",
            "eps (fixed size)",
            *(f"acc at eps {t:g}" for t in TARGETS),
        ]
        print(f"\n{title}\n\n| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
        for (cohort, dp, z, clip), runs in sorted(groups.items()):
            final = [r["final_accuracy"] for r in runs]
            at = [mean([within(r["curve"], t) for r in runs]) if dp else None for t in TARGETS]
            eps = [fmt(runs[0][k]) if z > 0 else "inf" if dp else "-"
                   for k in ("epsilon", "epsilon_fixed_size")]  # fmt: skip
            cols = [
                cohort,
                f"{z:g}" if dp else "non-private",
                f"{clip:g}" if dp else "-",
                len(runs),
                runs[0]["rounds"],
                f"{np.mean(final):.3f} [{min(final):.3f}-{max(final):.3f}]",
                fmt(mean([r["best_accuracy"] for r in runs])),
                *eps,
                *map(fmt, at),
            ]
            print("| " + " | ".join(map(str, cols)) + " |")
    if any(r["kind"] == "main" for r in lines):
        plot([r for r in lines if r["kind"] == "main"], out / "privacy_utility.png")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    with common.figure(path, figsize=(7, 4.2)) as (_, ax):
        colours = {10: "tab:blue", 30: "tab:red"}
        styles = {0.5: ":", 1.0: "--", 2.0: "-"}
        for cohort in sorted({r["cohort"] for r in rows}):
            base = [r["final_accuracy"] for r in rows if r["cohort"] == cohort and not r["private"]]
            line = {"color": colours.get(cohort), "lw": 0.8}
            ax.axhline(
                np.mean(base), **line, alpha=0.6, label=f"non-private FedAvg, {cohort}/round"
            )
            for z in sorted({r["noise"] for r in rows if r["cohort"] == cohort and r["private"]}):
                runs = [
                    r for r in rows if r["cohort"] == cohort and r["private"] and r["noise"] == z
                ]
                if z == 0:  # clipping only: no privacy, epsilon infinite
                    final = np.mean([r["final_accuracy"] for r in runs])
                    ax.axhline(
                        final, **line, ls=(0, (1, 3)), label=f"clipping only, {cohort}/round"
                    )
                    continue
                curve = np.array([[c[2], c[1]] for c in runs[0]["curve"] if c[0] > 0])
                acc = np.mean([[c[1] for c in r["curve"] if c[0] > 0] for r in runs], axis=0)
                label = f"z = {z:g}, {cohort}/round"
                ax.plot(curve[:, 0], acc, styles.get(z, "-."), marker=".", **line, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("epsilon at delta 1e-5 (RDP, Poisson sampling)")
        ax.set_ylabel("test accuracy (mean over seeds)")
        clip = next(r["clip"] for r in rows if r["private"])
        ax.set_title(
            f"DP-FedAvg on fashion_mnist, 100 clients, C = {clip:g}, {rows[0]['rounds']} rounds"
        )
        ax.legend(fontsize=7, loc="lower right", handlelength=3)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seed ids")
    parser.add_argument("--cohorts", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--noises", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--skip-baseline", action="store_true", help="no non-private runs")
    parser.add_argument("--clip", type=float, default=0.1, help="the clip norm C of the main runs")
    parser.add_argument("--probe", action="store_true", help="only the clip-norm probe")
    parser.add_argument("--clips", type=float, nargs="+", default=[0.1, 0.5])
    parser.add_argument("--probe-rounds", type=int, default=30)
    common.add_output_flags(parser, OUT)
    return parser.parse_args(argv)


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
