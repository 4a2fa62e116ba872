"""Throughput of one fedjax_het round against a per-client loop and a bare ``vmap``.

One round of FedAvg (McMahan et al. 2017, Algorithm 1: uniform sampling, one
local epoch of SGD, example-weighted mean, server step 1) is timed three ways,
in one process, on the same model, data, initial params, selected clients and
batch indices (DESIGN.md §9):

* ``engine``: ``round.Round.step`` jitted as one program: in-jit sampling and
  batching, gather, chunked local training with masks, aggregation, server
  update. Chunk from ``cohort.auto_chunk`` unless ``--chunk`` says.
* ``loop``: what per-client simulators do. One jitted call draws the cohort and
  its batch indices with the engine's own sampler and ``batch_indices`` (so the
  clients and batches are the same), a Python loop calls one jitted client
  update per client (gather, plain SGD, weighted add to a running sum), and one
  jitted call makes the server step.
* ``bare_vmap``: the lower bound. One ``jax.vmap`` of a plain per-client SGD
  scan over every client, gather from the flat store included, no masks and no
  in-jit sampling (ids and indices are inputs drawn before timing).

``--algorithms fedavg,scaffold`` adds an engine round of SCAFFOLD (Karimireddy
et al. 2020, ``algorithms/scaffold.py``) beside FedAvg's for each chunk and
unrolling, on the same setup (model, data, initial params, cohort, batches,
learning rates); its rows carry ``ratio_to_fedavg``, its median over FedAvg's
engine median at the same settings, measured in the same interleaved run. Its
control variates start at zero, so its round equals FedAvg's and passes the
same gate. ``--baselines`` keeps only some of ``loop`` and ``bare_vmap``
(``none``: the first engine row is the gate's reference).

The baselines unroll their local steps (XLA:CPU runs convolution gradients
inside a ``while`` loop several times slower); the engine's unrolling is
``--unroll`` (default 1, as in ``simulate.run``).

Validation gate: before its time counts, the global params after the round of
``engine`` and ``bare_vmap`` must match ``loop`` within GATE_TOLERANCE = 5e-3 in
``||p - p_loop||_2 / ||p_loop - p_0||_2`` over all params (the error relative to
the round's global update). Measured on CPU with 10 clients: float32 rounding
alone puts the W2 round of ``loop`` 3.3e-4 and of ``bare_vmap`` 1.4e-3 from a
float64 evaluation (XLA:CPU's batched convolutions accumulate less accurately);
real mistakes give 1e-2 and more (W1 / W2: the update scaled by 1.01: 1e-2 /
1e-2; one example of one client duplicated: 6e-2 / 1.5e-1; one client left
out: 3e-1 / 9e-2).

Timing: the gate round (the first warm-up), ``--warmup`` more untimed rounds
(none when MIN_REPS rounds like the gate's would pass ``--max-timing-s``), then
up to ``--reps`` timed rounds per implementation, interleaved (one round of
each in turn, so that other processes' load hits all alike), each blocked
until every output is ready; an implementation stops early, after MIN_REPS
rounds, once its rounds add up to ``--max-timing-s``. Compile time (trace,
lower and XLA compile of every jitted function) is reported apart. One JSON
line per (workload, cohort, implementation) holds median and min-max, the
ratios engine/loop and engine/bare of this run, the gate, the 1-minute load
average before each timed round, and the environment read by the program
(versions, device, XLA flags, git revision).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models, results, rng
from fedjax_het.algorithm import FederatedAlgorithm
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.scaffold import scaffold
from fedjax_het.cohort import auto_chunk
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.local import DeviceSplit, LocalSpec, client_batches
from fedjax_het.round import Round, RunState, device_split, init_state
from fedjax_het.sampling import uniform
from fedjax_het.typing import Hyper, Params

GATE_TOLERANCE = 5e-3
MIN_REPS = 3  # timed rounds kept even past --max-timing-s
POPULATION_PER_COHORT = 2  # the sampler draws the cohort from twice as many clients
SEED = 0
ROUND = 0
ALGORITHMS = {"fedavg": fedavg, "scaffold": scaffold}  # engine algorithms, default settings
BASELINES = ("loop", "bare_vmap")
DEFAULT_COHORTS = {  # CPU: a full run stays near 8 minutes on 2 shared cores
    "cpu": {"W1": (10, 100), "W2": (10,)},
    "accelerator": {"W1": (10, 100, 1000), "W2": (10, 100, 1000)},
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and one local epoch over ``examples_per_client`` rows (every client equal)."""

    name: str
    make_model: Callable[[], models.Model]
    example_shape: tuple[int, ...]
    examples_per_client: int
    batch_size: int
    num_classes: int = 62


