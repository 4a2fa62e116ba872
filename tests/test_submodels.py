"""Sub-models as masks (algorithms/submodels.py; FjORD, HeteroFL, FedRolex).

The engine's rounds of mixed widths are checked against a float64 per-client sequential
reference written here in numpy (an MLP 5-6-3 with its masks built independently, FjORD's
per-step widths redrawn from each step's key), over ``test_scaffold_feddyn``'s rounds:
ragged clients, step limits, a weight-0 client that trains, a round in which nobody counts,
chunks of 2 (not dividing the cohort of 3) and 3; FjORD's draws also at chunk 1. HeteroFL
and FedRolex run both as masks and as dense programs per width level (``-dense``,
``engine.groups``; ``test_dense_levels`` has the rest of that path).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import test_scaffold_feddyn as base

from fedjax_het import models, rng
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.fedrolex import fedrolex
from fedjax_het.algorithms.fjord import fjord
from fedjax_het.algorithms.heterofl import heterofl
from fedjax_het.algorithms.submodels import unit_layout, width_mask
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import masked_mean
from fedjax_het.engine.round import Round, init_state
from fedjax_het.system.sampler import Sampler

H = 6
MLP = models.mlp((base.F,), base.C, hidden=(H,))
LEVELS = (0, 1, 2, 1)  # each client's width level
WIDTHS = (1.0, 0.5, 0.2)  # kept hidden units: 6, 3, 2


@functools.cache
def make_round(algorithm, chunk: int = 2, model=MLP) -> Round:
    ids = jnp.arange(3, dtype=jnp.int32)
    sampler = Sampler(select=lambda key, r: ids, num_clients=base.N, cohort_size=3)
    spec = local.LocalSpec(model, algorithm, base.WORK, base.WORK.static_steps(max(base.SIZES)),
                           max(base.SIZES))
    return Round(model, algorithm, sampler, spec, chunk=chunk)


def engine_rounds(algorithm, chunk: int, rounds=base.ROUNDS):
    """The global params after each round, and each round's task keys."""
    key, train = rng.seed_key(3), base.device_split(base.make_store())
    round_, hyper = make_round(algorithm, chunk), algorithm.hyper()
    state = init_state(MLP, algorithm, base.N, hyper, key)
    out = [base.as64(algorithm.global_params(state.server_state))]
    keys = []
    for r, (ids, limits, weights) in enumerate(rounds):
        tasks = base.make_tasks(r, ids, limits, weights, key)
        keys.append(tasks.key)
        state, _, _ = base.train_cohort(round_, state, jnp.asarray(ids, jnp.int32), tasks, hyper,
                                        train)
        out.append(base.as64(algorithm.global_params(state.server_state)))
    return out, keys, make_round(algorithm, chunk).spec


# ---- the float64 reference ---------------------------------------------------------------


def keep(ratio: float, offset: int, n: int = H) -> np.ndarray:
    return (((np.arange(n) - offset) % n) < math.ceil(round(ratio * n, 9))).astype(np.float64)


def masks(ratio: float, offset: int, scaled: bool):
    """The MLP's (mask, forward factors) at ``ratio``: hidden units kept by ``keep``."""
    u = keep(ratio, offset)
    scale = 1.0 / ratio if scaled else 1.0
    mask = {"Dense_0": {"kernel": np.ones((base.F, 1)) * u, "bias": u},
            "Dense_1": {"kernel": u[:, None] * np.ones((1, base.C)), "bias": np.ones(base.C)}}
    factors = jax.tree.map(lambda m: m, mask)
    factors["Dense_1"]["kernel"] = mask["Dense_1"]["kernel"] * scale
    return mask, factors


def sgd_step(p, f, mask, xb, yb, m, lr):
    """One masked SGD step of the MLP at forward factors ``f``: (params, loss sum)."""
    w1, b1 = p["Dense_0"]["kernel"] * f["Dense_0"]["kernel"], p["Dense_0"]["bias"] * f["Dense_0"]["bias"]
    w2, b2 = p["Dense_1"]["kernel"] * f["Dense_1"]["kernel"], p["Dense_1"]["bias"]
    z = xb @ w1 + b1
    h = np.maximum(z, 0)
    logits = h @ w2 + b2
    top = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - top)
    losses = top[:, 0] + np.log(e.sum(axis=1)) - logits[np.arange(len(yb)), yb]
    g = (e / e.sum(axis=1, keepdims=True) - np.eye(base.C)[yb]) * (m / max(m.sum(), 1.0))[:, None]
    dz = (g @ w2.T) * (z > 0)
    grads = {"Dense_0": {"kernel": (xb.T @ dz) * f["Dense_0"]["kernel"],
                         "bias": dz.sum(axis=0) * f["Dense_0"]["bias"]},
             "Dense_1": {"kernel": (h.T @ g) * f["Dense_1"]["kernel"], "bias": g.sum(axis=0)}}
    p = jax.tree.map(lambda w, d, k: w - lr * d * k, p, grads, mask)
    return p, float(losses @ m)


