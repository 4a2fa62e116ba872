"""The harness shared by ``bench_throughput.py`` and ``bench_scale.py`` (experiments/README.md).

One round of FedAvg (McMahan et al. 2017, Algorithm 1: uniform sampling, one
local epoch of SGD, example-weighted mean, server step 1) is timed several
ways, in one process, on the same model, data, initial params, selected
clients and batch indices:

* ``engine``: ``round.Round.step`` jitted as one program: in-jit sampling and
  batching, gather, chunked local training with masks, aggregation, server
  update.
* ``loop``: what per-client simulators do. One jitted call draws the cohort and
  its batch indices with the engine's own sampler and ``batch_indices`` (so the
  clients and batches are the same), a Python loop calls one jitted client
  update per client that counts (gather, plain SGD over the client's own
  number of steps, weighted add to a running sum; a client with weight 0 is
  skipped, as a per-client simulator skips a dropped client), and one jitted
  call makes the server step. The engine, by contrast, runs chunks of slots sorted by
  planned steps, each for its longest client's steps, masked past each client's own
  count (``Round(proportional=False)``: every static step, masked). ``max_clients``
  times only the loop's first slots and scales their part of the seconds
  linearly to the cohort (the row says ``extrapolated``); its gate round is
  the full cohort.
* ``bare_vmap``: the lower bound. One ``jax.vmap`` of a plain per-client SGD
  scan over every client, gather from the flat store included, no masks and no
  in-jit sampling (ids and indices are inputs drawn before timing). Needs
  full batches (every client the same size, no system).

A **system** makes the round heterogeneous: ``flash_deadline_plan`` computes
one round's schedule row (``fedjax_het.system.schedule.plan_round``) under
FLASH's AI-Benchmark devices, a deadline with partial work and dropouts, and
the engine consumes it through ``Round.step(..., plan=row)`` as a planned run
does (the schedule is computed before training, ``simulate.plan_run``): every
slot keeps its shape, and step masks (partial work) and zero weights (late,
dropped) do the rest. The loop applies the same row: each client runs the
steps it completed, weight-0 clients are skipped.

Validation gate: before its time counts, the global params after the round of
every implementation must match the group's reference (the first row built
with the same system, normally ``loop``) within GATE_TOLERANCE = 5e-3 in
``||p - p_ref||_2 / ||p_ref - p_0||_2`` over all params (the error relative to
the round's global update). Measured on CPU with 10 clients: float32 rounding
alone puts the W2 round of ``loop`` 3.3e-4 and of ``bare_vmap`` 1.4e-3 from a
float64 evaluation (XLA:CPU's batched convolutions accumulate less accurately);
real mistakes give 1e-2 and more (W1 / W2: the update scaled by 1.01: 1e-2 /
1e-2; one example of one client duplicated: 6e-2 / 1.5e-1; one client left
out: 3e-1 / 9e-2).

Matmul precision: precision is fixed when ``jit`` traces a function, so each
implementation is built (traced, lowered, compiled) twice when the run's
precision differs from the gate's. Its gate round is computed by the program
compiled under ``jax.default_matmul_precision(gate_precision)`` ("highest" by
default: full float32 products, so the gate measures the implementation, not
the GPU's TF32 rounding, which put a bare ``vmap`` 0.04-0.14 from the loop on
an H200), and its timed rounds by the program compiled under
``matmul_precision`` (the run's: "default" is TF32 on NVIDIA GPUs, plain float32
on CPU). Rows record both (``gate_matmul_precision``, ``matmul_precision``) and
the timed program's own distance to the gate reference
(``timed_rel_l2_to_reference``, informative, not a gate: the first round of the
timed program against the reference's gate round, so the TF32 error is
visible). The gate program is dropped before the timed one is built (a
SCAFFOLD state of 2,000 CNN clients is 53 GB). With equal precisions one
program serves both.

Timing: the timed program's first round (the gate round when one program serves
both), ``warmup`` more untimed rounds
(none when MIN_REPS rounds like the first one would pass ``max_s``), then up to
``reps`` timed rounds per implementation, interleaved (one round of each in
turn, so that other processes' load hits all alike), each blocked until every
output is ready; an implementation stops early, after MIN_REPS rounds, once
its rounds add up to ``max_s``. Compile time (trace, lower and XLA compile of
every jitted function) is reported apart: ``compile_s`` of the timed program,
``gate_compile_s`` of the gate's. A variant that fails (out of
memory, say) gets a row with its error and no time; the others go on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import common
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import models, rng
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays, FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.local import DeviceSplit, LocalSpec, client_batches
from fedjax_het.engine.memory import ChunkPlan
from fedjax_het.engine.round import Round, RunState, device_split, init_state
from fedjax_het.sampling import uniform
from fedjax_het.system import policy as policies
from fedjax_het.system.schedule import OK, OUTCOMES, Schedule, plan_round
from fedjax_het.system.setup import System, profiles_from_options
from fedjax_het.training import freeze_pricing, options, simulate
from fedjax_het.training.programs import Setup as RunSetup
from fedjax_het.typing import Hyper, Params

GATE_TOLERANCE = 5e-3
GATE_PRECISION = "highest"  # jax.default_matmul_precision of every gate round
PRECISIONS = ("default", "high", "highest")  # --matmul-precision choices
MIN_REPS = 3  # timed rounds kept even past max_s
SEED = 0
ROUND = 0
SYSTEMS = ("none", "flash-deadline")  # "none": homogeneous round, no schedule row
DROPOUT = 0.1  # per-round dropout probability of every client under "flash-deadline"
BANDWIDTH = 1e7  # bytes/s both ways, the same for everyone: the deadline splits on compute


@dataclasses.dataclass(frozen=True)
class Setup:
    """One benchmark cell: the engine's round description, its inputs and initial state."""

    round_: Round
    train: DeviceSplit
    hyper: Hyper
    key: jax.Array
    state: RunState

    @property
    def params(self) -> Params:
        return self.state.server_state.params

    @property
    def cohort(self) -> int:
        return self.round_.sampler.cohort_size