WORKLOADS = {
    "W1": Workload("W1", lambda: models.mlp((784,), 62, hidden=(200, 200)), (784,), 64, 16),
    "W2": Workload("W2", lambda: models.femnist_cnn((28, 28, 1), 62), (28, 28, 1), 128, 32),
}


@dataclasses.dataclass(frozen=True)
class Setup:
    """One (workload, cohort): the engine's round description, its inputs and initial state."""

    workload: Workload
    cohort: int
    round_: Round
    train: DeviceSplit
    hyper: Hyper
    key: jax.Array
    state: RunState

    @property
    def params(self) -> Params:
        return self.state.server_state.params


def make_setup(workload: Workload, cohort: int) -> Setup:
    """Synthetic N(0, 1) inputs and uniform labels; FedAvg with its default learning rates."""
    population, n = POPULATION_PER_COHORT * cohort, workload.examples_per_client
    data_rng = np.random.default_rng(SEED)
    x = data_rng.standard_normal((population * n, *workload.example_shape), dtype=np.float32)
    y = data_rng.integers(0, workload.num_classes, population * n, dtype=np.int32)
    offset = np.arange(population, dtype=np.int32) * n
    train = device_split(ClientArrays(x, y, offset, np.full(population, n, np.int32)))
    model, algorithm = workload.make_model(), fedavg()
    work = LocalWork(workload.batch_size, epochs=1.0)
    spec = LocalSpec(model, algorithm, work, work.static_steps(n), n)
    round_ = Round(model, algorithm, uniform(population, cohort), spec, chunk=1)
    hyper, key = algorithm.hyper(), rng.seed_key(SEED)
    state = init_state(model, algorithm, population, hyper, key)
    return Setup(workload, cohort, round_, train, hyper, key, state)


def cohort_plan(setup: Setup, round_idx: jax.Array, train: DeviceSplit, key: jax.Array):
    """The round's ids, weights, batch indices and example masks, drawn as the engine draws them."""
    ids, tasks = setup.round_.cohort(round_idx, train, key)
    indices, masks, _ = jax.vmap(lambda t: client_batches(setup.round_.spec, t, train))(tasks)
    return ids, tasks.weight, indices, masks


def sgd_steps(model: models.Model, params: Params, xs, ys, masks, lr) -> Params:
    """Plain SGD ``p <- p - lr * grad`` over the leading (step) axis, steps unrolled.

    ``masks`` None takes the plain mean loss of every batch (the bare ``vmap``).
    """

    def batch_loss(p, x, y, mask):
        outputs = model.apply(p, x, train=True, key=None)
        if mask is None:
            return jnp.mean(model.per_example_loss(outputs, y))
        return model.loss(outputs, y, mask)

    def step(p, batch):
        x, y, *mask = batch
        grads = jax.grad(batch_loss)(p, x, y, mask[0] if mask else None)
        return jax.tree.map(lambda a, g: a - lr * g, p, grads), None

    batches = (xs, ys) if masks is None else (xs, ys, masks)
    return jax.lax.scan(step, params, batches, unroll=True)[0]


@dataclasses.dataclass
class Implementation:
    """A compiled round: ``run()`` returns ``(global params, every output to block on)``."""

    run: Callable[[], tuple[Params, Any]]
    compile_s: float


def compile_timed(*jobs: tuple[Callable, tuple]) -> tuple[list[Callable], float]:
    """Traces, lowers and compiles each ``(fn, args)``; returns the executables and the seconds."""
    start = time.perf_counter()
    compiled = [jax.jit(fn).lower(*args).compile() for fn, args in jobs]
    return compiled, time.perf_counter() - start


