"""A cohort's convolutions, formulation by formulation: W2's round (the LEAF CNN) timed as the
per-client loop, the bare ``vmap`` and the engine at several chunks, each with the CNN's
convolutions as XLA's (``"xla"``) and as im2col patches and a matmul (``"patches"``,
``fedjax_het.convolution``), and the engine as ``fedjax-het run`` builds it, twice: with
``engine.conv = "auto"`` (the default path: chunk and formulation of the plan,
``memory.plan_memory``, ``conv_choice.conv_impl_for``) and with ``engine.conv`` set to the
other formulation (planned by ``run`` likewise); each such row records its plan
(``bench_harness.plan_fields``: ``chunk_plan``, ``conv``, ``plan_bytes``).

The loop (the reference of the ratios and of the validation gate) keeps XLA's convolution,
the fastest single-client one on CPU. Data, timing and the gate are
``bench_throughput``'s and ``bench_harness``'s (experiments/README.md, "Convolutions of a
cohort"). One JSON line per row to ``--out`` (default
``experiments/bench_results/conv-<backend>-<date>.jsonl``), each with ``benchmark`` "conv",
``conv``, the 1-minute load averages, ``ratio_to_loop``, the round's training FLOPs and its
float32 compute bound on this device (``compute_bound``: ``compute_bound_s``, None where the
device's peak is not known, and an engine row's ``ratio_to_compute_bound``).

    python experiments/bench_conv.py --cohort 10 --xla-chunks 1,10 --patches-chunks 1,2,4,10
    python experiments/bench_conv.py --cohort 100 --xla-chunks "" --patches-chunks "" \
        --bare ""                         # the device check's: loop and run's two plans
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
from pathlib import Path

import bench_harness as harness
import bench_throughput as throughput
import compute_bound
import jax

from fedjax_het.convolution import CONV_IMPLS


def with_conv(setup: harness.Setup, conv: str) -> harness.Setup:
    """``setup`` with its model's convolutions run as ``conv`` (training and the baselines)."""
    round_ = setup.round_
    model = round_.model.with_conv(conv)
    spec = dataclasses.replace(round_.spec, model=model)
    return dataclasses.replace(setup, round_=dataclasses.replace(round_, model=model, spec=spec))


PLANNED = "run's plan (simulate's Setup, memory.plan_memory)"  # bench_throughput's chunk_from


def run_plans(setup: harness.Setup, data) -> list[harness.Variant]:
    """The engine as ``fedjax-het run`` builds the cell's round (``harness.run_setup``):
    ``engine.conv = "auto"``, then the formulation the plan did not choose."""

    def plan(conv: str):
        round_ = setup.round_
        options = {"rounds": 1, "work": round_.spec.work, "devices": 1, "conv": conv}
        return harness.run_setup(data, round_.model, round_.algorithm, round_.sampler, **options)

    auto = functools.cache(functools.partial(plan, "auto"))

    def other():
        chosen = auto().chunk_plan.conv
        return plan(next(conv for conv in CONV_IMPLS if conv != chosen))

    out = []
    for option, planned in (("auto", auto), ("the other formulation", other)):
        settings = {"engine_conv": option, "chunk_from": PLANNED}
        build = lambda planned=planned: harness.engine(setup, 0, 1, planned=planned)
        out.append(harness.Variant("engine", settings, build))
    return out


def variants(
    setup: harness.Setup, data, chunks: dict[str, tuple[int, ...]], bare: list[str]
) -> list[harness.Variant]:
    """The loop (XLA's convolution), a bare ``vmap`` per formulation of ``bare``, the engine
    at each of a formulation's ``chunks``, then the engine of run's two plans."""
    out = [harness.Variant("loop", {"conv": "xla"}, lambda: harness.per_client_loop(setup))]
    for conv in bare:
        made = with_conv(setup, conv)
        out.append(harness.Variant("bare_vmap", {"conv": conv},
                                   lambda made=made: harness.bare_vmap(made)))  # fmt: skip
    for conv, chunk in [(c, n) for c, sizes in chunks.items() for n in sizes]:
        made = with_conv(setup, conv)
        build = lambda made=made, chunk=chunk: harness.engine(made, chunk, 1)
        out.append(harness.Variant("engine", {"conv": conv, "chunk": chunk}, build))
    return out + run_plans(setup, data)


def with_bound(rows: list[dict], flops: float, device: str) -> None:
    """Each row's round FLOPs and compute bound; an engine row's median over the bound."""
    bound = compute_bound.bound_s(flops, device)
    for row in rows:
        row.update(round_flops=flops, compute_bound_s=bound)
        if bound and row["implementation"] == "engine" and "median_s" in row:
            row["ratio_to_compute_bound"] = row["median_s"] / bound


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cohort", type=int, default=10, help="clients a round (W2/cohort)")
    parser.add_argument("--xla-chunks", default="1,10", help="engine chunks with XLA's conv")
    parser.add_argument("--patches-chunks", default="1,2,4,10", help="engine chunks, patches")
    parser.add_argument("--bare", default="patches", help="bare vmaps: formulations, comma list "
                        "(xla's: 2.8x the loop at W2/10 on 2 cores, the slowest row)")
    parser.add_argument("--reps", type=int, default=5, help="timed rounds per implementation")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds after the gate's")
    parser.add_argument("--max-s", type=float, default=60.0, help="timing stops past this")
    parser.add_argument(
        "--matmul-precision",
        choices=harness.PRECISIONS,
        default=harness.GATE_PRECISION,
        help=f"the timed programs' (gates: {harness.GATE_PRECISION!r})",
    )
    parser.add_argument("--out", help="JSONL path (default: experiments/bench_results/...)")
    args = parser.parse_args(argv)
    chunks = {
        conv: throughput.int_list(text, f"--{conv}-chunks") if text else ()
        for conv, text in (("xla", args.xla_chunks), ("patches", args.patches_chunks))
    }
    bare = throughput.choices(args.bare, "--bare", CONV_IMPLS) if args.bare else []
    workload = throughput.WORKLOADS["W2"]
    data = throughput.make_data(workload, args.cohort)
    setup = throughput.make_setup(workload, args.cohort, data)
    load_before = os.getloadavg()
    rows = harness.measure(
        setup.params,
        variants(setup, data, chunks, bare),
        warmup=args.warmup,
        reps=args.reps,
        max_s=args.max_s,
        matmul_precision=args.matmul_precision,
    )
    device = jax.devices()[0].device_kind
    examples = args.cohort * workload.examples_per_client
    flops = compute_bound.round_flops(setup.round_.model, workload.example_shape, examples)
    with_bound(rows, flops, device)
    date = datetime.date.today().isoformat()
    out = Path(args.out or Path(__file__).parent / "bench_results" /
               f"conv-{jax.default_backend()}-{date}.jsonl")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    common_fields = {
        "benchmark": "conv", "workload": "W2", "cohort": args.cohort,
        "examples_per_client": workload.examples_per_client,
        "backend": jax.default_backend(), "device": device, "cpu_count": os.cpu_count(),
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "date": date,
    }  # fmt: skip
    with out.open("a") as f:
        for row in rows:
            f.write(json.dumps({**common_fields, **row}, default=str) + "\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
