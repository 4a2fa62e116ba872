"""The formulations of a model's convolution, one function each (docs/design.md §3).

A convolution layer (Flax's ``nn.Conv``) takes the function that convolves as its
``conv_general_dilated``; these are the choices, all with ``lax.conv_general_dilated``'s
signature and its values (to float rounding: the products are summed in another order):

* ``"xla"``: XLA's convolution (:func:`conv_for_backend`): on CPU the canonical form
  (:func:`canonical_conv`), elsewhere ``lax.conv_general_dilated`` itself. Under a
  ``vmap`` over clients that each hold their own kernel it becomes one *grouped*
  convolution (the clients folded into the feature groups), which XLA:CPU runs several
  times slower than a loop of single convolutions.
* ``"patches"``: im2col (Chellapilla et al. 2006, "High Performance Convolutional Neural
  Networks for Document Processing", §2.1): the input's ``kh x kw`` shifted windows laid
  side by side as ``[N, H', W', kh * kw * C]`` patches, then one matmul with the kernel
  read as ``[kh * kw * C, O]``. Under the cohort's ``vmap`` the matmul is a batched matmul
  (``dot_general`` with the clients as its batch dimension), and the backward pass is
  matmuls, slices and pads: no grouped convolution anywhere.

Either applies to a stride-1, undilated, ungrouped 2-D convolution with non-negative
padding (the LEAF CNN's); any other falls back to ``lax.conv_general_dilated``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ("xla", "patches")
"""The formulations a model may convolve with (:func:`conv_function`)."""

Pads = tuple[tuple[int, int], tuple[int, int]]


def _conv_nhwc(x: jax.Array, kernel: jax.Array, padding) -> jax.Array:
    return lax.conv_general_dilated(
        x, kernel, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def canonical_conv(x: jax.Array, kernel: jax.Array, padding: Pads) -> jax.Array:
    """Stride-1 NHWC x HWIO convolution whose two gradients are NHWC x HWIO convolutions too.

    XLA:CPU runs a convolution on its fast (Eigen) kernel only in this canonical
    form, and its ConvCanonicalization pass rewrites only the entry computation:
    the gradient convolutions JAX emits inside a ``scan`` (the cohort's chunk
    loop, the local steps) stay non-canonical and run 7-15x slower. Here the
    transposes are explicit, so every convolution is canonical wherever it runs.
    The values are those of ``lax.conv_general_dilated`` and its VJP.

    Args:
      x: ``[N, H, W, C]`` inputs.
      kernel: ``[kh, kw, C, O]``.
      padding: ``((top, bottom), (left, right))``.
    """
    return _conv_nhwc(x, kernel, padding)


def _canonical_conv_fwd(x, kernel, padding):
    return _conv_nhwc(x, kernel, padding), (x, kernel)


def _canonical_conv_bwd(padding, residuals, g):
    x, kernel = residuals
    kh, kw = kernel.shape[:2]
    (top, bottom), (left, right) = padding
    # dx: g correlated with the spatially flipped kernel, input and output features swapped.
    flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
    dx = _conv_nhwc(g, flipped, ((kh - 1 - top, kh - 1 - bottom), (kw - 1 - left, kw - 1 - right)))
    # dkernel[i, j, c, o] = sum_{n,h,w} x_pad[n, h+i, w+j, c] g[n, h, w, o]: a convolution of x
    # with channels as the batch and examples as the features, by g as an [H, W, N, O] kernel.
    dkernel = _conv_nhwc(x.transpose(3, 1, 2, 0), g.transpose(1, 2, 0, 3), padding)
    return dx, dkernel.transpose(1, 2, 0, 3)


canonical_conv.defvjp(_canonical_conv_fwd, _canonical_conv_bwd)


def patches_conv(
    x: jax.Array, kernel: jax.Array, padding: Pads, precision: lax.PrecisionLike = None
) -> jax.Array:
    """Stride-1 NHWC x HWIO convolution as im2col patches and one matmul.

    ``out[n, h, w, o] = sum_{i, j, c} x_pad[n, h + i, w + j, c] kernel[i, j, c, o]``, the
    sum over ``(i, j, c)`` taken as one contraction of the patches ``[N, H', W', kh kw C]``
    (window ``(i, j)``'s channels at ``(i kw + j) C``) with ``kernel.reshape(kh kw C, O)``.
    Its gradients are JAX's of that expression: matmuls, and the windows' slices
    transposed into pads that add up.

    Args:
      x: ``[N, H, W, C]`` inputs.
      kernel: ``[kh, kw, C, O]``.
      padding: ``((top, bottom), (left, right))``, each >= 0.
      precision: the matmul's (``lax.dot_general``).

    >>> x, k = jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 5))
    >>> bool(jnp.allclose(patches_conv(x, k, ((1, 1), (1, 1))),
    ...                   _conv_nhwc(x, k, ((1, 1), (1, 1)))))
    True
    """
    kh, kw, c, o = kernel.shape
    padded = jnp.pad(x, ((0, 0), *padding, (0, 0)))
    height, width = padded.shape[1] - kh + 1, padded.shape[2] - kw + 1
    # The kw shifts along the width, then the kh shifts of those along the height: kh + kw
    # slices instead of kh x kw (a smaller program), the same patches.
    rows = jnp.concatenate([padded[:, :, j : j + width] for j in range(kw)], axis=-1)
    patches = jnp.concatenate([rows[:, i : i + height] for i in range(kh)], axis=-1)
    out = lax.dot_general(
        patches, kernel.reshape(kh * kw * c, o), (((3,), (0,)), ((), ())), precision=precision
    )
    return out.astype(jnp.result_type(x, kernel))


def _plain_pads(lhs, rhs, window_strides, padding, kwargs) -> Pads | None:
    """The explicit padding of a convolution both formulations take (stride 1, no dilation,
    no groups, 2-D NHWC x HWIO, padding >= 0); None for any other."""
    dilations = (kwargs.get("lhs_dilation"), kwargs.get("rhs_dilation"))
    numbers = kwargs.get("dimension_numbers")
    nhwc = numbers is None or isinstance(numbers, lax.ConvDimensionNumbers) and (
        numbers == lax.conv_dimension_numbers(lhs.shape, rhs.shape, ("NHWC", "HWIO", "NHWC"))
    )
    plain = (
        lhs.ndim == 4
        and nhwc
        and tuple(window_strides) == (1, 1)
        and all(d is None or tuple(d) == (1, 1) for d in dilations)
        and kwargs.get("feature_group_count", 1) == 1
    )
    if not plain:
        return None
    if isinstance(padding, str):
        padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], (1, 1), padding)
    pads = tuple(tuple(int(p) for p in pair) for pair in padding)
    return pads if min(min(pair) for pair in pads) >= 0 else None


def conv_for_backend(lhs, rhs, window_strides, padding, **kwargs) -> jax.Array:
    """``"xla"``: :func:`canonical_conv` on CPU where it applies, else lax."""
    pads = _plain_pads(lhs, rhs, window_strides, padding, kwargs)
    if jax.default_backend() != "cpu" or pads is None or kwargs.get("precision") is not None:
        return lax.conv_general_dilated(lhs, rhs, window_strides, padding, **kwargs)
    return canonical_conv(lhs, rhs, pads)


def conv_as_patches(lhs, rhs, window_strides, padding, **kwargs) -> jax.Array:
    """``"patches"``: :func:`patches_conv` where it applies, else lax."""
    pads = _plain_pads(lhs, rhs, window_strides, padding, kwargs)
    if pads is None:
        return lax.conv_general_dilated(lhs, rhs, window_strides, padding, **kwargs)
    return patches_conv(lhs, rhs, pads, kwargs.get("precision"))


def conv_function(impl: str) -> Callable[..., jax.Array]:
    """The ``conv_general_dilated`` of formulation ``impl`` (one of :data:`CONV_IMPLS`)."""
    functions = {"xla": conv_for_backend, "patches": conv_as_patches}
    if impl not in functions:
        raise ValueError(f"conv must be one of {', '.join(CONV_IMPLS)}, got {impl!r}")
    return functions[impl]
