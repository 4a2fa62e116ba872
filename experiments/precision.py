"""The default experiment under each precision option, each gated against float32.

Options (``OPTIONS``): the float32 reference (``engine.matmul_precision =
"highest"``), TF32 products (``matmul_precision`` "high" and "default": on
NVIDIA GPUs "default" is TF32 and "high" bf16x3; on CPU all three are float32),
and bfloat16 local training (``engine.precision = "bfloat16"``: the forward and
backward passes on bfloat16 casts of the float32 master params and inputs,
``local.compute_model``; the loss, FedAvg's update, the optimizer and
aggregation stay float32; docs/design.md §9).

All run ``fedjax_het.front.config.DEFAULTS`` (Fashion-MNIST subset, 100
Dirichlet-0.5 clients, 784-200-200-10 MLP, FedAvg, 10 clients a round, one epoch
of batch 20) for ``--rounds`` (default 20) rounds, the same seed, in the same
process. Gate of an option (issue "Accelerator throughput II", item 5): after
the rounds, its final test accuracy within GATE_POINTS = 0.5 points of the
reference's, beside its distance ``||p - p_ref|| / ||p_ref - p_0||`` over the
global params (reported, not gated); its speed-up counts only when it passes.

Speed: every block of ``eval_every`` rounds is timed from one evaluation's host
copy to the next (so it includes the block's evaluation). The first block holds
the compile and is reported apart; the others are the steady state, reported as
median and min-max seconds per round. The options alternate over ``--repeats``
runs each, so a change in the load of the machine falls on all.

    python experiments/precision.py                 # 20 rounds x 2 repeats
    python experiments/precision.py --quick         # 6 rounds x 1 repeat, nothing written
    python experiments/precision.py --out FILE.json  # the device check's
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # common and provenance, also when loaded by path
import common
import jax
import numpy as np
import provenance

from fedjax_het.front import config
from fedjax_het.training import simulate

OUT = Path(__file__).parent / "results" / "precision.json"
OPTIONS = {  # name: config overrides; the first is the reference
    "float32": ('engine.matmul_precision="highest"',),
    "matmul_high": ('engine.matmul_precision="high"',),
    "matmul_default_tf32": ('engine.matmul_precision="default"',),
    "bfloat16": ('engine.precision="bfloat16"', 'engine.matmul_precision="highest"'),
}
REFERENCE = "float32"
GATE_POINTS = 0.5  # largest |final accuracy gap|, in points, for an option to train the same model


def run_once(overrides: tuple[str, ...], rounds: int, eval_every: int) -> dict:
    """One run of the default experiment; its accuracies, final params and per-block seconds
    per round."""
    e = config.build(
        config.load(None, [f"rounds={rounds}", f"eval_every={eval_every}", *overrides])
    )
    stamps = []
    history = simulate.run(
        e.data,
        *e.options(
            progress=False,
            on_eval=lambda line: stamps.append((line["round"],
            time.perf_counter()),
        ),
        ),
    )
    (_, t0), (_, t1), *rest = stamps
    steady = [(t - t_prev) / (r - r_prev) for (r_prev, t_prev), (r, t) in zip(stamps[1:], rest)]
    s = history.summary
    return {
        "status": s["status"],
        "final_test_accuracy": s["final_test_accuracy"],
        "best_test_accuracy": s["best_test_accuracy"],
        "client_accuracy_p10": s["client_accuracy_p10"],
        "first_block_s_with_compile": t1 - t0,
        "steady_s_per_round": steady,
        "params": jax.device_get(history.params),
    }


def distance(params, reference, initial) -> float:
    """``||params - reference|| / ||reference - initial||`` over every leaf, in float64."""
    flat = lambda tree: np.concatenate(
        [np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)]
    )
    ref = flat(reference)
    return float(
        np.linalg.norm(flat(params) - ref) / max(np.linalg.norm(ref - flat(initial)), 1e-30)
    )


def summarise(runs: list[dict]) -> dict:
    """Accuracies of the first run (checked equal over repeats), pooled steady blocks."""
    steady = np.concatenate([r["steady_s_per_round"] for r in runs])
    first = runs[0]
    return {
        **{
            k: first[k]
            for k in ("final_test_accuracy", "best_test_accuracy", "client_accuracy_p10")
        },
        "deterministic": all(
            r["final_test_accuracy"] == first["final_test_accuracy"] for r in runs
        ),
        "completed": all(r["status"] == "completed" for r in runs),
        "first_block_s_with_compile": [round(r["first_block_s_with_compile"], 3) for r in runs],
        "steady_blocks": int(steady.size),
        "steady_s_per_round_median": float(np.median(steady)),
        "steady_s_per_round_min_max": [float(steady.min()), float(steady.max())],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each option, alternating")
    parser.add_argument("--options", default=",".join(OPTIONS), help="comma list of options")
    parser.add_argument("--quick", action="store_true", help="6 rounds x 1 repeat, not written")
    parser.add_argument("--out", type=Path, help=f"JSON path (default {OUT}; --quick: none)")
    provenance.add_flag(parser)
    args = parser.parse_args(argv)
    rounds, repeats = (6, 1) if args.quick else (args.rounds, args.repeats)
    eval_every = 2 if args.quick else args.eval_every
    names = [REFERENCE, *(n for n in args.options.split(",") if n != REFERENCE)]
    if set(names) - set(OPTIONS) or rounds < 3 * eval_every or repeats < 1:
        parser.error(f"options from {', '.join(OPTIONS)}; rounds >= 3 x eval_every; repeats >= 1")
    out = args.out or (None if args.quick else OUT)
    if out is not None:
        provenance.guard(out, args.allow_dirty)
    runs = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            runs[name].append(run_once(OPTIONS[name], rounds, eval_every))
    initial = _initial_params()
    reference = runs[REFERENCE][0]
    rows = {}
    for name, option_runs in runs.items():
        row = summarise(option_runs)
        gap = 100 * (row["final_test_accuracy"] - reference["final_test_accuracy"])
        passed = abs(gap) <= GATE_POINTS and row["completed"] and row["deterministic"]
        speed_up = reference_speed(runs[REFERENCE]) / row["steady_s_per_round_median"]
        rows[name] = {
            **row,
            "overrides": list(OPTIONS[name]),
            "accuracy_gap_points": gap,
            "params_distance_to_float32": distance(
                option_runs[0]["params"], reference["params"], initial
            ),
            "gate": {"limit_points": GATE_POINTS, "passed": passed},
            "speed_up_over_float32": speed_up if passed else None,
        }
    report = {
        "experiment": f"config.DEFAULTS, {rounds} rounds; precision options against float32",
        "rounds": rounds,
        "repeats": repeats,
        "backend": jax.default_backend(),
        "options": rows,
        "environment": common.environment(args),
    }
    for name, row in rows.items():
        speed = row["speed_up_over_float32"]
        print(
            f"{name:22s} accuracy {row['final_test_accuracy']:.4f} (gap {row['accuracy_gap_points']:+.2f}"
            f" points), params distance {row['params_distance_to_float32']:.2e}, gate "
            f"{'PASS' if row['gate']['passed'] else 'FAIL'}, speed-up "
            f"{'-' if speed is None else f'{speed:.2f}x'}",
            flush=True,
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")


def reference_speed(runs: list[dict]) -> float:
    return float(np.median(np.concatenate([r["steady_s_per_round"] for r in runs])))


def _initial_params():
    """The default experiment's initial global params (the seed's ``model.init``)."""
    from fedjax_het import rng

    e = config.build(config.load(None, []))
    return jax.device_get(e.model.init(rng.stream(rng.seed_key(e.config["seed"]), "init")))


if __name__ == "__main__":
    main()
