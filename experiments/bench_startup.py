"""Start-up time of the default experiment: compilation cache off, cold and warm.

A second run of the same config should
compile nothing it compiled before (``engine.compile_cache``,
``fedjax_het.training.compilation``). Each measurement is a fresh process running
``fedjax-het run --set rounds=R --no-progress`` (the default experiment: the
784-200-200-10 MLP, FedAvg on the shipped Fashion-MNIST subset, 10 clients a
round, eval_every = 10), through ``fedjax_het.front.cli.main`` exactly as the
command runs, with timestamps taken in the child:

* ``off``: ``engine.compile_cache = false`` (every program compiled; the baseline);
* ``cold``: the cache on, in an empty folder (every program compiled and written);
* ``warm``: a second process on the folder ``cold`` filled.

Times are seconds from just before the parent starts the process (so
interpreter start-up counts) to: the package imported (``imported``), the
config validated and the data built (``built``), the round-0 evaluation
(``round0``: the run set up, the evaluation program compiled or loaded and
run), the end of the first block of ``eval_every`` rounds (``first_block``:
the block program traced, lowered, compiled or loaded, and 10 rounds trained),
and the process's exit (``end``). The first trained round is not observable
on its own (a block is one program); ``first_round`` estimates it as
``first_block`` less 9/10 of a steady block (the last block's time: the second
holds the partition report, written once the first block has trained). The
child also sums JAX's own durations up to the end of the first block
(``jax.monitoring``: tracing, lowering to StableHLO, XLA compile or cache
load) and times the partition report (``data_summary.json`` and
``label_heatmap.png``, written after the first block).

``--reps`` repetitions, interleaved (off, cold, warm, off, cold, warm...) so
that load from other processes hits all alike; per-variant medians follow the
per-process rows, every row with the 1-minute load average and the
environment read by the program (``results.environment``). The cache folders
are temporary: nothing is written to ``~/.cache``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

from fedjax_het import results

DEFAULT_OUT = common.BENCH_RESULTS / "startup-cpu.jsonl"
VARIANTS = ("off", "cold", "warm")
TARGET_S = 2.0  # the target: a warm run's first round within 2 s of process start

# The child: `fedjax-het run` (fedjax_het.front.cli.main), with timestamps. Its first argument is
# where it writes them; the rest is the command line.
CHILD = r"""
import dataclasses, inspect, json, sys, time
T = {"start": time.time()}
from fedjax_het.front import cli, config as config_lib
from fedjax_het.training import simulate
from fedjax_het.data import diagnostics
import jax
T["imported"] = time.time()
EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
          "/jax/core/compile/backend_compile_duration": "compile_s"}
spans = dict.fromkeys(EVENTS.values(), 0.0)

def on_duration(event, duration_secs, **_):
    if event in EVENTS:
        spans[EVENTS[event]] += duration_secs

jax.monitoring.register_event_duration_secs_listener(on_duration)
build, report, run = config_lib.build, diagnostics.save_report, simulate.run
evals = []

def timed_build(raw):
    out = build(raw)
    T["built"] = time.time()
    return out

def timed_report(*args, **kwargs):
    t = time.time()
    out = report(*args, **kwargs)
    T["data_report_s"] = T.get("data_report_s", 0.0) + time.time() - t
    return out

def timed_run(*args, **kwargs):
    def on_eval(line):
        evals.append({"round": line["round"], "t": time.time(), **spans})
    bound = inspect.signature(run).bind(*args, **kwargs)
    bound.apply_defaults()
    bound.arguments["output"] = dataclasses.replace(bound.arguments["output"], on_eval=on_eval)
    return run(*bound.args, **bound.kwargs)

