"""Cost of compressed updates per round, as a ratio to uncompressed FedAvg in the same run.

One jitted round (``Round.step``, ``bench_harness.engine``)
of plain ``fedavg()`` and of ``compression.compressed(fedavg(), ...)`` with
each upload encoder (identity, float16 cast, QSGD(16), TernGrad, signSGD,
EF-scaled sign, top-1 %, top-1 % with error feedback, random-1 %) and with a
bfloat16 download, on W1's MLP with 10 outputs (784-200-200-10, 199,210
params, Fashion-MNIST-shaped) over ``bench_throughput``'s synthetic stand-in
(N(0, 1) inputs, uniform labels, 64 examples per client, batch 16, one epoch),
cohort 10 drawn from 20 clients, chunk ``cohort.auto_chunk`` and 10.

experiments/README.md: compile time apart; a validation gate before any timing (with
identity upload the round's new params equal plain FedAvg's bit for bit, per
chunk); one warm-up round each, then ``--reps`` timed rounds, interleaved over
the variants of a chunk setting so that load hits all alike, every output
blocked on; median and min-max; plain FedAvg timed in the same process. Rows
carry the upload bytes per client (``compression.bytes_sent``) and their ratio
to float32, the 1-minute load average of each timed round and the
environment read by the program. ``--quick`` is a smoke run (3 reps, chunk
``auto`` only): its figures are not results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import bench_harness as harness
import bench_throughput
import common
import jax
import numpy as np

from fedjax_het import models, results
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.cohort import auto_chunk
from fedjax_het.engine.hooks import PayloadBytes
from fedjax_het.transforms import compression as C

COHORT = 10
WORKLOAD = dataclasses.replace(
    bench_throughput.WORKLOADS["W1"],
    make_model=lambda: models.mlp((784,), 10, hidden=(200, 200)),
    num_classes=10,
)
DEFAULT_OUT = common.BENCH_RESULTS / "compression-cpu.jsonl"


def uploads() -> dict[str, C.Compressor | None]:
    """Each variant's upload encoder (None: plain FedAvg, not wrapped)."""
    return {
        "fedavg": None,
        "identity": C.identity(),
        "float16": C.cast("float16"),
        "qsgd(16)": C.qsgd(16),
        "terngrad": C.terngrad(),
        "sign": C.sign(),
        "EF scaled sign": C.error_feedback(C.sign(scaled=True)),
        "top_k(0.01)": C.top_k(0.01),
        "EF top_k(0.01)": C.error_feedback(C.top_k(0.01)),
        "random_k(0.01)": C.random_k(0.01),
        "download bfloat16": C.identity(),
    }


def algorithm_of(name: str, upload: C.Compressor | None) -> FederatedAlgorithm:
    if upload is None:
        return fedavg()
    download = "bfloat16" if name.startswith("download") else None
    return C.compressed(fedavg(), upload=upload, download=download)


def bits_equal(a: Any, b: Any) -> bool:
    """Whether two pytrees hold the same arrays bit for bit (dtypes and shapes included)."""
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in ((np.asarray(p), np.asarray(q)) for p, q in pairs)
    )


