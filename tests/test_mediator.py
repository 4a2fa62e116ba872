"""GANDALF's mediators (``fedjax_het.gandalf.mediator``) against references written here.

- ``kl_groups``: each choice is re-checked by brute force (every remaining
  client's ``D_KL(P_m + P_c || P_u)`` in float64 with ``math.log``), every
  client lands in exactly one group, and the sizes follow Algorithm 4's cap.
- The group program (``Mediator.apply``: a ``vmap`` over groups of a
  ``lax.scan`` over slots, or ``lax.map`` in chunks of one group) against a
  float64 sequential reference: python loops over groups and slots, numpy SGD
  on the masked mean cross-entropy of multinomial logistic regression, each
  client starting from the weights the last one passed on, then
  ``Σ_m (n_m / n) w_m``. Groups of 1, 2 and 3 clients (padding slots), two
  passes, failed slots of every kind, a reordered second pass, and a second
  round in which one group trains nobody. Only the row indices of each slot's
  batches come from the engine (``local.client_batches`` with the key rebuilt
  here from ``rng``'s streams); step counts and masks are rebuilt from
  ``LocalWork``. Tolerance rtol 1e-5, atol 1e-6 (measured worst: 6e-8).
- ``run_mediator`` under faults gives the same run whatever the group order
  or the chunking: models within 1e-6, plans and clocks equal.
- Timing on hand-built profiles: a client slower than ``T_R``, one that is
  never ready and one that always drops, with and without fault tolerance,
  against the durations the module docstring states.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scaffold_feddyn as reference

from fedjax_het import models, rng
from fedjax_het.algorithms import fedavg, scaffold
from fedjax_het.data import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import local
from fedjax_het.engine.round import device_split
from fedjax_het.gandalf import mediator
from fedjax_het.gandalf.mediator import (
    GroupPlan,
    Groups,
    Mediator,
    MediatorState,
    kl_groups,
    timing,
)
from fedjax_het.system.availability import Availability
from fedjax_het.system.profiles import uniform_profiles
from fedjax_het.system.schedule import DROPPED, EMPTY, LATE, OK, UNAVAILABLE

F, C = 4, 3
SIZES = (1, 4, 7, 10, 3, 6)
N = len(SIZES)
CLIENT_LR = 0.1
RTOL, ATOL = 1e-5, 1e-6
WORK = LocalWork(batch_size=3, epochs=1.5)  # steps per client: 1, 2, 4, 5, 2, 3
LOGREG = models.logistic_regression((F,), C)
ALGORITHM = fedavg()
HYPER = ALGORITHM.hyper({"client_lr": CLIENT_LR})
SPEC = local.LocalSpec(LOGREG, ALGORITHM, WORK, WORK.static_steps(max(SIZES)), max(SIZES))
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def make_data(seed: int = 0) -> FederatedData:
    gen = np.random.default_rng(seed)
    xs = [gen.normal(k - 2.5, 1.0, (n, F)).astype(np.float32) for k, n in enumerate(SIZES)]
    ys = [gen.integers(0, C, n).astype(np.int32) for n in SIZES]
    return FederatedData.from_client_arrays(xs, ys, test_xs=xs, test_ys=ys, num_classes=C)


# ---- (1) grouping ----------------------------------------------------------------------


def kl_to_uniform(counts) -> float:
    total = sum(counts)
    return sum(c / total * math.log(c / total * len(counts)) for c in counts if c > 0)


def check_greedy(counts: np.ndarray, groups: Groups, cap: int) -> None:
    """Every client once; groups filled to ``cap`` in turn; each pick the brute-force argmin."""
    chosen = [int(k) for k in groups.members[groups.mask]]
    assert sorted(chosen) == list(range(len(counts)))
    sizes = groups.mask.sum(axis=1).tolist()
    assert sizes == [cap] * (len(counts) // cap) + (
        [len(counts) % cap] if len(counts) % cap else []
    )
    assert np.all(groups.mask == (np.arange(groups.group_size) < np.array(sizes)[:, None]))
    left = set(range(len(counts)))
    for row in groups.members[groups.mask.any(axis=1)]:
        pooled = [0] * counts.shape[1]
        for k in row[: min(cap, len(left))]:
            scores = {c: kl_to_uniform([p + q for p, q in zip(pooled, counts[c])]) for c in left}
            best = min(scores.values())
            assert scores[int(k)] == pytest.approx(best, abs=1e-12)
            assert int(k) == min(
                c for c, v in scores.items() if v <= best + 1e-12
            )  # ties: lowest id
            left.remove(int(k))
            pooled = [p + q for p, q in zip(pooled, counts[k])]
    assert not left


@pytest.mark.parametrize("seed", range(3))
def test_kl_groups_is_the_greedy_argmin_and_covers_everyone_once(seed):
    counts = np.random.default_rng(seed).integers(0, 12, (7, 3))
    counts[:, 0] += 1  # every client holds an example
    check_greedy(counts, kl_groups(counts, group_size=3), 3)
    check_greedy(counts, kl_groups(counts, num_groups=3), 3)  # cap ceil(7 / 3) = 3
    check_greedy(counts, kl_groups(counts, num_groups=4), 2)  # cap 2: sizes 2, 2, 2, 1
    check_greedy(counts, kl_groups(counts, group_size=7), 7)
    check_greedy(counts, kl_groups(counts, group_size=1), 1)


def test_kl_groups_balances_complementary_clients():
    """Four major-class clients (GANDALF's setup, in miniature): each group ends up uniform."""
    counts = np.array([[10, 10, 1, 1], [1, 1, 10, 10], [10, 1, 10, 1], [1, 10, 1, 10]])
    groups = kl_groups(counts, group_size=2)
    for row in groups.members:
        assert len(set(counts[row].sum(axis=0).tolist())) == 1


# ---- (2) the group program against a float64 sequential reference ----------------------


MEMBERS = np.array([[4, 0, 0], [1, 3, 0], [0, 2, 5]], np.int32)  # groups of 1, 2 and 3
MASK = np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], bool)
GROUPS = Groups(MEMBERS, MASK)
X, E, U, L, D = OK, EMPTY, UNAVAILABLE, LATE, DROPPED
# Two passes of three slots: (member positions, outcomes) of each group, each round.
PLANS = (
    (
        ([0, 1, 2, 0, 1, 2], [X, E, E, X, E, E]),  # a group of one, padding slots
        ([0, 1, 2, 1, 0, 2], [X, D, E, X, X, E]),  # client 3 drops, then trains first
        ([0, 1, 2, 2, 0, 1], [X, U, X, X, L, X]),  # failures in both passes
    ),
    (
        ([0, 1, 2, 0, 1, 2], [L, E, E, U, E, E]),  # nobody trains: the group is left out
        ([1, 0, 2, 0, 1, 2], [X, X, E, X, X, E]),
        ([2, 1, 0, 0, 1, 2], [X, X, X, D, X, X]),
    ),
)