def make_setup(model: models.Model, train: ClientArrays, work: LocalWork, cohort: int) -> Setup:
    """FedAvg with its default learning rates, ``cohort`` clients a round from all of ``train``."""
    max_count = int(train.count.max())
    algorithm = fedavg()
    spec = LocalSpec(model, algorithm, work, work.static_steps(max_count), max_count)
    round_ = Round(model, algorithm, uniform(train.num_clients, cohort), spec, chunk=1)
    hyper, key = algorithm.hyper(), rng.seed_key(SEED)
    state = init_state(model, algorithm, train.num_clients, hyper, key)
    return Setup(round_, device_split(train), hyper, key, state)


def flash_deadline_system(setup: Setup, *, dropout: float = DROPOUT) -> System:
    """The heterogeneous system of ``flash_deadline_plan``: FLASH's AI-Benchmark devices drawn
    uniformly (``profiles_from_options``, ``devices="flash"``: the median device takes 0.05 s
    a step); network: BANDWIDTH for everyone; always available; each client drops out with
    probability ``dropout``. Policy: a deadline with partial work (a client plans the steps
    that fit, ``policy.deadline(on_late="partial")``) set to the median time the cohort's
    clients need for their full round."""
    round_ = setup.round_
    profiles = profiles_from_options(
        round_.sampler.num_clients,
        seed=SEED,
        devices="flash",
        bandwidth=BANDWIDTH,
        dropout=dropout,
    )
    full = _round_row(setup, System(profiles, policies.wait_all()))
    deadline = float(np.median(np.asarray(full.finish)[np.asarray(full.outcome) == OK]))
    return System(profiles, policies.deadline(deadline, on_late="partial"))


def _round_row(setup: Setup, system: System) -> Schedule:
    """Round ROUND's schedule row under ``system``, selected by the round's sampler."""
    round_ = setup.round_
    payload = freeze_pricing.upload_bytes(jax.eval_shape(round_.model.init, setup.key))
    needed = jnp.asarray(simulate.steps_needed(round_.spec, np.asarray(setup.train.count)))
    return plan_round(
        system.profiles,
        system.policy,
        round_.sampler,
        round_idx=jnp.int32(ROUND),
        start=system.policy.start,
        key=setup.key,
        cohort_size=setup.cohort,
        steps_needed=needed,
        payload_down=payload,
        payload_up=payload,
    )[0]


