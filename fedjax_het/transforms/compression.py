"""Lossy update compressors, simulated as encode-then-decode, with the exact bits they send.

A ``Compressor`` acts on one client's update pytree (no client axis: the
engine vmaps it) and returns what the server decodes. It works leaf by leaf:
every float leaf with elements is one tensor, compressed on its own with the
key ``jax.random.fold_in(key, leaf_index)`` (``leaf_index`` its position in
``jax.tree.leaves``); every other leaf (integers, booleans, empty arrays) is
passed through untouched. Decoded leaves keep their input dtype.

Bits are counted per tensor from the encoding, not from the decoded array:
a tensor of ``d`` elements starts as ``Payload(d, value_bits)``, with
``value_bits`` its float width capped at 32 (float64 runs model the float32
deployment; ``fedjax_het.training.online`` counts uncompressed payloads this way too), and each compressor
maps that payload to the one it sends. In a ``chain`` each stage re-encodes
the values the previous stage sends and keeps its side information (indices,
norms, seeds): ``chain(top_k(f), cast("float16"))`` sends ``k`` 16-bit values
and their indices. Non-float leaves count at their own width.

>>> import jax, jax.numpy as jnp
>>> shapes = {
...     "w": jax.ShapeDtypeStruct((3, 4), jnp.float32),
...     "b": jax.ShapeDtypeStruct((4,), jnp.float32),
... }
>>> bits(identity(), shapes)  # 16 values x 32 bits
512
>>> compressor = chain(top_k(0.25), cast("float16"))
>>> bits(compressor, shapes)  # w: 3 x 16 + 3 x ceil(log2 12) index bits; b: 1 x 16 + 1 x 2
78
>>> bytes_sent(compressor, shapes)
10
>>> update = {"w": jnp.arange(12.0).reshape(3, 4) - 6, "b": jnp.ones(4)}
>>> sent, state = compressor.apply(update, compressor.init(update), jax.random.key(0))
>>> sent["w"].tolist()
[[-6.0, -5.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]]
>>> sent["b"].tolist()  # ties: the lowest index wins
[1.0, 0.0, 0.0, 0.0]

.. warning:: Payloads are per tensor: every tensor sends its own scale, norm
   or seed (32 bits each), as a per-layer implementation would.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from fractions import Fraction

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.engine.algorithm import (
    Aggregator,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    require_model_delta,
)
from fedjax_het.typing import ClientState, Params, PRNGKey, PyTree, ServerState, Update

FLOAT_BITS = 32  # a float goes over the wire as float32 at most


@dataclasses.dataclass(frozen=True)
class Payload:
    """What one tensor's encoding sends.

    Attributes:
      values: how many numbers are sent.
      value_bits: bits of each number.
      side_bits: everything else: indices, scales, norms, seeds.
    """

    values: int
    value_bits: int
    side_bits: int = 0

    @property
    def bits(self) -> int:
        """``values * value_bits + side_bits``."""
        return self.values * self.value_bits + self.side_bits


@dataclasses.dataclass(frozen=True)
class Compressor:
    """An update encoder, as the pure functions a simulation needs.

    Attributes:
      name: the factory call that built it, e.g. ``"top_k(0.01)"``.
      init: ``params -> state``, this client's compressor state (``()`` if none);
        params-like, so it inherits the params' sharding.
      apply: ``(update, state, key) -> (decoded, new state)``: what the server
        decodes from this client's encoded update. Pure, jit- and vmap-able,
        deterministic given the key.
      payload: ``(payload so far, d) -> payload`` for one tensor of ``d`` elements.
      unbiased: whether ``E[apply(u)] == u`` over the key.
    """

    name: str
    init: Callable[[PyTree], PyTree]
    apply: Callable[[Update, PyTree, PRNGKey], tuple[Update, PyTree]]
    payload: Callable[[Payload, int], Payload]
    unbiased: bool


@struct.dataclass
class ErrorFeedbackState:
    """``error_feedback``'s state: the residual ``e`` (update-shaped) and the inner state."""

    residual: Update
    inner: PyTree


def bits(compressor: Compressor, shapes: PyTree) -> int:
    """Bits one update shaped like ``shapes`` (arrays or ``jax.ShapeDtypeStruct``) sends."""
    return sum(_leaf_bits(compressor, leaf) for leaf in jax.tree.leaves(shapes))


