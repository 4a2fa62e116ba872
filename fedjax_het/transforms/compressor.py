"""What a compressor is and what it sends: the ``Compressor`` contract and its bit accounting.

A ``Compressor`` acts on one client's update pytree (no client axis: the
engine vmaps it) and returns what the server decodes. It works leaf by leaf
(``leafwise``): every float leaf with elements is one tensor, compressed on
its own with the key ``jax.random.fold_in(key, leaf_index)`` (``leaf_index``
its position in ``jax.tree.leaves``); every other leaf (integers, booleans,
empty arrays) is passed through untouched. Decoded leaves keep their input dtype.

Bits are counted per tensor from the encoding, not from the decoded array:
a tensor of ``d`` elements starts as ``Payload(d, value_bits)``, with
``value_bits`` its float width capped at 32 (float64 runs model the float32
deployment; ``fedjax_het.training.online`` counts uncompressed payloads this
way too), and each compressor maps that payload to the one it sends (``bits``,
``bytes_sent``). In a ``chain`` each stage re-encodes the values the previous
stage sends and keeps its side information (indices, norms, seeds):
``chain(top_k(f), cast("float16"))`` sends ``k`` 16-bit values and their
indices. Non-float leaves count at their own width. ``error_feedback`` and
``chain`` build compressors from others; the encoders themselves are in
``fedjax_het.transforms.encoders``.

.. warning:: Payloads are per tensor: every tensor sends its own scale, norm
   or seed (32 bits each), as a per-layer implementation would.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.typing import PRNGKey, PyTree, Update

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


def leafwise(
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

    >>> from fedjax_het.transforms.encoders import qsgd, top_k
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
