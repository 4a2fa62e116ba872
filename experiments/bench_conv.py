"""A cohort's convolutions, formulation by formulation: W2's round (the LEAF CNN) timed as the
per-client loop, the bare ``vmap`` and the engine at several chunks, each with the CNN's
convolutions as XLA's (``"xla"``) and as im2col patches and a matmul (``"patches"``,
``fedjax_het.convolution``), and the engine as its plan runs it (chunk and formulation
chosen: ``memory.plan_memory``, ``conv_choice.conv_impl_for``).

The loop (the reference of the ratios and of the validation gate) keeps XLA's convolution,
the fastest single-client one on CPU. Data, timing and the gate are
``bench_throughput``'s and ``bench_harness``'s (experiments/README.md, "Convolutions of a
cohort"). One JSON line per row to ``--out`` (default
``experiments/bench_results/conv-<backend>-<date>.jsonl``), each with ``conv``, the
1-minute load averages and ``ratio_to_loop``.

    python experiments/bench_conv.py --cohort 10 --xla-chunks 1,10 --patches-chunks 1,2,4,10
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
from pathlib import Path

import bench_harness as harness
import bench_throughput as throughput
import jax

from fedjax_het.convolution import CONV_IMPLS
from fedjax_het.engine import conv_choice


def with_conv(setup: harness.Setup, conv: str) -> harness.Setup:
    """``setup`` with its model's convolutions run as ``conv`` (training and the baselines)."""
    round_ = setup.round_
    model = round_.model.with_conv(conv)
    spec = dataclasses.replace(round_.spec, model=model)
    return dataclasses.replace(setup, round_=dataclasses.replace(round_, model=model, spec=spec))


def planned(setup: harness.Setup) -> tuple[int, str]:
    """The chunk and formulation ``simulate.run`` would choose for the cell on this device."""
    model, conv = conv_choice.conv_model(setup.round_.spec.model, None)
    chunk = throughput.planned_chunk(with_conv(setup, conv))
    return chunk, conv_choice.conv_impl_for(jax.default_backend(), model, chunk)


def variants(
    setup: harness.Setup, chunks: dict[str, tuple[int, ...]], bare: list[str]
) -> list[harness.Variant]:
    """The loop (XLA's convolution), a bare ``vmap`` per formulation of ``bare`` and the
    engine at each of a formulation's ``chunks``, then the engine as planned."""
    out = [harness.Variant("loop", {"conv": "xla"}, lambda: harness.per_client_loop(setup))]
    for conv in bare:
        made = with_conv(setup, conv)
        out.append(harness.Variant("bare_vmap", {"conv": conv},
                                   lambda made=made: harness.bare_vmap(made)))  # fmt: skip
    plan = planned(setup)
    for conv, chunk in [(c, n) for c, sizes in chunks.items() for n in sizes] + [plan[::-1]]:
        settings = {"conv": conv, "chunk": chunk, "planned": (chunk, conv) == plan}
        if any(v.settings == settings for v in out):
            continue  # the planned round is one of the rows already
        made = with_conv(setup, conv)
        build = lambda made=made, chunk=chunk: harness.engine(made, chunk, 1)
        out.append(harness.Variant("engine", settings, build))
    return out


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
    parser.add_argument("--out", help="JSONL path (default: experiments/bench_results/...)")
    args = parser.parse_args(argv)
    chunks = {
        conv: throughput.int_list(text, f"--{conv}-chunks") if text else ()
        for conv, text in (("xla", args.xla_chunks), ("patches", args.patches_chunks))
    }
    bare = throughput.choices(args.bare, "--bare", CONV_IMPLS) if args.bare else []
    setup = throughput.make_setup(throughput.WORKLOADS["W2"], args.cohort)
    load_before = os.getloadavg()
    rows = harness.measure(
        setup.params, variants(setup, chunks, bare),
        warmup=args.warmup, reps=args.reps, max_s=args.max_s,
    )  # fmt: skip
    date = datetime.date.today().isoformat()
    out = Path(args.out or Path(__file__).parent / "bench_results" /
               f"conv-{jax.default_backend()}-{date}.jsonl")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    common_fields = {
        "workload": "W2", "cohort": args.cohort, "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind, "cpu_count": os.cpu_count(),
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "date": date,
    }  # fmt: skip
    with out.open("a") as f:
        for row in rows:
            f.write(json.dumps({**common_fields, **row}, default=str) + "\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
