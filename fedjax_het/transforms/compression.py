"""Lossy update compressors, simulated as encode-then-decode, with the exact bits they send.

This module wraps an algorithm so that its clients send compressed updates
(``compressed``), reads the ``[compression]`` table (``from_options``) and holds
signSGD's majority vote. The ``Compressor`` contract and its bit accounting are in
``fedjax_het.transforms.compressor``, the encoders in ``fedjax_het.transforms.encoders``;
their names are importable from here too.

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
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_het.engine.algorithm import (
    Aggregator,
    ClientStats,
    FederatedAlgorithm,
    LocalContext,
    LocalTraining,
    require_model_delta,
)
from fedjax_het.engine.hooks import Freezing, PayloadBytes, Personalized, attach
from fedjax_het.transforms.compressor import (
    FLOAT_BITS,
    Compressor,
    ErrorFeedbackState,
    Payload,
    at_least_float32,
    bits,
    bytes_sent,
    chain,
    error_feedback,
    pairwise_sum,
)
from fedjax_het.transforms.encoders import (
    CAST_DTYPES,
    cast,
    identity,
    qsgd,
    random_k,
    sign,
    terngrad,
    top_k,
)
from fedjax_het.typing import ClientState, Params, PyTree, ServerState, Update

__all__ = [
    "CAST_DTYPES", "FLOAT_BITS", "UPLOADS", "Compressor", "ErrorFeedbackState", "Payload",
    "at_least_float32", "bits", "bytes_sent", "cast", "chain", "compressed", "error_feedback",
    "from_options", "identity", "majority_vote", "pairwise_sum", "qsgd", "random_k",
    "sign", "terngrad", "top_k",
]  # fmt: skip


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
    compressor = makers[upload]()  # first, so that an error names the encoder chosen
    qsgd(levels), top_k(fraction)  # both options are checked, used or not
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
    encodings' exact bytes (a ``PayloadBytes`` hook), so compression
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
    if algorithm.hook(Freezing) is not None:
        raise ValueError(
            f"{algorithm.name} uploads only the layers it trains: it cannot be compressed"
        )

    local = algorithm.local

    def inner(ctx: LocalContext) -> LocalContext:
        return ctx.replace(client_state=ctx.client_state[0])

    def client_init(params: Params) -> ClientState:
        return algorithm.client_init(params), upload.init(params)

    def client_start(model, payload, client_state, batches, hyper, key):
        start, state = local.start(model, payload, client_state[0], batches, hyper, key)
        return start, (state, client_state[1])

    def local_loss(model, params, batch, ctx, hyper, key):
        return local.loss(model, params, batch, inner(ctx), hyper, key)

    def client_finalize(params, ctx, hyper):
        update, state = local.finalize(params, inner(ctx), hyper)
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

    compressed_algorithm = dataclasses.replace(
        algorithm,
        aggregator=_majority_vote() if majority_vote else algorithm.aggregator,
        name=f"{algorithm.name}+{upload.name}+down({download or 'float32'})",
        client_init=client_init,
        local=LocalTraining(local.optimizer, local_loss, client_start, client_finalize),
        broadcast=broadcast,
    )
    hooks = [PayloadBytes(payload)]
    if (personal := algorithm.hook(Personalized)) is not None:
        hooks.append(Personalized(lambda s, c: personal.params(s, c[0])))
    return attach(compressed_algorithm, *hooks)
