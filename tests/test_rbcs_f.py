"""RBCS-F: the bandit's time estimates, the virtual queues, the per-round drift-plus-penalty
problem solved exactly, the fairness guarantee, and a run through a config.

The references are float64 numpy written from the paper's equations (ridge regression,
virtual queues, a brute force over every K-subset), independent of the selection's code.
"""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import selection_runs

from fedjax_het.sampling import rbcs_f
from fedjax_het.sampling.rbcs_f import RBCSFState
from fedjax_het.system.sampler import ClientRecord, ClientReport

N, K = 7, 3
SECONDS = np.array([3.0, 1.0, 6.0, 2.0, 1.5, 4.0, 2.5])
REPORT = ClientReport(jnp.asarray(SECONDS, jnp.float32), jnp.zeros(N), jnp.full(N, 10))


def objective(chosen, tau, queue, tradeoff) -> float:
    """The drift-plus-penalty of a selection: ``V max tau - sum Z``."""
    chosen = list(chosen)
    return tradeoff * max(tau[chosen]) - queue[chosen].sum()


def brute_force(tau, queue, ready, tradeoff):
    """The K ready clients minimising ``objective`` (fewer ready: all of them)."""
    pool = np.flatnonzero(ready)
    if len(pool) <= K:
        return set(pool.tolist())
    return set(min(itertools.combinations(pool, K),
                   key=lambda s: objective(s, tau, queue, tradeoff)))


def numpy_rounds(measured, ready, *, tradeoff, beta, alpha, ridge):
    """Each round: learn from last round's counted clients, estimate, select, queue."""
    unit = SECONDS.mean()
    c = np.stack([np.ones(N), SECONDS / unit], 1)
    h, b, z, out = ridge * np.eye(2), np.zeros(2), np.zeros(N), []
    last = set()
    for r in range(len(measured)):
        for i in last:
            h += np.outer(c[i], c[i])
            b += measured[r - 1][i] / unit * c[i]
        inv = np.linalg.inv(h)
        tau = c @ inv @ b - alpha * np.sqrt(np.einsum("nd,de,ne->n", c, inv, c))
        chosen = brute_force(tau, z, ready[r], tradeoff)
        x = np.isin(np.arange(N), list(chosen)).astype(float)
        z = np.maximum(z + beta - x, 0)
        out.append((chosen, z.copy()))
        last = chosen
    return out


def test_rounds_match_the_paper_against_numpy():
    """Estimates, exact per-round solution and queues over 12 rounds; times are measured
    (noisy, 1.3x the reported seconds), some clients unavailable in some rounds."""
    rng = np.random.default_rng(0)
    rounds = 12
    measured = 1.3 * SECONDS * rng.uniform(0.9, 1.1, (rounds, N))
    ready = rng.random((rounds, N)) < 0.8
    ready[3, :] = [True, True, False, False, False, False, False]  # fewer ready than K
    options = {"tradeoff": 2.0, "fairness": 0.9, "confidence": 0.3, "ridge": 0.5}
    want = numpy_rounds(measured, ready, tradeoff=2.0, beta=0.9 * K / N, alpha=0.3, ridge=0.5)
    select = rbcs_f(N, K, **options)
    step = jax.jit(select.select)
    state, record = select.init(N), ClientRecord.empty(N)
    for r in range(rounds):
        ids, valid, state = step(jax.random.key(r), r, jnp.asarray(ready[r]), record, state,
                                 REPORT)
        chosen, queue = want[r]
        got = set(np.asarray(ids)[np.asarray(valid)].tolist())
        assert got == chosen, f"round {r}"
        np.testing.assert_allclose(state.queue, queue, rtol=1e-5, atol=1e-6)
        picked = np.asarray(ids)[np.asarray(valid)]
        record = record.replace(  # every selected client finishes and counts
            seconds=record.seconds.at[picked].set(measured[r][picked]),
            last_aggregated=record.last_aggregated.at[picked].set(r),
        )
    # After 12 rounds the estimate has learnt the 1.3x scale: every client's tau-hat is within
    # 10 % of its measured mean (ridge prior, noise), in units of the mean reported seconds.
    theta = np.linalg.solve(np.asarray(state.gram, np.float64), np.asarray(state.moment))
    c = np.stack([np.ones(N), SECONDS / SECONDS.mean()], 1)
    np.testing.assert_allclose(c @ theta, 1.3 * SECONDS / SECONDS.mean(), rtol=0.1)


