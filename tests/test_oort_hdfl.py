"""Utility-driven selection in the loop: Oort, HDFL (with LS-FL, its over-selection baseline).

References are float64 numpy written from the papers' equations, independent of the
selections' code. Closed-form checks: rtol 1e-5 (float32 against float64). Sampling checks:
Monte-Carlo frequencies within about 5 standard errors of the exact probabilities.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform
from fedjax_het.sampling.hdfl import (
    HDFLState,
    hdfl,
    log_weights,
    ls_fl,
    mutualism_probabilities,
    selection_probabilities,
    underestimation,
)
from fedjax_het.sampling.oort import OortState, exploration_share, oort, pace, utility
from fedjax_het.system import setup
from fedjax_het.system.policy import num_selected
from fedjax_het.system.sampler import ClientRecord, ClientReport
from fedjax_het.system.schedule import OK, schedule_round
from fedjax_het.training import online, simulate
from fedjax_het.training.options import run_options

N, M = 8, 3
DATA = leaf_synthetic(num_clients=N, alpha=0.5, beta=0.5, num_features=4, num_classes=3)
MODEL = models.logistic_regression(DATA.example_shape, DATA.num_classes)
WORK = LocalWork(batch_size=5, epochs=1)


def hellinger(p, q):
    p, q = p / p.sum(), q / q.sum()
    return np.sqrt(0.5) * np.linalg.norm(np.sqrt(p) - np.sqrt(q))


def report(seconds, dropout=None, examples=None) -> ClientReport:
    n = len(seconds)
    dropout = np.zeros(n) if dropout is None else dropout
    examples = np.full(n, 10) if examples is None else examples
    return ClientReport(
        jnp.asarray(seconds, jnp.float32), jnp.asarray(dropout, jnp.float32),
        jnp.asarray(examples, jnp.int32),
    )


def hdfl_draws(select, uei, rep: ClientReport, keys, ready=None):
    """``select`` over many keys: ids ``[draws, slots]`` and valid."""
    n = rep.seconds.shape[0]
    ready = jnp.ones(n, bool) if ready is None else ready
    state, record = HDFLState(jnp.asarray(uei, jnp.float32)), ClientRecord.empty(n)
    one = lambda key: select.select(key, 0, ready, record, state, rep)[:2]
    return jax.jit(jax.vmap(one))(keys)


# ---------------------------------------------------------------- HDFL


def test_uei_is_the_hellinger_distance_of_the_class_histograms():
    rng = np.random.default_rng(0)
    predicted = rng.integers(0, 6, (5, 4)).astype(np.float64)
    actual = rng.integers(0, 6, (5, 4)).astype(np.float64)
    predicted[0], actual[1, 2] = 0, 0  # client 0 has no rows; a class absent from client 1
    actual[0] = 0
    want = [0.0] + [hellinger(predicted[i], actual[i]) for i in range(1, 5)]
    np.testing.assert_allclose(underestimation(predicted, actual), want, rtol=1e-5, atol=1e-6)
    same = underestimation(jnp.array([[1.0, 3.0]]), jnp.array([[2.0, 6.0]]))
    np.testing.assert_allclose(same, [0.0], atol=1e-3)  # same proportions


def test_the_profile_runs_every_i_rounds_on_the_global_model_and_losses_are_squared():
    """OnlineRound's profile (lax.cond at round % I == 0) and record, against numpy."""
    profiles = setup.profiles_from_options(N, step_time=0.1, bandwidth=1e6)
    policy = setup.policy_from_options(kind="wait_all")
    built = simulate.Setup.build(
        DATA, MODEL, fedavg(), uniform(N, M), rounds=3, work=WORK, hyper={"client_lr": 0.5},
        eval_every=1, chunk=2, unroll=1, weighting="uniform", eval_batch_size=64,
    )
    key = jax.random.key(3)
    inputs = online.RoundInputs(
        built.hyper, built.train, key, profiles,
        jnp.asarray(simulate.steps_needed(built.round.spec, DATA.train.count)), jnp.ones(1),
    )

    def numpy_forward(params):
        kernel, bias = (np.asarray(params["Dense_0"][k], np.float64) for k in ("kernel", "bias"))
        for k in range(N):
            x, y = DATA.train.client(k)
            yield x.reshape(len(x), -1) @ kernel + bias, y

    def numpy_uei(params):
        return [
            hellinger(np.bincount(np.argmax(logits, -1), minlength=3), np.bincount(y, minlength=3))
            for logits, y in numpy_forward(params)
        ]

    # HDFL's profile every 2 rounds, and squared losses asked for too (Oort asks for them).
    selection = dataclasses.replace(hdfl(N, M, profile_every=2), loss_squares=True)
    program = online.OnlineRound(built.round, policy, selection, profile_batch_size=7)
    block = jax.jit(program.run_block)  # 7 rows a batch: divides no client's rows
    states = [built.on_mesh(program.init(built.init(key), N))]  # placed as blocks return it
    for r in range(3):
        states.append(block(states[-1], jnp.arange(r, r + 1), inputs)[0])
    assert block._cache_size() == 1
    initial = states[0].run.server_state.params
    np.testing.assert_allclose(states[1].selection.uei, numpy_uei(initial), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(states[2].selection.uei, states[1].selection.uei)  # round 1
    np.testing.assert_allclose(  # round 2: the model after rounds 0 and 1
        states[3].selection.uei, numpy_uei(states[2].run.server_state.params), rtol=1e-5,
        atol=1e-6,
    )
    # Round 0's squared losses: the initial model on each trained example (1 epoch: all rows).
    record = states[1].record
    selected = set(np.flatnonzero(np.asarray(record.last_selected) == 0).tolist())
    assert len(selected) == M and (np.asarray(record.last_aggregated) == 0).sum() == M
    for k, (logits, y) in enumerate(numpy_forward(initial)):
        top = logits.max(1, keepdims=True)
        loss = (np.log(np.exp(logits - top).sum(1, keepdims=True)) + top)[:, 0]
        loss -= logits[np.arange(len(y)), y]
        if k in selected:
            np.testing.assert_allclose(record.loss_sq[k], np.mean(loss**2), rtol=1e-5)
            assert record.examples[k] == len(y)
        else:
            assert np.isnan(record.loss_sq[k]) and record.last_selected[k] == -1


def test_hdfl_probabilities_follow_eqs_5_to_7_and_9_with_the_sign_corrected():
    uei = np.array([0.1, 0.5, 0.9, 0.3, 0.0, 0.7])
    examples = np.array([10, 40, 20, 30, 25, 5])
    cdr = np.array([0.0, 0.5, 0.97, 1.0, 0.2, 0.4])
    latency = np.array([3.0, 5.0, 4.0, 7.5, 6.0, 5.5])
    ready = np.array([True, True, True, True, True, False])
    beta, cap, tau = 2.0, 0.95, 1.5

    def numpy_s(cap):
        cuei = uei / (examples / examples.mean())
        c = np.minimum(cdr, cap)
        g = np.where(c < 1, np.exp(beta * cuei) / np.where(c < 1, 1 - c, 1), np.exp(beta * cuei))
        g = np.where(ready, g, 0.0)
        return g / g.sum()

    for cdr_cap in (cap, 1.0):  # the notes' cap; Eq. 6 as printed (CDR = 1 weighs 1)
        got = selection_probabilities(
            log_weights(jnp.asarray(uei), jnp.asarray(examples), jnp.asarray(cdr), beta=beta,
                        cdr_cap=cdr_cap),
            jnp.asarray(ready),
        )
        np.testing.assert_allclose(got, numpy_s(cdr_cap), rtol=1e-5, atol=1e-7)
    s = numpy_s(cap)
    for anchor in range(5):
        w = s * np.exp(-np.abs(latency - latency[anchor]) / tau)  # Eq. 9, exp(-|.|)
        np.testing.assert_allclose(
            mutualism_probabilities(jnp.asarray(s), jnp.asarray(latency), anchor, tau=tau),
            w / w.sum(), rtol=1e-5, atol=1e-7,
        )

    # The sampler draws (anchor, second) with probability S_d * S'_n / (1 - S'_d).
    draws = 20_000
    select = hdfl(6, 2, beta=beta, tau=tau, cdr_max=1.0, cdr_cap=cap)
    ids, valid = hdfl_draws(
        select, uei, report(latency, cdr, examples), jax.random.split(jax.random.key(0), draws),
        ready=jnp.asarray(ready),
    )
    assert bool(valid.all())
    want = np.zeros((6, 6))
    for d in range(6):
        w = s * np.exp(-np.abs(latency - latency[d]) / tau)
        w[d] = 0
        want[d] = s[d] * w / max(w.sum(), 1e-300)
    got = np.zeros((6, 6))
    np.add.at(got, (np.asarray(ids[:, 0]), np.asarray(ids[:, 1])), 1.0 / draws)
    np.testing.assert_allclose(got, want, atol=5 * np.sqrt(want.max() / draws))


def test_mutualism_lowers_the_expected_slowest_latency():
    """Notes' Monte-Carlo (179 clients, 10 a round, L ~ N(5, 1.5)): 7.30 s uniform, 6.43 s."""
    n, k, populations, draws = 179, 10, 20, 200
    rng = np.random.default_rng(1)
    latency = np.maximum(rng.normal(5.0, 1.5, (populations, n)), 0.1)
    uniform_ids = np.argsort(rng.random((populations, draws, n)), axis=-1)[..., :k]
    uniform_max = np.take_along_axis(latency[:, None, :], uniform_ids, -1).max(-1).mean()
    select = hdfl(n, k, tau=1.0, cdr_max=1.0)
    state, record, ready = HDFLState(jnp.zeros(n)), ClientRecord.empty(n), jnp.ones(n, bool)

    def slowest(seconds, key):
        ids, _, _ = select.select(key, 0, ready, record, state, report(seconds))
        return jnp.max(seconds[ids])

    keys = jax.random.split(jax.random.key(2), populations * draws).reshape(populations, draws)
    per_population = jax.vmap(lambda L, ks: jax.vmap(lambda key: slowest(L, key))(ks))
    mutual = float(jax.jit(per_population)(jnp.asarray(latency, jnp.float32), keys).mean())
    assert abs(uniform_max - 7.30) < 0.1 and abs(mutual - 6.43) < 0.1
    assert mutual < 0.9 * uniform_max


def test_cdr_max_holds_whenever_some_selection_meets_it():
    cdr = np.array([0.9, 0.9, 0.9, 0.9, 0.9, 0.05, 0.1, 0.1])  # high CDR is weighted up (Eq. 6)
    rep, keys = report(np.arange(8.0), cdr), jax.random.split(jax.random.key(4), 300)

    def mean_cdr(cdr_max, ready=None, max_draws=10):
        select = hdfl(8, 3, cdr_max=cdr_max, max_draws=max_draws)
        ids, valid = hdfl_draws(select, np.zeros(8), rep, keys, ready)
        ids = np.asarray(ids)
        assert all(len(set(row)) == 3 for row in ids) and bool(valid.all())
        return cdr[ids].mean(axis=1)

    assert np.mean(mean_cdr(1.0) > 0.4) > 0.5  # unconstrained draws mostly break the bound
    assert np.all(mean_cdr(0.4) <= 0.4 + 1e-6)
    assert np.all(mean_cdr(0.4, max_draws=1) <= 0.4 + 1e-6)  # the repair alone
    # Infeasible (only one low-CDR client ready): the lowest achievable mean.
    ready = jnp.asarray([True] * 6 + [False] * 2)
    np.testing.assert_allclose(mean_cdr(0.4, ready), (0.9 + 0.9 + 0.05) / 3, rtol=1e-5)


def test_ls_fl_keeps_exactly_the_first_m_finishers_of_ceil_four_thirds_m():
    for m, n in ((3, 6), (10, 20)):
        policy = ls_fl()
        slots = int(num_selected(m, policy.over_commit))
        assert slots == math.ceil(m * 4 / 3 - 1e-9)  # 4 of 3, 14 of 10
        step_time = jnp.asarray(np.random.default_rng(m).permutation(n) + 1.0, jnp.float32)
        profiles = setup.profiles_from_options(n, bandwidth=math.inf).replace(step_time=step_time)
        ids = jnp.arange(slots, dtype=jnp.int32)
        row, _ = jax.jit(functools.partial(
            schedule_round, round_idx=0, start=0.0, key=jax.random.key(0), selected=ids,
            valid=jnp.ones(slots, bool), steps_needed=2, payload_down=0.0, payload_up=0.0,
            cohort_size=m,
        ))(profiles, policy)
        ok = np.asarray(row.outcome) == OK
        fastest = np.argsort(np.asarray(step_time)[:slots])[:m]
        assert ok.sum() == m and set(np.flatnonzero(ok)) == set(fastest.tolist())
        np.testing.assert_allclose(row.duration, 2 * np.sort(np.asarray(step_time)[:slots])[m - 1])
    with pytest.raises(ValueError, match="fixes over_commit"):
        ls_fl(over_commit=0.5)


# ---------------------------------------------------------------- Oort


def oort_record(rng, n, explored, round_idx):
    record = ClientRecord.empty(n)
    examples = rng.integers(5, 50, n)
    loss_sq = rng.uniform(0.1, 4.0, n)
    seconds = rng.uniform(1.0, 10.0, n)
    last = rng.integers(0, max(round_idx, 1), n)
    return record.replace(
        loss_sq=jnp.asarray(np.where(explored, loss_sq, np.nan), jnp.float32),
        examples=jnp.asarray(np.where(explored, examples, 0), jnp.int32),
        seconds=jnp.asarray(np.where(explored, seconds, np.nan), jnp.float32),
        last_selected=jnp.asarray(np.where(explored, last, -1), jnp.int32),
        last_aggregated=jnp.asarray(np.where(explored, last, -1), jnp.int32),
    )


def test_oort_utility_against_the_paper():
    """Util = (clipped, min-max scaled |B| sqrt(mean loss^2) + sqrt(0.1 log R / L)) (T/t)^alpha."""
    rng, n, round_idx = np.random.default_rng(5), 12, 30
    explored = np.arange(n) < 9
    record = oort_record(rng, n, explored, round_idx)
    estimate = rng.uniform(1.0, 10.0, n)
    duration = np.where(explored, np.asarray(record.seconds, np.float64), estimate)
    preferred = np.quantile(duration, 0.3)
    got = utility(record, jnp.asarray(duration, jnp.float32), jnp.float32(preferred), round_idx,
                  clip_quantile=0.9, staleness=0.1, penalty=2.0)

    big_u = np.asarray(record.examples, np.float64) * np.sqrt(np.asarray(record.loss_sq, float))
    clipped = np.minimum(big_u[explored], np.quantile(big_u[explored], 0.9))
    scaled = (clipped - clipped.min()) / (clipped.max() - clipped.min())
    last_round = np.asarray(record.last_selected)[explored] + 1.0  # 1-based, as R
    bonus = np.sqrt(0.1 * np.log(round_idx + 1.0) / last_round)
    t = duration[explored]
    system = np.where(t > preferred, (preferred / t) ** 2.0, 1.0)
    np.testing.assert_allclose(got[explored], (scaled + bonus) * system, rtol=1e-5)
    assert np.all(np.isnan(np.asarray(got)[~explored]))
    # Staleness: same statistical utility and speed, selected longer ago -> larger utility.
    stale = record.replace(last_selected=record.last_selected.at[0].set(0).at[1].set(20),
                           loss_sq=record.loss_sq.at[1].set(record.loss_sq[0]),
                           examples=record.examples.at[1].set(record.examples[0]))
    fast = jnp.full(n, preferred / 2, jnp.float32)
    util = utility(stale, fast, jnp.float32(preferred), round_idx)
    bonus = np.sqrt(0.1 * np.log(round_idx + 1.0) / np.array([1.0, 21.0]))
    np.testing.assert_allclose(util[0] - util[1], bonus[0] - bonus[1], rtol=1e-4)


def test_oort_explores_an_epsilon_share_of_never_observed_clients_by_speed():
    rng, n, k = np.random.default_rng(6), 40, 10
    explored = np.arange(n) < 20
    state = OortState(jnp.float32(0.3), jnp.float32(0), jnp.float32(jnp.nan))
    rep = report(rng.uniform(1.0, 10.0, n))
    select = jax.jit(oort(n, k).select)
    for round_idx in (0, 20, 50, 100):
        record = oort_record(rng, n, explored, round_idx)
        epsilon = max(0.9 * 0.98**round_idx, 0.2)
        np.testing.assert_allclose(exploration_share(round_idx), epsilon, rtol=1e-5)
        ids, valid, _ = select(jax.random.key(round_idx), round_idx, jnp.ones(n, bool),
                               record, state, rep)
        ids = np.asarray(ids)
        assert bool(valid.all()) and len(set(ids.tolist())) == k
        assert explored[ids].sum() == math.floor(k * (1 - epsilon) + 1e-9)
    # Round 0, nothing explored, one slot: P(i) = speed_i / sum(speed), speed = 1 / seconds.
    seconds = np.array([1.0, 2.0, 4.0, 8.0])
    select, draws = oort(4, 1), 20_000
    one = lambda key: select.select(key, 0, jnp.ones(4, bool), ClientRecord.empty(4),
                                    select.init(4), report(seconds))[0][0]
    picks = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(7), draws))
    want = (1 / seconds) / (1 / seconds).sum()
    got = np.bincount(np.asarray(picks), minlength=4) / draws
    np.testing.assert_allclose(got, want, atol=5 * np.sqrt(want.max() / draws))