def engine(
    setup: Setup, chunk: int, unroll: int, algorithm: FederatedAlgorithm | None = None
) -> Implementation:
    """``Round.step`` of ``algorithm`` (default: the setup's FedAvg) as one compiled program,
    ``chunk`` clients per ``vmap``; another algorithm starts from its own initial state
    (same key, so the same initial params) with its default hyperparameters."""
    state, hyper = setup.state, setup.hyper
    if algorithm is None:
        algorithm = setup.round_.algorithm
    else:
        hyper = algorithm.hyper()
        population = setup.round_.sampler.num_clients
        state = init_state(setup.round_.model, algorithm, population, hyper, setup.key)
    spec = dataclasses.replace(setup.round_.spec, algorithm=algorithm, unroll=unroll)
    round_ = dataclasses.replace(setup.round_, algorithm=algorithm, chunk=chunk, spec=spec)
    args = (state, jnp.int32(ROUND), hyper, setup.train, setup.key)
    (step,), compile_s = compile_timed((round_.step, args))

    def run():
        state, metrics = step(*args)
        return algorithm.global_params(state.server_state), (state, metrics)

    return Implementation(run, compile_s)


def per_client_loop(setup: Setup) -> Implementation:
    """One jitted plan, one jitted update per client in a Python loop, one jitted server step."""
    model, train, params = setup.round_.model, setup.train, setup.params
    lr, plan_args = setup.hyper["client_lr"], (jnp.int32(ROUND), setup.train, setup.key)
    plan_fn = functools.partial(cohort_plan, setup)
    _, weights, indices, masks = jax.jit(plan_fn)(*plan_args)
    zeros = jax.tree.map(jnp.zeros_like, params)
    slots = [jnp.int32(k) for k in range(setup.cohort)]

    def client_update(params, total, x, y, indices, masks, weights, k, lr):
        local = sgd_steps(model, params, x[indices[k]], y[indices[k]], masks[k], lr)
        return jax.tree.map(lambda t, p, q: t + weights[k] * (p - q), total, params, local)

    def server_step(params, total, weights):
        return jax.tree.map(lambda p, t: p - t / jnp.sum(weights), params, total)

    (plan, client, server), compile_s = compile_timed(
        (plan_fn, plan_args),
        (client_update, (params, zeros, train.x, train.y, indices, masks, weights, slots[0], lr)),
        (server_step, (params, zeros, weights)),
    )

    def run():
        _, weights, indices, masks = plan(*plan_args)
        total = zeros
        for k in slots:
            total = client(params, total, train.x, train.y, indices, masks, weights, k, lr)
        new_params = server(params, total, weights)
        return new_params, new_params

    return Implementation(run, compile_s)


def bare_vmap(setup: Setup) -> Implementation:
    """One ``vmap`` of plain SGD over every client; ids and indices drawn before timing."""
    model, train, params = setup.round_.model, setup.train, setup.params
    _, weights, indices, masks = jax.jit(functools.partial(cohort_plan, setup))(
        jnp.int32(ROUND), train, setup.key
    )
    if not bool(jnp.all(masks)):
        raise ValueError("bare_vmap has no masks: every client needs full batches")

    def bare_round(params, x, y, indices, weights, lr):
        local = jax.vmap(lambda xs, ys: sgd_steps(model, params, xs, ys, None, lr))(
            x[indices], y[indices]
        )
        share = weights / jnp.sum(weights)
        return jax.tree.map(lambda l: jnp.tensordot(share, l, axes=1), local)

    args = (params, train.x, train.y, indices, weights, setup.hyper["client_lr"])
    (compiled,), compile_s = compile_timed((bare_round, args))

    def run():
        new_params = compiled(*args)
        return new_params, new_params

    return Implementation(run, compile_s)


def gate_error(params: Params, reference: Params, initial: Params) -> float:
    """``||params - reference||_2 / ||reference - initial||_2`` over all leaves, in float64."""

    def flat(tree):
        return np.concatenate(
            [np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)]
        )

    reference = flat(reference)
    return float(
        np.linalg.norm(flat(params) - reference) / np.linalg.norm(reference - flat(initial))
    )