def test_the_per_round_problem_is_solved_exactly_on_random_instances():
    rng = np.random.default_rng(1)
    select = rbcs_f(N, K, tradeoff=1.5, confidence=0.0)
    step = jax.jit(select.select)
    for trial in range(20):
        queue = rng.exponential(1.0, N).astype(np.float32)
        gram, moment = np.eye(2, dtype=np.float32), rng.normal(1, 0.5, 2).astype(np.float32)
        state = RBCSFState(jnp.asarray(queue), jnp.asarray(gram), jnp.asarray(moment))
        ready = rng.random(N) < 0.85
        ids, valid, _ = step(jax.random.key(0), 0, jnp.asarray(ready), ClientRecord.empty(N),
                             state, REPORT)
        c = np.stack([np.ones(N), SECONDS / SECONDS.mean()], 1)
        tau = c @ moment.astype(np.float64)
        got = np.asarray(ids)[np.asarray(valid)]
        assert len(set(got.tolist())) == len(got) == min(K, ready.sum())
        assert ready[got].all()
        want = brute_force(tau, queue, ready, 1.5)
        assert objective(got, tau, queue, 1.5) == pytest.approx(
            objective(want, tau, queue, 1.5), rel=1e-5, abs=1e-5), f"trial {trial}"


def test_every_client_gets_at_least_its_minimum_rate_in_the_long_run():
    """A toy population with a six-fold speed gap, V large: the fast clients would win every
    round, yet every client's selection rate reaches ``beta = fairness K / N``."""
    n, k, rounds = 10, 2, 3000
    seconds = jnp.linspace(1.0, 6.0, n)
    report = ClientReport(seconds, jnp.zeros(n), jnp.full(n, 10))
    select = rbcs_f(n, k, tradeoff=20.0, fairness=0.8, confidence=0.0)
    record = ClientRecord.empty(n).replace(seconds=seconds)

    def one_round(state, r):
        ids, valid, state = select.select(
            jax.random.key(0), r, jnp.ones(n, bool), record.replace(
                last_aggregated=jnp.full(n, r - 1)), state, report)
        return state, jnp.zeros(n).at[ids].max(valid.astype(jnp.float32))

    _, chosen = jax.lax.scan(one_round, select.init(n), jnp.arange(rounds))
    rate = np.asarray(chosen).mean(0)
    beta = 0.8 * k / n
    assert np.all(rate >= beta - 0.01), rate
    assert rate[0] > rate[-1]  # the fastest client is still preferred
    assert np.asarray(chosen).sum(1).max() == k


def test_only_ready_distinct_clients_and_the_key_does_not_matter():
    select = rbcs_f(N, K)
    ready = jnp.asarray([True, False, True, True, False, True, True])
    run = lambda key: select.select(key, 0, ready, ClientRecord.empty(N), select.init(N), REPORT)
    (ids_a, valid_a, _), (ids_b, valid_b, _) = run(jax.random.key(0)), run(jax.random.key(9))
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_array_equal(valid_a, valid_b)
    picked = np.asarray(ids_a)[np.asarray(valid_a)]
    assert len(set(picked.tolist())) == K and np.asarray(ready)[picked].all()


@pytest.mark.parametrize(
    ("options", "message"),
    [({"fairness": 1.5}, "fairness must be in [0, 1], got 1.5"),
     ({"fairness": -0.1}, "fairness must be in [0, 1]"),
     ({"tradeoff": -1.0}, "need tradeoff >= 0"),
     ({"ridge": 0.0}, "ridge > 0")],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        rbcs_f(N, K, **options)
    assert "\n" not in str(err.value)


def test_a_config_runs_fedavg_with_rbcs_f():
    experiment = selection_runs.build(
        "model.name=logistic_regression", "rounds=4", "eval_every=4",
        "system.devices=lognormal", 'selection.name="rbcs_f"', "selection.tradeoff=5.0",
    )
    assert experiment.config["selection"] == {
        "name": "rbcs_f", "tradeoff": 5.0, "fairness": 0.5, "confidence": 0.1, "ridge": 1.0}
    selection_runs.run_with_distinct_cohorts(experiment)
    selection_runs.assert_refused_in_one_line(
        "fairness", 'selection.name="rbcs_f"', "selection.fairness=2.0")