config_lib.build, diagnostics.save_report, simulate.run = timed_build, timed_report, timed_run
code = cli.main(sys.argv[2:])
T["done"] = time.time()
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "T": T, "evals": evals}, f)
"""


def measure(variant: str, cache: Path, rounds: int, work: Path) -> dict:
    """One process of ``variant`` with its cache folder; the row of its times."""
    stamps, out = work / f"{variant}-stamps.json", work / f"{variant}-run"
    sets = [f"rounds={rounds}"] + (["engine.compile_cache=false"] if variant == "off" else [])
    argv = [
        "run",
        *[a for s in sets for a in ("--set", s)],
        "--out",
        str(out),
        "--overwrite",
        "--no-progress",
    ]
    env = {**os.environ, "FEDJAX_HET_CACHE_DIR": str(cache)}
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(stamps), *argv],
        env=env,
        cwd=work,
        check=False,
        capture_output=True,
        text=True,
    )
    end = time.time() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{variant}: exit {done.returncode}\n{done.stderr[-3000:]}")
    child = json.loads(stamps.read_text())
    T, evals = child["T"], child["evals"]
    summary = json.loads((out / "summary.json").read_text())
    # A steady block is timed between the last two evaluations: the one after the first
    # block also holds the partition report, written once the first block has trained.
    first = evals[1]
    steady = evals[-1]["t"] - evals[-2]["t"] if len(evals) > 3 else None
    block = evals[-1]["round"] - evals[-2]["round"] if steady is not None else None
    at = lambda t: round(t - t0, 3)
    files = sorted(cache.glob("*-cache"))
    return {
        "variant": variant,
        "rounds": rounds,
        "to_python_s": at(T["start"]),
        "to_imported_s": at(T["imported"]),
        "to_built_s": at(T["built"]),
        "to_round0_eval_s": at(evals[0]["t"]),
        "to_first_block_s": at(first["t"]),
        "first_block_rounds": first["round"],
        "steady_block_s": None if steady is None else round(steady, 3),
        "to_first_round_s_est": None
        if steady is None
        else round(first["t"] - t0 - steady * (first["round"] - 1) / block, 3),
        "to_end_s": round(end, 3),
        "after_last_round_s": round(T["done"] - evals[-1]["t"], 3),
        "data_report_s": round(T.get("data_report_s", 0.0), 3),
        "jax_to_first_block": {k: round(v, 3) for k, v in first.items() if k.endswith("_s")},
        "jax_whole_run": {k: round(v, 3) for k, v in evals[-1].items() if k.endswith("_s")},
        "summary_compile_cache": summary["compile_cache"],
        "summary_first_block_s_with_compile": summary["first_block_s_with_compile"],
        "summary_wall_s": summary["wall_s"],
        "final_test_accuracy": summary["final_test_accuracy"],
        "cache_files": len(files),
        "cache_bytes": sum(f.stat().st_size for f in files),
        "load_1min": round(os.getloadavg()[0], 2),
    }


KEYS = (
    "to_python_s",
    "to_imported_s",
    "to_built_s",
    "to_round0_eval_s",
    "to_first_block_s",
    "to_first_round_s_est",
    "to_end_s",
    "steady_block_s",
    "data_report_s",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--rounds",
        type=int,
        default=30,
        help="rounds of each run (three blocks: the last times a steady block)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma list of off, cold, warm (warm needs cold before it); default all",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if set(variants) - set(VARIANTS) or ("warm" in variants and "cold" not in variants):
        parser.error(f"--variants: a comma list of {', '.join(VARIANTS)}; warm needs cold")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for rep in range(args.reps):
            work = Path(tmp) / f"rep{rep}"
            cache = work / "xla"
            work.mkdir()
            for variant in variants:
                row = {"rep": rep, **measure(variant, cache, args.rounds, work)}
                rows.append(row)
                print(
                    f"rep {rep} {variant:4}  imported {row['to_imported_s']:5.2f}  built "
                    f"{row['to_built_s']:5.2f}  round0 {row['to_round0_eval_s']:5.2f}  "
                    f"first block {row['to_first_block_s']:5.2f}  first round ~"
                    f"{row['to_first_round_s_est']:5.2f}  end {row['to_end_s']:5.2f} s  "
                    f"(cache: {row['summary_compile_cache']})",
                    flush=True,
                )
    medians = []
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        med = {k: round(statistics.median(r[k] for r in mine), 3) for k in KEYS}
        for part in ("jax_to_first_block", "jax_whole_run"):
            med[part] = {
                k: round(statistics.median(r[part][k] for r in mine), 3) for k in mine[0][part]
            }
        medians.append({"variant": variant, "stat": f"median of {len(mine)}", **med})
    common.write_rows(args.out, rows + medians, results.environment(), mode="w")
    for m in medians:
        print(f"median {m['variant']:4}: " + ", ".join(f"{k} {m[k]}" for k in KEYS))
    if "warm" not in variants:
        return
    warm = medians[variants.index("warm")]["to_first_round_s_est"]
    target = {
        "variant": "target",
        "metric": "warm to_first_round_s_est (median)",
        "value": warm,
        "target_s": TARGET_S,
        "passes": warm <= TARGET_S,
    }
    common.write_rows(args.out, [target], results.environment())
    print(
        f"warm first round ~{warm} s (target {TARGET_S} s: "
        f"{'passes' if warm <= TARGET_S else 'fails'}); rows in {args.out}"
    )


if __name__ == "__main__":
    main()
