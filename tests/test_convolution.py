"""The convolution formulations compute lax's convolution: values and gradients in float64,
alone, inside the LEAF CNN, and under a vmap over clients that each hold their own weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_het import convolution, models

PADDINGS = [((2, 2), (2, 2)), ((0, 0), (0, 0)), ((1, 3), (2, 0))]
TOL = {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


def lax_conv(x, kernel, padding):
    return lax.conv_general_dilated(
        x, kernel, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def close(got, want):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), got, want)


@pytest.mark.parametrize("padding", PADDINGS)
def test_patches_conv_equals_lax_values_and_both_gradients(padding):
    kx, kk, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (3, 9, 8, 2), jnp.float64)
    kernel = jax.random.normal(kk, (5, 4, 2, 3), jnp.float64)
    out, vjp = jax.vjp(lambda a, b: convolution.patches_conv(a, b, padding), x, kernel)
    ref, ref_vjp = jax.vjp(lambda a, b: lax_conv(a, b, padding), x, kernel)
    assert out.dtype == jnp.float64 and out.shape == ref.shape
    close(out, ref)
    g = jax.random.normal(kg, out.shape, jnp.float64)
    close(vjp(g), ref_vjp(g))


def test_patches_conv_is_not_a_correlation_of_the_flipped_kernel():
    """The test above can fail: a kernel read in the wrong window order is caught."""
    x = jax.random.normal(jax.random.key(1), (1, 6, 6, 2), jnp.float64)
    kernel = jax.random.normal(jax.random.key(2), (3, 3, 2, 4), jnp.float64)
    flipped = convolution.patches_conv(x, jnp.flip(kernel, (0, 1)), ((1, 1), (1, 1)))
    assert not np.allclose(flipped, lax_conv(x, kernel, ((1, 1), (1, 1))), **TOL)


def plain_cnn_loss(params, x, y):
    """The LEAF CNN written out with lax's convolution, independent of the model's code."""
    h = x
    for layer in ("Conv_0", "Conv_1"):
        w = params[layer]
        h = jax.nn.relu(lax_conv(h, w["kernel"], ((2, 2), (2, 2))) + w["bias"][None, None, None])
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    dense, out = params["Dense_0"], params["Dense_1"]
    h = jax.nn.relu(h.reshape(h.shape[0], -1) @ dense["kernel"] + dense["bias"][None])
    logits = h @ out["kernel"] + out["bias"][None]
    return models.softmax_cross_entropy(logits, y).mean()


@pytest.mark.parametrize("conv", convolution.CONV_IMPLS)
def test_the_cnn_per_client_gradients_equal_the_plain_model_under_vmap(conv):
    """Three clients, each with its own weights and batch: the vmapped loss and gradients of
    the model with ``conv`` equal the unbatched plain model's, client by client."""
    model = models.femnist_cnn((12, 12, 1), 4).with_conv(conv)
    assert model.conv == conv and model.with_conv is not None
    params = jax.vmap(lambda k: jax.tree.map(lambda p: p.astype(jnp.float64), model.init(k)))(
        jax.random.split(jax.random.key(3), 3)
    )
    x = jax.random.normal(jax.random.key(4), (3, 5, 12, 12, 1), jnp.float64)
    y = jax.random.randint(jax.random.key(5), (3, 5), 0, 4)

    def model_loss(p, xb, yb):
        return models.softmax_cross_entropy(model.apply(p, xb, train=True, key=None), yb).mean()

    got = jax.jit(jax.vmap(jax.value_and_grad(model_loss)))(params, x, y)
    plain = jax.jit(jax.value_and_grad(plain_cnn_loss))
    for client in range(3):
        mine = jax.tree.map(lambda a, k=client: a[k], (params, x, y))
        close(jax.tree.map(lambda a, k=client: a[k], got), plain(*mine))


def test_a_width_level_keeps_the_formulation():
    model = models.femnist_cnn((12, 12, 1), 4, conv="patches")
    half = model.at_width(0.5)
    params = half.init(jax.random.key(6))
    x = jax.random.normal(jax.random.key(7), (2, 12, 12, 1))
    jaxpr = jax.make_jaxpr(lambda p: half.apply(p, x, train=True, key=None))(params)
    assert "conv_general_dilated" not in str(jaxpr)
    assert "conv_general_dilated" in str(jax.make_jaxpr(
        lambda p: model.with_conv("xla").at_width(0.5).apply(p, x, train=True, key=None))(params))


def test_a_bad_formulation_is_refused_in_one_line():
    with pytest.raises(ValueError, match="conv must be one of xla, patches, got 'fft'"):
        models.femnist_cnn((12, 12, 1), 4, conv="fft")