def measure(
    setup: Setup,
    variants: list[tuple[str, dict, Callable[[], Implementation]]],
    *,
    warmup: int,
    reps: int,
    max_s: float,
) -> list[dict[str, Any]]:
    """Builds, validates and times each ``(name, settings, build)``; the first is the reference.

    Timed rounds are interleaved (one round of each implementation in turn) so
    that a change of machine load hits them alike. An implementation stops
    after ``reps`` rounds, or after MIN_REPS once its rounds add up to ``max_s``.
    A variant that fails (out of memory, say) gets a row with its error and no time.
    """
    rows, impls, reference = [], [], None
    for name, settings, build in variants:
        row = {"implementation": name, **settings}
        rows.append(row)
        try:
            impl = build()
            start = time.perf_counter()
            params = jax.block_until_ready(impl.run())[0]
            row.update(compile_s=impl.compile_s, first_round_s=time.perf_counter() - start)
            params = jax.device_get(params)
        except Exception as error:  # noqa: BLE001 - recorded in the row, the run goes on
            row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
            print(f"  {name:9s} {settings} failed: {row['error'][:200]}", flush=True)
            continue
        if reference is None:
            reference, row["gate"] = params, {"reference": True}
        else:
            value = gate_error(params, reference, setup.params)
            row["gate"] = {
                "metric": "rel_l2_to_loop",
                "value": value,
                "tolerance": GATE_TOLERANCE,
                "passed": value <= GATE_TOLERANCE,
            }
        if row["gate"].get("passed", True):
            impls.append((row, impl))
    for row, impl in impls:
        row["warmup_rounds"] = 0 if row["first_round_s"] * MIN_REPS > max_s else warmup
        for _ in range(row["warmup_rounds"]):
            jax.block_until_ready(impl.run())
        row.update(times_s=[], loadavg_1min=[])
    active = impls
    while active:
        for row, impl in active:
            row["loadavg_1min"].append(os.getloadavg()[0])
            start = time.perf_counter()
            jax.block_until_ready(impl.run())
            row["times_s"].append(time.perf_counter() - start)
        active = [
            (row, impl)
            for row, impl in active
            if len(row["times_s"]) < reps
            and (len(row["times_s"]) < MIN_REPS or sum(row["times_s"]) < max_s)
        ]
    for row, _ in impls:
        times = row["times_s"]
        row.update(
            reps_timed=len(times),
            median_s=statistics.median(times),
            min_s=min(times),
            max_s=max(times),
        )
    medians = {r["implementation"]: r["median_s"] for r in rows if "median_s" in r}
    for row in rows:
        print(
            f"  {row['implementation']:9s} "
            f"{json.dumps({k: row[k] for k in ('algorithm', 'chunk', 'unroll') if k in row})}"
            f" compile {row.get('compile_s', float('nan')):6.1f} s  median "
            f"{row.get('median_s', float('nan')):8.4f} s  x{row.get('reps_timed', 0)}  "
            f"gate {row.get('gate', {}).get('value', 'reference' if 'gate' in row else '-')}",
            flush=True,
        )
        if row["implementation"] == "engine" and "median_s" in row:
            for other in ("loop", "bare_vmap"):
                if other in medians:
                    row[f"ratio_to_{other}"] = row["median_s"] / medians[other]
    return rows


def algorithm_ratios(rows: list[dict[str, Any]]) -> None:
    """Adds ``ratio_to_fedavg`` to each timed engine row of another algorithm: its median over
    that of FedAvg's engine row with the same chunk and unrolling, and prints it."""

    def key(row: dict[str, Any]) -> tuple:
        return row.get("chunk"), row.get("unroll")

    fedavg_median = {
        key(row): row["median_s"]
        for row in rows
        if row["implementation"] == "engine" and row["algorithm"] == "fedavg" and "median_s" in row
    }
    for row in rows:
        if row["implementation"] != "engine" or row["algorithm"] == "fedavg":
            continue
        if "median_s" in row and key(row) in fedavg_median:
            row["ratio_to_fedavg"] = row["median_s"] / fedavg_median[key(row)]
            print(
                f"  {row['algorithm']} / fedavg (engine): {row['ratio_to_fedavg']:.3f}", flush=True
            )