def test_oort_exploits_only_above_the_cut_off_proportionally_to_utility():
    n, k, round_idx = 6, 2, 200  # epsilon = 0.2: floor(2 * 0.8) = 1 exploited, 1 explored
    record = ClientRecord.empty(n).replace(
        loss_sq=jnp.asarray([1.0, 1.0, 0.01, 0.0, np.nan, np.nan], jnp.float32),
        examples=jnp.asarray([100, 90, 10, 1, 0, 0], jnp.int32),
        seconds=jnp.asarray([1.0, 1.0, 1.0, 1.0, np.nan, np.nan], jnp.float32),
        last_selected=jnp.full(n, round_idx - 1, jnp.int32),
    )
    state = OortState(jnp.float32(1.0), jnp.float32(0), jnp.float32(jnp.nan))
    select = oort(n, k, cut_off=0.8)
    one = lambda key: select.select(key, round_idx, jnp.ones(n, bool), record, state,
                                    report(np.ones(n)))[0]
    ids = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(8), 4000)))
    exploited = np.where(ids < 4, ids, -1).max(axis=1)
    assert set(exploited.tolist()) == {0, 1}  # 2 and 3 are below 0.8 x the best
    util = np.asarray(utility(record, jnp.ones(n), jnp.inf, round_idx))[:2]
    np.testing.assert_allclose(np.mean(exploited == 0), util[0] / util.sum(), atol=0.04)
    assert np.all(ids.max(axis=1) >= 4)  # the other slot explores


