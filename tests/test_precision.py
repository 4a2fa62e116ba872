"""Local training in bfloat16 with float32 master params, update and aggregation.

Tolerance: one round of an MLP in bfloat16 moves the global model within
5e-2 of the float32 round, relative to the float32 update's norm (bfloat16
keeps 8 bits of mantissa: about 4e-3 per operation; measured 1-2e-2 here),
and must differ from it (the option must do something).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import config, local, models, rng
from fedjax_het.algorithms import fedavg, fedprox
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.round import Round, device_split, init_state
from fedjax_het.sampling import uniform

WORK = LocalWork(batch_size=8, epochs=2)


def make_data(tokens: bool = False) -> FederatedData:
    gen = np.random.default_rng(0)
    sizes = (12, 5, 20, 9)
    if tokens:
        xs = [gen.integers(0, 20, (n, 6)).astype(np.int32) for n in sizes]
        ys = [gen.integers(0, 20, n).astype(np.int32) for n in sizes]
        return FederatedData.from_client_arrays(xs, ys, num_classes=20)
    xs = [gen.normal(size=(n, 10)).astype(np.float32) for n in sizes]
    ys = [gen.integers(0, 4, n).astype(np.int32) for n in sizes]
    return FederatedData.from_client_arrays(xs, ys, num_classes=4)


def one_round(model, algorithm, data, precision: str, hyper=None):
    """The global params before and after one round of all four clients."""
    max_count = int(data.train.count.max())
    spec = local.LocalSpec(model, algorithm, WORK, WORK.static_steps(max_count), max_count,
                           precision=precision)
    round_ = Round(model, algorithm, uniform(4, 4), spec, chunk=2)
    hyper, key = algorithm.hyper(hyper or {"client_lr": 0.1}), rng.seed_key(0)
    state = init_state(model, algorithm, 4, hyper, key)
    step = jax.jit(functools.partial(round_.step, hyper=hyper, train=device_split(data.train),
                                     key=key))
    new_state, _ = step(state, jnp.int32(0))
    return (algorithm.global_params(state.server_state),
            algorithm.global_params(new_state.server_state))


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("algorithm", [fedavg(), fedprox()], ids=["fedavg", "fedprox"])
def test_bfloat16_round_is_close_to_float32_and_keeps_float32_params(algorithm):
    data, model = make_data(), models.mlp((10,), 4, hidden=(32,))
    start, full = one_round(model, algorithm, data, "float32")
    _, low = one_round(model, algorithm, data, "bfloat16")
    assert {x.dtype for x in jax.tree.leaves(low)} == {jnp.dtype(jnp.float32)}
    update = np.linalg.norm(flat(full) - flat(start))
    error = np.linalg.norm(flat(low) - flat(full)) / update
    assert 0 < error < 5e-2


def test_float32_precision_is_the_default_bit_for_bit():
    data, model = make_data(), models.mlp((10,), 4, hidden=(32,))
    _, explicit = one_round(model, fedavg(), data, "float32")
    max_count = int(data.train.count.max())
    default = local.LocalSpec(model, fedavg(), WORK, WORK.static_steps(max_count), max_count)
    assert default.precision == "float32"
    jax.tree.map(np.testing.assert_array_equal, explicit,
                 one_round(model, fedavg(), data, default.precision)[1])


def test_the_cast_covers_every_float_leaf_and_nothing_else():
    tree = {"w": jnp.ones(3), "ids": jnp.arange(3), "mask": jnp.ones(3, bool),
            "key": jax.random.key(0), "h": jnp.ones((), jnp.float16)}
    cast = local.in_bfloat16(tree)
    assert cast["w"].dtype == cast["h"].dtype == jnp.bfloat16
    assert cast["ids"].dtype == jnp.int32 and cast["mask"].dtype == jnp.bool_
    assert jax.dtypes.issubdtype(cast["key"].dtype, jax.dtypes.prng_key)


def test_token_models_train_in_bfloat16():
    data = make_data(tokens=True)
    model = models.char_gru((6,), 20, embed=8, hidden=16, layers=1)
    start, low = one_round(model, fedavg(), data, "bfloat16")
    assert np.all(np.isfinite(flat(low))) and not np.allclose(flat(low), flat(start))


def test_config_accepts_bfloat16_and_refuses_other_precisions():
    base = ['data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3",
            "model.name=logistic_regression"]
    e = config.build(config.load(None, [*base, 'engine.precision="bfloat16"']))
    assert e.run_kwargs()["precision"] == "bfloat16"
    with pytest.raises(config.ConfigError, match="engine.precision must be one of"):
        config.build(config.load(None, [*base, 'engine.precision="float16"']))
