"""Training follows the schedule: steps done become step masks, failures have no influence."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_het
from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.engine import local
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.sampling import uniform
from fedjax_het.system import setup
from fedjax_het.system.sampler import Sampler
from fedjax_het.system.schedule import DROPPED, LATE, OK, UNAVAILABLE, Schedule
from fedjax_het.training.options import run_options

NUM_CLIENTS = 4
DATA = leaf_synthetic(num_clients=NUM_CLIENTS, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
MODEL = models.logistic_regression(DATA.example_shape, DATA.num_classes)
ALGORITHM = fedavg()
WORK = LocalWork(batch_size=5, epochs=2)


def plan(outcome, steps_done) -> Schedule:
    """One round's plan over clients 0..3 in slot order."""
    m = len(outcome)
    zeros = jnp.zeros((m,), jnp.float32)
    return Schedule(
        selected=jnp.arange(m, dtype=jnp.int32), valid=jnp.ones((m,), bool),
        outcome=jnp.asarray(outcome, jnp.int32), steps_done=jnp.asarray(steps_done, jnp.int32),
        version=jnp.zeros((m,), jnp.int32), start=jnp.float32(0), duration=jnp.float32(1),
        clock=jnp.float32(1), finish=zeros, bytes_down=zeros, bytes_up=zeros,
    )


def setting(poison_client=None):
    train = DATA.train
    if poison_client is not None:
        x = train.x.copy()
        start, n = int(train.offset[poison_client]), int(train.count[poison_client])
        x[start : start + n] = np.nan
        train = type(train)(x, train.y, train.offset, train.count)
    max_count = int(train.count.max())
    spec = local.LocalSpec(MODEL, ALGORITHM, WORK, WORK.static_steps(max_count), max_count)
    sampler = Sampler(select=None, num_clients=NUM_CLIENTS, cohort_size=NUM_CLIENTS)
    round_ = Round(MODEL, ALGORITHM, sampler, spec, chunk=2)
    key = jax.random.key(7)
    hyper = ALGORITHM.hyper({"client_lr": 0.1})
    state = init_state(MODEL, ALGORITHM, NUM_CLIENTS, hyper, key)
    return round_, spec, state, hyper, device_split(train), key


@functools.partial(jax.jit, static_argnums=0)
def planned_round(round_, state, hyper, split, key, plan):
    new_state, _ = round_.step(state, jnp.int32(0), hyper, split, key, plan)
    return ALGORITHM.global_params(new_state.server_state)


def alone(round_, spec, state, hyper, split, key, client, steps):
    """Client ``client`` trained on its own for exactly ``steps`` steps; its final params."""
    _, tasks = round_.cohort(jnp.int32(0), split, key, plan([OK] * NUM_CLIENTS, [0] * NUM_CLIENTS))
    task = jax.tree.map(lambda t: t[client], tasks).replace(step_limit=jnp.int32(steps))
    broadcast = ALGORITHM.broadcast(state.server_state)
    update, _, stats = jax.jit(local.local_update, static_argnums=0)(
        spec, hyper, broadcast, (), task, split
    )
    assert int(stats.steps) == steps
    return jax.tree.map(lambda b, u: b - u, broadcast, update)


def fedavg_of(params_by_client: dict[int, object]):
    weights = {k: float(DATA.train.count[k]) for k in params_by_client}
    total = sum(weights.values())
    leaves = [jax.tree.map(lambda p, k=k: weights[k] / total * np.asarray(p, np.float64), params)
              for k, params in params_by_client.items()]
    return jax.tree.map(lambda *xs: sum(xs), *leaves)


def test_each_client_trains_exactly_its_scheduled_steps():
    round_, spec, state, hyper, split, key = setting()
    steps = [1, 2, 0, 3]
    got = planned_round(round_, state, hyper, split, key, plan([OK] * 4, steps))
    expected = fedavg_of({k: alone(round_, spec, state, hyper, split, key, k, s)
                          for k, s in enumerate(steps)})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, expected)


@pytest.mark.parametrize("failure", [LATE, DROPPED, UNAVAILABLE])
def test_a_failed_client_has_no_influence_even_with_nan_data(failure):
    round_, spec, state, hyper, split, key = setting(poison_client=2)
    steps = [2, 2, 5, 1]
    got = planned_round(round_, state, hyper, split, key, plan([OK, OK, failure, OK], steps))
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(got))
    clean = setting()
    expected = fedavg_of({k: alone(*clean, k, steps[k]) for k in (0, 1, 3)})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, expected)


def run(system=None, rounds=6):
    return fedjax_het.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=ALGORITHM,
            sampler=uniform(NUM_CLIENTS, 2),
            rounds=rounds,
            work=WORK,
            hyper={"client_lr": 0.1},
            eval_every=3,
            progress=False,
            system=system,
        ),
    )


def test_a_homogeneous_system_reproduces_the_plain_run_bitwise():
    plain = run()
    homogeneous = run(setup.System(setup.profiles_from_options(NUM_CLIENTS),
                                   setup.policy_from_options(kind="wait_all")))
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(homogeneous.params)):
        np.testing.assert_array_equal(a, b)
    assert [m["test_accuracy"] for m in plain.metrics] == [
        m["test_accuracy"] for m in homogeneous.metrics
    ]


def test_run_metrics_follow_the_schedule():
    profiles = setup.profiles_from_options(
        NUM_CLIENTS, devices="lognormal", step_time=1.0, step_time_sigma=1.5, dropout=0.2
    )
    policy = setup.policy_from_options(kind="deadline", deadline=4.0, overhead=1.0)
    history = run(setup.System(profiles, policy))
    s = jax.device_get(history.schedule)
    ok = (s.outcome == OK) & s.valid
    np.testing.assert_array_equal(history.round_metrics["participants"], ok.sum(axis=1))
    assert history.metrics[-1]["virtual_s"] == pytest.approx(float(s.clock[-1]))
    assert np.all(np.diff(s.clock) > 0)
    outcomes = history.summary["outcomes"]
    assert sum(outcomes.values()) == int(s.valid.sum())
    assert outcomes["ok"] == int(ok.sum())