def measure_chunk(
    setup: harness.Setup, chunk: int, chunk_from: str, reps: int
) -> list[dict[str, Any]]:
    """Builds, gates, warms and times every variant at one chunk size; one row each."""
    params = setup.params
    float32_bytes = C.bytes_sent(C.identity(), params)
    rows, impls, outputs = [], {}, {}
    for name, upload in uploads().items():
        algorithm = algorithm_of(name, upload)
        impl = harness.engine(setup, chunk, 1, algorithm)
        new_params = jax.device_get(jax.block_until_ready(impl.run())[0])
        outputs[name] = new_params
        up = C.bytes_sent(upload or C.identity(), params)
        payload = algorithm.hook(PayloadBytes)
        down = payload.count(params)[0] if payload else float32_bytes
        row = {
            "variant": name, "algorithm": algorithm.name, "chunk": chunk,
            "chunk_from": chunk_from, "compile_s": impl.compile_s, "upload_bytes": up,
            "upload_ratio_to_float32": up / float32_bytes, "download_bytes": down,
            "gate_error_to_fedavg": harness.gate_error(new_params, outputs["fedavg"], params),
        }  # fmt: skip
        print(f"  chunk {chunk} {name:18s} compile {impl.compile_s:5.1f} s", flush=True)
        rows.append(row)
        impls[name] = impl.run
    if not bits_equal(outputs["identity"], outputs["fedavg"]):
        raise AssertionError(f"chunk {chunk}: identity upload is not FedAvg bit for bit")
    rows[1]["gate"] = {"identity_equals_fedavg_bitwise": True}
    timing = common.interleaved(impls, reps=reps, warmup=1)  # after the gate's round
    base = statistics.median(timing["fedavg"]["seconds"])
    for row in rows:
        t = timing[row["variant"]]["seconds"]
        row.update(
            reps_timed=len(t), **common.seconds_summary(t), times_s=t,
            ratio_to_fedavg=statistics.median(t) / base,
            loadavg_1min=timing[row["variant"]]["load"],
        )  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table: one line per variant, the chunk settings side by side."""
    chunks = sorted({row["chunk"] for row in rows})
    head = "| variant | upload bytes/client (x float32) |"
    rule = "|---|---|"
    for c in chunks:
        head += f" chunk {c}: compile s | ms/round, median (min-max) | x FedAvg |"
        rule += "---|---|---|"
    lines = [head, rule]
    for name in uploads():
        mine = {row["chunk"]: row for row in rows if row["variant"] == name}
        first = mine[chunks[0]]
        line = f"| {name} | {first['upload_bytes']:,} ({first['upload_ratio_to_float32']:.3f}) |"
        for c in chunks:
            r = mine[c]
            line += (
                f" {r['compile_s']:.1f} | {1e3 * r['median_s']:.1f} "
                f"({1e3 * r['min_s']:.1f}-{1e3 * r['max_s']:.1f}) | {r['ratio_to_fedavg']:.2f} |"
            )
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, help="timed rounds per variant (default 10, quick 3)")
    parser.add_argument("--chunks", default="auto,10", help="comma list of sizes or 'auto'")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 reps, chunk auto")
    parser.add_argument("--out", type=Path, help=f"JSONL path (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 10)
    if reps < 1:
        raise ValueError(f"--reps must be >= 1, got {reps}")
    chunk_list = ["auto"] if args.quick else args.chunks.split(",")
    out = args.out or DEFAULT_OUT.with_name(
        DEFAULT_OUT.stem + ("-quick" if args.quick else "") + DEFAULT_OUT.suffix
    )
    out.parent.mkdir(parents=True, exist_ok=True)

    env = results.environment()
    print(f"{env['device']}  jax {env['versions']['jax']}  load {env['load_average']} -> {out}")
    started = time.perf_counter()
    setup = bench_throughput.make_setup(WORKLOAD, COHORT)
    common = {
        "workload": "W1 (784-200-200-10)", "model": WORKLOAD.make_model().name,
        "examples_per_client": WORKLOAD.examples_per_client, "batch_size": WORKLOAD.batch_size,
        "cohort": COHORT, "population": bench_throughput.POPULATION_PER_COHORT * COHORT,
        "warmup": 1, "reps_requested": reps, "quick": args.quick,
    }  # fmt: skip
    rows = []
    for chunk in chunk_list:
        size = auto_chunk(COHORT) if chunk == "auto" else int(chunk)
        rows += measure_chunk(setup, size, "auto_chunk" if chunk == "auto" else "--chunks", reps)
    total_s = time.perf_counter() - started
    with out.open("w") as f:
        f.write(json.dumps({"environment": env, "total_s": total_s, "finished_load_average":
                            os.getloadavg()}) + "\n")  # fmt: skip
        for row in rows:
            f.write(json.dumps({**common, **row}) + "\n")
    print(table(rows))
    print(f"total {total_s:.0f} s, load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()
