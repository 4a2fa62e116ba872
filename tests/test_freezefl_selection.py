"""FreezeFL's client selection (Eqs. 5-8): utilities, warm restarts, the draw, the engine's
measurements (work kept, update alignment) and a run through a config.

References are float64 numpy loops written from the paper's equations, independent of the
selection's code; float32 against float64 at rtol 1e-5. Sampling checks: Monte-Carlo
frequencies within 5 standard errors of the exact successive-sampling probabilities.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import selection_runs

from fedjax_het import models
from fedjax_het.algorithms import freezefl
from fedjax_het.algorithms.freezefl import depth_masks
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import freezefl_selection, uniform
from fedjax_het.sampling.freezefl_selection import FreezeFLState
from fedjax_het.system import setup
from fedjax_het.system.sampler import ClientRecord, ClientReport
from fedjax_het.training import freeze_pricing, online, simulate

N = 7
REPORT = ClientReport(jnp.ones(N), jnp.zeros(N), jnp.full(N, 10))


def records(rounds: int, seed: int = 0) -> list[ClientRecord]:
    """What the server has seen before each round: some clients' updates count each round,
    with a work share and an alignment (negative ones included); client 6 never counts."""
    rng = np.random.default_rng(seed)
    record, out = ClientRecord.empty(N), []
    for r in range(rounds):
        out.append(record)
        counted = rng.random(N) < 0.5
        counted[6] = False
        ids = np.flatnonzero(counted)
        record = record.replace(
            aggregated=record.aggregated.at[ids].add(1),
            last_aggregated=record.last_aggregated.at[ids].set(r),
            work_kept=record.work_kept.at[ids].set(rng.choice([0.25, 0.5, 1.0], len(ids))),
            alignment=record.alignment.at[ids].set(rng.normal(0.5, 1.0, len(ids))),
        )
    return out


def numpy_utilities(recs, *, period, ema, restarts=True):
    """Eq. 7 after each counted round, Eq. 8 every ``period`` rounds, in float64."""
    u, base, out = np.full(N, np.nan), np.zeros(N), []
    for r, rec in enumerate(recs):
        last = np.asarray(rec.last_aggregated)
        x = np.asarray(rec.work_kept, np.float64) * np.maximum(np.asarray(rec.alignment), 0)
        for k in range(N):
            if r > 0 and last[k] == r - 1:
                u[k] = x[k] if np.isnan(u[k]) else ema * u[k] + (1 - ema) * x[k]
        agg = np.asarray(rec.aggregated, np.float64)
        if restarts and r > 0 and r % period == 0:
            seen = ~np.isnan(u)
            scale = u[seen].max() if u[seen].max() > 0 else 1.0
            v, mean = u / scale, np.mean(u[seen] / scale)
            for k in np.flatnonzero(seen):
                phi = agg[k] - base[k]
                bound = np.sqrt(2 * np.log(period) / phi) if phi > 0 else np.inf
                v[k] = min(mean, v[k] + bound) if v[k] < mean else max(mean, v[k] - bound)
            u, base = v * scale, agg.copy()
        out.append(u.copy())
    return out


def run_rounds(select, recs, ready=None):
    ready = jnp.ones(N, bool) if ready is None else ready
    state, states, draws = select.init(N), [], []
    step = jax.jit(select.select)
    for r, rec in enumerate(recs):
        ids, valid, state = step(jax.random.key(r), r, ready, rec, state, REPORT)
        states.append(state)
        draws.append((np.asarray(ids), np.asarray(valid)))
    return states, draws


@pytest.mark.parametrize("restarts", [True, False])
def test_utilities_follow_eqs_5_to_8_against_numpy(restarts):
    recs = records(10)
    states, _ = run_rounds(freezefl_selection(N, 3, restart_every=3, ema=0.3,
                                              warm_restarts=restarts), recs)
    want = numpy_utilities(recs, period=3, ema=0.3, restarts=restarts)
    for r, (state, expected) in enumerate(zip(states, want)):
        np.testing.assert_allclose(state.utility, expected, rtol=1e-5, err_msg=f"round {r}")
    assert np.isnan(states[-1].utility[6])  # never counted: never observed
    if restarts:  # the counts of phi_k restart at round 9 (the last multiple of 3)
        np.testing.assert_array_equal(states[-1].counted_at_restart, recs[9].aggregated)


def test_a_warm_restart_moves_every_utility_toward_the_mean_without_crossing_it():
    u = jnp.array([0.1, 0.2, 0.9, 1.0, 0.5, 0.05, jnp.nan])
    counted = jnp.array([1, 9, 1, 9, 4, 0, 0], jnp.int32)
    record = ClientRecord.empty(N).replace(aggregated=counted)
    select = freezefl_selection(N, 2, restart_every=60)
    _, _, state = select.select(jax.random.key(0), 60, jnp.ones(N, bool), record,
                                FreezeFLState(u, jnp.zeros(N, jnp.int32)), REPORT)
    before, after = np.asarray(u[:6]), np.asarray(state.utility[:6])
    mean = before.mean()
    assert np.all(np.abs(after - mean) <= np.abs(before - mean) + 1e-7)
    assert np.all(np.sign(after - mean) * np.sign(before - mean) >= 0)  # none crosses
    assert after.std() < 0.6 * before.std()
    # Less participation, a wider bound: client 0 (phi 1) moves further than client 1 (phi 9).
    assert after[0] - before[0] > after[1] - before[1] > 0
    assert after[5] == pytest.approx(mean)  # phi 0: onto the mean
    assert np.isnan(state.utility[6])


def exact_first_pick(weights):
    return weights / weights.sum()


def test_the_draw_is_proportional_to_utility_among_ready_clients_and_deterministic():
    u = jnp.array([0.0, 1.0, 3.0, 2.0, 4.0, jnp.nan, 0.0])  # 5: never observed, weighs the mean
    ready = jnp.array([True, True, True, True, False, True, True])
    state = FreezeFLState(u, jnp.zeros(N, jnp.int32))
    select = freezefl_selection(N, 3)
    one = lambda key: select.select(key, 1, ready, ClientRecord.empty(N), state, REPORT)[:2]
    keys = jax.random.split(jax.random.key(1), 4000)
    ids, valid = jax.jit(jax.vmap(one))(keys)
    ids, valid = np.asarray(ids), np.asarray(valid)
    assert valid.all()
    assert all(len(set(row)) == 3 for row in ids)
    assert not np.isin(ids, [4]).any()  # not ready
    assert not np.isin(ids, [0, 6]).any()  # utility 0: enough positive ready clients
    weights = np.array([0, 1, 3, 2, 0, 10 / 6, 0])  # the mean over the six observed: 10 / 6
    p = exact_first_pick(weights)
    freq = np.bincount(ids[:, 0], minlength=N) / len(keys)
    se = np.sqrt(p * (1 - p) / len(keys)) + 1e-12
    assert np.all(np.abs(freq - p) <= 5 * se)
    again = jax.jit(jax.vmap(one))(keys[:5])[0]
    np.testing.assert_array_equal(again, ids[:5])


def test_slots_left_go_to_ready_clients_of_utility_zero_then_stay_invalid():
    u = jnp.array([0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    state = FreezeFLState(u, jnp.zeros(N, jnp.int32))
    select = freezefl_selection(N, 4)
    ready = jnp.array([True, True, True, False, False, False, False])
    ids, valid, _ = select.select(jax.random.key(2), 1, ready, ClientRecord.empty(N), state,
                                  REPORT)
    assert valid.tolist() == [True, True, True, False]
    assert ids[0] == 1 and set(ids[:3].tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [({"restart_every": 0}, "restart_every (Phi) must be >= 1"),
     ({"ema": 1.0}, "ema must be in [0, 1)"),
     ({"ema": -0.1}, "ema must be in [0, 1)")],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        freezefl_selection(N, 2, **options)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- the engine's measurements


def test_the_engine_records_work_kept_and_the_first_order_alignment():
    """Two rounds of FreezeFL (beta large: slow clients freeze) with its selection: each
    counted client's ``work_kept`` is ``(L - n_k) / L`` and its alignment is, in float64,
    ``sum_l <-tau_k m_k grad F_k(w_r), w_{r+1} - w_r>_l / dim_l``."""
    data = leaf_synthetic(num_clients=N, alpha=0.5, beta=0.5, num_features=4, num_classes=3)
    model = models.mlp(data.example_shape, data.num_classes, hidden=(5,))
    profiles = setup.profiles_from_options(N, devices="lognormal", step_time=0.1,
                                           step_time_sigma=1.0, bandwidth=1e5)
    built = simulate.Setup.build(
        data, model, freezefl(beta=50.0, epochs=2), uniform(N, 4), rounds=2,
        work=LocalWork(batch_size=5, epochs=2), hyper={"client_lr": 0.3}, eval_every=1,
        chunk=2, unroll=1, weighting="examples", eval_batch_size=64,
    )
    key = jax.random.key(5)
    spec = built.round.spec
    params0 = built.init(key).server_state.params
    masks = depth_masks(params0)
    inputs = online.RoundInputs(
        built.hyper, built.train, key, profiles,
        jnp.asarray(simulate.steps_needed(spec, data.train.count)),
        jnp.asarray(freeze_pricing.step_costs(spec, built.hyper, built.train, masks)),
    )
    program = online.OnlineRound(built.round, setup.policy_from_options(kind="wait_all"),
                                 freezefl_selection(N, 4))
    block = jax.jit(program.run_block)
    states = [program.init(built.init(key), N)]
    for r in range(2):
        states.append(block(states[-1], jnp.arange(r, r + 1), inputs)[0])
    layers = len(params0)
    kept_some = False
    for r in range(2):
        before, after = (states[r + i].run.server_state.params for i in (0, 1))
        record = states[r + 1].record
        counted = np.flatnonzero(np.asarray(record.last_aggregated) == r)
        assert len(counted) == 4
        for k in counted:
            depth = round((1 - float(record.work_kept[k])) * layers)
            assert float(record.work_kept[k]) == pytest.approx((layers - depth) / layers)
            kept_some |= depth > 0
            x, y = data.train.client(k)
            grad = mlp_gradient(before, np.asarray(x, np.float64).reshape(len(y), -1), y)
            steps = int(np.ceil(2 * len(y) / 5))  # two epochs in batches of 5
            want = 0.0
            for i, name in enumerate(before):
                if i >= depth:  # frozen layers are neither trained nor in Eq. 6's sum
                    moved = flat(after[name]) - flat(before[name])
                    want += -steps * grad[name] @ moved / moved.size
            np.testing.assert_allclose(record.alignment[k], want, rtol=1e-4, atol=1e-9)
    assert kept_some  # some slow client froze a layer in round 1


def flat(layer) -> np.ndarray:
    """A layer's bias then kernel, flattened, in float64."""
    return np.concatenate([np.ravel(np.asarray(layer[k], np.float64)) for k in ("bias", "kernel")])


