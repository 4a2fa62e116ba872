"""The CPU convolution with explicit gradients equals lax's, values and both gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_het import convolution, models

PADDINGS = [((2, 2), (1, 2)), ((0, 0), (0, 0)), ((1, 3), (2, 0))]


def lax_conv(x, kernel, padding):
    return lax.conv_general_dilated(
        x, kernel, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


@pytest.mark.parametrize("padding", PADDINGS)
def test_canonical_conv_matches_lax_and_its_gradients(padding):
    kx, kk, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (3, 9, 8, 2))
    kernel = jax.random.normal(kk, (5, 4, 2, 3))
    out, vjp = jax.vjp(lambda a, b: convolution.canonical_conv(a, b, padding), x, kernel)
    ref, ref_vjp = jax.vjp(lambda a, b: lax_conv(a, b, padding), x, kernel)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    g = jax.random.normal(kg, out.shape)
    for got, want in zip(vjp(g), ref_vjp(g)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_femnist_cnn_gradients_equal_a_plain_lax_copy_under_vmap():
    model = models.femnist_cnn((12, 12, 1), 4)
    params = model.init(jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (2, 3, 12, 12, 1))
    y = jnp.array([[0, 1, 2], [3, 2, 1]])

    def loss(p, xb, yb, conv):
        h = xb
        for layer in ("Conv_0", "Conv_1"):
            w = p[layer]
            h = jax.nn.relu(conv(h, w["kernel"], ((2, 2), (2, 2))) + w["bias"][None, None, None])
            h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = h.reshape(h.shape[0], -1)
        h = jax.nn.relu(h @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"][None])
        logits = h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"][None]
        return models.softmax_cross_entropy(logits, yb).mean()

    def model_loss(p, xb, yb):
        return models.softmax_cross_entropy(model.apply(p, xb, train=True, key=None), yb).mean()

    got = jax.vmap(jax.grad(model_loss), in_axes=(None, 0, 0))(params, x, y)
    want = jax.vmap(jax.grad(lambda p, a, b: loss(p, a, b, lax_conv)), in_axes=(None, 0, 0))(
        params, x, y
    )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), got, want)
