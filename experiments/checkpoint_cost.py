"""How long a checkpoint takes and how big it is.

Two runs, each built from its config as ``fedjax-het run`` builds it, with a
run state as training leaves it (``Setup.init``: the sizes and dtypes are the
trained run's, the values do not change the cost of an uncompressed file):

* ``default``: the default experiment (FedAvg, MLP 784-200-200-10 on
  Fashion-MNIST, 100 clients): the server's params, no client state;
* ``scaffold_10k``: SCAFFOLD over 10,000 clients with every client's control
  variate on the device (``client_state = "device"``), IID shards, a logistic-regression
  model on Fashion-MNIST (the MLP's 10,000 control variates would be 8 GB, more
  than this 24 GiB CI-sized machine holds twice).

For each: ``save`` (gather to host + write + fsync + rename, the checkpointer
the run loop calls) and ``load`` (read + place on the device), ``--reps``
times in one process after one warm-up; median and min-max seconds, file
bytes. Writes ``experiments/results/checkpoint_cost.jsonl`` with the
environment (``results.environment()``).

    .venv/bin/python experiments/checkpoint_cost.py [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import common
import jax
import numpy as np
import provenance

from fedjax_het import rng
from fedjax_het.engine.client_store import format_bytes
from fedjax_het.front import config
from fedjax_het.training import checkpoint, simulate

CASES = {
    "default": [],
    "scaffold_10k": [
        'algorithm.name="scaffold"',
        "data.num_clients=10000",
        'partition.kind="iid"',
        "model.name=logistic_regression",
        'engine.client_state="device"',
    ],
}


def measure(overrides: list[str], reps: int) -> dict:
    exp = config.build(config.load(None, overrides))
    kwargs = exp.run_kwargs()
    setup = simulate.Setup.build(
        exp.data,
        exp.model,
        exp.algorithm,
        exp.sampler,
        rounds=kwargs["rounds"],
        work=exp.work,
        hyper=exp.hyper,
        eval_every=kwargs["eval_every"],
        chunk=kwargs["chunk"],
        unroll=1,
        weighting="examples",
        eval_batch_size=1024,
        client_state=kwargs["client_state"],
    )
    state = jax.block_until_ready(setup.init(rng.seed_key(0)))
    recorder = simulate.Recorder(time.perf_counter(), None)
    saves, loads = [], []
    with tempfile.TemporaryDirectory() as out:
        save = simulate.checkpointer(out, exp.config, [recorder], setup.round.store, dict)
        for rep in range(reps + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            save(0, state)
            t1 = time.perf_counter()
            restored = jax.block_until_ready(checkpoint.load(out).tree("state", state))
            t2 = time.perf_counter()
            if rep:
                saves.append(t1 - t0)
                loads.append(t2 - t1)
        size = (Path(out) / checkpoint.FILE).stat().st_size
    jax.tree.map(np.testing.assert_array_equal, restored, state)  # the round trip is exact
    return {
        "clients": exp.data.num_clients,
        "client_state_bytes": setup.state_plan.held_bytes(setup.round.store),
        "bytes": size,
        "size": format_bytes(size),
        "save_s_median": statistics.median(saves),
        "save_s_range": [min(saves), max(saves)],
        "load_s_median": statistics.median(loads),
        "load_s_range": [min(loads), max(loads)],
        "reps": reps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 reps")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "checkpoint_cost.jsonl")
    provenance.add_flag(parser)
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    path = args.out
    provenance.guard(path, args.allow_dirty)
    environment = common.environment(args)
    rows = []
    for name, overrides in CASES.items():
        rows.append({"case": name, **measure(overrides, reps)})
        print(json.dumps(rows[-1]))
    common.write_rows(path, rows, environment, key="environment", mode="w")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