def mlp_gradient(params, x, y) -> dict[str, np.ndarray]:
    """Per layer, ``flat`` of the gradient of the mean cross-entropy of a one-hidden-layer
    ReLU MLP, by hand in float64."""
    w0, b0, w1, b1 = (np.asarray(params[layer][k], np.float64)
                      for layer in ("Dense_0", "Dense_1") for k in ("kernel", "bias"))
    h = np.maximum(x @ w0 + b0, 0)
    logits = h @ w1 + b1
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = (p - np.eye(logits.shape[1])[y]) / len(y)
    dh = (d @ w1.T) * (h > 0)
    layer = lambda gb, gw: np.concatenate([gb.ravel(), gw.ravel()])
    return {"Dense_0": layer(dh.sum(0), x.T @ dh), "Dense_1": layer(d.sum(0), h.T @ d)}


# ---------------------------------------------------------------- through a config


def test_a_config_runs_freezefl_with_its_selection_and_warm_restarts():
    experiment = selection_runs.build(
        "model.name=logistic_regression", "rounds=5", "eval_every=5",
        'algorithm.name="freezefl"', 'selection.name="freezefl"', "selection.restart_every=2",
    )
    assert experiment.config["selection"] == {
        "name": "freezefl", "restart_every": 2, "warm_restarts": True, "ema": 0.5}
    selection_runs.run_with_distinct_cohorts(experiment)


def test_a_bad_option_in_the_config_is_one_line():
    selection_runs.assert_refused_in_one_line(
        "restart_every", 'selection.name="freezefl"', "selection.restart_every=0")