def reference_rounds(x, keys, spec, *, draw: bool, rolling: bool, scaled: bool, rounds=base.ROUNDS):
    store = base.make_store()
    out = [x]
    for r, (ids, limits, weights) in enumerate(rounds):
        offset = r if rolling else 0
        pairs = []
        for slot, k in enumerate(ids):
            count, start_row = int(store.count[k]), int(store.offset[k])
            steps, ex_mask = base.expected_work(count, spec.max_steps, limits[slot])
            task = local.ClientTask(jnp.int32(k), jnp.float32(1), jnp.int32(limits[slot]),
                                    keys[r][slot])
            indices, _, _ = local.client_batches(spec, task, base.device_split(store))
            indices = np.asarray(indices)
            p = x
            for s in range(steps):
                level = LEVELS[k]
                if draw:
                    step_key = jax.random.fold_in(rng.stream(keys[r][slot], "train"), s)
                    level = int(jax.random.randint(rng.stream(step_key, "submodel"), (), level,
                                                   len(WIDTHS), jnp.int32))
                    assert LEVELS[k] <= level < len(WIDTHS)  # FjORD: p <= p_max(k)
                mask, f = masks(WIDTHS[level], offset, scaled)
                rows = indices[s]
                assert np.all((rows >= start_row) & (rows < start_row + count))
                p, _ = sgd_step(p, f, mask, store.x[rows].astype(np.float64), store.y[rows],
                                ex_mask[s].astype(np.float64), 0.05)
            trained, _ = masks(WIDTHS[LEVELS[k]], offset, False)
            pairs.append((jax.tree.map(np.subtract, x, p), trained, weights[slot]))
        def mean(*leaves):
            us, ms = leaves[: len(pairs)], leaves[len(pairs):]
            num = sum(w * m * u for (_, _, w), u, m in zip(pairs, us, ms) if w > 0)
            den = sum(w * np.broadcast_to(m, u.shape) for (_, _, w), u, m in zip(pairs, us, ms) if w > 0)
            den = np.broadcast_to(den, us[0].shape)
            return np.where(den > 0, num / np.where(den > 0, den, 1), 0)
        agg = jax.tree.map(mean, *[u for u, _, _ in pairs], *[m for _, m, _ in pairs])
        x = jax.tree.map(lambda a, d: a - d, x, agg)
        out.append(x)
    return out