def flash_deadline_plan(setup: Setup, *, dropout: float = DROPOUT) -> tuple[Schedule, dict]:
    """Round ROUND's schedule row under ``flash_deadline_system``, and a summary of it.

    In 10,000 W1-like clients 45 % trained fully, 19 % part of their steps, 26 % (too slow
    for one step) none (LATE), and ``dropout`` of them were DROPPED. Selection is the
    round's sampler with the same key, so the cohort is the homogeneous round's.
    """
    system = flash_deadline_system(setup, dropout=dropout)
    plan = _round_row(setup, system)
    needed = simulate.steps_needed(setup.round_.spec, np.asarray(setup.train.count))
    outcome, done = np.asarray(plan.outcome), np.asarray(plan.steps_done)
    ok, wanted = outcome == OK, needed[np.asarray(plan.selected)]
    summary = {
        "system": "flash-deadline",
        "devices": "flash (AI-Benchmark), median 0.05 s a step",
        "bandwidth_bytes_s": BANDWIDTH,
        "dropout": dropout,
        "deadline_s": float(system.policy.deadline),
        "policy": "deadline, on_late=partial, deadline = median full-round time",
        "outcomes": {name: int(np.sum(outcome == code)) for code, name in enumerate(OUTCOMES)},
        "ok_partial": int(np.sum(ok & (done < wanted))),
        "steps_done_share": float(done[ok].sum() / max(wanted.sum(), 1)),
    }
    return plan, summary


def run_setup(
    data: FederatedData,
    model: models.Model,
    algorithm: FederatedAlgorithm,
    sampler,
    **run_kwargs: Any,
) -> RunSetup:
    """The ``training.programs.Setup`` that ``fedjax-het run`` builds for these arguments
    (``simulate.run``'s keywords, its defaults for the rest): ``run``'s own option groups
    (``options.run_options``) and its own ``round_setup``, so that the chunk plan is the one ``run`` records in
    ``summary.json`` (``tests/test_bench_plan.py``)."""
    grouped = options.run_options(model=model, algorithm=algorithm, sampler=sampler, **run_kwargs)
    return simulate.round_setup(data, grouped.training, grouped.engine, grouped.timing)


