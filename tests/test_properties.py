"""Property tests: random cohorts against a float64 reference, random schedules against invariants.

Issue 15, item 6. ``hypothesis`` draws the values; the static choices that
select a compiled program (chunk size, device count, policy structure) are
enumerated, and every drawn example is run under each of them.

1. **The engine against a per-client float64 loop.** Drawn: ragged client
   sizes (1 to 9 examples), a cohort of 5 distinct clients in any order from
   a population of 5 to 7 (so sometimes every client), per-slot weights
   (0 included), step limits (0, within, above the task, none), client and
   server learning rates, the data and the key. Every example runs on the 8
   ``LAYOUTS`` (chunks that divide the slots, leave padded slots or exceed
   them, on 1, 2 and 4 devices). ``Round.train_cohort``
   (FedAvg, McMahan et al. 2017, Algorithm 1, with an SGD server step) must
   equal ``reference_round``: multinomial logistic regression trained client
   by client in float64 numpy on the masked mean cross-entropy, then ``x -
   lr_s Σ_k w_k (x - x_k) / Σ_k w_k`` over the clients with ``w_k > 0``. The
   reference shares only the batch index draw with the engine
   (``local.client_batches``; the rows are checked to be the client's own);
   steps and example masks are recomputed from ``LocalWork``'s definition.
   Tolerance rtol 1e-5, atol 1e-6 (float32 against float64, at most 3 SGD
   steps). Per client, the outputs (stats, and updates stored as client state
   by ``RECORDING``) must be bitwise those of one device, chunk 1 and the
   cohort sorted by id: only the aggregate's summation order may change.
2. **The schedule against its invariants.** Drawn: profiles (step times,
   bandwidths with random spread, dropout in [0, 1)), availability traces (0
   to 3 intervals per trace, random periods), per-client steps and payloads,
   the policy's numbers (overhead, over-commitment, start time, deadline,
   readiness share) and the key. Every example runs under the 12 policy
   ``STRUCTURES`` (wait for all; deadline dropping late work or planning
   partial work, ending at the last success or at the deadline; readiness;
   availability-aware selection or not; paused or lost work: a pairwise
   design, in which every pair of values of two of these choices occurs).
   ``check_schedule``: a slot that is not OK never counts in
   ``Round.cohort(..., plan=row)``, steps never exceed the budget, the clock
   never goes back, finish times lie inside their round, and more.

Runtime. Compiling is what costs (2 to 4 s a program on this 2-core CPU,
depending on load; running one takes milliseconds), so every shape is fixed
across examples and only values are drawn: the data store has room for 7
clients of up to 9 examples (rows past the clients' are NaN, so a foreign
read would show), the cohort always has 5 slots, the availability store is
padded to a fixed row count. That leaves 8 + 12 compiled programs for the
file (plus two small helpers), each compiled once, at XLA backend
optimisation level 0 (the same HLO, about twice as fast to compile); all 24
policy structures would add about 40 s. The example counts (60, 30 and 80,
so 480, 270 and 960 runs) keep the file at about a minute on an idle
machine. ``deadline=None`` because the first example compiles;
``derandomize=True`` with no example database: the same examples on every
run and in CI.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, note, settings

from fedjax_het import models, rng
from fedjax_het.algorithms import fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import delta_update
from fedjax_het.engine.client_store import DeviceStore
from fedjax_het.engine.cohort import client_mesh
from fedjax_het.engine.round import Round, init_state
from fedjax_het.sampling.uniform import uniform
from fedjax_het.system import policy as policies
from fedjax_het.system.availability import Availability
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import (
    DROPPED,
    EMPTY,
    LATE,
    OK,
    UNAVAILABLE,
    schedule,
    select_among_ready,
)

REPRODUCIBLE = {"deadline": None, "derandomize": True, "database": None}
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})

# ----------------------------------------------------------------------- 1. engine vs reference

NUM_FEATURES, NUM_CLASSES = 4, 3
POPULATION = 7  # clients the store has room for
MAX_SIZE = 9  # examples per client at most: LocalSpec.max_count
SLOTS = 5  # cohort slots
# 1.5 epochs of batch 4, at most 3 steps: a lone example, ragged last batches, a partial
# second epoch, and clients of 7 or more examples cut by the cap.
WORK = LocalWork(batch_size=4, epochs=1.5, max_steps=3)
# (chunk, devices); every example runs on each. One device: the un-vmapped chunk 1, chunks of 2
# and 4 that leave 1 and 3 padded slots, and 6 > the cohort (one vmap of 5). Two devices hold 3
# slots each (one padded slot), run in chunks of 1 or 2 (padded again); four hold 2 each (three
# padded slots), in chunks of 1 or 6 (one vmap of 2).
LAYOUTS = ((1, 1), (2, 1), (4, 1), (6, 1), (1, 2), (2, 2), (1, 4), (6, 4))
RTOL, ATOL = 1e-5, 1e-6
MODEL = models.logistic_regression((NUM_FEATURES,), NUM_CLASSES)


def record_update(params, ctx, hyper):
    """FedAvg's update, also kept as the client state, so ``train_cohort`` returns it per client."""
    update, _ = delta_update(params, ctx, hyper)
    return update, update


