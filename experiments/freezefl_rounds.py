"""FreezeFL against FedAvg: round length, accuracy and upload under device heterogeneity.

FreezeFL's claim (Chou et al.; notes Appendix B.2, Table III): freezing alone shortens the
average round by about 30 % against FedAvg (E = 3, synchronous rounds that wait for the slowest
client) without hurting accuracy. This script measures the same comparison on the default
experiment's data and model (Fashion-MNIST subset, 100 clients, Dirichlet 0.5,
784-200-200-10 MLP, 10 clients a round), with ``E = 3`` local epochs of batch 20:

* devices: log-normal step times (median ``--step-time``, log-std 0.8: the 10th to 90th
  percentile ratio is 7.8, near FreezeFL's "up to a 6x gap"); network: the FLASH profiles;
  always available; a wait-for-all round with ``--overhead`` seconds of server time;
* algorithms: FedAvg, and FreezeFL at ``beta`` in ``--betas`` (4 is the paper's FEMNIST value),
  both with the same system, seeds and rounds.

Per (algorithm, seed): final and best test accuracy, mean round length (virtual seconds),
virtual hours to ``--target``, total upload bytes, and the share of updates sent at each freeze
depth (read from the bytes each client uploaded).

Usage::

    python experiments/freezefl_rounds.py --rounds 100 --seeds 2
    python experiments/freezefl_rounds.py --report
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import common
import jax
import numpy as np

from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms.freezefl import depth_masks, freezefl
from fedjax_het.data.batching import LocalWork
from fedjax_het.front import config as config_lib
from fedjax_het.system import setup
from fedjax_het.system.schedule import OK
from fedjax_het.training import simulate
from fedjax_het.training.freeze_pricing import upload_bytes
from fedjax_het.training.options import run_options

OUT = common.RESULTS / "freezefl_rounds"
EPOCHS = 3


def run_one(exp, algorithm, system, seed: int, args) -> dict[str, Any]:
    kwargs = {
        k: v
        for k, v in exp.run_kwargs().items()
        if k not in ("system", "seed", "work", "eval_every")
    }
    history = simulate.run(
        exp.data,
        *run_options(
            model=exp.model,
            algorithm=algorithm,
            sampler=exp.sampler,
            system=system,
            seed=seed,
            work=LocalWork(batch_size=exp.work.batch_size, epochs=EPOCHS),
            progress=True,
            targets=(args.target,),
            eval_every=args.eval_every,
            **kwargs,
        ),
    )
    s = jax.device_get(history.schedule)
    ok = np.asarray(s.outcome) == OK
    depth_bytes = np.asarray(
        upload_bytes(history.params, depth_masks(history.params))
    )  # bytes sent at each depth
    sent = np.asarray(s.bytes_up)[ok]
    share = [float(np.mean(np.isclose(sent, b))) for b in depth_bytes]
    hit = history.summary["to_accuracy"].get(f"{args.target:g}")
    return {
        "algorithm": algorithm.name,
        "hyper": {k: float(v) for k, v in algorithm.hyper(kwargs["hyper"]).items()},
        "seed": seed,
        "final_accuracy": history.summary["final_test_accuracy"],
        "best_accuracy": history.summary["best_test_accuracy"],
        "mean_round_s": float(np.mean(s.duration)),
        "rounds_to_target": None if hit is None else hit["round"],
        "hours_to_target": None if hit is None else hit["virtual_s"] / 3600,
        "bytes_up": history.summary["bytes_up"],
        "depth_share": share,
        "wall_s": history.summary["wall_s"],
    }


def main(args) -> None:
    out = common.out_dir(args.out)
    exp = config_lib.build(config_lib.load(None, [f"rounds={args.rounds}"]))
    profiles = setup.profiles_from_options(
        exp.data.num_clients,
        devices="lognormal",
        step_time=args.step_time,
        step_time_sigma=0.8,
        network="flash",
    )
    system = setup.System(
        profiles, setup.policy_from_options(kind="wait_all", overhead=args.overhead)
    )
    algorithms = [fedavg()] + [freezefl(beta=b, epochs=EPOCHS) for b in args.betas]
    rows = []
    for seed in range(args.seeds):
        for algorithm in algorithms:
            rows.append(run_one(exp, algorithm, system, seed, args))
            common.write_json(out / "results.json", common.record(args, runs=rows))
    report(out)


def report(out: Path) -> None:
    """Prints the per-run table and the means per algorithm."""
    record = json.loads((out / "results.json").read_text())
    print(
        "| algorithm | beta | seed | final acc | best acc | mean round s | rounds to target "
        "| h to target | MB up | updates at depth 0/1/2 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in record["runs"]:
        beta = r["hyper"].get("beta", "-")
        hours = "-" if r["hours_to_target"] is None else f"{r['hours_to_target']:.2f}"
        shares = "/".join(f"{x:.2f}" for x in r["depth_share"])
        print(
            f"| {r['algorithm']} | {beta} | {r['seed']} | {r['final_accuracy']:.3f} "
            f"| {r['best_accuracy']:.3f} | {r['mean_round_s']:.1f} "
            f"| {r.get('rounds_to_target') or '-'} | {hours} "
            f"| {r['bytes_up'] / 1e6:.0f} | {shares} |"
        )
    base = [r["mean_round_s"] for r in record["runs"] if r["algorithm"] == "fedavg"]
    for beta in sorted({r["hyper"].get("beta") for r in record["runs"]} - {None}):
        mine = [r["mean_round_s"] for r in record["runs"] if r["hyper"].get("beta") == beta]
        print(
            f"\nFreezeFL beta={beta:g}: mean round {np.mean(mine):.1f} s vs FedAvg "
            f"{np.mean(base):.1f} s ({np.mean(mine) / np.mean(base) - 1:+.0%})"
        )


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument(
        "--betas", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 4.0]
    )
    parser.add_argument("--step-time", type=float, default=0.3, help="median device, s/step")
    parser.add_argument("--overhead", type=float, default=5.0)
    parser.add_argument("--target", type=float, default=0.75)
    parser.add_argument("--eval-every", type=int, default=5)
    common.add_output_flags(parser, OUT)
    return parser.parse_args(argv)


if __name__ == "__main__":
    common.main_or_report(parse, main, report)