def hand_plan(rows) -> GroupPlan:
    positions = np.array([p for p, _ in rows], np.int32)
    outcomes = np.array([o for _, o in rows], np.int32)
    clients = np.where(outcomes == EMPTY, 0, np.take_along_axis(MEMBERS, positions % 3, axis=1))
    seconds = np.zeros(outcomes.shape, np.float32)
    return GroupPlan(
        jnp.asarray(clients, jnp.int32),
        jnp.asarray(positions),
        jnp.asarray(outcomes),
        jnp.asarray(seconds),
        jnp.zeros(len(rows), jnp.float32),
    )


@functools.cache
def jitted_apply(chunk):
    mediator_ = Mediator(SPEC, passes=2, chunk=chunk)

    def apply(state, plan, hyper, train, round_idx, key):
        return mediator_.apply(
            state,
            plan,
            jnp.asarray(MEMBERS),
            jnp.asarray(MASK),
            hyper,
            train,
            round_idx=round_idx,
            key=key,
        )

    return fast_jit(apply)


@fast_jit
def engine_rows(client, key, train):
    task = local.ClientTask(client, jnp.float32(1), jnp.int32(local.NO_STEP_LIMIT), key)
    indices, _, steps = local.client_batches(SPEC, task, train)
    return indices, steps


def slot_key(key, round_idx: int, client: int, pass_idx: int):
    """The documented rule: fold_in(client_keys(key, r, "train", k), e), from rng's pieces."""
    train_stream = rng.stream(jax.random.fold_in(key, round_idx), "train")
    return jax.random.fold_in(jax.random.fold_in(train_stream, client), pass_idx)