def int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{flag} values must be >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W1,W2", help="comma list of W1, W2")
    parser.add_argument("--cohorts", help="comma list of cohort sizes (default: per backend)")
    parser.add_argument("--reps", type=int, default=10, help="timed rounds, >= 10 for results")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds after the gate's")
    parser.add_argument(
        "--max-timing-s",
        type=float,
        default=60.0,
        help=f"stop timing (after {MIN_REPS} rounds) past this many seconds",
    )
    parser.add_argument(
        "--chunk",
        default="auto",
        help="engine chunk sizes, comma list; 'auto' is cohort.auto_chunk",
    )
    parser.add_argument("--unroll", default="1", help="engine local-step unrolling, comma list")
    parser.add_argument(
        "--algorithms",
        default="fedavg",
        help=f"engine algorithms, comma list of {', '.join(ALGORITHMS)}",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma list of {', '.join(BASELINES)}, or none; the first row is the gate's reference",
    )
    parser.add_argument("--out", help="JSONL path (default: experiments/bench_results/...)")
    parser.add_argument("--quick", action="store_true", help="smoke run: W1, 10 clients")
    args = parser.parse_args(argv)

    workloads = ["W1"] if args.quick else args.workloads.split(",")
    if set(workloads) - set(WORKLOADS):
        raise ValueError(f"--workloads takes {sorted(WORKLOADS)}, got {args.workloads!r}")
    if args.reps < 1 or args.warmup < 0:
        raise ValueError(f"--reps must be >= 1 and --warmup >= 0, got {args.reps}, {args.warmup}")
    cohorts = int_list(args.cohorts, "--cohorts") if args.cohorts else None
    chunks = [c if c == "auto" else int_list(c, "--chunk")[0] for c in args.chunk.split(",")]
    unrolls = int_list(args.unroll, "--unroll")
    algorithms = args.algorithms.split(",")
    if set(algorithms) - set(ALGORITHMS):
        raise ValueError(f"--algorithms takes {sorted(ALGORITHMS)}, got {args.algorithms!r}")
    baselines = [] if args.baselines == "none" else args.baselines.split(",")
    if set(baselines) - set(BASELINES):
        raise ValueError(f"--baselines takes {list(BASELINES)} or none, got {args.baselines!r}")
    backend = jax.default_backend()
    defaults = DEFAULT_COHORTS["cpu" if backend == "cpu" else "accelerator"]
    stamp = datetime.datetime.now(datetime.UTC)
    out = Path(
        args.out
        or Path(__file__).parent
        / "bench_results"
        / f"throughput-{backend}-{stamp:%Y%m%dT%H%M%SZ}.jsonl"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    env = results.environment()
    print(f"{env['device']}  jax {env['versions']['jax']}  -> {out}", flush=True)

    for name in workloads:
        for cohort in cohorts or ((10,) if args.quick else defaults[name]):
            setup = make_setup(WORKLOADS[name], cohort)
            print(f"{name}, cohort {cohort}", flush=True)
            builds = {"loop": per_client_loop, "bare_vmap": bare_vmap}
            variants = [
                (baseline, {"algorithm": "fedavg"}, functools.partial(builds[baseline], setup))
                for baseline in baselines
            ]
            for chunk in chunks:
                size = auto_chunk(cohort) if chunk == "auto" else chunk
                for unroll in unrolls:
                    for algorithm in algorithms:
                        settings = {
                            "algorithm": algorithm,
                            "chunk": size,
                            "chunk_from": "auto_chunk" if chunk == "auto" else "--chunk",
                            "unroll": unroll,
                        }
                        made = None if algorithm == "fedavg" else ALGORITHMS[algorithm]()
                        variants.append(
                            (
                                "engine",
                                settings,
                                functools.partial(engine, setup, size, unroll, made),
                            )
                        )
            rows = measure(
                setup, variants, warmup=args.warmup, reps=args.reps, max_s=args.max_timing_s
            )
            algorithm_ratios(rows)
            workload = WORKLOADS[name]
            common = {
                "workload": name,
                "model": setup.round_.model.name,
                "examples_per_client": workload.examples_per_client,
                "batch_size": workload.batch_size,
                "epochs": 1.0,
                "local_steps": setup.round_.spec.max_steps,
                "cohort": cohort,
                "population": setup.round_.sampler.num_clients,
                "warmup": args.warmup,
                "reps_requested": args.reps,
                "quick": args.quick,
                "timestamp": stamp.isoformat(timespec="seconds"),
            }
            with out.open("a") as f:
                for row in rows:
                    f.write(json.dumps({**common, **row, "env": env}) + "\n")


if __name__ == "__main__":
    main()
