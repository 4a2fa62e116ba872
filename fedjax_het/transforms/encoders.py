"""The update encoders of the compression literature, each per tensor with its exact payload.

``identity`` and ``cast`` (narrower floats), the stochastic quantisers ``qsgd``
and ``terngrad``, signSGD's ``sign``, and the sparsifiers ``top_k`` and
``random_k``: each a stateless ``Compressor`` (``fedjax_het.transforms.compressor``)
built by ``leafwise``, with the paper and the bit count in its docstring.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from fractions import Fraction

import jax
import jax.numpy as jnp

from fedjax_het.transforms.compressor import (
    FLOAT_BITS,
    Compressor,
    Payload,
    at_least_float32,
    leafwise,
    pairwise_sum,
)
from fedjax_het.typing import PRNGKey


def identity() -> Compressor:
    """No compression: every value at its wire width (32 bits for float32 and float64)."""
    return leafwise("identity()", lambda x, key: x, lambda p, d: p, unbiased=True)


CAST_DTYPES = ("float16", "bfloat16", "float32")


def cast(dtype) -> Compressor:
    """Send every value in a narrower float (round to nearest even), decode back to the input dtype.

    Bits: ``d * w`` per tensor, ``w`` the width of ``dtype`` (16 for float16 and
    bfloat16). Deterministic rounding, so biased. Values beyond the range of
    ``dtype`` become ``inf`` (65504 is float16's largest); subnormals are kept,
    as a real conversion keeps them.

    Args:
      dtype: ``"float16"``, ``"bfloat16"`` or ``"float32"`` (which rounds a
        float64 run's update as the float32 wire would).
    """
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"cast: unknown dtype {dtype!r}") from None
    if dtype.name not in CAST_DTYPES:
        raise ValueError(f"cast: dtype must be one of {', '.join(CAST_DTYPES)}, got {dtype.name}")
    width = jnp.finfo(dtype).bits
    return leafwise(
        f"cast({dtype.name})",
        lambda x, key: _round_to(x, dtype),
        lambda p, d: dataclasses.replace(p, value_bits=width),
        unbiased=False,
    )


def _round_to(x: jax.Array, dtype) -> jax.Array:
    """``x`` rounded to the nearest ``dtype`` value (ties to even), in ``x``'s dtype.

    Not ``x.astype(dtype).astype(x.dtype)``: XLA:GPU removes that pair of
    conversions (openxla/xla#41605). ``lax.reduce_precision`` is kept, but
    flushes the subnormals of a type with fewer exponent bits, so those are
    rounded on their fixed grid (multiples of ``dtype``'s smallest subnormal).
    """
    target, u = jnp.finfo(dtype), at_least_float32(x)
    rounded = jax.lax.reduce_precision(u, exponent_bits=target.nexp, mantissa_bits=target.nmant)
    if target.nexp < jnp.finfo(u.dtype).nexp:
        step = float(target.smallest_subnormal)
        subnormal = jnp.round(u * (1 / step)) * step  # powers of two: exact scaling
        rounded = jnp.where(jnp.abs(u) < float(target.smallest_normal), subnormal, rounded)
    return rounded.astype(x.dtype)


def _safe(denominator: jax.Array) -> jax.Array:
    """``denominator``, or 1 where it is 0 (the numerators are then 0 too)."""
    return jnp.where(denominator > 0, denominator, 1)


def qsgd(levels: int) -> Compressor:
    """QSGD's stochastic quantiser with ``s = levels`` levels, per tensor.

    Alistarh, Grubic, Li, Tomioka and Vojnovic, "QSGD: Communication-Efficient
    SGD via Gradient Quantization and Encoding" (NeurIPS 2017), §3.1:

        Q_s(u)_i = ||u||_2 sign(u_i) ξ_i / s,   l_i = floor(s |u_i| / ||u||_2),
        ξ_i = l_i + 1 with probability s |u_i| / ||u||_2 - l_i, else l_i.

    Unbiased, with ``E||Q_s(u) - u||^2 <= min(d / s^2, sqrt(d) / s) ||u||^2``
    (Lemma 3.1). Bits, with the paper's naive fixed-length code (not Elias
    coding): ``32 + d (1 + ceil(log2(s + 1)))`` per tensor (the norm, then a
    sign bit and a level in ``0..s`` per value).

    >>> qsgd(4).payload(Payload(10, 32), 10).bits  # 32 + 10 * (1 + 3)
    72
    """
    if isinstance(levels, bool) or not isinstance(levels, numbers.Integral) or levels < 1:
        raise ValueError(f"qsgd: levels must be an integer >= 1, got {levels!r}")
    levels = int(levels)
    level_bits = math.ceil(math.log2(levels + 1))

    def encode(x: jax.Array, key: PRNGKey) -> jax.Array:
        u = at_least_float32(x)
        norm = jnp.sqrt(pairwise_sum(jnp.square(u)))
        scaled = levels * jnp.abs(u) / _safe(norm)
        lower = jnp.floor(scaled)
        up = jax.random.uniform(key, u.shape, u.dtype) < scaled - lower
        level = jnp.minimum(lower + up, levels)  # a rounded |u_i| > ||u|| cannot exceed s
        # times 1/s, not / s: jit turns a division by a constant into this, eager does not
        return (norm * (1 / levels) * jnp.sign(u) * level).astype(x.dtype)

    def payload(p: Payload, d: int) -> Payload:
        return Payload(p.values, 1 + level_bits, p.side_bits + FLOAT_BITS)

    return leafwise(f"qsgd({levels})", encode, payload, unbiased=True)


def terngrad() -> Compressor:
    """TernGrad's stochastic ternarisation, per tensor (one scaler per layer).

    Wen, Xu, Yan, Wu, Wang, Chen and Li, "TernGrad: Ternary Gradients to Reduce
    Communication in Distributed Deep Learning" (NeurIPS 2017), §3:

        s = max_i |u_i|,   ũ = s sign(u) ∘ b,   b_i ~ Bernoulli(|u_i| / s).

    Unbiased. Bits: ``2 d + 32`` per tensor (a value in ``{-s, 0, s}`` is 2
    bits; ``s`` is a float32).

    .. warning:: Without the paper's gradient clipping (§3.3), an optional
       variance-reduction step outside the quantiser.
    """

    def encode(x: jax.Array, key: PRNGKey) -> jax.Array:
        u = at_least_float32(x)
        scale = jnp.max(jnp.abs(u))
        keep = jax.random.uniform(key, u.shape, u.dtype) < jnp.abs(u) / _safe(scale)
        return jnp.where(keep, scale * jnp.sign(u), 0).astype(x.dtype)

    def payload(p: Payload, d: int) -> Payload:
        return Payload(p.values, 2, p.side_bits + FLOAT_BITS)

    return leafwise("terngrad()", encode, payload, unbiased=True)


def sign(*, scaled: bool = False) -> Compressor:
    """signSGD's 1-bit sign, or with ``scaled=True`` the scaled sign of EF-signSGD.

    Bernstein, Wang, Azizzadenesheli and Anandkumar, "signSGD: Compressed
    Optimisation for Non-Convex Problems" (ICML 2018), Algorithm 1: send
    ``sign(u)``. Karimireddy, Rebjock, Stich and Jaggi, "Error Feedback Fixes
    SignSGD and other Gradient Compression Schemes" (ICML 2019), Algorithm 1:
    send ``(||u||_1 / d) sign(u)``, one scale per tensor.

    ``sign(0) = +1`` (as is ``sign(-0.0)``): a value is one bit, and the server
    decodes exactly what those bits say. Bits: ``d`` per tensor, ``+ 32`` for
    the scale when scaled. Biased; pair it with ``error_feedback``.

    .. warning:: Do not chain it after ``top_k`` or ``random_k``: their unsent
       zeros would decode as ``+1`` (times the scale), while the payload counts
       only the values sent.
    """

    def encode(x: jax.Array, key: PRNGKey) -> jax.Array:
        signs = jnp.where(x >= 0, 1, -1).astype(x.dtype)
        if not scaled:
            return signs
        u = at_least_float32(x)
        return (pairwise_sum(jnp.abs(u)) * (1 / x.size) * signs).astype(x.dtype)  # 1/d: see qsgd

    def payload(p: Payload, d: int) -> Payload:
        return Payload(p.values, 1, p.side_bits + (FLOAT_BITS if scaled else 0))

    return leafwise(f"sign(scaled={scaled})", encode, payload, unbiased=False)


def _kept(fraction: float, d: int) -> int:
    """``max(1, ceil(fraction * d))``, ``fraction`` as written (0.07 of 100 is 7, not 8)."""
    return max(1, math.ceil(Fraction(str(fraction)) * d))


def _check_fraction(name: str, fraction: float) -> None:
    is_number = isinstance(fraction, numbers.Real) and not isinstance(fraction, bool)
    if not (is_number and 0 < fraction <= 1):
        raise ValueError(f"{name}: fraction must be in (0, 1], got {fraction!r}")


def _scatter(flat: jax.Array, index: jax.Array, values: jax.Array, shape) -> jax.Array:
    """A zero tensor of ``shape`` holding ``values`` at the flat positions ``index``."""
    return jnp.zeros_like(flat).at[index].set(values).reshape(shape)


def top_k(fraction: float) -> Compressor:
    """Keep the ``k = max(1, ceil(fraction d))`` largest ``|u_i|`` of each tensor, zero the rest.

    The ``top_k`` operator of Stich, Cordonnier and Jaggi, "Sparsified SGD with
    Memory" (NeurIPS 2018), §2. Ties go to the lower flat (row-major) index
    (``jax.lax.top_k``). Biased; pair it with ``error_feedback``. Bits: the
    ``k`` values plus ``k ceil(log2 d)`` index bits per tensor.

    .. warning:: Indices are always sent as a list, even where a ``d``-bit
       bitmap would be smaller (``fraction > 1 / ceil(log2 d)``).
    """
    _check_fraction("top_k", fraction)

    def encode(x: jax.Array, key: PRNGKey) -> jax.Array:
        flat = x.reshape(-1)
        _, index = jax.lax.top_k(jnp.abs(flat), _kept(fraction, x.size))
        return _scatter(flat, index, flat[index], x.shape)

    def payload(p: Payload, d: int) -> Payload:
        k = _kept(fraction, d)
        return Payload(k, p.value_bits, p.side_bits + k * math.ceil(math.log2(d)))

    return leafwise(f"top_k({fraction})", encode, payload, unbiased=False)


def random_k(fraction: float) -> Compressor:
    """Keep ``k = max(1, ceil(fraction d))`` uniformly drawn coordinates, times ``d / k``.

    The ``rand_k`` operator of Stich, Cordonnier and Jaggi (NeurIPS 2018), §2,
    scaled by ``d / k`` so that it is unbiased, as the "subsampling" sketched
    updates of Konečný, McMahan, Yu, Richtárik, Suresh and Bacon, "Federated
    Learning: Strategies for Improving Communication Efficiency" (NIPS 2016
    workshop), §3. The server redraws the coordinates from a seed shared with
    the client, so no index is sent. Bits: the ``k`` values plus a 32-bit seed
    per tensor.
    """
    _check_fraction("random_k", fraction)

    def encode(x: jax.Array, key: PRNGKey) -> jax.Array:
        flat, d = x.reshape(-1), x.size
        k = _kept(fraction, d)
        # The k largest of d iid uniforms are a uniform k-subset; one top-k, where
        # random.choice(replace=False) shuffles all d (two sorts: 46x a FedAvg round on CPU).
        _, index = jax.lax.top_k(jax.random.uniform(key, (d,)), k)
        return _scatter(flat, index, flat[index] * (d / k), x.shape)

    def payload(p: Payload, d: int) -> Payload:
        return Payload(_kept(fraction, d), p.value_bits, p.side_bits + 32)

    return leafwise(f"random_k({fraction})", encode, payload, unbiased=True)
