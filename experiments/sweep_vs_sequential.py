"""A 16-cell grid as one ``vmap``-ed sweep against the same 16 runs one after another.

``fedjax-het sweep`` compiles a grid of traced settings once
and trains its cells together. This measures what that buys on this machine,
in one process, for 4 client learning rates x 4 seeds of a small W1-like run
(``experiments/README.md``: MLP 784-200-200-10 on the shipped Fashion-MNIST
subset, IID over 200 clients of 66 examples, 10 clients a round, batch 16, one
local epoch: 5 steps; FedAvg).

The cells come from ``fedjax_het.front.grid.plan`` (validated, one program). The
sweep runs in its two modes (``sweep.sweep``'s ``cell_batch``): ``map``, one
cell at a time inside the program (``lax.map``, the CPU default), and
``vmap``, all 16 cells as one ``vmap`` (the accelerator default). Three
figures, each sweep against sequential:

* end to end, as a user pays it: ``sweep.sweep`` over the 16 cells, against 16
  ``simulate.run`` calls one after another (each compiles its own program);
  wall time including compilation, data on the device, evaluation;
* compilation: the first block of rounds (compile + one execution) of the
  sweep's program and of the runs' (summed);
* steady state: one block of ``eval_every`` rounds of the compiled programs,
  ``block_until_ready`` on the output, after a warm-up, ``--reps`` repetitions
  (median, min-max): the sweep's block over 16 cells, against the single-run
  block called for the 16 cells in turn (one compilation, reused).

Validation gate (experiments/README.md), before any time counts: the ``map`` sweep's
cells equal their runs bitwise after every round (it runs each cell's unbatched
program), and one block of either sweep program, from the same state, matches
the single-run block of every cell within ``GATE_RTOL`` (max |difference| of
the params over max |param|). Whole runs of the ``vmap`` sweep are not gated,
only recorded (``whole_run_drift``): batched matrix products round differently
from single ones, and over 20 rounds at a learning rate of 0.3 a ReLU that
flips on a rounding difference lets a cell drift by percents of its params
(0.06 relative, 0.0014 final accuracy, in the first run), the same drift
any change of summation order (another device count, another XLA) gives.

Usage::

    .venv/bin/python experiments/sweep_vs_sequential.py          # appends to bench_results
    .venv/bin/python experiments/sweep_vs_sequential.py --rounds 4 --reps 2 --out /tmp/x.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import common
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import results, rng
from fedjax_het.front import grid
from fedjax_het.front.sweep import Cell, sweep
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

OUT = common.BENCH_RESULTS / "sweep-vs-sequential-cpu.jsonl"
GATE_RTOL = 1e-4
CONFIG = [
    'data.name="fashion_mnist"',
    "data.num_clients=200",
    'partition.kind="iid"',
    'model.name="mlp"',
    "model.hidden=[200, 200]",
    "sampler.clients_per_round=10",
    "local.batch_size=16",
    "local.epochs=1.0",
    "engine.devices=1",
]
AXES = ("algorithm.client_lr=0.01,0.03,0.1,0.3", "seed=0..3")
MODES = {"map": 1, "vmap": 16}  # sweep.sweep's cell_batch: one cell at a time, or all 16


def gate_error(got, want) -> float:
    """max |got - want| / max |want| over every leaf of the final params."""
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))
    )
    scale = max(float(np.max(np.abs(np.asarray(b)))) for b in jax.tree.leaves(want))
    return diff / scale


def timed(fn, *, reps: int) -> dict[str, Any]:
    """Median and min-max seconds of ``fn()`` after one warm-up."""
    times = common.interleaved({"fn": fn}, reps=reps, warmup=1)["fn"]["seconds"]
    return {**common.seconds_summary(times), "times_s": times, "reps": reps}


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Measures, prints and appends the record (the environment added under ``env``)."""
    env = results.environment()
    overrides = [*CONFIG, f"rounds={args.rounds}", f"eval_every={args.eval_every}"]
    plan = grid.plan(None, overrides, [grid.parse_axis(a) for a in AXES], one_program=True)
    exp = plan.programs[0].experiment
    kwargs = exp.run_kwargs()
    for key in ("seed", "hyper", "system", "select"):
        kwargs.pop(key)
    cells = [Cell(c.seed, c.hyper) for c in plan.cells]
    print(
        f"{len(cells)} cells, {len(plan.programs)} program; {exp.data.num_clients} clients, "
        f"max {int(exp.data.train.count.max())} examples"
    )

    # End to end: the sweep in each mode, then the runs one after another.
    swept, sweep_s = {}, {}
    for mode, batch in MODES.items():
        t0 = time.perf_counter()
        swept[mode] = sweep(
            exp.data,
            exp.model,
            exp.algorithm,
            exp.sampler,
            cells=cells,
            cell_batch=batch,
            progress=False,
            **kwargs,
        )
        sweep_s[mode] = time.perf_counter() - t0
    sequential, run_s = [], []
    for cell in cells:
        t0 = time.perf_counter()
        sequential.append(
            simulate.run(
                exp.data,
                *run_options(
                    model=exp.model,
                    algorithm=exp.algorithm,
                    sampler=exp.sampler,
                    seed=cell.seed,
                    hyper=cell.hyper,
                    progress=False,
                    **kwargs,
                ),
            )
        )
        run_s.append(time.perf_counter() - t0)
    drift = {}
    for mode, histories in swept.items():
        drift[mode] = {
            "max_rel_error": max(
                gate_error(a.params, b.params) for a, b in zip(histories, sequential)
            ),
            "max_final_accuracy_gap": max(
                abs(a.summary["final_test_accuracy"] - b.summary["final_test_accuracy"])
                for a, b in zip(histories, sequential)
            ),
        }
        print(
            f"whole runs ({mode}): max relative param difference "
            f"{drift[mode]['max_rel_error']:.2e}, final accuracy gap "
            f"{drift[mode]['max_final_accuracy_gap']:.2e}"
        )

    # Steady state: one block of eval_every rounds of each compiled program.
    def build(runs: int) -> simulate.Setup:
        return simulate.Setup.build(
            exp.data,
            exp.model,
            exp.algorithm,
            exp.sampler,
            rounds=args.rounds,
            work=exp.work,
            hyper=None,
            eval_every=args.eval_every,
            chunk=kwargs["chunk"],
            unroll=kwargs["unroll"],
            weighting=kwargs["weighting"],
            eval_batch_size=kwargs["eval_batch_size"],
            client_state="device",
            runs=runs,
            precision=kwargs["precision"],
            devices=1,
        )

    ids = jnp.arange(args.eval_every, dtype=jnp.int32)
    keys = jnp.stack([rng.seed_key(c.seed) for c in cells])
    hypers = [exp.algorithm.hyper(c.hyper) for c in cells]
    stacked = jax.tree.map(lambda *h: jnp.stack(h), *hypers)
    many = build(len(cells))
    state = many.init(keys, cells=True, hyper=stacked)
    one = build(1)
    runs = []
    for cell, hyper in zip(cells, hypers):
        key = rng.seed_key(cell.seed)
        runs.append((one.programs(key, hyper=hyper, donate=False)[0], one.init(key, hyper=hyper)))
    reference = [b(s, ids, None)[0].server_state for b, s in runs]
    blocks, gate = (
        {},
        {"rtol": GATE_RTOL, "whole_runs_map_bitwise": drift["map"]["max_rel_error"] == 0},
    )
    for mode, batch in MODES.items():
        blocks[mode], _ = many.programs(
            keys,
            cells=True,
            hyper=stacked,
            donate=False,
            cell_batch=None if batch == len(cells) else batch,
        )
        out = blocks[mode](state, ids, None)[0].server_state
        gate[f"block_{mode}_max_rel_error"] = max(
            gate_error(jax.tree.map(lambda a, i=i: a[i], out), ref)
            for i, ref in enumerate(reference)
        )
    gate["passed"] = gate["whole_runs_map_bitwise"] and all(
        gate[f"block_{mode}_max_rel_error"] <= GATE_RTOL for mode in MODES
    )
    print(f"gate: {gate}")
    if not gate["passed"]:
        raise SystemExit("validation gate failed: the sweep's cells differ from their runs")
    steady = {
        f"sweep_{mode}": timed(
            lambda block=block: jax.block_until_ready(block(state, ids, None)), reps=args.reps
        )
        for mode, block in blocks.items()
    }
    steady["sequential"] = timed(
        lambda: [jax.block_until_ready(b(s, ids, None)) for b, s in runs], reps=args.reps
    )

    first_runs = [h.summary["first_block_s_with_compile"] for h in sequential]
    first = {f"sweep_{m}_s": swept[m][0].summary["first_block_s_with_compile"] for m in MODES}
    record = {
        "benchmark": "sweep_vs_sequential",
        "cells": len(cells),
        "axes": list(AXES),
        "config": overrides,
        "rounds": args.rounds,
        "eval_every": args.eval_every,
        "gate": gate,
        "whole_run_drift": drift,
        "end_to_end": {
            **{f"sweep_{m}_s": sweep_s[m] for m in MODES},
            "sequential_s": sum(run_s),
            "sequential_runs_s": run_s,
            **{f"ratio_sequential_over_sweep_{m}": sum(run_s) / sweep_s[m] for m in MODES},
        },
        "first_block_with_compile": {
            **first,
            "sequential_total_s": sum(first_runs),
            "one_run_median_s": statistics.median(first_runs),
        },
        "steady_block": {
            "rounds_per_block": args.eval_every,
            **steady,
            **{
                f"ratio_sequential_over_sweep_{m}": steady["sequential"]["median_s"]
                / steady[f"sweep_{m}"]["median_s"]
                for m in MODES
            },
        },
    }
    e2e = record["end_to_end"]
    print(
        f"end to end: sequential {sum(run_s):.1f} s; "
        + ", ".join(
            f"sweep ({m}) {sweep_s[m]:.1f} s (x{e2e[f'ratio_sequential_over_sweep_{m}']:.2f})"
            for m in MODES
        )
    )
    print(
        f"first block with compile: 16 runs {sum(first_runs):.1f} s; "
        + ", ".join(f"sweep ({m}) {first[f'sweep_{m}_s']:.1f} s" for m in MODES)
    )
    print(
        f"steady block of {args.eval_every} rounds (median, min-max): "
        + "; ".join(
            f"{name} {t['median_s']:.3f} s ({t['min_s']:.3f}-{t['max_s']:.3f})"
            for name, t in steady.items()
        )
    )
    common.write_rows(Path(args.out), [record], env)
    print(f"appended to {args.out}")
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions of a block")
    parser.add_argument("--out", default=str(OUT))
    main(parser.parse_args())