def reference_sgd(w, b, x, y, indices, count):
    """float64 SGD on the masked mean cross-entropy (``test_scaffold_feddyn``'s, with no extra
    term); returns (w, b, loss sum, examples, steps)."""
    examples = math.ceil(WORK.epochs * count)
    steps = min(math.ceil(examples / WORK.batch_size), SPEC.max_steps)
    mask = (np.arange(SPEC.max_steps * WORK.batch_size) < examples).reshape(SPEC.max_steps, -1)
    trained, loss_sum = reference.reference_sgd(
        reference.pack(w, b), (x, y, indices, mask, steps), CLIENT_LR, reference.zeros_like
    )
    layer = trained["Dense_0"]
    return layer["kernel"], layer["bias"], loss_sum, int(mask[:steps].sum()), steps


def reference_round(params, plan_rows, round_idx, key, data, train):
    """Groups one after another, slots one after another, float64; then Σ n_m w_m / Σ n_m."""
    x, y = data.train.x.astype(np.float64), data.train.y
    w0 = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b0 = np.asarray(params["Dense_0"]["bias"], np.float64)
    models_, sizes, loss_sum, examples, tasks = [], [], 0.0, 0, np.zeros(N, int)
    for m, (positions, outcomes) in enumerate(plan_rows):
        w, b, trained = w0, b0, set()
        for s, (position, outcome) in enumerate(zip(positions, outcomes)):
            if outcome != OK:
                continue  # a padding or failed slot: the weights stay with the last holder
            k = int(MEMBERS[m, position])
            indices, engine_steps = jax.device_get(
                engine_rows(jnp.int32(k), slot_key(key, round_idx, k, s // 3), train)
            )
            start, count = data.train.offset[k], data.train.count[k]
            assert np.all((indices >= start) & (indices < start + count)), "foreign rows"
            w, b, client_loss, client_examples, steps = reference_sgd(w, b, x, y, indices, count)
            assert engine_steps == steps
            loss_sum, examples = loss_sum + client_loss, examples + client_examples
            trained.add(k)
            tasks[k] += 1
        models_.append((w, b))
        sizes.append(sum(int(data.train.count[k]) for k in trained))
    n = sum(sizes)
    w = sum(s * wm for s, (wm, _) in zip(sizes, models_)) / n if n else w0
    b = sum(s * bm for s, (_, bm) in zip(sizes, models_)) / n if n else b0
    return {"Dense_0": {"kernel": w, "bias": b}}, loss_sum / max(examples, 1), examples, tasks


@pytest.mark.parametrize("chunk", [None, 1])
def test_group_program_matches_float64_sequential_reference(chunk):
    """Two rounds of PLANS: global model, train loss, examples and the participation table
    equal the float64 reference (rtol 1e-5, atol 1e-6), for one vmap and for chunks of one."""
    data = make_data()
    train, key = device_split(data.train), rng.seed_key(3)
    params = LOGREG.init(rng.stream(key, "init"))
    state = MediatorState(
        ALGORITHM.server_init(params, HYPER, N), jnp.zeros(N, jnp.int32), jnp.float32(0)
    )
    reference, participation = jax.tree.map(lambda a: np.asarray(a, np.float64), params), 0
    for r, plan_rows in enumerate(PLANS):
        state, metrics = jitted_apply(chunk)(
            state, hand_plan(plan_rows), HYPER, train, jnp.int32(r), key
        )
        reference, loss, examples, tasks = reference_round(
            reference, plan_rows, r, key, data, train
        )
        participation = participation + tasks
        got = ALGORITHM.global_params(state.server_state)
        jax.tree.map(
            lambda g, w: np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL), got, reference
        )
        np.testing.assert_allclose(metrics["train_loss"], loss, rtol=RTOL, atol=ATOL)
        assert int(metrics["examples"]) == examples
        np.testing.assert_array_equal(state.participation, participation)
    assert int(metrics["participants"]) == 5  # round 2: group 0 trained nobody


def test_reference_check_can_fail():
    """A plan whose failed slot trained anyway differs from the reference by far more than 1e-5."""
    data = make_data()
    train, key = device_split(data.train), rng.seed_key(3)
    params = LOGREG.init(rng.stream(key, "init"))
    state = MediatorState(
        ALGORITHM.server_init(params, HYPER, N), jnp.zeros(N, jnp.int32), jnp.float32(0)
    )
    rows = PLANS[0]
    cheated = (rows[0], (rows[1][0], [X, X, E, X, X, E]), rows[2])
    state, _ = jitted_apply(None)(state, hand_plan(cheated), HYPER, train, jnp.int32(0), key)
    reference, *_ = reference_round(
        jax.tree.map(lambda a: np.asarray(a, np.float64), params), rows, 0, key, data, train
    )
    got = np.asarray(ALGORITHM.global_params(state.server_state)["Dense_0"]["kernel"])
    assert np.abs(got - reference["Dense_0"]["kernel"]).max() > 1e-3


# ---- (3) independent of group order and chunking ---------------------------------------


def faulty_profiles():
    profiles = uniform_profiles(N, step_time=1.0, bandwidth=400.0, dropout=0.3)
    step_time = jnp.asarray([1.0, 0.5, 2.0, 1.0, 3.0, 0.7], jnp.float32)
    return profiles.replace(step_time=step_time, up_std=jnp.full(N, 100.0))


def run(groups, **kwargs):
    return mediator.run_mediator(
        make_data(), LOGREG, ALGORITHM, groups, rounds=3, work=WORK, max_wait=12.0,
        passes=2, profiles=faulty_profiles(), hyper={"client_lr": CLIENT_LR}, seed=1,
        eval_every=3, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("fault_tolerant", [True, False])
def test_runs_do_not_depend_on_group_order_or_chunking(fault_tolerant):
    heartbeat = 1.0 if fault_tolerant else None
    base = run(GROUPS, heartbeat=heartbeat)
    order = [2, 0, 1]
    shuffled = run(Groups(MEMBERS[order], MASK[order]), heartbeat=heartbeat, chunk=1)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), base.params,
        shuffled.params,
    )  # fmt: skip
    np.testing.assert_array_equal(base.participation, shuffled.participation)
    for name in ("client", "outcome", "seconds"):
        np.testing.assert_array_equal(
            getattr(base.plans, name)[:, order], getattr(shuffled.plans, name)
        )
    for name in ("duration", "clock", "failures", "participants", "examples"):
        np.testing.assert_array_equal(base.round_metrics[name], shuffled.round_metrics[name])
    outcomes = base.plans.outcome
    assert np.any(outcomes == DROPPED) and np.any(outcomes == OK)  # the faults happened
    assert base.plans.seconds.max() <= 12.0  # no slot costs more than T_R
    assert base.evaluations[-1]["round"] == 3 and np.isfinite(base.evaluations[-1]["loss"])


