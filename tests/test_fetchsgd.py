"""FetchSGD (``algorithms/fetchsgd.py``) against numpy: the Count Sketch, its unsketch, and the
server's momentum and error in sketch space over three rounds.

Only the hash functions come from the engine (``CountSketch.draw``, like a seed shared by
clients and server); sketching, estimating, top-k and the bucket zeroing are recomputed here.
Integer-valued vectors make the sketch sums exact in any order (bitwise checks); the server's
rounds use float updates and are compared at rtol 1e-6.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms.fetchsgd import CountSketch, fetchsgd
from fedjax_het.data import LocalWork
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.engine.hooks import PayloadBytes
from fedjax_het.front.config import ConfigError, build, load
from fedjax_het.sampling import uniform
from fedjax_het.training import simulate
from fedjax_het.training.options import run_options

D = 40
SKETCH = CountSketch.draw(D, rows=3, cols=16, seed=5)


def numpy_sketch(vector, buckets, signs, cols):
    table = np.zeros((buckets.shape[0], cols))
    for j in range(buckets.shape[0]):
        np.add.at(table[j], buckets[j], signs[j] * vector)
    return table


def numpy_estimate(table, buckets, signs):
    return np.median(np.stack([signs[j] * table[j, buckets[j]] for j in range(len(table))]), 0)


def numpy_top_k(vector, k):
    keep = np.argsort(-np.abs(vector), kind="stable")[:k]
    out = np.zeros_like(vector)
    out[keep] = vector[keep]
    return out


def test_sketch_and_estimate_equal_numpy():
    vector = np.random.default_rng(0).integers(-9, 10, D).astype(np.float32)
    buckets, signs = np.asarray(SKETCH.buckets), np.asarray(SKETCH.signs)
    table = numpy_sketch(vector, buckets, signs, SKETCH.cols)
    np.testing.assert_array_equal(SKETCH.sketch(jnp.asarray(vector)), table)
    np.testing.assert_array_equal(SKETCH.estimate(jnp.asarray(table, jnp.float32)),
                                  numpy_estimate(table, buckets, signs))  # fmt: skip


def test_heavy_hitters_come_back_from_the_sketch():
    vector = np.random.default_rng(1).normal(0, 0.01, D).astype(np.float32)
    vector[[3, 17, 31]] = [5.0, -4.0, 6.0]
    sketch = CountSketch.draw(40, rows=5, cols=64, seed=5)  # room enough for three heavy hitters
    estimate = sketch.estimate(sketch.sketch(jnp.asarray(vector)))
    assert set(np.argsort(-np.abs(np.asarray(estimate)))[:3]) == {3, 17, 31}


def test_three_server_rounds_equal_numpy():
    rows, cols, k, rho, lr = 3, 16, 0.1, 0.9, 0.5
    algorithm = fetchsgd(rows=rows, cols=cols, k=k, momentum=rho, server_lr=lr, seed=5)
    params = {"w": jnp.zeros((8, 5), jnp.float32)}  # d = 40: the hashes of SKETCH
    hyper = algorithm.hyper()
    state = algorithm.server_init(params, hyper, 4)
    buckets, signs = np.asarray(SKETCH.buckets), np.asarray(SKETCH.signs)
    x, s_u, s_e = np.zeros(40), np.zeros((rows, cols)), np.zeros((rows, cols))
    gen = np.random.default_rng(2)
    for _ in range(3):
        mean = gen.normal(size=40).astype(np.float32)
        state = algorithm.server_update(state, {"w": jnp.asarray(mean.reshape(8, 5))}, hyper)
        s_u = rho * s_u + numpy_sketch(mean, buckets, signs, cols)
        s_e = s_e + s_u
        delta = numpy_top_k(numpy_estimate(s_e, buckets, signs), 4)
        touched = numpy_sketch(np.abs(delta) > 0, buckets, np.ones_like(signs), cols) > 0
        s_u, s_e = np.where(touched, 0, s_u), np.where(touched, 0, s_e)
        x = x - lr * delta
        np.testing.assert_allclose(state.params["w"].reshape(-1), x, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(state.momentum, s_u, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(state.error, s_e, rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(x) > 4  # several rounds moved different coordinates


def test_fetchsgd_trains_and_uploads_its_sketch():
    data = leaf_synthetic(num_clients=6, alpha=0.5, beta=0.5, num_features=6, num_classes=3)
    model = models.mlp(data.example_shape, data.num_classes, hidden=(8,))
    algorithm = fetchsgd(rows=3, cols=20, k=0.2)
    history = simulate.run(
        data,
        *run_options(
            model=model,
            algorithm=algorithm,
            sampler=uniform(6, 3),
            rounds=8,
            eval_every=4,
            work=LocalWork(batch_size=5, epochs=1),
            progress=False,
            devices=1,
            hyper={"client_lr": 0.1},
        ),
    )  # fmt: skip
    assert history.metrics[-1]["test_loss"] < history.metrics[0]["test_loss"]
    shapes = jax.eval_shape(model.init, jax.random.key(0))
    assert algorithm.hook(PayloadBytes).count(shapes) == (4 * 83, 4 * 3 * 20)


@pytest.mark.parametrize("override", ["algorithm.k=0.0", "algorithm.rows=0", "algorithm.momentum=1.0"])
def test_impossible_settings_are_one_line_errors(override):
    with pytest.raises(ConfigError) as err:
        build(load(None, ["algorithm.name='fetchsgd'", override]))
    assert "\n" not in str(err.value)
