"""Cost of an asynchronous server event against a synchronous round of as many clients.

One event of FedBuff's server (``system.events``: K = 20
arrivals, each trained from the model version it downloaded, out of a ring
of ``max_staleness + 1 = 6`` models) against one synchronous round of 20
clients, same model, same data, same local work, in the same process. The
model is W1's MLP with 10 outputs (784-200-200-10, 199,210 params) over
a synthetic stand-in (N(0, 1) inputs, uniform labels, 64
examples per client, batch 16, one epoch) with 200 clients; the async server
runs 100 tasks at once on lognormal step times. Both run as the engine runs
them: blocks of ``--block`` rounds (events) as one ``lax.scan``
(``Setup.programs``), timed per block and divided by its length.

experiments/README.md: compile time apart (and the number of compilations of the
training program over a whole run of ``--events`` events in blocks, which
must be 1); a validation gate before any timing (an async event whose 20
slots are all fresh equals the synchronous round of the same slots bit for
bit); one warm-up block each, then ``--reps`` timed blocks interleaved over
the variants, every output blocked on; median and min-max; the 1-minute
load average; the environment read by the program. ``--quick`` is a smoke
run: its figures are not results.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Any

import common
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models, results, rng
from fedjax_het.algorithms import fedavg, fedbuff
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.sampling import uniform
from fedjax_het.system import events, setup
from fedjax_het.system.schedule import OK
from fedjax_het.training import simulate

K, CONCURRENCY, MAX_STALENESS, CLIENTS = 20, 100, 5, 200
DEFAULT_OUT = common.BENCH_RESULTS / "async-cpu.jsonl"


def workload() -> tuple[FederatedData, models.Model, LocalWork]:
    gen = np.random.default_rng(0)
    xs = [gen.normal(size=(64, 784)).astype(np.float32) for _ in range(CLIENTS)]
    ys = [gen.integers(0, 10, 64).astype(np.int32) for _ in range(CLIENTS)]
    data = FederatedData.from_client_arrays(
        xs, ys, num_classes=10, test_xs=[x[:8] for x in xs], test_ys=[y[:8] for y in ys]
    )
    return data, models.mlp((784,), 10, hidden=(200, 200)), LocalWork(batch_size=16, epochs=1)


def build(data, model, work, algorithm, *, chunk, ring_depth, rounds):
    return simulate.Setup.build(
        data,
        model,
        algorithm,
        uniform(CLIENTS, K),
        rounds=rounds,
        work=work,
        hyper=None,
        eval_every=rounds,
        chunk=chunk,
        unroll=1,
        weighting="examples",
        eval_batch_size=1024,
        slots=K,
        ring_depth=ring_depth,
        devices=1,
    )


def fresh_plan(async_plans: events.EventSchedule, e: int) -> events.EventSchedule:
    """Event ``e`` of ``async_plans`` with every slot fresh (version and task ``e``)."""
    row = jax.tree.map(lambda a: a[e : e + 1], async_plans)
    now = jnp.full_like(row.version, e)
    return row.replace(version=now, task=now)


def gate(sync_setup, async_setup, async_plans, key) -> None:
    """A fresh async event equals the synchronous round of the same slots, bit for bit."""
    plan = fresh_plan(async_plans, 0)
    sync_row = jax.tree.map(lambda a: a[0], plan)
    schedule_row = simulate.Schedule(
        selected=sync_row.selected,
        valid=sync_row.valid,
        outcome=sync_row.outcome,
        steps_done=sync_row.steps_done,
        version=sync_row.version,
        start=sync_row.start,
        duration=sync_row.duration,
        clock=sync_row.clock,
        finish=jnp.zeros(K),
        bytes_down=jnp.zeros(K),
        bytes_up=jnp.zeros(K),
    )
    ids = jnp.zeros((1,), jnp.int32)
    block_a, _ = async_setup.programs(key)
    block_s, _ = sync_setup.programs(key)
    state_a, _ = block_a(async_setup.init(key), ids, plan)
    state_s, _ = block_s(sync_setup.init(key), ids, jax.tree.map(lambda a: a[None], schedule_row))
    got = async_setup.round.algorithm.global_params(state_a.server_state)
    want = sync_setup.round.algorithm.global_params(state_s.server_state)
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    if not same:
        raise SystemExit("gate failed: a fresh async event differs from the synchronous round")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--block", type=int, default=10, help="rounds (events) per lax.scan block")
    parser.add_argument("--events", type=int, default=50, help="events of the compile-count run")
    parser.add_argument("--chunks", default="auto,20")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.quick:
        args.reps, args.block, args.events, args.chunks = 3, 2, 4, "auto"
    out = (
        Path(args.out)
        if args.out
        else DEFAULT_OUT.with_name(("quick-" if args.quick else "") + DEFAULT_OUT.name)
    )
    data, model, work = workload()
    key = rng.seed_key(0)
    profiles = setup.profiles_from_options(CLIENTS, devices="lognormal", step_time=0.5, seed=0)
    system = setup.System(profiles, setup.policy_from_options())
    server = events.async_server(
        concurrency=CONCURRENCY, buffer_size=K, max_staleness=MAX_STALENESS
    )
    rows = []
    for chunk_name in args.chunks.split(","):
        chunk = None if chunk_name == "auto" else int(chunk_name)
        rows += measure_chunk(chunk, data, model, work, system, server, args, key)
    common.write_rows(out, rows, results.environment())
    compiles = rows[-1]["training_compiles_over_run"]  # the last chunk's async row
    print(f"async step compiles over a run of {args.events} events: {compiles}; rows in {out}")


def measure_chunk(
    chunk: int | None, data, model, work, system, server, args, key
) -> list[dict[str, Any]]:
    """Gates and times a synchronous FedAvg and FedBuff round and an async FedBuff event at one
    chunk size (``None``: the engine's choice); one row each."""
    total = args.block * (args.reps + 2)
    rows = []
    variants = {
        "sync fedavg": build(data, model, work, fedavg(), chunk=chunk, ring_depth=0, rounds=total),
        "sync fedbuff": build(
            data, model, work, fedbuff(), chunk=chunk, ring_depth=0, rounds=total
        ),
        "async fedbuff": build(
            data,
            model,
            work,
            fedbuff(),
            chunk=chunk,
            ring_depth=server.ring_depth,
            rounds=total,
        ),
    }
    spec = variants["async fedbuff"].round.spec
    async_plans = simulate.plan_events(system, data, spec, server, events=total, key=key)
    sync_plans = simulate.plan_run(system, data, spec, uniform(CLIENTS, K), rounds=total, key=key)
    assert bool(jnp.all(sync_plans.outcome == OK)) and bool(jnp.all(async_plans.valid))
    gate(variants["sync fedbuff"], variants["async fedbuff"], async_plans, key)
    plans = {name: async_plans if name.startswith("async") else sync_plans for name in variants}
    runs = {}
    for name, s in variants.items():
        block, _ = s.programs(key)
        state = s.init(key)
        ids = jnp.arange(args.block, dtype=jnp.int32)
        t0 = time.perf_counter()
        state = jax.block_until_ready(
            block(state, ids, jax.tree.map(lambda a: a[: args.block], plans[name]))[0]
        )
        runs[name] = {
            "block": block,
            "state": state,
            "compile_s": time.perf_counter() - t0,
            "first": 0,
        }
    timing = common.interleaved(
        {
            name: functools.partial(next_block, run, plans[name], args.block)
            for name, run in runs.items()
        },
        reps=args.reps,
    )
    for name, run in runs.items():
        run["times"] = [seconds / args.block for seconds in timing[name]["seconds"]]
        run["load"] = timing[name]["load"]
    compiles = compile_count(variants["async fedbuff"], async_plans, args, key)
    sync_median = statistics.median(runs["sync fedavg"]["times"])
    for name, run in runs.items():
        median = statistics.median(run["times"])
        row = {
            "variant": name,
            "chunk": variants[name].round.chunk,
            "cohort": K,
            **common.seconds_summary(run["times"]),
            "ratio_to_sync_fedavg": median / sync_median,
            "compile_s": run["compile_s"],
            "load_1min": statistics.median(run["load"]),
            "reps": args.reps,
            "block": args.block,
            **(
                {"training_compiles_over_run": compiles, "events_in_run": args.events}
                if name.startswith("async")
                else {}
            ),
        }
        rows.append(row)
        print(
            f"chunk {row['chunk']:>3} {name:14} {1e3 * median:8.2f} ms "
            f"[{1e3 * row['min_s']:.2f}, {1e3 * row['max_s']:.2f}]  "
            f"{row['ratio_to_sync_fedavg']:.3f}x sync fedavg"
        )
    return rows


def next_block(run: dict, plans, size: int):
    """Runs the block of ``size`` rounds (events) after ``run``'s last one on its state."""
    run["first"] += size
    first = run["first"]
    ids = jnp.arange(first, first + size, dtype=jnp.int32)
    run["state"] = run["block"](
        run["state"], ids, jax.tree.map(lambda a: a[first : first + size], plans)
    )[0]
    return run["state"]


def compile_count(async_setup, async_plans, args, key) -> int:
    """Compilations of the training program over a run of ``--events`` events in blocks."""
    s = build(
        *workload(),
        fedbuff(),
        chunk=async_setup.round.chunk,
        ring_depth=async_setup.round.ring_depth,
        rounds=args.events,
    )
    block, _ = s.programs(key)
    state = s.init(key)
    for first in range(0, args.events, args.block):
        size = min(args.block, args.events - first)
        ids = jnp.arange(first, first + size, dtype=jnp.int32)
        state = block(
            state, ids, jax.tree.map(lambda a, f=first, n=size: a[f : f + n], async_plans)
        )[0]
    jax.block_until_ready(state)
    ((jitted_block, _),) = s._jitted.values()  # the one mode this setup compiled
    return jitted_block._cache_size()


if __name__ == "__main__":
    main()
