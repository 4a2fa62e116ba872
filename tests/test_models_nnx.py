"""Flax NNX models through ``models.from_nnx``: the same training as the model written in Linen."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fedjax_het
from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data.catalog import leaf_synthetic
from fedjax_het.sampling import uniform
from fedjax_het.training.options import run_options


class MLP(nnx.Module):
    """The zoo's ``models.mlp`` (Linen) written in NNX."""

    def __init__(self, features: int, hidden: int, classes: int, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(features, hidden, rngs=rngs)
        self.out = nnx.Linear(hidden, classes, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x.reshape((x.shape[0], -1)))))


class Dropped(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.dense = nnx.Linear(4, 8, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.dense(x))


def as_nnx(linen_params):
    """Linen's ``Dense_0``/``Dense_1`` params in ``MLP``'s layout."""
    return {"hidden": linen_params["Dense_0"], "out": linen_params["Dense_1"]}


def test_init_draws_from_the_key_and_a_built_module_keeps_its_weights():
    model = models.from_nnx(lambda rngs: MLP(5, 7, 3, rngs=rngs))
    a, b, again = (model.init(jax.random.key(k)) for k in (0, 1, 0))
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert not np.allclose(a["hidden"]["kernel"], b["hidden"]["kernel"])
    np.testing.assert_array_equal(a["hidden"]["kernel"], again["hidden"]["kernel"])

    built = MLP(5, 7, 3, rngs=nnx.Rngs(42))
    fixed = models.from_nnx(built)
    for key in (0, 1):
        np.testing.assert_array_equal(
            fixed.init(jax.random.key(key))["out"]["kernel"], built.out.kernel[...]
        )
    assert fixed.name == "MLP"


def test_dropout_follows_the_key_in_training_and_is_off_in_evaluation():
    model = models.from_nnx(lambda rngs: Dropped(rngs=rngs))
    params, x = model.init(jax.random.key(0)), jnp.ones((3, 4))
    apply = jax.jit(model.apply, static_argnames="train")
    one = apply(params, x, train=True, key=jax.random.key(1))
    two = apply(params, x, train=True, key=jax.random.key(2))
    assert not np.array_equal(one, two)
    np.testing.assert_array_equal(one, apply(params, x, train=True, key=jax.random.key(1)))
    plain = apply(params, x, train=False, key=None)
    np.testing.assert_allclose(plain, x @ params["dense"]["kernel"] + params["dense"]["bias"][None])


def test_a_module_with_batch_statistics_is_refused_in_one_line():
    class Normed(nnx.Module):
        def __init__(self, *, rngs):
            self.dense, self.norm = nnx.Linear(4, 4, rngs=rngs), nnx.BatchNorm(4, rngs=rngs)

        def __call__(self, x):
            return self.norm(self.dense(x))

    with pytest.raises(ValueError, match="Normed keeps BatchStat variables.*client state"):
        models.from_nnx(lambda rngs: Normed(rngs=rngs))


def test_a_federated_run_of_the_nnx_model_equals_the_linen_one():
    data = leaf_synthetic(num_clients=12, alpha=0.5, beta=0.5, seed=3)
    linen = models.mlp(data.example_shape, data.num_classes, hidden=(16,))
    written = models.from_nnx(
        lambda rngs: MLP(int(np.prod(data.example_shape)), 16, data.num_classes, rngs=rngs)
    )
    # The same initial weights for both, in each one's own layout.
    nnx_model = models.Model(
        lambda key: as_nnx(linen.init(key)), written.apply, written.per_example_loss
    )
    runs = [
        fedjax_het.run(
            data,
            *run_options(
                model=model,
                algorithm=fedavg(),
                sampler=uniform(num_clients=12, cohort_size=4),
                rounds=6,
                work=fedjax_het.LocalWork(batch_size=8, epochs=1),
                hyper={"client_lr": 0.1},
                eval_every=3,
                progress=False,
            ),
        )
        for model in (linen, nnx_model)
    ]
    for ours, theirs in zip(runs[0].metrics, runs[1].metrics, strict=True):
        np.testing.assert_allclose(ours["test_loss"], theirs["test_loss"], rtol=1e-6)
    np.testing.assert_allclose(
        runs[0].params["Dense_0"]["kernel"], runs[1].params["hidden"]["kernel"], rtol=1e-5, atol=1e-7
    )
    assert runs[1].metrics[-1]["test_accuracy"] > runs[1].metrics[0]["test_accuracy"]
