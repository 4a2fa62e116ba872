"""Local training in bfloat16: the model's passes in bfloat16, everything else float32.

Tolerance: one round of a small MLP with the model in bfloat16 moves the
global model within 2e-2 of the float32 round, relative to the float32
update's norm (bfloat16 keeps 8 bits of mantissa, about 4e-3 per rounding;
measured 4e-3 for FedAvg and for FedProx at ``mu = 5``), and must differ from
it (the option must do something). FedProx at ``mu = 5`` is there because
its proximal term is the part that must stay float32: run in bfloat16 it
moves the round by 7.5e-2, past the tolerance.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models, rng
from fedjax_het.algorithms import fedavg, fedprox
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.engine import local
from fedjax_het.engine.algorithm import model_loss
from fedjax_het.engine.round import Round, device_split, init_state
from fedjax_het.front import config
from fedjax_het.sampling import uniform

WORK = LocalWork(batch_size=8, epochs=2)
BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)


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


def spec_for(model, algorithm, data, precision: str) -> local.LocalSpec:
    max_count = int(data.train.count.max())
    return local.LocalSpec(
        model, algorithm, WORK, WORK.static_steps(max_count), max_count, precision=precision
    )


def one_round(model, algorithm, data, precision: str, hyper=None):
    """The global params before and after one round of all four clients."""
    round_ = Round(model, algorithm, uniform(4, 4), spec_for(model, algorithm, data, precision),
                   chunk=2)
    hyper, key = algorithm.hyper({"client_lr": 0.1, **(hyper or {})}), rng.seed_key(0)
    state = init_state(model, algorithm, 4, hyper, key)
    step = jax.jit(functools.partial(round_.step, hyper=hyper, train=device_split(data.train),
                                     key=key))
    new_state, _ = step(state, jnp.int32(0))
    return (algorithm.global_params(state.server_state),
            algorithm.global_params(new_state.server_state))


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize(
    "algorithm, hyper", [(fedavg(), {}), (fedprox(), {"prox_mu": 5.0})], ids=["fedavg", "fedprox"]
)
def test_bfloat16_round_is_close_to_float32_and_keeps_float32_params(algorithm, hyper):
    data, model = make_data(), models.mlp((10,), 4, hidden=(32,))
    start, full = one_round(model, algorithm, data, "float32", hyper)
    _, low = one_round(model, algorithm, data, "bfloat16", hyper)
    assert {x.dtype for x in jax.tree.leaves(low)} == {F32}
    error = np.linalg.norm(flat(low) - flat(full)) / np.linalg.norm(flat(full) - flat(start))
    assert 0 < error < 2e-2


@pytest.mark.parametrize("tokens", [False, True], ids=["features", "tokens"])
def test_only_the_model_sees_bfloat16(tokens):
    """Every float leaf the model's ``apply`` gets is bfloat16; the algorithm's loss, float32."""
    data = make_data(tokens)
    if tokens:
        model = models.char_gru((6,), 20, embed=8, hidden=16, layers=1)
    else:
        model = models.mlp((10,), 4, hidden=(32,))
    seen = {}

    def apply(params, x, *, train, key):
        seen["apply"] = {leaf.dtype for leaf in jax.tree.leaves(params)}, x.dtype
        return model.apply(params, x, train=train, key=key)

    def loss(model, params, batch, ctx, hyper, key):
        seen["local_loss"] = {leaf.dtype for leaf in jax.tree.leaves((params, ctx.start))}
        return model_loss(model, params, batch, ctx, hyper, key)

    algorithm = fedavg(local_loss=loss)
    spec = spec_for(dataclasses.replace(model, apply=apply), algorithm, data, "bfloat16")
    params = model.init(jax.random.key(0))
    task = local.ClientTask(jnp.int32(2), jnp.float32(1), jnp.int32(local.NO_STEP_LIMIT),
                            jax.random.key(1))
    update, _, stats = jax.jit(local.local_update, static_argnums=0)(
        spec, algorithm.hyper(), params, (), task, device_split(data.train)
    )
    assert seen["apply"] == ({BF16}, jnp.dtype(jnp.int32) if tokens else BF16)
    assert seen["local_loss"] == {F32}
    assert {x.dtype for x in jax.tree.leaves(update)} == {F32} and stats.loss_sum.dtype == F32
    assert np.all(np.isfinite(flat(update))) and np.any(flat(update) != 0)


def test_float32_local_training_is_the_model_itself():
    """The float32 path adds nothing: local steps run the model object they were given."""
    data, model = make_data(), models.mlp((10,), 4, hidden=(32,))
    spec = local.LocalSpec(model, fedavg(), WORK, 4, int(data.train.count.max()))
    assert spec.precision == "float32"
    assert local.compute_model(model, spec.precision) is model


def test_cast_floats_covers_every_float_leaf_and_nothing_else():
    tree = {"w": jnp.ones(3), "ids": jnp.arange(3), "mask": jnp.ones(3, bool),
            "key": jax.random.key(0), "h": jnp.ones((), jnp.float16)}
    cast = local.cast_floats(tree, jnp.bfloat16)
    assert cast["w"].dtype == cast["h"].dtype == BF16
    assert cast["ids"].dtype == jnp.int32 and cast["mask"].dtype == jnp.bool_
    assert jax.dtypes.issubdtype(cast["key"].dtype, jax.dtypes.prng_key)


def test_token_models_train_in_bfloat16():
    data = make_data(tokens=True)
    model = models.char_gru((6,), 20, embed=8, hidden=16, layers=1)
    start, low = one_round(model, fedavg(), data, "bfloat16")
    assert np.all(np.isfinite(flat(low))) and not np.allclose(flat(low), flat(start))


def test_unknown_precisions_are_refused():
    data, model = make_data(), models.mlp((10,), 4, hidden=(32,))
    with pytest.raises(ValueError, match="precision must be one of 'float32', 'bfloat16'"):
        spec_for(model, fedavg(), data, "float16")
    base = ['data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3",
            "model.name=logistic_regression"]
    e = config.build(config.load(None, [*base, 'engine.precision="bfloat16"']))
    assert e.run_kwargs()["precision"] == "bfloat16"
    with pytest.raises(config.ConfigError, match="engine.precision must be one of"):
        config.build(config.load(None, [*base, 'engine.precision="float16"']))