# ---- (4) timing with and without fault tolerance ---------------------------------------


T_R, HEARTBEAT = 10.0, 1.5


def timing_profiles():
    """Clients 0 and 3 work 2 s and 5 s, client 1 needs 400 s (> T_R), client 2 is never ready,
    client 4 always drops (within its 0.3 s of work), client 5 works 0.3 s."""
    never = Availability.from_intervals([np.zeros((0, 2))], 100.0)
    profiles = uniform_profiles(N, step_time=1.0)
    return profiles.replace(
        step_time=jnp.asarray(
            [2.0, 200.0, 1.0, 1.0, 0.15, 0.1], jnp.float32
        ),  # steps 1, 2, 4, 5, 2, 3
        trace=jnp.asarray([-1, -1, 0, -1, -1, -1], jnp.int32),
        dropout=jnp.asarray([0, 0, 0, 0, 1, 0], jnp.float32),
        availability=never,
    )


@functools.cache
def jitted_step(fault_tolerant):
    return fast_jit(Mediator(SPEC, passes=2, fault_tolerant=fault_tolerant).step)


def timed_run(heartbeat, rounds=2):
    """``rounds`` rounds of ``Mediator.step``: (params, participation, metrics [R], plans [R])."""
    members = jnp.asarray([[0, 1, 2, 3], [4, 5, 0, 0]], jnp.int32)
    mask = jnp.asarray([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    key, train = rng.seed_key(2), device_split(make_data().train)
    params = LOGREG.init(rng.stream(key, "init"))
    state = MediatorState(
        ALGORITHM.server_init(params, HYPER, N), jnp.zeros(N, jnp.int32), jnp.float32(0)
    )
    times = timing(T_R, heartbeat=heartbeat, payload_down=60.0, payload_up=60.0)
    rows = []
    for r in range(rounds):
        state, plan, metrics = jitted_step(heartbeat is not None)(
            state, jnp.int32(r), members, mask, timing_profiles(), times, HYPER, train, key
        )
        rows.append(jax.device_get((plan, metrics)))
    plans, metrics = jax.tree.map(lambda *a: np.stack(a), *rows)
    return ALGORITHM.global_params(state.server_state), state.participation, metrics, plans


def test_fault_tolerance_timing_order_and_rollback():
    """Group 0 per pass: clients 0 and 3 work 2 + 5 s; client 1 is LATE (T_R either way);
    client 2 is UNAVAILABLE (heartbeat with FT, T_R without). Group 1: client 4 drops
    (FT: its drop point + heartbeat, at most T_R; without: T_R), client 5 works 0.3 s.
    A round is its longest group; the clock adds rounds up."""
    (ft_params, ft_tasks, ft, ft_plans), (params, tasks, no_ft, plans) = (
        timed_run(HEARTBEAT),
        timed_run(None),
    )
    work = 2.0 + 5.0
    np.testing.assert_allclose(ft_plans.duration[:, 0], 2 * (work + T_R + HEARTBEAT), rtol=1e-6)
    np.testing.assert_allclose(plans.duration[:, 0], 2 * (work + 2 * T_R), rtol=1e-6)
    np.testing.assert_allclose(plans.duration[:, 1], 2 * (T_R + 0.3), rtol=1e-6)
    dropped = ft_plans.seconds[:, 1][ft_plans.outcome[:, 1] == DROPPED]
    assert dropped.size == 4 and np.all((dropped >= HEARTBEAT) & (dropped <= 0.3 + HEARTBEAT))
    for metrics, plan, participation in ((ft, ft_plans, ft_tasks), (no_ft, plans, tasks)):
        np.testing.assert_array_equal(metrics["duration"], plan.duration.max(axis=1))
        np.testing.assert_allclose(metrics["clock"], np.cumsum(metrics["duration"]), rtol=1e-6)
        assert metrics["failures"].tolist() == [6, 6]
        np.testing.assert_array_equal(participation, [4, 0, 0, 4, 0, 4])
    # Without FT the order is fixed; with it the clients that trained least go first.
    assert plans.client[0, 0].tolist() == [0, 1, 2, 3] * 2
    assert ft_plans.client[0, 0].tolist() == [0, 1, 2, 3, 1, 2, 0, 3]
    assert ft_plans.client[1, 0].tolist() == [1, 2, 0, 3, 1, 2, 0, 3]
    assert ft_plans.outcome[0, 0].tolist() == [X, L, U, X, L, U, X, X]
    # Rollback: the failures cost time, not the group's progress.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), ft_params, params)


# ---- (5) bad inputs --------------------------------------------------------------------


def one_line(fn, match):
    with pytest.raises(ValueError, match=match) as err:
        fn()
    assert "\n" not in str(err.value)


def test_bad_inputs_are_refused_in_one_line():
    counts = np.ones((4, 2))
    one_line(lambda: kl_groups(counts, group_size=5), "group_size")
    one_line(lambda: kl_groups(counts, group_size=0), "group_size")
    one_line(lambda: kl_groups(counts, num_groups=5), "num_groups")
    one_line(lambda: kl_groups(counts), "group_size or num_groups")
    one_line(lambda: kl_groups(counts, group_size=2, num_groups=2), "group_size or num_groups")
    one_line(lambda: kl_groups(np.zeros((2, 2)), group_size=1), "class_counts")
    one_line(lambda: Groups(np.zeros((2, 2)), np.array([[1, 1], [0, 0]])), "group 1 is empty")
    one_line(lambda: Groups(np.zeros((1, 2)), np.ones((1, 2))), "distinct")
    one_line(lambda: timing(0.0), "max_wait")
    one_line(lambda: timing(-1.0), "max_wait")
    one_line(lambda: timing(math.inf), "max_wait")
    one_line(lambda: timing(5.0, heartbeat=6.0), "heartbeat")
    one_line(lambda: Mediator(SPEC, passes=0), "passes")
    one_line(lambda: Mediator(SPEC, chunk=0), "chunk")
    bad_spec = local.LocalSpec(LOGREG, scaffold(), WORK, SPEC.max_steps, SPEC.max_count)
    one_line(lambda: Mediator(bad_spec), "fedavg's client hooks")
    data = make_data()
    common = {"rounds": 1, "work": WORK, "max_wait": 1.0}
    one_line(
        lambda: mediator.run_mediator(
            data, LOGREG, ALGORITHM, Groups(np.array([[0, N]]), np.ones((1, 2))), **common
        ),
        "groups name client",
    )
    one_line(
        lambda: mediator.run_mediator(
            data, LOGREG, ALGORITHM, GROUPS, profiles=uniform_profiles(N + 1), **common
        ),
        "profiles hold",
    )
    one_line(
        lambda: mediator.run_mediator(data, LOGREG, ALGORITHM, GROUPS, **{**common, "rounds": 0}),
        "rounds",
    )
