"""The round schedule against an independent float64 loop, and its invariants.

Expected values come from ``np_round``, a plain-Python reading of the round
model in ``fedjax_het.system.schedule``'s docstring (deterministic speeds, no
dropout), and from closed forms; random profiles are checked for invariants.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import rng
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
    sampler_select,
    schedule,
    select_among_ready,
)

# Eight clients: three traces (period 1000 s, 1000 s and 100 s) and three always available.
INTERVALS = [
    np.array([[0.0, 300.0], [400.0, 900.0]]),
    np.array([[100.0, 200.0], [500.0, 600.0], [700.0, 980.0]]),
    np.array([[0.0, 50.0]]),
]
PERIODS = [1000.0, 1000.0, 100.0]
TRACE = np.array([-1, 0, 1, -1, 0, 2, 1, -1])
STEP_TIME = np.array([0.5, 1.0, 2.0, 0.2, 1.5, 0.8, 3.0, 1.0])
DOWN = np.array([1e6, 2e6, 5e5, 1e6, 3e6, 1e6, 8e5, 2e6])  # bytes/s
UP = np.array([5e5, 1e6, 4e5, 5e5, 1e6, 5e5, 4e5, 8e5])
STEPS = np.array([5, 10, 3, 8, 12, 6, 4, 10])
PAYLOAD_DOWN = 2e6
PAYLOAD_UP = np.array([1e6, 1e6, 5e5, 1e6, 2e6, 1e6, 5e5, 1e6])  # per client
N, SLOTS, COHORT, ROUNDS = 8, 4, 3, 24
TOL = 1e-3  # seconds; float32 clocks reach ~2,000 s here


def make_profiles(*, std_frac=0.0, dropout=0.0) -> ClientProfiles:
    f = lambda v: jnp.asarray(np.broadcast_to(v, (N,)), jnp.float32)
    return ClientProfiles(
        step_time=f(STEP_TIME),
        down_mean=f(DOWN),
        down_std=f(std_frac * DOWN),
        up_mean=f(UP),
        up_std=f(std_frac * UP),
        trace=jnp.asarray(TRACE, jnp.int32),
        dropout=f(dropout),
        availability=Availability.from_intervals(INTERVALS, PERIODS),
    )


AMONG_READY = select_among_ready(N, SLOTS)
# These programs run for milliseconds: compiling them without LLVM's optimisations halves the
# time of this file.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@functools.partial(jax.jit, static_argnums=3, compiler_options=FAST_COMPILE)
def run(profiles, policy, key, select):
    """The schedule under test (``select`` is always passed: a default is a different cache key)."""
    return schedule(
        profiles,
        policy,
        select,
        rounds=ROUNDS,
        cohort_size=COHORT,
        steps_needed=STEPS,
        payload_down=PAYLOAD_DOWN,
        payload_up=PAYLOAD_UP,
        key=key,
    )


# ----------------------------------------------------------------- independent float64 reference


def np_ready(client: int, t: float) -> bool:
    if TRACE[client] < 0:
        return True
    pos = t % PERIODS[TRACE[client]]
    return any(s <= pos < e for s, e in INTERVALS[TRACE[client]])


def np_until(client: int, t: float) -> float:
    """End of the ready interval holding ``t`` (inf for an always-available client)."""
    if TRACE[client] < 0:
        return math.inf
    period = PERIODS[TRACE[client]]
    cycle, pos = divmod(t, period)
    return next(cycle * period + e for s, e in INTERVALS[TRACE[client]] if s <= pos < e)


def np_finish(client: int, t0: float, work: float) -> float:
    """When ``work`` ready seconds started at ``t0`` are done, pausing while not ready."""
    if TRACE[client] < 0 or work <= 0:
        return t0 + work
    period, intervals = PERIODS[TRACE[client]], INTERVALS[TRACE[client]]
    t, left = t0, work
    while True:
        cycle, pos = divmod(t, period)
        for s, e in intervals:
            if e <= pos:
                continue
            begin = max(pos, s)
            if e - begin >= left:
                return cycle * period + begin + left
            left -= e - begin
        t = (cycle + 1) * period


def np_ready_seconds(client: int, t0: float, t1: float) -> float:
    """Ready seconds in ``[t0, t1]``, by bisection on ``np_finish``."""
    if TRACE[client] < 0:
        return t1 - t0
    lo, hi = 0.0, t1 - t0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np_finish(client, t0, mid) <= t1 else (lo, mid)
    return lo


def test_reference_finish_by_hand():
    # Client 5 is ready [0, 50) every 100 s: 10 s of work until 50, the other 20 s from 100.
    assert np_finish(5, 40.0, 30.0) == 120.0
    assert np_finish(5, 40.0, 10.0) == 50.0
    assert np_until(5, 140.0) == 150.0 and not np_ready(5, 160.0)
    # Client 2 (trace 1): ready [100, 200), [500, 600), [700, 980) of 1000 s.
    assert np_finish(2, 150.0, 200.0) == 750.0  # 50 s to 200, 100 s in [500, 600), 50 s from 700


def np_round(policy, ids, valid, start):
    """One round as the module docstring states it: (outcome, finish, steps_done, duration)."""
    kind, oh = policy.kind, float(policy.overhead)
    deadline, r = float(policy.deadline), float(policy.drop_share)
    keep = min(COHORT, len(ids))
    t0 = start + oh
    slots = []
    for slot, (i, v) in enumerate(zip(ids, valid)):
        c = {"slot": slot, "id": i, "valid": v, "ready": v and np_ready(i, t0)}
        d, u, st = PAYLOAD_DOWN / DOWN[i], PAYLOAD_UP[i] / UP[i], STEP_TIME[i]
        steps = STEPS[i]
        if kind == "deadline" and policy.on_late == "partial":
            steps = int(min(max(math.floor((deadline - d - u) / st), 0), STEPS[i]))
        c.update(down=d, st=st, steps=steps, eligible=steps >= min(STEPS[i], 1))
        work = d + steps * st + u
        c["work"] = work
        if policy.on_unavailable == "pause":
            c["done"], c["fail"] = np_finish(i, t0, work) - t0, None
        else:
            room = np_until(i, t0) - t0 if c["ready"] else 0.0
            c["done"], c["fail"] = work, (room if work > room else None)
        slots.append(c)
    active = [c for c in slots if c["ready"]]
    complete = [c for c in active if c["fail"] is None]
    if kind == "wait_all":
        ok = complete
        end = max([c["done"] if c["fail"] is None else c["fail"] for c in active], default=0.0)
    elif kind == "readiness":
        end = float(np.quantile([c["done"] for c in complete], 1 - r)) if complete else 0.0
        ok = [c for c in complete if c["done"] <= end]
    else:
        ok = [c for c in complete if c["eligible"] and c["done"] <= deadline]
        if policy.deadline_end == "last_ok":
            end = max(c["done"] for c in ok) if ok else (deadline if active else 0.0)
        else:
            reports = [
                c["fail"] if c["fail"] is not None else c["done"] if c["eligible"] else math.inf
                for c in active
            ]
            end = max([min(deadline, x) for x in reports], default=0.0)
    ok.sort(key=lambda c: (c["done"], c["id"], c["slot"]))
    if len(ok) >= keep:
        end = ok[keep - 1]["done"]
    kept = {c["slot"] for c in ok[:keep]}
    outcome, finish, steps_done = [], [], []
    for c in slots:
        if not c["valid"]:
            outcome.append(EMPTY), finish.append(0.0), steps_done.append(0)
            continue
        if not c["ready"]:
            outcome.append(UNAVAILABLE), finish.append(oh), steps_done.append(0)
            continue
        if c["slot"] in kept:
            code, stop, progress = OK, c["done"], c["work"]
        elif c["fail"] is not None and c["fail"] <= end:
            code, stop, progress = DROPPED, c["fail"], c["fail"]
        else:
            code, stop = LATE, end
            progress = np_ready_seconds(c["id"], t0, t0 + end)
            if policy.on_unavailable == "lost":
                progress = end
        progress = min(progress, c["work"])
        done_steps = c["steps"] if code == OK else math.floor((progress - c["down"]) / c["st"])
        outcome.append(code), finish.append(oh + stop)
        steps_done.append(int(min(max(done_steps, 0), c["steps"])))
    return outcome, finish, steps_done, oh + end


# ------------------------------------------------------------------------------------ the tests

# Three sets of static choices (three compiled programs; over-commitment is a number). The
# deadline policy with deadline_end="wait_deadline" and on_late="drop" is the one FLHetBench's
# R-metrics use, checked against the release's loop in test_flhetbench.py.
UNAWARE = {"on_unavailable": "lost", "availability_aware": False}
POLICIES = {
    "wait_all": policies.wait_all(overhead=2.0, **UNAWARE),
    "wait_all_overcommit": policies.wait_all(overhead=2.0, over_commit=0.3, **UNAWARE),
    "deadline": policies.deadline(16.0, on_late="partial", overhead=2.0),
    "readiness": policies.readiness(0.25, overhead=2.0),
    "readiness_overcommit": policies.readiness(0.25, overhead=2.0, over_commit=0.3),
}
SAMPLER = uniform(N, SLOTS)  # blind to readiness: used with the unaware policies
SELECT = {"wait_all": SAMPLER, "wait_all_overcommit": SAMPLER}


def run_named(name, profiles, key):
    return jax.tree.map(
        np.asarray, run(profiles, POLICIES[name], key, SELECT.get(name, AMONG_READY))
    )


@pytest.mark.parametrize("name", list(POLICIES))
def test_matches_reference_loop(name):
    policy = POLICIES[name]
    s = run_named(name, make_profiles(), jax.random.key(3))
    codes = set()
    for r in range(ROUNDS):
        outcome, finish, steps, duration = np_round(
            policy, s.selected[r], s.valid[r], float(s.start[r])
        )
        codes.update(outcome)
        np.testing.assert_array_equal(s.outcome[r], outcome, err_msg=f"round {r}")
        np.testing.assert_allclose(s.finish[r], finish, atol=TOL, err_msg=f"round {r}")
        np.testing.assert_allclose(s.duration[r], duration, atol=TOL, err_msg=f"round {r}")
        ok = s.outcome[r] == OK
        np.testing.assert_array_equal(s.steps_done[r][ok], np.asarray(steps)[ok])
        # A float32 clock can put a late client's partial step on either side of the line.
        np.testing.assert_allclose(s.steps_done[r], steps, atol=1)
    assert OK in codes and len(codes) >= 2, codes  # the case exercises the policy


def check_invariants(s, policy, profiles):
    """What must hold for any profiles, key and policy."""
    oh = float(policy.overhead)
    outcome, valid, ids = s.outcome, s.valid, s.selected
    assert set(np.unique(outcome)) <= {OK, UNAVAILABLE, LATE, DROPPED, EMPTY}
    np.testing.assert_array_equal(outcome == EMPTY, ~valid)  # outcomes partition the slots
    np.testing.assert_array_equal(s.version, np.broadcast_to(np.arange(ROUNDS)[:, None], ids.shape))
    # The clock: starts at 0, each round starts when the last one ended, never goes back.
    assert s.start[0] == 0
    np.testing.assert_allclose(s.clock, s.start + s.duration, rtol=1e-6)
    np.testing.assert_array_equal(s.start[1:], s.clock[:-1])
    assert np.all(s.duration >= oh - TOL) and np.all(np.diff(s.clock) >= 0)
    # Readiness at the round start decides UNAVAILABLE; aware selection never picks it.
    for r, i in zip(*np.nonzero(valid)):
        ready = np_ready(ids[r, i], s.start[r] + oh)
        assert (outcome[r, i] == UNAVAILABLE) == (not ready), (r, i)
    if policy.availability_aware:  # min(ceil(m (1 + over_commit)), #ready) ready clients
        assert not np.any(outcome == UNAVAILABLE)
        wanted = int(policies.num_selected(COHORT, policy.over_commit))
        for r in range(ROUNDS):
            ready = sum(np_ready(i, s.start[r] + oh) for i in range(N))
            assert valid[r].sum() == min(wanted, ready), r
    # Every slot finishes or gives up inside its round, after the compute it did.
    step_time = np.asarray(profiles.step_time)[ids]
    started = valid & (outcome != UNAVAILABLE)
    duration = np.broadcast_to(s.duration[:, None], ids.shape)
    assert np.all(s.finish[started] <= duration[started] + TOL)
    compute = oh + s.steps_done * step_time
    assert np.all(compute[started] <= s.finish[started] + TOL)
    assert np.all(s.steps_done <= STEPS[ids]) and np.all(s.steps_done[~started] == 0)
    # Only finished clients upload; every OK client downloaded and uploaded.
    ok = outcome == OK
    np.testing.assert_array_equal(s.bytes_up[ok], PAYLOAD_UP[ids][ok])
    np.testing.assert_array_equal(s.bytes_down[ok], np.full(ok.sum(), PAYLOAD_DOWN))
    assert np.all(s.bytes_up[~started] == 0) and np.all(s.bytes_down[~started] == 0)
    assert np.all(ok.sum(1) <= COHORT)
    if policy.kind == "wait_all":  # every started client counts
        np.testing.assert_allclose(
            s.duration, np.maximum(oh, np.where(started, s.finish, 0).max(1)), atol=TOL
        )
    if policy.kind == "deadline":
        assert np.all(s.duration <= oh + float(policy.deadline) + TOL)
    if policy.on_late != "partial":  # OK clients did all their steps
        assert np.all(s.steps_done[ok] == STEPS[ids][ok])


@pytest.mark.parametrize("name", list(POLICIES))
def test_invariants_with_random_speeds_and_dropout(name):
    profiles = make_profiles(std_frac=0.4, dropout=0.15)
    s = run_named(name, profiles, jax.random.key(7))
    check_invariants(s, POLICIES[name], profiles)
    assert np.any(s.outcome == DROPPED)


def test_dropout_rate_and_drop_point():
    profiles = make_profiles(dropout=0.3)
    s = run_named("wait_all", profiles, jax.random.key(11))
    started = s.valid & (s.outcome != UNAVAILABLE)
    trials, drops = started.sum(), (s.outcome == DROPPED).sum()
    assert abs(drops - 0.3 * trials) < 4 * math.sqrt(trials * 0.3 * 0.7), (drops, trials)
    full = make_profiles()  # the same rounds without dropout: a drop happens before the finish
    s_full = run_named("wait_all", full, jax.random.key(11))
    dropped = s.outcome == DROPPED
    np.testing.assert_array_equal(s.selected[0], s_full.selected[0])
    assert np.all(s.finish[0][dropped[0]] <= s_full.finish[0][dropped[0]] + TOL)
    assert np.all(s.bytes_up[dropped] == 0)


def test_keys_decide_the_schedule_and_slot_order_does_not():
    profiles, policy = make_profiles(std_frac=0.4, dropout=0.15), POLICIES["deadline"]
    key0, key1 = jax.random.split(jax.random.key(0), 2)
    a, b = run(profiles, policy, key0, AMONG_READY), run(profiles, policy, key1, AMONG_READY)
    same = lambda x, y: jax.tree.map(np.testing.assert_array_equal, x, y)
    same(a, run(profiles, policy, key0, AMONG_READY))
    assert not np.array_equal(a.selected, b.selected) and not np.array_equal(a.finish, b.finish)

    def run_in_order(key, deadline, order):  # the slots of every round permuted by ``order``
        def select(k, round_idx, ready):
            ids, valid = AMONG_READY(k, round_idx, ready)
            return ids[order], valid[order]

        return schedule(
            profiles,
            policy.replace(deadline=deadline),
            select,
            rounds=ROUNDS,
            cohort_size=COHORT,
            steps_needed=STEPS,
            payload_down=PAYLOAD_DOWN,
            payload_up=PAYLOAD_UP,
            key=key,
        )

    # One vmapped program over keys, deadlines and slot orders, against separate runs.
    order = jnp.array([[0, 1, 2, 3], [0, 1, 2, 3], [2, 0, 1, 3]])  # the first 3 slots are used
    batched = jax.jit(jax.vmap(run_in_order), compiler_options=FAST_COMPILE)(
        jnp.stack([key0, key1, key0]), jnp.array([16.0, 9.0, 16.0]), order
    )
    row = lambda i: jax.tree.map(lambda x: x[i], batched)
    same(row(0), a)
    same(
        row(1),
        run(profiles, policy.replace(deadline=jnp.array(9.0, jnp.float32)), key1, AMONG_READY),
    )
    np.testing.assert_array_equal(row(2).clock, a.clock)
    for field in ("selected", "valid", "outcome", "steps_done", "finish", "bytes_up"):
        np.testing.assert_array_equal(getattr(row(2), field), getattr(a, field)[:, order[2]])


def test_select_among_ready_is_uniform_over_ready_clients():
    ready = jnp.array([True, False, True, True, False, True, True, True])
    keys = jax.random.split(jax.random.key(2), 3000)
    draw = jax.jit(jax.vmap(lambda k: AMONG_READY(k, 0, ready)), compiler_options=FAST_COMPILE)
    ids, valid = draw(keys)
    assert np.all(valid) and np.all(np.asarray(ready)[np.asarray(ids)])
    assert all(len(set(row)) == SLOTS for row in np.asarray(ids).tolist())
    counts = np.bincount(np.asarray(ids).ravel(), minlength=N)[np.asarray(ready)]
    expected = 3000 * SLOTS / 6  # 6 ready clients, p = 2/3 each
    assert np.all(np.abs(counts - expected) < 4 * math.sqrt(3000 * (2 / 3) * (1 / 3)))
    few = jnp.arange(N) < 2
    ids, valid = select_among_ready(N, SLOTS)(keys[0], 0, few)
    np.testing.assert_array_equal(valid, [True, True, False, False])
    assert set(np.asarray(ids)[:2].tolist()) == {0, 1}


def test_sampler_selection_matches_the_training_loop_and_marks_unready_empty():
    sampler = SAMPLER
    key = jax.random.key(4)
    ready = jnp.arange(N) % 2 == 0
    ids, valid = sampler_select(sampler)(key, 0, ready)
    np.testing.assert_array_equal(ids, sampler.select(key, 0))
    np.testing.assert_array_equal(valid, np.asarray(ready)[np.asarray(ids)])
    # Round r draws from stream(fold_in(key, r), "select"), as round.Round.cohort does.
    s = run_named("wait_all", make_profiles(), key)
    for r in (0, 5):
        expected = sampler.select(rng.stream(rng.round_key(key, r), "select"), r)
        np.testing.assert_array_equal(s.selected[r], expected)


def test_policy_validation():
    with pytest.raises(ValueError, match="deadline must be > 0"):
        policies.deadline(0.0)
    with pytest.raises(ValueError, match=r"drop_share must be in \(0, 1\)"):
        policies.readiness(1.0)
    with pytest.raises(ValueError, match="over_commit must be >= 0"):
        policies.wait_all(over_commit=-0.1)
    with pytest.raises(ValueError, match="overhead must be >= 0"):
        policies.readiness(0.2, overhead=-1.0)
    with pytest.raises(ValueError, match="on_late must be one of"):
        policies.deadline(10.0, on_late="retry")
    with pytest.raises(ValueError, match="on_unavailable must be one of"):
        policies.wait_all(on_unavailable="skip")
    with pytest.raises(ValueError, match="drop_share must be in"):
        policies.readiness(jnp.array([0.2, 0.0]))  # arrays are checked elementwise
    assert policies.num_selected(20, 0.3) == 26 and policies.num_selected(20, 0.0) == 20


def test_schedule_rejects_bad_shapes_and_too_few_slots():
    profiles = make_profiles()
    with pytest.raises(ValueError, match="payload_up must be a scalar or have shape"):
        schedule(
            profiles,
            POLICIES["wait_all"],
            select_among_ready(N, SLOTS),
            rounds=2,
            cohort_size=COHORT,
            steps_needed=STEPS,
            payload_down=1.0,
            payload_up=np.ones(3),
            key=jax.random.key(0),
        )
    with pytest.raises(ValueError, match="select returns 4 ids but the policy selects"):
        schedule(
            profiles,
            policies.wait_all(over_commit=0.5),
            select_among_ready(N, SLOTS),
            rounds=2,
            cohort_size=COHORT,
            steps_needed=STEPS,
            payload_down=1.0,
            payload_up=1.0,
            key=jax.random.key(0),
        )


def test_the_clock_starts_at_the_policy_start_and_traces_replay_cyclically():
    profiles, key = make_profiles(), jax.random.key(5)
    base = policies.deadline(16.0, on_late="partial", overhead=2.0)
    at = lambda start: jax.tree.map(
        np.asarray, run(profiles, base.replace(start=jnp.float32(start)), key, AMONG_READY)
    )
    s0, one_cycle, shifted = at(0.0), at(1000.0), at(250.0)
    assert shifted.start[0] == 250.0 and one_cycle.start[0] == 1000.0
    # 1000 s is a whole number of every trace's period: the same rounds, 1000 s later.
    np.testing.assert_array_equal(one_cycle.outcome, s0.outcome)
    np.testing.assert_allclose(one_cycle.clock - 1000.0, s0.clock, atol=TOL)
    # 250 s in, other clients are ready at the first round: the schedule differs.
    assert not np.array_equal(shifted.outcome, s0.outcome)
    with pytest.raises(ValueError, match="start must be >= 0"):
        policies.wait_all(start=-1.0)
