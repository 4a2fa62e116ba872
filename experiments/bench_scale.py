"""Scale test: a 100,000-client population (1,000,000 on an accelerator), 10,000 a round.

Data: LEAF's Synthetic(1, 1) (FedProx §5.1: 60 features, 10 classes) generated
for every client of the population, client sizes ``10 + lognormal(3, 0.5)``
(median 30 examples, 80 % of each for training: median 24, largest about 180
at 100,000 clients). ``--generator flat`` (the default) draws it under ``jit``
straight into the flat store (``fedjax_het.data.synthetic_flat``: per-client
keys, the same distribution, other draws; for accelerators: on the project's
loaded 2-core CPU 100,000 clients took 51 s, 1,000,000 took 345 s);
``--generator loop`` is ``fedjax_het.data.synthetic.leaf_synthetic``'s numpy
loop (22 s per 100,000 clients in the same hour), then
``ClientArrays.from_clients``. Rows record the generator and ``data_s``.
Model: W1's MLP on these features, 60-200-200-10 (54,410 params). Local work:
one epoch of batch 16, at most 4 steps (``LocalWork(max_steps=4)``: the about
0.6 % of clients with more than 64 training examples stop at 4), so the
cohort's batches are ragged and the example and step masks do real work.
FedAvg with its default learning rates.

Measured with ``bench_harness`` (same process, same cohort and batches, gate
against the loop of the same system): the engine's homogeneous round, the
engine's round on a ``flash-deadline`` schedule row (FLASH devices, deadline
with partial work, 10 % dropouts) and the per-client loop of each, timed on
``--loop-clients`` of the cohort and scaled linearly (its gate round, the full
cohort, is ``first_round_s``). No bare ``vmap``: the clients differ in size.
Memory: the peak resident set size of the process (``ru_maxrss``) after the
data is generated, after the setup (the flat store on the device) and after
the timing; on CPU device arrays live in the same memory.

``--stateful`` adds FedPer's round (a personal head per client) built as
``fedjax-het run`` builds it, its client states placed by run's plan; the row's
``client_state`` records the placement and bytes (``stateful_variant``).

``--per-round 100000`` on an accelerator runs the other half of item 4 (the
population grows to at least the cohort). ``--quick``: 1,000 clients, 100 a
round, 3 timed rounds, a smoke run whose figures are not results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import time
from typing import Any

import bench_harness as harness
import common
import jax

from fedjax_het import models, results
from fedjax_het.algorithms.personal_layers import fedper
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.data.synthetic_flat import leaf_synthetic_flat
from fedjax_het.engine.cohort import auto_chunk
from fedjax_het.system.schedule import Schedule

DATA = {
    "name": "LEAF Synthetic(1, 1)",
    "alpha": 1.0,
    "beta": 1.0,
    "num_features": 60,
    "num_classes": 10,
    "size_mean": 3.0,
    "size_sigma": 0.5,
    "min_size": 10,
}
BATCH_SIZE, MAX_STEPS = 16, 4
GENERATORS = ("flat", "loop")


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far, in GB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def population(num_clients: int, generator: str = "flat", split: str = "train") -> ClientArrays:
    """One split of every client, flat, from ``generator`` (module docstring)."""
    options = {k: v for k, v in DATA.items() if k != "name"}
    if generator == "flat":
        return leaf_synthetic_flat(num_clients, seed=harness.SEED, split=split, **options)
    clients = leaf_synthetic(num_clients, seed=harness.SEED, **options)
    if split == "train":
        return ClientArrays.from_clients(clients.train_x, clients.train_y)
    return ClientArrays.from_clients(clients.test_x, clients.test_y)


def stateful_variant(
    data: FederatedData, setup: harness.Setup, system: str, plan: Schedule | None, rounds: int
) -> harness.Variant:
    """FedPer (the model's last layer personal, a 2,010-float head per client) as ``fedjax-het
    run`` builds it (``harness.run_setup``): its client state is placed by run's plan
    (``client_store.plan_client_state``: "device" when every client's head fits in half the
    device's free memory, else "host", the rows ``rounds`` rounds can write); the row records
    the plan as ``client_state``."""
    settings = {"system": system, "algorithm": "fedper", "gate_group": "fedper"}

    def build() -> harness.Implementation:
        system_ = None if system == "none" else harness.flash_deadline_system(setup)
        round_ = setup.round_
        made = harness.run_setup(
            data,
            round_.model,
            fedper(),
            round_.sampler,
            rounds=rounds,
            work=round_.spec.work,
            system=system_,
            devices=1,
        )
        impl = harness.engine(setup, round_.chunk, 1, plan=plan, planned=lambda: made)
        state = made.state_plan
        impl.settings["client_state"] = {
            "placement": state.placement,
            "row_bytes": state.row_bytes,
            "device_bytes": state.device_bytes,
            "host_bytes": state.host_bytes,
            "max_rows": state.max_rows,
        }
        print(f"  fedper client state: {json.dumps(impl.settings['client_state'])}", flush=True)
        return impl

    return harness.Variant("engine", settings, build)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100_000, help="population size")
    parser.add_argument("--per-round", type=int, default=10_000, help="clients a round")
    parser.add_argument(
        "--systems",
        default=",".join(harness.SYSTEMS),
        help=f"comma list of {', '.join(harness.SYSTEMS)}",
    )
    parser.add_argument(
        "--baselines", default="loop", choices=("loop", "none"), help="per-client loop or none"
    )
    parser.add_argument(
        "--loop-clients", type=int, default=1000, help="time loops on this many clients, scaled"
    )
    parser.add_argument(
        "--generator", default="flat", choices=GENERATORS, help="data generator (docstring)"
    )
    parser.add_argument(
        "--stateful",
        action="store_true",
        help="also time FedPer, its per-client heads placed by run's plan (stateful_variant)",
    )
    parser.add_argument("--chunk", default="auto", help="engine chunk ('auto': auto_chunk)")
    parser.add_argument("--reps", type=int, help="timed rounds (default 10)")
    parser.add_argument(
        "--max-timing-s",
        type=float,
        default=120.0,
        help=f"stop timing (after {harness.MIN_REPS} rounds) past this many seconds",
    )
    parser.add_argument("--out", help="JSONL path (default: experiments/bench_results/...)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1,000 clients, 100 a round"
    )
    args = parser.parse_args(argv)

    clients, per_round = (1000, 100) if args.quick else (args.clients, args.per_round)
    clients = max(clients, per_round)
    reps = args.reps or (3 if args.quick else 10)
    systems = args.systems.split(",")
    if set(systems) - set(harness.SYSTEMS):
        raise ValueError(f"--systems takes {', '.join(harness.SYSTEMS)}, got {args.systems!r}")
    if per_round < 1 or reps < 1 or args.loop_clients < 1:
        raise ValueError(
            f"--per-round, --reps and --loop-clients must be >= 1, got "
            f"{per_round}, {reps}, {args.loop_clients}"
        )
    chunk = auto_chunk(per_round) if args.chunk == "auto" else int(args.chunk)
    if chunk < 1:
        raise ValueError(f"--chunk must be 'auto' or >= 1, got {args.chunk!r}")

    backend = jax.default_backend()
    stamp = datetime.datetime.now(datetime.UTC)
    out = common.results_path(args.out, f"scale-{backend}-{clients}x{per_round}", quick=args.quick)
    env = results.environment()
    print(f"{env['device']}  jax {env['versions']['jax']}  {clients} clients, {per_round} a round")

    start = time.perf_counter()
    train = population(clients, args.generator)
    memory = {"after_data_gb": peak_rss_gb()}
    data_s = time.perf_counter() - start
    print(f"data: {train.x.shape[0]} training rows in {data_s:.1f} s", flush=True)
    model = models.mlp((DATA["num_features"],), DATA["num_classes"], hidden=(200, 200))
    work = LocalWork(BATCH_SIZE, epochs=1.0, max_steps=MAX_STEPS)
    setup = harness.make_setup(model, train, work, per_round)
    memory["after_setup_gb"] = peak_rss_gb()
    counts, data = train.count, None
    if args.stateful:
        test = population(clients, args.generator, split="test")
        data = FederatedData(train, test, DATA["num_classes"], DATA["name"])
    del train

    variants, summary = [], None
    for system in systems:
        plan = None
        if system != "none":
            plan, summary = harness.flash_deadline_plan(setup)
            print(f"flash-deadline: {json.dumps(summary)}", flush=True)
        settings = {"system": system, "algorithm": "fedavg"}
        if args.baselines == "loop":
            variants.append(
                harness.Variant(
                    "loop",
                    settings,
                    lambda p=plan: harness.per_client_loop(setup, p, args.loop_clients),
                )
            )
        variants.append(
            harness.Variant(
                "engine",
                {**settings, "chunk": chunk, "unroll": 1},
                lambda p=plan: harness.engine(setup, chunk, 1, plan=p),
            )
        )
        if data is not None:
            variants.append(stateful_variant(data, setup, system, plan, reps + 1))
    rows = harness.measure(setup.params, variants, warmup=0, reps=reps, max_s=args.max_timing_s)
    memory["after_timing_gb"] = peak_rss_gb()
    print(f"peak RSS (GB): {json.dumps(memory)}")

    shared: dict[str, Any] = {
        "benchmark": "scale",
        "population": clients,
        "cohort": per_round,
        "data": DATA,
        "train_examples": int(counts.sum()),
        "train_count_median": float(sorted(counts)[len(counts) // 2]),
        "train_count_max": int(counts.max()),
        "generator": args.generator,
        "data_s": data_s,
        "model": f"{model.name} 60-200-200-10",
        "params": sum(leaf.size for leaf in jax.tree.leaves(setup.params)),
        "batch_size": BATCH_SIZE,
        "epochs": 1.0,
        "local_steps": MAX_STEPS,
        "loop_clients": args.loop_clients,
        "reps_requested": reps,
        "quick": args.quick,
        "peak_rss_gb": memory,
        "timestamp": stamp.isoformat(timespec="seconds"),
    }
    for row in rows:
        if row.get("system", "none") != "none":
            row["system_summary"] = summary
    common.write_rows(out, [{**shared, **row} for row in rows], env)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