CASES = {
    "heterofl": (heterofl(widths=WIDTHS, client_levels=LEVELS, dense_groups=False),
                 dict(draw=False, rolling=False, scaled=True)),
    "fedrolex": (fedrolex(widths=WIDTHS, client_levels=LEVELS, dense_groups=False),
                 dict(draw=False, rolling=True, scaled=True)),
    "fjord": (fjord(widths=WIDTHS, client_levels=LEVELS), dict(draw=True, rolling=False, scaled=False)),
    # Each level's clients as a dense program of the cut model (engine.groups).
    "heterofl-dense": (heterofl(widths=WIDTHS, client_levels=LEVELS, dense_groups=True),
                       dict(draw=False, rolling=False, scaled=True)),
    "fedrolex-dense": (fedrolex(widths=WIDTHS, client_levels=LEVELS, dense_groups=True),
                       dict(draw=False, rolling=True, scaled=True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("chunk", [2, 3])  # 2 does not divide the cohort of 3
def test_mixed_widths_match_the_float64_per_client_reference(name, chunk):
    algorithm, options = CASES[name]
    got, keys, spec = engine_rounds(algorithm, chunk)
    want = reference_rounds(got[0], keys, spec, **options)
    for a, b in zip(got, want):
        base.tree_close(a, b)


def test_ratio_one_is_the_full_model_bit_for_bit():
    full = heterofl(widths=(1.0,), client_levels=(0,) * base.N)
    got, _, _ = engine_rounds(full, 2)
    want, _, _ = engine_rounds(fedavg(aggregator=masked_mean()), 2)  # the same aggregation
    plain, _, _ = engine_rounds(fedavg(), 2)  # weighted_mean divides exactly too
    for a, b, c in zip(got, want, plain):
        jax.tree.map(np.testing.assert_array_equal, a, b)
        jax.tree.map(np.testing.assert_array_equal, a, c)
    for model, x in [(models.femnist_cnn((28, 28, 1), 10), jnp.ones((2, 28, 28, 1))),
                     (models.char_lstm((10,), 20, hidden=8), jnp.ones((2, 10), jnp.int32))]:
        params = model.init(jax.random.key(0))
        mask = width_mask(unit_layout(model, params, x, (1.0, 0.5)), 0, scaler=True)
        plain = model.apply(params, x, train=False, key=None)
        masked = local.masked_model(model, mask).apply(params, x, train=False, key=None)
        np.testing.assert_array_equal(plain, masked)


def test_dropped_units_get_exactly_zero_update_even_with_momentum_and_weight_decay():
    def optimizer(h):  # weight decay moves every param whose update is not masked
        return optax.chain(optax.add_decayed_weights(0.1), optax.sgd(h["client_lr"], momentum=0.9))

    base_algorithm = fjord(widths=WIDTHS, client_levels=LEVELS)
    algorithm = dataclasses.replace(
        base_algorithm, local=dataclasses.replace(base_algorithm.local, optimizer=optimizer))
    key, train = rng.seed_key(3), base.device_split(base.make_store())
    spec, hyper = make_round(algorithm).spec, algorithm.hyper()
    state = init_state(MLP, algorithm, base.N, hyper, key)
    payload = algorithm.broadcast(state.server_state)
    task = local.ClientTask(jnp.int32(2), jnp.float32(1), jnp.int32(base.NO), key)
    update, _, stats = local.local_update(spec, hyper, payload, (), task, train)
    kept = keep(WIDTHS[LEVELS[2]], 0)  # client 2: p_max = 0.2, 2 of 6 units
    kernel = np.asarray(update["Dense_0"]["kernel"])
    assert np.all(kernel[:, kept == 0] == 0) and np.any(kernel[:, kept == 1] != 0)
    assert np.all(np.asarray(update["Dense_1"]["kernel"])[kept == 0] == 0)
    np.testing.assert_array_equal(np.broadcast_to(stats.trained["Dense_0"]["bias"], (H,)), kept)


def test_fedrolex_window_advances_one_unit_a_round():
    layout = unit_layout(MLP, MLP.init(jax.random.key(0)), jnp.ones((1, base.F)), WIDTHS)
    windows = [np.asarray(width_mask(layout, 1, r)["Dense_0"]["bias"]) for r in range(H + 1)]
    for r, window in enumerate(windows):
        np.testing.assert_array_equal(window, keep(0.5, r))
    np.testing.assert_array_equal(windows[0], windows[H])  # mod units
    algorithm = fedrolex(widths=WIDTHS, client_levels=LEVELS)
    state = init_state(MLP, algorithm, base.N, algorithm.hyper(), rng.seed_key(0))
    moved = algorithm.server_update(state.server_state, algorithm.global_params(state.server_state),
                                    algorithm.hyper())
    assert int(moved.round) == 1 and int(state.server_state.round) == 0


def test_fjord_draws_are_reproducible_from_the_key():
    algorithm = fjord(widths=WIDTHS, client_levels=LEVELS)
    once, _, _ = engine_rounds(algorithm, 1, base.ROUNDS[:1])  # one client at a time, no vmap
    again, _, _ = engine_rounds(algorithm, 3, base.ROUNDS[:1])
    jax.tree.map(np.testing.assert_array_equal, once[-1], again[-1])


@pytest.mark.parametrize("build, message", [
    (lambda: heterofl(widths=(1.0, 1.5)), "must lie in (0, 1]"),
    (lambda: fjord(widths=(1.0, 0.0)), "must lie in (0, 1]"),
    (lambda: fedrolex(widths=(0.5, 1.0)), "strictly decreasing"),
    (lambda: heterofl(widths=(1.0, 0.5, 0.5)), "strictly decreasing"),
    (lambda: heterofl(widths=(1.0, 0.5), client_levels=(0, 2)), "not an index"),
])
def test_bad_width_options_are_one_line_errors(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")) as err:
        build()
    assert "\n" not in str(err.value)


def test_a_model_without_hidden_units_is_refused_in_one_line():
    model = models.logistic_regression((base.F,), base.C)
    with pytest.raises(ValueError, match="no hidden units") as err:
        unit_layout(model, model.init(jax.random.key(0)), jnp.ones((1, base.F)))
    assert "\n" not in str(err.value)