RECORDING = fedavg(
    client_init=lambda params: jax.tree.map(jnp.zeros_like, params),
    client_finalize=record_update,
    name="fedavg_recording",
)
SPEC = local.LocalSpec(MODEL, RECORDING, WORK, WORK.max_steps, MAX_SIZE)


@functools.cache
def cohort_round(chunk: int, devices: int) -> Round:
    """The round under test; its sampler is unused (the tests pass the cohort's tasks)."""
    mesh = client_mesh(devices)
    return Round(
        MODEL, RECORDING, uniform(POPULATION, SLOTS), SPEC, chunk=chunk,
        store=DeviceStore(mesh=mesh), mesh=mesh,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Cohort:
    """One drawn round: the population, the cohort's slots and the numbers."""

    sizes: tuple[int, ...]  # examples of each of the POPULATION clients
    ids: tuple[int, ...]  # the cohort, SLOTS distinct clients in slot order
    weights: tuple[float, ...]
    limits: tuple[int, ...]
    client_lr: float
    server_lr: float
    seed: int


@st.composite
def cohorts(draw) -> Cohort:
    sizes = draw(st.lists(st.integers(1, MAX_SIZE), min_size=POPULATION, max_size=POPULATION))
    population = draw(st.integers(SLOTS, POPULATION))
    ids = draw(st.permutations(range(population)))[:SLOTS]
    weight = st.one_of(st.just(0.0), st.floats(1 / 64, 128.0, width=32))
    limit = st.one_of(st.integers(0, WORK.max_steps + 1), st.just(local.NO_STEP_LIMIT))
    return Cohort(
        sizes=tuple(sizes),
        ids=tuple(ids),
        weights=tuple(draw(st.lists(weight, min_size=SLOTS, max_size=SLOTS))),
        limits=tuple(draw(st.lists(limit, min_size=SLOTS, max_size=SLOTS))),
        client_lr=draw(st.floats(1 / 64, 1 / 2, width=32)),
        server_lr=draw(st.floats(1 / 8, 2.0, width=32)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def client_data(case: Cohort) -> tuple[np.ndarray, np.ndarray, local.DeviceSplit]:
    """float64 features, labels and the engine's store; rows past the clients' are NaN."""
    gen = np.random.default_rng(case.seed)
    total = sum(case.sizes)
    x = np.full((POPULATION * MAX_SIZE, NUM_FEATURES), np.nan)
    x[:total] = gen.normal(0.0, 1.0, (total, NUM_FEATURES)).astype(np.float32)
    y = np.zeros(POPULATION * MAX_SIZE, np.int32)
    y[:total] = gen.integers(0, NUM_CLASSES, total)
    count = np.asarray(case.sizes, np.int32)
    offset = np.cumsum(count) - count
    split = local.DeviceSplit(
        jnp.asarray(x, jnp.float32), jnp.asarray(y), jnp.asarray(offset, jnp.int32),
        jnp.asarray(count),
    )  # fmt: skip
    return x, y, split


def cohort_tasks(case: Cohort, key, order=None) -> tuple[jax.Array, local.ClientTask]:
    """The slots' tasks (slot ``i`` of ``order`` is slot ``order[i]`` of the case)."""
    order = np.arange(SLOTS) if order is None else np.asarray(order)
    ids = jnp.asarray(np.asarray(case.ids)[order], jnp.int32)
    return ids, local.ClientTask(
        client_id=ids,
        weight=jnp.asarray(np.asarray(case.weights, np.float32)[order]),
        step_limit=jnp.asarray(np.asarray(case.limits, np.int32)[order]),
        key=client_keys(key, ids),
    )


@fast_jit
def client_keys(key, ids):
    return rng.client_keys(key, jnp.int32(0), "train", ids)


@functools.partial(fast_jit, static_argnums=0)
def engine_round(round_, hyper, key, ids, tasks, train):
    """A fresh run state and ``Round.train_cohort`` of the tasks from it."""
    state = init_state(MODEL, RECORDING, POPULATION, hyper, key, store=round_.store)
    new_state, stats, metrics = round_.train_cohort(state, ids, tasks, hyper, train)
    return state.server_state.params, new_state, stats, metrics


@fast_jit
def batch_rows(tasks, train):
    """The engine's row indices ``[SLOTS, max_steps, batch]``: all the reference shares."""
    return jax.vmap(lambda task: local.client_batches(SPEC, task, train)[0])(tasks)


def run_engine(case: Cohort, chunk: int, devices: int, order=None):
    key = rng.seed_key(case.seed)
    _, _, train = client_data(case)
    ids, tasks = cohort_tasks(case, key, order)
    hyper = RECORDING.hyper({"client_lr": case.client_lr, "server_lr": case.server_lr})
    return jax.device_get(engine_round(cohort_round(chunk, devices), hyper, key, ids, tasks, train))


def expected_work(count: int, limit: int) -> tuple[int, np.ndarray]:
    """Steps and ``[max_steps, batch]`` example mask, from LocalWork's definition."""
    examples = math.ceil(WORK.epochs * count)
    steps = min(math.ceil(examples / WORK.batch_size), WORK.max_steps, limit)
    position = np.arange(WORK.max_steps * WORK.batch_size)
    return steps, position.reshape(WORK.max_steps, WORK.batch_size) < examples


def reference_client(params, x, y, rows, steps, mask, lr):
    """float64 SGD on the masked mean softmax cross-entropy of ``x W + b``.

    Returns the update ``start - trained`` and the loss summed over the
    examples of the steps taken (each step's mean loss times its examples).
    """
    w, b = params
    loss_sum = 0.0
    for s in range(steps):
        xb, yb, m = x[rows[s]], y[rows[s]], mask[s].astype(np.float64)
        logits = xb @ w + b
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        n = max(m.sum(), 1.0)
        loss_sum += -(log_p[np.arange(len(yb)), yb] * m).sum()
        g = (np.exp(log_p) - np.eye(NUM_CLASSES)[yb]) * (m / n)[:, None]
        w, b = w - lr * xb.T @ g, b - lr * g.sum(axis=0)
    return [params[0] - w, params[1] - b], loss_sum


def as64(params) -> list[np.ndarray]:
    dense = params["Dense_0"]
    return [np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64)]


def assert_close(got, want, what):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=what)


@dataclasses.dataclass(frozen=True)
class Slot:
    """What the reference says one slot's client does."""

    steps: int
    examples: int
    loss_sum: float
    update: list[np.ndarray]


def reference_round(case: Cohort, params: list[np.ndarray]) -> tuple[list[Slot], list[np.ndarray]]:
    """Every slot trained alone in float64, then the new global model ``x - lr_s Δ``.

    ``Δ = Σ_k w_k (x - x_k) / Σ_k w_k`` over the slots with ``w_k > 0``, zero
    when nobody counts (``algorithm.weighted_mean``).
    """
    x, y, train = client_data(case)
    rows = jax.device_get(batch_rows(cohort_tasks(case, rng.seed_key(case.seed))[1], train))
    offset = np.cumsum(case.sizes) - np.asarray(case.sizes)
    slots, total, norm = [], [np.zeros_like(p) for p in params], 0.0
    for slot, (k, weight, limit) in enumerate(zip(case.ids, case.weights, case.limits)):
        begin, count = offset[k], case.sizes[k]
        own = (rows[slot] >= begin) & (rows[slot] < begin + count)
        assert np.all(own), f"client {k} reads rows that are not its own"
        steps, mask = expected_work(count, limit)
        update, loss_sum = reference_client(params, x, y, rows[slot], steps, mask, case.client_lr)
        slots.append(Slot(steps, int(mask[:steps].sum()), loss_sum, update))
        if weight > 0:
            total = [t + weight * u for t, u in zip(total, update)]
            norm += weight
    delta = [t / norm if norm > 0 else t for t in total]
    return slots, [p - case.server_lr * d for p, d in zip(params, delta)]


def client_rows(client_states) -> dict:
    """The stored client states as numpy, without the rows that pad them over devices."""
    return jax.tree.map(lambda s: np.asarray(s)[:POPULATION], client_states)


@settings(max_examples=60, **REPRODUCIBLE)
@given(case=cohorts())
def test_train_cohort_matches_float64_per_client_reference(case):
    """On every layout, ``train_cohort`` = the float64 loop (rtol 1e-5, atol 1e-6).

    The global model, each counted client's update (its stored state), each
    slot's steps, examples and loss; uncounted and unselected clients keep
    their state; the round's participants and examples.
    """
    results = {layout: run_engine(case, *layout) for layout in LAYOUTS}
    start = results[LAYOUTS[0]][0]
    slots, want = reference_round(case, as64(start))
    for layout, (layout_start, state, stats, metrics) in results.items():
        where = f"(chunk, devices) = {layout}"
        jax.tree.map(np.testing.assert_array_equal, layout_start, start)
        stored = client_rows(state.client_states)
        for slot, (k, weight, expected) in enumerate(zip(case.ids, case.weights, slots)):
            at = f"{where}, slot {slot} (client {k})"
            assert stats.steps[slot] == expected.steps, at
            assert stats.examples[slot] == expected.examples, at
            np.testing.assert_allclose(stats.loss_sum[slot], expected.loss_sum, RTOL, ATOL, at)
            if weight > 0:
                assert_close(as64(jax.tree.map(lambda s, k=k: s[k], stored)), expected.update, at)
        counted = {k for k, w in zip(case.ids, case.weights) if w > 0}
        untouched = sorted(set(range(POPULATION)) - counted)
        assert all(np.all(leaf[untouched] == 0) for leaf in jax.tree.leaves(stored)), where
        assert_close(as64(state.server_state.params), want, f"{where}, global model")
        assert metrics["participants"] == sum(w > 0 for w in case.weights), where
        assert metrics["examples"] == sum(s.examples for s in slots), where
        assert metrics["nonfinite_updates"] == 0, where


@settings(max_examples=30, **REPRODUCIBLE)
@given(case=cohorts())
def test_per_client_outputs_do_not_depend_on_layout_or_order(case):
    """Every slot's stats and stored update are bitwise those of one device, chunk 1, slots by id.

    Only the aggregate's summation order may change: the global model agrees
    within rtol 1e-5, atol 1e-6.
    """
    order = np.argsort(case.ids)  # the baseline's slot i is the case's slot order[i]
    _, base_state, base_stats, _ = run_engine(case, 1, 1, order)
    base_stats = jax.tree.map(lambda a: a[np.argsort(order)], base_stats)
    for layout in LAYOUTS:
        _, state, stats, _ = run_engine(case, *layout)
        jax.tree.map(np.testing.assert_array_equal, stats, base_stats)
        jax.tree.map(np.testing.assert_array_equal, client_rows(state.client_states),
                     client_rows(base_state.client_states))  # fmt: skip
        assert_close(as64(state.server_state.params), as64(base_state.server_state.params),
                     f"(chunk, devices) = {layout}")  # fmt: skip


# ------------------------------------------------------------------- 2. schedule invariants

CLIENTS, SCHEDULE_SLOTS, COHORT, ROUNDS = 8, 6, 4, 5
TRACES, MAX_INTERVALS = 3, 3
MAX_STEPS = 12
MAX_OVER_COMMIT = 0.5  # ceil(4 * 1.5) = 6 slots
AMONG_READY = select_among_ready(CLIENTS, SCHEDULE_SLOTS)
SAMPLER = uniform(CLIENTS, SCHEDULE_SLOTS)  # blind to readiness: for policies that are too
# The round that turns schedule rows into training tasks (its spec and sampler are unused).
PLAN_ROUND = Round(MODEL, RECORDING, SAMPLER, SPEC, chunk=1)
PLAN_TRAIN = local.DeviceSplit(
    x=jnp.zeros((CLIENTS, NUM_FEATURES)), y=jnp.zeros((CLIENTS,), jnp.int32),
    offset=jnp.arange(CLIENTS, dtype=jnp.int32), count=jnp.ones((CLIENTS,), jnp.int32),
)  # fmt: skip


def padded(av: Availability, rows: int) -> Availability:
    """``av`` with unused interval rows appended up to ``rows`` (queries never read them)."""
    pad = lambda a: jnp.concatenate([a, jnp.zeros((rows - a.shape[0],), a.dtype)])
    return av.replace(start=pad(av.start), end=pad(av.end), ready_before=pad(av.ready_before))


def float32s(low: float, high: float, **kwargs) -> st.SearchStrategy[float]:
    """Normal float32s only: XLA on CPU flushes subnormals to zero, so ``1e-45 s`` is ``0 s`` there."""
    return st.floats(low, high, width=32, allow_subnormal=False, **kwargs)


def per_client(strategy: st.SearchStrategy) -> st.SearchStrategy[list]:
    return st.lists(strategy, min_size=CLIENTS, max_size=CLIENTS)


@st.composite
def availability(draw) -> Availability:
    """``TRACES`` traces of 0 to ``MAX_INTERVALS`` random intervals and random periods."""
    periods = draw(st.lists(float32s(10.0, 1000.0), min_size=TRACES, max_size=TRACES))
    fraction = float32s(0.0, 1.0)
    intervals = []
    for period in periods:  # (start, length) as shares of the period; past-the-end is clipped
        pairs = draw(st.lists(st.tuples(fraction, fraction), max_size=MAX_INTERVALS))
        intervals.append(np.asarray([(a * period, (a + b) * period) for a, b in pairs]))
    return padded(Availability.from_intervals(intervals, periods), TRACES * MAX_INTERVALS)


@st.composite
def profiles(draw) -> ClientProfiles:
    f32 = lambda values: jnp.asarray(values, jnp.float32)
    down, up = draw(per_client(float32s(1e4, 1e7))), draw(per_client(float32s(1e4, 1e7)))
    spread = draw(per_client(float32s(0.0, 0.5)))
    dropout = st.one_of(st.just(0.0), float32s(0.0, 1.0, exclude_max=True))
    return ClientProfiles(
        step_time=f32(draw(per_client(st.one_of(st.just(0.0), float32s(0.0, 10.0))))),
        down_mean=f32(down),
        down_std=f32(np.multiply(spread, down)),
        up_mean=f32(up),
        up_std=f32(np.multiply(spread, up)),
        trace=jnp.asarray(draw(per_client(st.integers(-1, TRACES - 1))), jnp.int32),
        dropout=f32(draw(per_client(dropout))),
        availability=draw(availability()),
    )


@dataclasses.dataclass(frozen=True)
class PolicyNumbers:
    """The traced numbers of a round policy (its structure is enumerated, see ``STRUCTURES``)."""

    overhead: float
    over_commit: float
    start: float
    deadline: float
    drop_share: float


policy_numbers = st.builds(
    PolicyNumbers,
    overhead=float32s(0.0, 10.0),
    over_commit=float32s(0.0, MAX_OVER_COMMIT),
    start=float32s(0.0, 5000.0),
    deadline=float32s(1.0, 200.0),
    drop_share=float32s(1 / 16, 15 / 16),
)
# The static choices: six kinds (wait_all, readiness, deadline x on_late x deadline_end), aware
# selection or not, paused or lost work. The 12 structures are a pairwise design: every pair of
# values of two choices occurs (each kind with both values of the others, and all four aware x
# on_unavailable pairs), at half the compile time of all 24 combinations.
KINDS = [("wait_all", "drop", "last_ok"), ("readiness", "drop", "last_ok")] + [
    ("deadline", late, end) for late in policies.ON_LATE for end in policies.DEADLINE_ENDS
]
STRUCTURES = [
    (*kind, aware, policies.ON_UNAVAILABLE[(i + (not aware)) % 2])
    for i, kind in enumerate(KINDS)
    for aware in (True, False)
]


def round_policy(structure, numbers: PolicyNumbers) -> policies.RoundPolicy:
    kind, on_late, deadline_end, aware, on_unavailable = structure
    common = {
        "overhead": numbers.overhead, "over_commit": numbers.over_commit, "start": numbers.start,
        "availability_aware": aware, "on_unavailable": on_unavailable,
    }  # fmt: skip
    if kind == "wait_all":
        return policies.wait_all(**common)
    if kind == "readiness":
        return policies.readiness(numbers.drop_share, **common)
    return policies.deadline(numbers.deadline, on_late=on_late, deadline_end=deadline_end, **common)


@functools.partial(fast_jit, static_argnums=0)
def planned(select, profiles, policy, steps_needed, payload_down, payload_up, key):
    """The schedule and the training tasks ``Round.cohort`` builds from each of its rows."""
    plan = schedule(
        profiles, policy, select, rounds=ROUNDS, cohort_size=COHORT, steps_needed=steps_needed,
        payload_down=payload_down, payload_up=payload_up, key=key,
    )  # fmt: skip
    tasks = jax.vmap(lambda r, row: PLAN_ROUND.cohort(r, PLAN_TRAIN, key, plan=row)[1])(
        jnp.arange(ROUNDS, dtype=jnp.int32), plan
    )
    return plan, tasks


def check_schedule(s, tasks, policy, profiles, needed, payload_down, payload_up):
    """The invariants of any schedule (``s`` and ``tasks`` as numpy, ``[R, S]``)."""
    oh = np.float32(policy.overhead)
    ids, valid, outcome, steps = s.selected, s.valid, s.outcome, s.steps_done
    ok, started = outcome == OK, valid & (outcome != UNAVAILABLE)
    # Float32 times: about 100 ulps of the largest time involved.
    deadline = float(policy.deadline) if policy.kind == "deadline" else 0.0
    tol = 1e-5 * (1.0 + np.abs(s.clock).max() + deadline)
    assert set(np.unique(outcome)) <= {OK, UNAVAILABLE, LATE, DROPPED, EMPTY}
    np.testing.assert_array_equal(outcome == EMPTY, ~valid)
    np.testing.assert_array_equal(s.version, np.broadcast_to(np.arange(ROUNDS)[:, None], ids.shape))
    # Selection: valid ids are clients, distinct within a round, at most ceil(m (1 + oc)) of them.
    wanted = int(policies.num_selected(COHORT, policy.over_commit))
    for r in range(ROUNDS):
        chosen = ids[r][valid[r]]
        assert np.all((chosen >= 0) & (chosen < CLIENTS)) and len(set(chosen)) == len(chosen), r
        assert valid[r].sum() <= wanted, r
    if policy.availability_aware:
        assert not np.any(outcome == UNAVAILABLE)
    # Only OK slots count, and never more than the cohort.
    assert np.all(ok.sum(axis=1) <= COHORT)
    np.testing.assert_array_equal(tasks.weight > 0, ok)
    assert np.all(tasks.step_limit[~ok] == 0)
    np.testing.assert_array_equal(tasks.step_limit[ok], steps[ok])
    # Steps: within [0, budget]; none without starting; OK did all (or, partial, >= 1) of them.
    budget = needed[ids]
    assert np.all((steps >= 0) & (steps <= budget)) and np.all(steps[~started] == 0)
    if policy.on_late == "partial":
        assert np.all(steps[ok & (budget > 0)] >= 1)
    else:
        np.testing.assert_array_equal(steps[ok], budget[ok])
    # The clock: from the policy's start, each round where the last ended, or later when nobody
    # was ready then and it waited for the first ready client (then someone starts); never back.
    ended = np.concatenate([[np.float32(policy.start)], s.clock[:-1]])
    waited = s.start != ended
    assert np.all(s.start[waited] > ended[waited])
    assert policy.availability_aware or not waited.any()
    assert np.all(started[waited].any(axis=1))
    np.testing.assert_array_equal(s.clock, s.start + s.duration)
    assert np.all(s.duration >= oh) and np.all(np.diff(s.clock) >= 0)
    # Finish times (seconds after the round start): never before it, inside the round.
    assert np.all(s.finish >= 0) and np.all(s.finish[~valid] == 0)
    assert np.all(s.finish[valid & ~started] == oh) and np.all(s.finish[started] >= oh)
    duration = np.broadcast_to(s.duration[:, None], ids.shape)
    assert np.all(s.finish[started] <= duration[started] + tol)
    compute = oh + steps * np.asarray(profiles.step_time)[ids]
    assert np.all(compute[started] <= s.finish[started] + tol)
    if policy.kind == "deadline":
        limit = oh + np.float32(policy.deadline) + tol
        assert np.all(s.duration <= limit) and np.all(s.finish[ok] <= limit)
    if policy.kind == "wait_all" and wanted == COHORT:  # everyone started reports
        assert not np.any(outcome == LATE)
    # Bytes: a transfer counts whole or not at all; OK slots made both; no start, no bytes.
    down, up = np.full(ids.shape, np.float32(payload_down)), payload_up[ids]
    assert np.all((s.bytes_down == 0) | (s.bytes_down == down))
    assert np.all((s.bytes_up == 0) | (s.bytes_up == up))
    np.testing.assert_array_equal(s.bytes_down[ok], down[ok])
    np.testing.assert_array_equal(s.bytes_up[ok], up[ok])
    assert np.all(s.bytes_down[~started] == 0) and np.all(s.bytes_up[~started] == 0)


@settings(max_examples=80, **REPRODUCIBLE)
@given(
    population=profiles(),
    numbers=policy_numbers,
    needed=per_client(st.integers(0, MAX_STEPS)),
    payload_down=float32s(0.0, 1e6),
    payload_up=per_client(float32s(0.0, 1e6)),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_schedules_keep_their_invariants(
    population, numbers, needed, payload_down, payload_up, seed
):
    """Any profiles, traces, policy numbers and key, under every structure: ``check_schedule``."""
    needed, payload_up = np.asarray(needed, np.int32), np.asarray(payload_up, np.float32)
    for structure in STRUCTURES:
        note(f"policy structure (kind, on_late, deadline_end, aware, on_unavailable) = {structure}")
        policy = round_policy(structure, numbers)
        select = AMONG_READY if policy.availability_aware else SAMPLER
        plan, tasks = jax.device_get(
            planned(select, population, policy, needed, np.float32(payload_down), payload_up,
                    jax.random.key(seed))
        )  # fmt: skip
        check_schedule(plan, tasks, policy, population, needed, payload_down, payload_up)
