"""CPU cost of one GANDALF mediator round against one FedAvg round of the same clients.

The 20 clients of ``gandalf_fault_tolerance.py`` (Fashion-MNIST subset, 4 major classes each,
seed 0), the same 784-100-10 MLP, one local epoch of batch 32, FedAvg's default hyperparameters,
no failures. Three compiled rounds, each one ``jax.jit`` program:

- ``fedavg``: ``round.Round.step`` (``bench_harness.make_setup``: all 20 clients a round,
  chunk 1, the CPU default): the 20 local trainings as a ``vmap``/``scan`` over clients;
- ``mediator M_c=2``: ``mediator.Mediator.step`` on ``kl_groups(num_groups=2)``: 2 groups in
  one ``vmap``, each a ``scan`` over its 10 members, one pass (``E_m = 1``), fault tolerant;
- ``mediator singletons``: the same step on 20 groups of one client: FedAvg's round in the
  mediator program.

Compile time is measured apart (``jit(...).lower().compile()``), then ``--warmup`` untimed
rounds, then ``--reps`` timed rounds of each, interleaved, each blocked until ready; median and
min-max. The ratio is the mediator's median over FedAvg's.

Validation gate (before any timing): the singleton mediator round must equal a FedAvg round
written here from ``local.local_update`` (a Python loop over clients with the mediator's keys,
``fold_in(client_key(stream(round_key(key, 0), "train"), k), 0)``, then
``w - sum_k (n_k / n) u_k``) within ``||p - p_ref|| / ||p_ref - p_0|| <= 1e-5`` (float32
rounding of the sum). ``Round.step`` draws its batches from other keys, so its params are not
comparable bit for bit; its round is checked to move the params by a norm within 20 % of the
reference's (the same amount of SGD).

Usage::

    python experiments/bench_mediator.py            # rows to bench_results/mediator-cpu.jsonl
    python experiments/bench_mediator.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_harness
import common
from gandalf_fault_tolerance import WORK, partition

from fedjax_het import models, rng
from fedjax_het import results as run_results
from fedjax_het.engine.local import ClientTask, local_update
from fedjax_het.gandalf.mediator import Mediator, MediatorState, kl_groups, timing
from fedjax_het.gandalf.rebalance import class_counts
from fedjax_het.system.profiles import uniform_profiles

OUT = common.BENCH_RESULTS / "mediator-cpu.jsonl"
GATE = 1e-5


def mediator_round(setup: bench_harness.Setup, groups, num_clients: int):
    """``(compiled step, args)`` of one mediator round from the setup's initial state."""
    mediator = Mediator(setup.round_.spec, passes=1, fault_tolerant=True)
    state = MediatorState(
        setup.state.server_state, jnp.zeros((num_clients,), jnp.int32), jnp.float32(0)
    )
    args = (
        state, jnp.int32(0), jnp.asarray(groups.members), jnp.asarray(groups.mask),
        uniform_profiles(num_clients), timing(60.0, heartbeat=5.0), setup.hyper, setup.train,
        setup.key,
    )  # fmt: skip
    (step,), compile_s = bench_harness.compile_timed((mediator.step, args))
    return step, args, compile_s


def reference_fedavg(setup: bench_harness.Setup, num_clients: int):
    """FedAvg's round from ``local_update``, client by client, with the mediator's keys."""
    spec, params = setup.round_.spec, setup.params
    stream = rng.stream(rng.round_key(setup.key, jnp.int32(0)), "train")
    update = jax.jit(lambda params, task: local_update(spec, setup.hyper, params, (), task,
                                                       setup.train))  # fmt: skip
    total, weighted = 0.0, jax.tree.map(lambda p: np.zeros(p.shape, np.float64), params)
    for k in range(num_clients):
        task = ClientTask(
            client_id=jnp.int32(k), weight=jnp.float32(1), step_limit=jnp.int32(2**30),
            key=jax.random.fold_in(rng.client_key(stream, jnp.int32(k)), 0),
        )  # fmt: skip
        u, _, _ = update(params, task)
        n = float(setup.train.count[k])
        weighted = jax.tree.map(lambda s, v, n=n: s + n * np.asarray(v, np.float64), weighted, u)
        total += n
    return jax.tree.map(lambda p, s: np.asarray(p, np.float64) - s / total, params, weighted)


def main(args: argparse.Namespace) -> None:
    env = run_results.environment()
    data = partition(0)
    num_clients = data.num_clients
    model = models.mlp((28, 28, 1), data.num_classes, hidden=(100,))
    setup = bench_harness.make_setup(model, data.train, WORK, num_clients)
    algorithm = setup.round_.algorithm
    fedavg = bench_harness.engine(setup, chunk=1, unroll=1)
    counts = class_counts(data.train, data.num_classes)
    pairs = kl_groups(counts, num_groups=2)
    singles = kl_groups(counts, group_size=1)
    paired_step, paired_args, paired_compile = mediator_round(setup, pairs, num_clients)
    single_step, single_args, single_compile = mediator_round(setup, singles, num_clients)

    def mediator_params(step, step_args):
        state, plan, metrics = step(*step_args)
        return algorithm.global_params(state.server_state), (state, plan, metrics)

    reference = reference_fedavg(setup, num_clients)
    single_params, _ = mediator_params(single_step, single_args)
    gate = bench_harness.gate_error(single_params, reference, setup.params)
    fedavg_params, _ = fedavg.run()
    flat = lambda t: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(t)])
    move = lambda t: float(np.linalg.norm(flat(t) - flat(setup.params)))
    norm_ratio = move(fedavg_params) / move(reference)
    print(f"gate: singleton mediator vs loop FedAvg {gate:.2e} (<= {GATE}); Round.step moves the "
          f"params {norm_ratio:.3f}x the reference's norm", flush=True)  # fmt: skip
    if gate > GATE or not 0.8 <= norm_ratio <= 1.25:
        raise SystemExit("validation gate failed: no timing")

    impls = {
        "fedavg Round.step": (fedavg.run, fedavg.compile_s),
        "mediator M_c=2": (lambda: mediator_params(paired_step, paired_args), paired_compile),
        "mediator singletons": (lambda: mediator_params(single_step, single_args), single_compile),
    }
    timing = common.interleaved(
        {name: run for name, (run, _) in impls.items()}, reps=args.reps, warmup=args.warmup
    )
    seconds = {name: timing[name]["seconds"] for name in impls}
    base = statistics.median(seconds["fedavg Round.step"])
    rows = []
    for name, (_, compile_s) in impls.items():
        median = statistics.median(seconds[name])
        rows.append({
            "variant": name, "clients": num_clients, **common.seconds_summary(seconds[name]),
            "ratio_to_fedavg": median / base, "compile_s": compile_s, "reps": args.reps,
            "warmup": args.warmup, "gate_error": gate, "round_step_norm_ratio": norm_ratio,
            "model": "mlp 784-100-10", "work": "1 epoch, batch 32", "quick": args.quick,
            "load_1min": os.getloadavg()[0],
        })  # fmt: skip
        print(
            f"{name:20s} median {median * 1e3:8.1f} ms [{min(seconds[name]) * 1e3:.1f}-"
            f"{max(seconds[name]) * 1e3:.1f}]  x{median / base:.2f}  compile {compile_s:.1f} s"
        )
    common.write_rows(Path(args.out), rows, env)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="3 reps, 1 warm-up")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.warmup = 3, 1
        if args.out == str(OUT):
            args.out = str(OUT.with_name("mediator-cpu-quick.jsonl"))
    return args


if __name__ == "__main__":
    main(parse())
