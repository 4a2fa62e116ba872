"""The default experiment trained locally in float32 and in bfloat16.

Both use ``fedjax_het.front.config.DEFAULTS`` (Fashion-MNIST subset, 100 Dirichlet-0.5
clients, 784-200-200-10 MLP, FedAvg, 10 clients a round, one epoch of batch 20,
200 rounds), the same seed, in the same process. In bfloat16 the model's
forward and backward passes run on bfloat16 casts of the float32 master params
and inputs (``local.compute_model``); the loss, FedAvg's update, the optimizer
and aggregation stay float32.

Speed: every block of ``eval_every`` rounds is timed from one evaluation's host
copy to the next (so it includes the block's evaluation, float32 and the same
for both). The first block holds the compile and is reported apart; the
others are the steady state, reported as median and min-max seconds per round.
The two precisions alternate over ``--repeats`` runs each, so a change in the
load of the shared machine falls on both. Validation gate: every run
completes, repeats give the same accuracy, and bfloat16's final accuracy is
within ``GATE`` of float32's; the speed ratio counts only then.

    python experiments/precision.py            # 200 rounds x 2 repeats (~2 min on 2 CPU cores)
    python experiments/precision.py --quick    # 30 rounds x 1 repeat, nothing written
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import common
import numpy as np
import provenance

from fedjax_het.front import config
from fedjax_het.training import simulate

OUT = Path(__file__).parent / "results" / "precision.json"
PRECISIONS = ("float32", "bfloat16")
GATE = 0.02  # largest |final accuracy gap| for bfloat16 to count as training the same model


def run_once(precision: str, rounds: int) -> dict:
    """One run of the default experiment; its accuracies and per-block seconds per round."""
    e = config.build(config.load(None, [f"rounds={rounds}", f'engine.precision="{precision}"']))
    stamps = []
    history = simulate.run(
        e.data,
        e.model,
        e.algorithm,
        e.sampler,
        **e.run_kwargs(),
        progress=False,
        on_eval=lambda line: stamps.append((line["round"], time.perf_counter())),
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
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=config.DEFAULTS["rounds"])
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each precision, alternating"
    )
    parser.add_argument("--quick", action="store_true", help="30 rounds x 1 repeat, not written")
    parser.add_argument("--out", type=Path, default=OUT, help=f"default {OUT}")
    provenance.add_flag(parser)
    args = parser.parse_args()
    if not args.quick:
        provenance.guard(args.out, args.allow_dirty)
    rounds, repeats = (30, 1) if args.quick else (args.rounds, args.repeats)
    if rounds < 3 * config.DEFAULTS["eval_every"] or repeats < 1:
        parser.error(f"need rounds >= {3 * config.DEFAULTS['eval_every']} and repeats >= 1")
    runs = {p: [] for p in PRECISIONS}
    for _ in range(repeats):
        for precision in PRECISIONS:
            runs[precision].append(run_once(precision, rounds))
    rows = {p: summarise(r) for p, r in runs.items()}
    gap = rows["bfloat16"]["final_test_accuracy"] - rows["float32"]["final_test_accuracy"]
    valid = abs(gap) <= GATE and all(r["completed"] and r["deterministic"] for r in rows.values())
    ratio = (
        rows["bfloat16"]["steady_s_per_round_median"] / rows["float32"]["steady_s_per_round_median"]
    )
    report = {
        "experiment": "config.DEFAULTS, [engine] precision float32 vs bfloat16",
        "rounds": rounds,
        "repeats": repeats,
        "runs": rows,
        "accuracy_gap_bfloat16_minus_float32": gap,
        "validated": valid,
        "speed_ratio_bfloat16_over_float32": ratio if valid else None,
        "environment": common.environment(args),
    }
    print(json.dumps({k: v for k, v in report.items() if k != "environment"}, indent=1))
    if not args.quick:
        args.out.parent.mkdir(exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
