"""The default experiment trained locally in float32 and in bfloat16 (issue "Scale", item 5).

Both runs use ``fedjax_het.config.DEFAULTS`` (Fashion-MNIST subset, 100 Dirichlet-0.5
clients, 784-200-200-10 MLP, FedAvg, 10 clients a round, one epoch of batch 20),
the same seed, in the same process. bfloat16 runs the local loss on bfloat16
casts of the float32 master params (``local.in_bfloat16``); the update and
aggregation stay float32. Speed: steady-state seconds per round, the run's wall
time after its first block (which holds the compile), over the remaining rounds,
evaluations included.

    python experiments/precision.py            # 200 rounds (the default experiment)
    python experiments/precision.py --quick    # 20 rounds
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedjax_het import config, results, simulate

OUT = Path(__file__).parent / "results" / "precision.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="20 rounds, not written")
    args = parser.parse_args()
    rounds = 20 if args.quick else args.rounds
    rows = {}
    for precision in ("float32", "bfloat16"):
        e = config.build(config.load(None, [f"rounds={rounds}", f'engine.precision="{precision}"']))
        h = simulate.run(e.data, e.model, e.algorithm, e.sampler, **e.run_kwargs(), progress=False)
        s = h.summary
        steady = (s["wall_s"] - s["first_block_s_with_compile"]) / (rounds - e.config["eval_every"])
        rows[precision] = {
            "final_test_accuracy": s["final_test_accuracy"],
            "best_test_accuracy": s["best_test_accuracy"],
            "client_accuracy_p10": s["client_accuracy_p10"],
            "first_block_s_with_compile": s["first_block_s_with_compile"],
            "steady_s_per_round": steady,
        }
        print(precision, json.dumps(rows[precision]))
    report = {
        "rounds": rounds,
        "runs": rows,
        "speed_ratio_bfloat16_over_float32": rows["bfloat16"]["steady_s_per_round"]
        / rows["float32"]["steady_s_per_round"],
        "accuracy_gap_bfloat16_minus_float32": rows["bfloat16"]["final_test_accuracy"]
        - rows["float32"]["final_test_accuracy"],
        "environment": results.environment(),
    }
    print(json.dumps({k: v for k, v in report.items() if k != "environment"}))
    if not args.quick:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
