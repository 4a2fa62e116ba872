"""The headline run: FedJAX's published EMNIST setting end to end, on FEMNIST-shaped data.

FedJAX (Ro et al. 2021, "FedJAX: Federated learning simulation with JAX", §4) times FedAvg
on EMNIST-62 with the LEAF CNN: 50 clients a round, one epoch of batch 20 each, 1,500
rounds ("a few minutes" on TPUs). Its learning rates are those of Reddi et al. 2021
("Adaptive Federated Optimization", Table 9/10: FedAvg on EMNIST CNN, client SGD at
10^-1.5, server SGD at 10^0). Here the same run on ``data.name = "femnist_like"`` (3,400
writers of 28x28x1 images in 62 classes, generated from the seed:
``fedjax_het.data.femnist_like``), or on the real FEMNIST in LEAF's format (``--leaf PATH``).

Wall time is measured end to end: data generation (or loading), the config's build, every
round's compile and training, and every evaluation on the test split (``--eval-every``), as
``time.perf_counter`` around each stage. One JSON line per run to ``--out`` (default
``experiments/bench_results/headline_emnist-<backend>.jsonl``): the stages' seconds, the
final and best test accuracy, the rounds, the plan (chunk, convolutions) and the environment.
The target (issue "Accelerator throughput II", item 8): 1,500 rounds in <= 60 s on one H200.

    python experiments/headline_emnist.py                 # 1,500 rounds (an accelerator)
    python experiments/headline_emnist.py --rounds 20     # shortened, for a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax

from fedjax_het import results
from fedjax_het.front import config
from fedjax_het.training import simulate

CLIENT_LR = 10**-1.5  # Reddi et al. 2021, FedAvg on EMNIST CNN
SETTING = [
    'model.name = "femnist_cnn"', 'algorithm.name = "fedavg"', f"algorithm.client_lr = {CLIENT_LR}",
    "algorithm.server_lr = 1.0", "sampler.clients_per_round = 50", "local.batch_size = 20",
    "local.epochs = 1.0",
]  # fmt: skip


def overrides(args: argparse.Namespace) -> list[str]:
    """The config of the run: FedJAX's EMNIST setting on the chosen data."""
    if args.leaf:
        data = ['data.name = "leaf"', f'data.path = "{args.leaf}"', 'data.dataset = "femnist"']
    else:
        data = ['data.name = "femnist_like"', f"data.num_clients = {args.clients}"]
    every = args.eval_every or args.rounds
    return [*data, *SETTING, f"rounds = {args.rounds}", f"eval_every = {every}",
            f"seed = {args.seed}", f'engine.conv = "{args.conv}"', *args.set]  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    """Builds the config (data included) and runs it; the stages' seconds and the results."""
    start = time.perf_counter()
    experiment = config.build(config.load(None, overrides(args)))
    built = time.perf_counter()
    history = simulate.run(
        experiment.data,
        *experiment.options(progress=not args.no_progress, targets=(),
        ),
    )  # fmt: skip
    end = time.perf_counter()
    summary = history.summary
    return {
        "setting": "fedjax_emnist", "data": experiment.data.name,
        "clients": experiment.data.num_clients,
        "train_examples": int(experiment.data.train.count.sum()),
        "rounds": summary["rounds"], "wall_s": end - start, "data_and_build_s": built - start,
        "run_s": end - built, "final_test_accuracy": summary["final_test_accuracy"],
        "best_test_accuracy": summary["best_test_accuracy"], "chunk": summary["chunk"],
        "chunk_plan": summary["chunk_plan"], "conv": summary.get("conv"),
        "timing": {k: summary[k] for k in summary if k.endswith("_s")},
        "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
        "load_avg": os.getloadavg(), "environment": results.environment(),
        "overrides": overrides(args),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1500, help="rounds (1,500: FedJAX's)")
    parser.add_argument("--clients", type=int, default=3400, help="generated writers")
    parser.add_argument("--eval-every", type=int, default=0, help="0: only after the last round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--conv", default="auto", help="engine.conv: auto, xla or patches")
    parser.add_argument("--leaf", help="a LEAF-format FEMNIST directory (the real data)")
    parser.add_argument("--set", action="append", default=[], help="more config overrides")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--out", help="JSONL path (default: bench_results/headline_emnist-*)")
    args = parser.parse_args(argv)
    row = run(args)
    out = Path(args.out or Path(__file__).parent / "bench_results" /
               f"headline_emnist-{row['backend']}.jsonl")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    print(f"{row['rounds']} rounds in {row['wall_s']:.1f} s end to end "
          f"({row['data_and_build_s']:.1f} s data and build), final test accuracy "
          f"{row['final_test_accuracy']:.4f}; {row['chunk_plan']} -> {out}")  # fmt: skip


if __name__ == "__main__":
    main()