def bytes_sent(compressor: Compressor, shapes: PyTree) -> int:
    """``ceil(bits / 8)``: the update is sent as one message."""
    return -(-bits(compressor, shapes) // 8)


def _leaf_bits(compressor: Compressor, leaf) -> int:
    dtype, d = jnp.dtype(leaf.dtype), math.prod(leaf.shape)
    if not _is_tensor(dtype, d):
        return d * 8 * dtype.itemsize
    return compressor.payload(Payload(d, min(8 * dtype.itemsize, FLOAT_BITS)), d).bits


def _is_tensor(dtype, size: int) -> bool:
    """Whether a leaf is compressed: a float array with elements."""
    return jnp.issubdtype(dtype, jnp.floating) and size > 0


def _no_state(params: PyTree) -> tuple[()]:
    del params
    return ()


def _leafwise(
    name: str,
    encode: Callable[[jax.Array, PRNGKey], jax.Array],
    payload: Callable[[Payload, int], Payload],
    *,
    unbiased: bool,
) -> Compressor:
    """A stateless compressor that runs ``encode(tensor, fold_in(key, leaf_index))`` per tensor."""

    def apply(update: Update, state: tuple[()], key: PRNGKey) -> tuple[Update, tuple[()]]:
        leaves, treedef = jax.tree.flatten(update)
        decoded = [
            encode(x, jax.random.fold_in(key, i)) if _is_tensor(x.dtype, x.size) else x
            for i, x in enumerate(leaves)
        ]
        return jax.tree.unflatten(treedef, decoded), state

    return Compressor(name, _no_state, apply, payload, unbiased)


def at_least_float32(x: jax.Array) -> jax.Array:
    """``x`` in at least float32, for norms, scales and probabilities of half-precision leaves."""
    return jnp.asarray(x, jnp.promote_types(x.dtype, jnp.float32))


def pairwise_sum(x: jax.Array) -> jax.Array:
    """``Σ x`` as a fixed pairwise tree of elementwise adds.

    The same bits with or without ``vmap``, for any batch size: XLA may order a
    batched ``reduce`` differently (a ``[37, 53]`` tensor's sum changes by an ulp).
    """
    flat = x.reshape(-1)
    while flat.size > 1:
        half = flat.size // 2
        flat = jnp.concatenate([flat[:half] + flat[half : 2 * half], flat[2 * half :]])
    return flat[0]


def _safe(denominator: jax.Array) -> jax.Array:
    """``denominator``, or 1 where it is 0 (the numerators are then 0 too)."""
    return jnp.where(denominator > 0, denominator, 1)


def identity() -> Compressor:
    """No compression: every value at its wire width (32 bits for float32 and float64)."""
    return _leafwise("identity()", lambda x, key: x, lambda p, d: p, unbiased=True)


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
    return _leafwise(
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

    return _leafwise(f"qsgd({levels})", encode, payload, unbiased=True)


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

    return _leafwise("terngrad()", encode, payload, unbiased=True)


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

    return _leafwise(f"sign(scaled={scaled})", encode, payload, unbiased=False)


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

    return _leafwise(f"top_k({fraction})", encode, payload, unbiased=False)


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

    return _leafwise(f"random_k({fraction})", encode, payload, unbiased=True)


def error_feedback(inner: Compressor) -> Compressor:
    """``inner`` with error feedback: what it failed to send is added to the next update.

    Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory" (NeurIPS 2018),
    Algorithm 1; Karimireddy, Rebjock, Stich and Jaggi, "Error Feedback Fixes
    SignSGD and other Gradient Compression Schemes" (ICML 2019), Algorithm 2.
    With the residual ``e`` (zeros at first):

        p = u + e,   c = inner(p),   e <- p - c,   send c.

    So ``Σ_t c_t + e_T = Σ_t u_t`` (up to float rounding). Bits: ``inner``'s.
    Biased. The state is a full update per client: kept for every client
    between rounds, it costs ``num_clients x params``.
    """

    def init(params: PyTree) -> ErrorFeedbackState:
        return ErrorFeedbackState(jax.tree.map(jnp.zeros_like, params), inner.init(params))

    def apply(
        update: Update, state: ErrorFeedbackState, key: PRNGKey
    ) -> tuple[Update, ErrorFeedbackState]:
        corrected = jax.tree.map(jnp.add, update, state.residual)
        sent, inner_state = inner.apply(corrected, state.inner, key)
        residual = jax.tree.map(jnp.subtract, corrected, sent)
        return sent, ErrorFeedbackState(residual, inner_state)

    return Compressor(f"error_feedback({inner.name})", init, apply, inner.payload, False)


def chain(*compressors: Compressor) -> Compressor:
    """Apply ``compressors`` in order; stage ``i`` gets the key ``fold_in(key, i)``.

    The state is the tuple of the stages' states. Each stage re-encodes the
    values the previous stage sends, and earlier side information is still
    sent: the payload is the stages' payloads composed in order. Unbiased when
    every stage is (their randomness is independent).

    >>> # 10 values x 2 bits, 10 x ceil(log2 100) index bits, a 32-bit norm
    >>> chain(top_k(0.1), qsgd(1)).payload(Payload(100, 32), 100).bits
    122
    """
    if not compressors:
        raise ValueError("chain: needs at least one compressor")

    def init(params: PyTree) -> tuple:
        return tuple(c.init(params) for c in compressors)

    def apply(update: Update, state: tuple, key: PRNGKey) -> tuple[Update, tuple]:
        states = []
        for i, (c, s) in enumerate(zip(compressors, state, strict=True)):
            update, s = c.apply(update, s, jax.random.fold_in(key, i))
            states.append(s)
        return update, tuple(states)

    def payload(p: Payload, d: int) -> Payload:
        for c in compressors:
            p = c.payload(p, d)
        return p

    name = f"chain({', '.join(c.name for c in compressors)})"
    return Compressor(name, init, apply, payload, all(c.unbiased for c in compressors))


def majority_vote() -> Aggregator:
    """The server's side of signSGD with majority vote: ``sign(Σ_k sign(u_k))``.

    Bernstein, Zhao, Azizzadenesheli and Anandkumar, "signSGD with Majority
    Vote is Communication Efficient and Fault Tolerant" (ICLR 2019),
    Algorithm 1. Every client that counts (weight > 0) has one vote per
    coordinate, whatever its weight; a tie moves nothing (``sign(0) = 0``).
    Pair it with ``upload=sign()``; the server's optimizer then steps along the vote.
    """

    def contribute(update: Update, weight: jax.Array, stats: ClientStats) -> PyTree:
        del stats
        return jax.tree.map(lambda u: jnp.where(weight > 0, jnp.sign(u), 0), update)

    return Aggregator(contribute, lambda votes: jax.tree.map(jnp.sign, votes))


UPLOADS = ("none", "float16", "bfloat16", "qsgd", "terngrad", "sign", "scaled_sign", "top_k",
           "random_k")  # fmt: skip
_error_feedback = error_feedback  # arguments of these names shadow them below
_majority_vote = majority_vote


def from_options(
    *,
    upload: str = "none",
    levels: int = 16,
    fraction: float = 0.01,
    error_feedback: bool = False,
    majority_vote: bool = False,
    download: str = "float32",
) -> tuple[Compressor, str | None, bool]:
    """The ``[compression]`` table: ``compressed``'s ``(upload, download, majority_vote)``.

    Args:
      upload: one of ``UPLOADS``: "none", a cast ("float16", "bfloat16"), "qsgd"
        (with ``levels``), "terngrad", "sign" (signSGD), "scaled_sign"
        (EF-signSGD's scaled sign, with ``error_feedback``), "top_k" or "random_k"
        (with ``fraction``).
      levels: QSGD's s.
      fraction: share of each tensor's values top-k and random-k send.
      error_feedback: wrap the upload in error feedback (the residual is client state).
      majority_vote: aggregate by ``majority_vote()`` (signSGD-MV; needs upload "sign").
      download: the model clients receive: "float32", "float16" or "bfloat16".
    """
    if upload not in UPLOADS:
        raise ValueError(f"upload must be one of {', '.join(UPLOADS)}, got {upload!r}")
    if download not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"download must be 'float32', 'float16' or 'bfloat16', got {download!r}")
    makers = {
        "none": identity, "float16": lambda: cast("float16"), "bfloat16": lambda: cast("bfloat16"),
        "qsgd": lambda: qsgd(levels), "terngrad": terngrad, "sign": sign,
        "scaled_sign": lambda: sign(scaled=True), "top_k": lambda: top_k(fraction),
        "random_k": lambda: random_k(fraction),
    }  # fmt: skip
    if majority_vote and upload != "sign":
        raise ValueError(f"majority_vote counts the signs of upload 'sign', not of {upload!r}")
    qsgd(levels), top_k(fraction)  # both options are checked, used or not
    compressor = makers[upload]()
    if error_feedback:
        compressor = _error_feedback(compressor)
    return compressor, None if download == "float32" else download, majority_vote


def compressed(
    algorithm: FederatedAlgorithm,
    *,
    upload: Compressor | None = None,
    download: str | None = None,
    majority_vote: bool = False,
) -> FederatedAlgorithm:
    """``algorithm`` whose clients send ``upload``'s encoding of their update and receive the
    model cast to ``download`` (``"float16"``, ``"bfloat16"``; None: float32).

    The server aggregates what it decodes, and the round's schedule carries the
    encodings' exact bytes (``FederatedAlgorithm.payload``), so compression
    shortens simulated transfers and changes who meets a deadline. The upload
    compressor's state (error feedback's residual) is client state, kept as the
    algorithm's own is: only when the client's update counted. Randomised
    encodings draw from the client's finalisation key (``fold_in(seed, round,
    client)``), so they do not depend on chunking or cohort order. The download
    is a cast of the model every client receives alike (the global model the
    server evaluates stays uncast). ``majority_vote`` replaces the algorithm's
    aggregator with ``majority_vote()`` (signSGD-MV, with ``upload=sign()``).

    Applies to algorithms whose update is shaped like the params (the FedAvg
    family, FedProx, FedNova, Ditto, FedPer/FedRep); SCAFFOLD's and q-FFL's
    updates are refused when the round is traced, FreezeFL's per-layer uploads
    when wrapped.
    """
    upload = upload or identity()
    cast_down = identity() if download is None else cast(download)
    if algorithm.freezing is not None:
        raise ValueError(f"{algorithm.name} uploads only the layers it trains: it cannot be compressed")

    def inner(ctx: LocalContext) -> LocalContext:
        return ctx.replace(client_state=ctx.client_state[0])

    def client_init(params: Params) -> ClientState:
        return algorithm.client_init(params), upload.init(params)

    def client_start(model, payload, client_state, batches, hyper, key):
        start, state = algorithm.client_start(model, payload, client_state[0], batches, hyper, key)
        return start, (state, client_state[1])

    def local_loss(model, params, batch, ctx, hyper, key):
        return algorithm.local_loss(model, params, batch, inner(ctx), hyper, key)

    def client_finalize(params, ctx, hyper):
        update, state = algorithm.client_finalize(params, inner(ctx), hyper)
        require_model_delta(
            update, ctx.start, algorithm.name,
            "compression applies to the FedAvg family, FedProx, FedNova, Ditto and FedPer/FedRep",
        )  # fmt: skip
        decoded, upload_state = upload.apply(update, ctx.client_state[1], ctx.key)
        return decoded, (state, upload_state)

    def broadcast(server_state: ServerState) -> PyTree:
        no_key = jax.random.key(0)  # a cast draws nothing
        return cast_down.apply(algorithm.broadcast(server_state), (), no_key)[0]

    def payload(params: Params) -> tuple[int, int]:
        return bytes_sent(cast_down, params), bytes_sent(upload, params)

    personal = algorithm.personal_params
    return dataclasses.replace(
        algorithm,
        aggregator=_majority_vote() if majority_vote else algorithm.aggregator,
        name=f"{algorithm.name}+{upload.name}+down({download or 'float32'})",
        client_init=client_init,
        client_start=client_start,
        local_loss=local_loss,
        client_finalize=client_finalize,
        broadcast=broadcast,
        payload=payload,
        personal_params=None if personal is None else lambda s, c: personal(s, c[0]),
    )