def cohort_plan(
    setup: Setup,
    round_idx: jax.Array,
    train: DeviceSplit,
    key: jax.Array,
    plan: Schedule | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """The round's ids, weights, batch indices ``[m, max_steps, batch]``, example masks and
    step counts ``[m]``, drawn as the engine draws them; a step past a slot's count (small
    client, partial work) is all False."""
    spec = setup.round_.spec
    ids, tasks = setup.round_.cohort(round_idx, train, key, plan)
    indices, masks, steps = jax.vmap(lambda t: client_batches(spec, t, train))(tasks)
    active = jnp.arange(spec.max_steps)[None, :] < steps[:, None]
    return ids, tasks.weight, indices, masks & active[:, :, None], steps


def sgd_steps(model: models.Model, params: Params, xs, ys, masks, lr) -> Params:
    """Plain SGD ``p <- p - lr * grad`` over the leading (step) axis, steps unrolled.

    ``masks`` None takes the plain mean loss of every batch (the bare ``vmap``);
    an all-False step leaves ``p`` as it is (its masked loss is 0).
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
    """A compiled round. ``run()`` is the full round and returns ``(global params, every output
    to block on)``. With ``estimate`` the timed repetitions call it for their seconds instead
    of timing ``run()``: a loop run on ``timed_clients`` of the cohort's clients estimates the
    full round's."""

    run: Callable[[], tuple[Params, Any]]
    compile_s: float
    estimate: Callable[[], float] | None = None
    timed_clients: int | None = None
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


def compile_timed(
    *jobs: tuple[Callable, tuple], donate: tuple[int, ...] = ()
) -> tuple[list[Callable], float]:
    """Traces, lowers and compiles each ``(fn, args)`` (``donate``: the argument numbers whose
    buffers the program may reuse); returns the executables and the seconds."""
    start = time.perf_counter()
    compiled = [jax.jit(fn, donate_argnums=donate).lower(*args).compile() for fn, args in jobs]
    return compiled, time.perf_counter() - start


def plan_fields(plan: ChunkPlan) -> dict[str, Any]:
    """A row's record of run's chunk plan: its line, its formulation of the convolutions
    (None: the model offers no choice) and its bytes (``memory.ChunkPlan``: what the round
    needs with its chunk, the device's free memory, the compiled chunk program's own, if
    measured, and the estimate they came from)."""
    return {
        "chunk_plan": plan.describe(),
        "conv": plan.conv,
        "plan_bytes": {
            "needed": plan.needed,
            "free": plan.free_bytes,
            "compiled_chunk_program": plan.measured_bytes,
            "source": plan.source,
        },
    }


def engine(
    setup: Setup,
    chunk: int,
    unroll: int,
    algorithm: FederatedAlgorithm | None = None,
    plan: Schedule | None = None,
    proportional: bool = True,
    planned: Callable[[], RunSetup] | None = None,
) -> Implementation:
    """``Round.step`` of ``algorithm`` (default: the setup's FedAvg) as one compiled program,
    ``chunk`` clients per ``vmap``, on ``plan`` (a schedule row) when given; another algorithm
    starts from its own initial state (same key, so the same initial params) with its default
    hyperparameters. ``proportional=False`` runs every masked step (``Round.proportional``):
    the same round's bits at the cost of the engine before work-proportional rounds.

    ``planned``: builds the round as ``fedjax-het run`` does (``run_setup``: its round, chunk
    plan, client-state store, hyperparameters and initial state; ``chunk`` and ``algorithm``
    are then its); the row gets the plan's chunk and ``plan_fields``
    (``Implementation.settings``)."""
    settings = {}
    if planned is not None:
        made = planned()
        round_ = dataclasses.replace(
            made.round,
            spec=dataclasses.replace(made.round.spec, unroll=unroll),
            proportional=proportional,
        )
        state, hyper, algorithm = made.init(setup.key), made.hyper, made.round.algorithm
        settings = {"chunk": round_.chunk, **plan_fields(made.chunk_plan)}
    else:
        state, hyper = setup.state, setup.hyper
        if algorithm is None:
            algorithm = setup.round_.algorithm
            state = jax.tree.map(jnp.copy, state)  # this program takes it over (donation, below)
        else:
            hyper = algorithm.hyper()
            population = setup.round_.sampler.num_clients
            state = init_state(setup.round_.model, algorithm, population, hyper, setup.key)
        spec = dataclasses.replace(setup.round_.spec, algorithm=algorithm, unroll=unroll)
        round_ = dataclasses.replace(
            setup.round_, algorithm=algorithm, chunk=chunk, spec=spec, proportional=proportional
        )
    args = (jnp.int32(ROUND), hyper, setup.train, setup.key, plan)
    # The state is donated, as simulate.run's blocks donate it: the client-state table is
    # updated in place, never copied (SCAFFOLD's at W2/1000 is 53 GB). Each round starts
    # from the last one's state, the same work on other values.
    (step,), compile_s = compile_timed((round_.step, (state, *args)), donate=(0,))
    current = [state]

    def run():
        state, metrics = step(current.pop(), *args)
        current.append(state)
        return algorithm.global_params(state.server_state), (state, metrics)

    return Implementation(run, compile_s, settings=settings)


def per_client_loop(
    setup: Setup, plan: Schedule | None = None, max_clients: int | None = None
) -> Implementation:
    """One jitted plan, one jitted update per counted client in a Python loop, one jitted server
    step. A client runs its own number of steps (one compiled update per count that occurs),
    as a per-client simulator does; clients with weight 0 or no steps are skipped.

    With ``max_clients`` below the cohort's ``m`` slots the timed rounds run only the first
    ``max_clients`` slots and estimate a full round's seconds: the per-round work (drawing the
    whole cohort's plan, the server step) as measured, the clients' part times
    ``m / max_clients``. (Scaling the whole round instead overestimated a loop of 10,000 CPU
    clients by 54 %: its draw takes about 0.5 s.)
    """
    model, train, params = setup.round_.model, setup.train, setup.params
    lr, plan_args = setup.hyper["client_lr"], (jnp.int32(ROUND), setup.train, setup.key)
    plan_fn = functools.partial(cohort_plan, setup, plan=plan)
    _, weights, indices, masks, steps = jax.jit(plan_fn)(*plan_args)
    counts = sorted(set(np.asarray(steps)[np.asarray(weights) > 0].tolist()) - {0})
    zeros = jax.tree.map(jnp.zeros_like, params)
    slots = [jnp.int32(k) for k in range(weights.shape[0])]

    def client_update(params, total, x, y, indices, masks, weights, k, lr, *, num_steps):
        rows, mask = indices[k][:num_steps], masks[k][:num_steps]
        local = sgd_steps(model, params, x[rows], y[rows], mask, lr)
        return jax.tree.map(lambda t, p, q: t + weights[k] * (p - q), total, params, local)

    def server_step(params, total, weights):
        return jax.tree.map(lambda p, t: p - t / jnp.sum(weights), params, total)

    client_args = (params, zeros, train.x, train.y, indices, masks, weights, slots[0], lr)
    (draw, server, *updates), compile_s = compile_timed(
        (plan_fn, plan_args),
        (server_step, (params, zeros, weights)),
        *((functools.partial(client_update, num_steps=n), client_args) for n in counts),
    )
    client = dict(zip(counts, updates))

    def one_round(num_slots: int, marks: list[float] | None = None):
        _, weights, indices, masks, steps = draw(*plan_args)
        host_steps = np.asarray(steps)  # waits for the draw
        counted = np.flatnonzero(
            (np.asarray(weights) > 0)[:num_slots] & (host_steps[:num_slots] > 0)
        )
        total = zeros
        if marks is not None:
            marks.append(time.perf_counter())
        for k in counted:
            total = client[host_steps[k]](
                params, total, train.x, train.y, indices, masks, weights, slots[k], lr
            )
        if marks is not None:
            jax.block_until_ready(total)
            marks.append(time.perf_counter())
        new_params = server(params, total, weights)
        return new_params, new_params

    def estimate() -> float:
        marks = [time.perf_counter()]
        jax.block_until_ready(one_round(max_clients, marks))
        server_s = time.perf_counter() - marks[2]
        start, drawn, trained = marks
        return (drawn - start) + (trained - drawn) * m / max_clients + server_s

    m = len(slots)
    if max_clients is None or max_clients >= m:
        return Implementation(functools.partial(one_round, m), compile_s)
    return Implementation(functools.partial(one_round, m), compile_s, estimate, max_clients)


def bare_vmap(setup: Setup) -> Implementation:
    """One ``vmap`` of plain SGD over every client; ids and indices drawn before timing."""
    model, train, params = setup.round_.model, setup.train, setup.params
    _, weights, indices, masks, _ = jax.jit(functools.partial(cohort_plan, setup))(
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


@dataclasses.dataclass(frozen=True)
class Variant:
    """One implementation to measure: its row name, settings (``system`` names its gate
    group) and a builder, called inside ``measure`` so that a failure is recorded (twice,
    under each matmul precision, when the gate's and the run's differ)."""

    name: str
    settings: dict[str, Any]
    build: Callable[[], Implementation]


def _first_round(variant: Variant, precision: str) -> tuple[Implementation, Params, float]:
    """Builds ``variant`` under ``jax.default_matmul_precision(precision)`` (every function it
    jits is traced and compiled there) and runs its first round: the implementation, the
    round's global params on the host and the round's seconds."""
    with jax.default_matmul_precision(precision):
        impl = variant.build()
    start = time.perf_counter()
    params = jax.block_until_ready(impl.run())[0]
    seconds = time.perf_counter() - start
    return impl, jax.device_get(params), seconds


def _failed(row: dict[str, Any], variant: Variant, what: str, error: Exception) -> None:
    row["error"] = f"{what}{type(error).__name__}: {str(error)[:500]}"
    print(f"  {variant.name:9s} {variant.settings} failed: {row['error'][:200]}", flush=True)


def measure(
    initial: Params,
    variants: list[Variant],
    *,
    warmup: int,
    reps: int,
    max_s: float,
    matmul_precision: str = GATE_PRECISION,
    gate_precision: str = GATE_PRECISION,
) -> list[dict[str, Any]]:
    """Builds, validates and times each variant; returns one row each (see the module docstring).

    The gate reference of a variant is the first row built with the same
    ``settings["system"]`` and ``settings.get("gate_group")`` (an algorithm whose round is
    not FedAvg's is its own group); ``initial`` are the params the round starts from.
    Gate rounds run programs compiled under ``gate_precision``, timed rounds
    programs compiled under ``matmul_precision`` (one program when equal).
    """
    for precision in (matmul_precision, gate_precision):
        if precision not in PRECISIONS:
            raise ValueError(f"matmul precision must be one of {PRECISIONS}, got {precision!r}")
    shared = matmul_precision == gate_precision
    rows, impls, references = [], [], {}
    for variant in variants:
        row = {
            "implementation": variant.name,
            **variant.settings,
            "matmul_precision": matmul_precision,
            "gate_matmul_precision": gate_precision,
        }
        rows.append(row)
        try:
            impl, params, gate_round_s = _first_round(variant, gate_precision)
        except Exception as error:  # noqa: BLE001 - recorded in the row, the run goes on
            _failed(row, variant, "" if shared else f"gate program ({gate_precision}): ", error)
            continue
        row.update(**impl.settings, gate_compile_s=impl.compile_s, gate_round_s=gate_round_s)
        group = (variant.settings.get("system", "none"), variant.settings.get("gate_group"))
        if group not in references:
            references[group], row["gate"] = (variant.name, params), {"reference": True}
        else:
            value = gate_error(params, references[group][1], initial)
            row["gate"] = {
                "metric": f"rel_l2_to_{references[group][0]}",
                "value": value,
                "tolerance": GATE_TOLERANCE,
                "passed": value <= GATE_TOLERANCE,
            }
        reference_name, reference = references[group]
        if shared:
            timed_params, first_round_s = params, gate_round_s
        elif not row["gate"].get("passed", True):
            print(f"  {variant.name:9s} failed the gate: {row['gate']['value']:.2e}", flush=True)
            continue  # not timed, so its timed program is not built
        else:
            del impl  # the gate program and its inputs leave the device first
            try:
                impl, timed_params, first_round_s = _first_round(variant, matmul_precision)
            except Exception as error:  # noqa: BLE001 - recorded in the row, the run goes on
                _failed(row, variant, f"timed program ({matmul_precision}): ", error)
                continue
        row.update(
            compile_s=impl.compile_s,
            first_round_s=first_round_s,
            timed_rel_l2_to_reference=gate_error(timed_params, reference, initial),
            timed_reference=reference_name,
        )
        print(
            f"  {variant.name:9s} built: compile {row['compile_s']:.1f} s, first round "
            f"{row['first_round_s']:.3f} s, gate {row['gate'].get('value', 'reference')}"
            + ("" if shared else f", {matmul_precision} {row['timed_rel_l2_to_reference']:.2e}"),
            flush=True,
        )
        if impl.timed_clients is not None:
            row.update(extrapolated=True, timed_clients=impl.timed_clients)
        if row["gate"].get("passed", True):
            impls.append((row, impl))
    _time(impls, warmup=warmup, reps=reps, max_s=max_s)
    _ratios(rows)
    for row in rows:
        _print(row)
    return rows


def _time(impls: list[tuple[dict, Implementation]], *, warmup: int, reps: int, max_s: float):
    """Interleaved timed rounds (module docstring); fills ``times_s`` and the statistics. An
    implementation whose round fails (out of memory beside the others' buffers) gets its
    error in its row and leaves the rotation; the others' rows are kept."""
    active = []
    for row, impl in impls:
        row["warmup_rounds"] = 0 if row["first_round_s"] * MIN_REPS > max_s else warmup
        row.update(times_s=[], loadavg_1min=[])
        if all(_round(row, impl, timed=False) for _ in range(row["warmup_rounds"])):
            active.append((row, impl))
    while active:
        for row, impl in active:
            row["loadavg_1min"].append(os.getloadavg()[0])
            _round(row, impl, timed=True)
        active = [
            (row, impl)
            for row, impl in active
            if "error" not in row
            and len(row["times_s"]) < reps
            and (len(row["times_s"]) < MIN_REPS or sum(row["times_s"]) < max_s)
        ]
    for row, _ in impls:
        if "error" not in row:
            times = row["times_s"]
            row.update(reps_timed=len(times), **common.seconds_summary(times))


def _round(row: dict[str, Any], impl: Implementation, *, timed: bool) -> bool:
    """One round of ``impl`` (its estimate where it has one), its seconds appended to ``row``
    when ``timed``; False, with the error in ``row``, when it fails."""
    try:
        start = time.perf_counter()
        seconds = impl.estimate() if impl.estimate is not None else None
        if seconds is None:
            jax.block_until_ready(impl.run())
            seconds = time.perf_counter() - start
    except Exception as error:  # noqa: BLE001 - recorded in the row, the others go on
        row["error"] = f"timed round: {type(error).__name__}: {str(error)[:500]}"
        print(f"  {row['implementation']:9s} failed while timed: {row['error'][:200]}", flush=True)
        return False
    if timed:
        row["times_s"].append(seconds)
    return True


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Each timed engine row over the loop of its system and over the bare ``vmap``
    (``ratio_to_loop``, ``ratio_to_bare_vmap``), another algorithm's engine row over
    FedAvg's with the same system, chunk (or both of run's plan) and unrolling
    (``ratio_to_fedavg``), and a
    heterogeneous engine row over the same engine's (algorithm, chunk, unrolling) homogeneous
    round (``ratio_to_homogeneous``; a chunk the homogeneous round did not run, a
    ``--sorted-chunks`` row's, over its fastest chunk), and a work-proportional engine row over the same round
    run with every masked step (``ratio_to_masked``, rows of ``proportional`` False)."""

    def key(row: dict[str, Any]) -> tuple:
        return (
            row.get("system", "none"),
            row.get("chunk"),
            row.get("unroll"),
            row.get("proportional", True),
        )

    def fedavg_key(row: dict[str, Any]) -> tuple:  # rows of run's plan: each its own chunk
        planned = str(row.get("chunk_from", "")).startswith("run's plan")
        return ("planned" if planned else key(row)[1], *key(row)[:1], *key(row)[2:])

    timed = [row for row in rows if "median_s" in row]
    loop = {
        row.get("system", "none"): row["median_s"]
        for row in timed
        if row["implementation"] == "loop"
    }
    bare = [row["median_s"] for row in timed if row["implementation"] == "bare_vmap"]
    fedavg_median = {
        fedavg_key(row): row["median_s"]
        for row in timed
        if row["implementation"] == "engine" and row.get("algorithm") == "fedavg"
    }
    homogeneous = {
        key(row)[1:] + (row.get("algorithm"),): row["median_s"]
        for row in timed
        if row["implementation"] == "engine" and row.get("system", "none") == "none"
    }
    masked = {
        key(row)[:3] + (row.get("algorithm"),): row["median_s"]
        for row in timed
        if row["implementation"] == "engine" and not row.get("proportional", True)
    }
    for row in timed:
        if row["implementation"] != "engine":
            continue
        if row.get("proportional", True) and key(row)[:3] + (row.get("algorithm"),) in masked:
            row["ratio_to_masked"] = row["median_s"] / masked[key(row)[:3] + (row["algorithm"],)]
        same_engine = key(row)[1:] + (row.get("algorithm"),)
        fastest = [
            seconds
            for (_, *rest), seconds in homogeneous.items()
            if tuple(rest) == same_engine[1:]
        ]
        if row.get("system", "none") != "none" and (same_engine in homogeneous or fastest):
            row["ratio_to_homogeneous"] = row["median_s"] / homogeneous.get(
                same_engine, min(fastest or [math.nan])
            )
        if row.get("system", "none") in loop:
            row["ratio_to_loop"] = row["median_s"] / loop[row.get("system", "none")]
        if bare:
            row["ratio_to_bare_vmap"] = row["median_s"] / bare[0]
        if row.get("algorithm") != "fedavg" and fedavg_key(row) in fedavg_median:
            row["ratio_to_fedavg"] = row["median_s"] / fedavg_median[fedavg_key(row)]


def _print(row: dict[str, Any]) -> None:
    names = ("system", "algorithm", "engine_conv", "conv", "chunk", "unroll", "proportional")
    settings = {k: row[k] for k in names if k in row}
    gate = row.get("gate", {})
    extrapolated = (
        f" (extrapolated from {row['timed_clients']} clients)" if "timed_clients" in row else ""
    )
    ratios = "  ".join(
        f"{name[len('ratio_to_') :]} x{row[name]:.2f}"
        for name in (
            "ratio_to_loop",
            "ratio_to_bare_vmap",
            "ratio_to_fedavg",
            "ratio_to_homogeneous",
            "ratio_to_masked",
        )
        if name in row
    )
    print(
        f"  {row['implementation']:9s} {json.dumps(settings)}"
        f" compile {row.get('compile_s', float('nan')):6.1f} s  median "
        f"{row.get('median_s', float('nan')):8.4f} s  x{row.get('reps_timed', 0)}"
        f"{extrapolated}"
        f"  gate {gate.get('value', 'reference' if gate else '-')}  {ratios}",
        flush=True,
    )