def test_the_pacer_relaxes_the_preferred_duration_when_utility_drops():
    window, delta = 2, 0.1
    utilities = [5.0, 5.0, 3.0, 3.0, 4.0, 4.0, 1.0, 1.0]  # windows: 10, 6, 8, 2
    state = OortState(jnp.float32(0.3), jnp.float32(0), jnp.float32(jnp.nan))
    quantiles = []
    for r in range(1, 9):  # before round r, the client that counted in round r - 1 reports
        record = ClientRecord.empty(1).replace(
            loss_sq=jnp.asarray([utilities[r - 1] ** 2], jnp.float32),
            examples=jnp.ones(1, jnp.int32), last_aggregated=jnp.asarray([r - 1], jnp.int32),
        )
        state = pace(state, record, r, window=window, delta=delta)
        quantiles.append(float(state.quantile))
    # Compared at rounds 4 (6 < 10: relax), 6 (8 > 6: keep) and 8 (2 < 8: relax).
    np.testing.assert_allclose(quantiles, [0.3, 0.3, 0.3, 0.4, 0.4, 0.4, 0.4, 0.5], rtol=1e-6)


# ---------------------------------------------------------------- in simulate.run


@pytest.mark.parametrize("name", ["oort", "hdfl"])
def test_a_run_selects_distinct_clients_and_compiles_once(name):
    profiles = setup.profiles_from_options(
        N, devices="lognormal", step_time=0.1, step_time_sigma=0.8, bandwidth=1e3,
        availability="bernoulli", availability_p=0.8, dropout=0.2,
    )
    sys = setup.System(profiles, setup.policy_from_options(kind="wait_all", over_commit=0.34))
    slots = int(num_selected(M, sys.policy.over_commit))
    selection = oort(N, slots, pacer_window=2) if name == "oort" else hdfl(N, slots,
                                                                            profile_every=2)
    traces = []

    def counted(*args):
        traces.append(1)
        return selection.select(*args)

    history = simulate.run(
        DATA,
        *run_options(
            model=MODEL,
            algorithm=fedavg(),
            sampler=uniform(N, M),
            system=sys,
            select=dataclasses.replace(selection, select=counted),
            rounds=6,
            eval_every=2,
            work=WORK,
            hyper={"client_lr": 0.1},
            progress=False,
            weighting="uniform" if name == "hdfl" else "examples",
        ),
    )
    assert len(traces) == 1  # three blocks, one compilation
    s = history.schedule
    selected, valid = np.asarray(s.selected), np.asarray(s.valid)
    assert selected.shape == (6, slots) and valid.any()
    for ids, ok in zip(selected, valid):
        assert len(set(ids[ok].tolist())) == ok.sum()
    assert ((np.asarray(s.outcome) == OK).sum(axis=1) <= M).all()  # over-commit keeps m
    assert np.isfinite(history.summary["final_test_accuracy"])
