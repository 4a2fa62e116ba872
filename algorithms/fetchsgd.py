"""FetchSGD: clients send a Count Sketch of their update; momentum and error live in sketch space.

Rothchild, Panda, Ullah, Ivkin, Stoica, Braverman, Gonzalez and Arora,
"FetchSGD: Communication-Efficient Federated Learning with Sketching" (ICML
2020), Algorithm 1. Each client trains as in FedAvg and sends ``S(Δ_k)``, the
Count Sketch (Charikar, Chen and Farach-Colton 2002) of its update flattened
to ``d`` values: ``rows x cols`` buckets, coordinate ``i`` added with sign
``s_j(i)`` into bucket ``h_j(i)`` of every row ``j``. The sketch is linear, so
the server's weighted mean of the sketches is the sketch of the weighted mean
of the updates (computed that way here: the same numbers up to float
rounding, at one sketch a round instead of one a client). The server keeps a
momentum sketch ``S_u`` and an error sketch ``S_e``:

    S_u <- ρ S_u + S(mean Δ)      S_e <- S_e + S_u
    Δ = top_k(U(S_e))             params <- params - η Δ

where ``U`` estimates every coordinate as the median over rows of
``s_j(i) S_e[j, h_j(i)]``, and ``top_k`` keeps the ``k`` largest estimates.
Then the buckets ``S(Δ)`` touches are zeroed in ``S_e`` (error feedback) and
in ``S_u`` (momentum masking), as the authors' code does: it reports that
subtracting ``S(Δ)`` from ``S_e``, as the paper writes, diverged.

Clients are stateless. Bytes: each client uploads ``rows x cols`` float32
values and downloads the model (a sketch as large as the model saves nothing). ``ρ`` (``fetch_momentum``) and ``η``
(``server_lr``) are traced; the sketch's shape and ``k`` are structural. The
hash functions come from ``jax.random`` with a fixed ``seed``, known to clients
and server.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import struct
from jax.flatten_util import ravel_pytree

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.engine.algorithm import FederatedAlgorithm, float_dtype
from fedjax_het.engine.hooks import PayloadBytes
from fedjax_het.engine.hyper import DECAY
from fedjax_het.transforms.compression import bytes_sent, identity
from fedjax_het.typing import Hyper, Params, PRNGKey, Update


@struct.dataclass
class ServerState:
    params: Params
    momentum: jax.Array  # S_u, [rows, cols]
    error: jax.Array  # S_e, [rows, cols]


@dataclasses.dataclass(frozen=True)
class CountSketch:
    """A Count Sketch with ``cols`` buckets a row: coordinate ``i`` goes to bucket
    ``buckets[j, i]`` of row ``j`` with sign ``signs[j, i]`` (``[rows, d]`` each)."""

    buckets: jax.Array
    signs: jax.Array
    cols: int

    @classmethod
    def draw(cls, d: int, rows: int, cols: int, seed: int = 0) -> CountSketch:
        """The hashes of ``d``-vectors, drawn from ``seed`` (shared by clients and server)."""
        bucket_key, sign_key = jax.random.split(jax.random.key(seed))
        buckets = jax.random.randint(bucket_key, (rows, d), 0, cols, jnp.int32)
        signs = jnp.where(jax.random.bernoulli(sign_key, 0.5, (rows, d)), 1.0, -1.0)
        return cls(buckets, signs.astype(jnp.float32), cols)

    def sketch(self, vector: jax.Array) -> jax.Array:
        """``S(vector)``: ``[rows, cols]``."""
        one_row = lambda b, s: jax.ops.segment_sum(s * vector, b, num_segments=self.cols)
        return jax.vmap(one_row)(self.buckets, self.signs.astype(vector.dtype))

    def estimate(self, table: jax.Array) -> jax.Array:
        """``U(table)``: every coordinate's median over rows of ``s_j(i) table[j, h_j(i)]``."""
        values = jnp.take_along_axis(table, self.buckets, axis=1) * self.signs.astype(table.dtype)
        return jnp.median(values, axis=0)

    def touched(self, vector: jax.Array) -> jax.Array:
        """``[rows, cols]`` whether a nonzero coordinate of ``vector`` hashes to each bucket."""
        nonzero = (vector != 0).astype(jnp.int32)
        one_row = lambda b: jax.ops.segment_max(nonzero, b, num_segments=self.cols)
        return jax.vmap(one_row)(self.buckets) > 0


def top_k(vector: jax.Array, k: int) -> jax.Array:
    """``vector`` with all but its ``k`` largest magnitudes zeroed (ties: the lower index)."""
    _, index = jax.lax.top_k(jnp.abs(vector), k)
    return jnp.zeros_like(vector).at[index].set(vector[index])


def fetchsgd(
    *,
    rows: int = 5,
    cols: int = 10_000,
    k: float = 0.01,
    momentum: float = 0.9,
    client_lr: float = 0.05,
    server_lr: float = 1.0,
    seed: int = 0,
) -> FederatedAlgorithm:
    """FetchSGD with a ``rows x cols`` sketch, unsketching the top ``k`` (a share of the params).

    Args:
      rows, cols: the Count Sketch's shape (the paper: 5 rows, columns set by the
        upload budget).
      k: share of the ``d`` parameters the server takes from the sketch each round, in (0, 1].
      momentum: ``ρ``, the server's momentum in sketch space (``fetch_momentum``).
      client_lr, server_lr: local SGD's and the server's learning rates.
      seed: of the hash functions.

    Hyperparameters:
      fetch_momentum: ρ, the server's momentum in sketch space, in [0, 1).

    References:
      Rothchild, Panda, Ullah, Ivkin, Stoica, Braverman, Gonzalez and Arora, "FetchSGD:
      Communication-Efficient Federated Learning with Sketching" (ICML 2020), Algorithm 1.
    """
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"fetchsgd: {name} must be an int >= 1, got {value!r}")
    if not 0 < k <= 1:
        raise ValueError(f"fetchsgd: k must be a share of the params in (0, 1], got {k}")
    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        extra_hyper=(("fetch_momentum", float(momentum)),),
        hyper_ranges=(("fetch_momentum", DECAY),),
        name="fetchsgd",
    )

    def server_init(params: Params, hyper: Hyper, num_clients: int) -> ServerState:
        del hyper, num_clients
        zeros = jnp.zeros((rows, cols), float_dtype(params))
        return ServerState(params, zeros, zeros)

    def server_update(
        state: ServerState, mean_update: Update, hyper: Hyper, key: PRNGKey | None = None
    ) -> ServerState:
        del key
        flat, unflatten = ravel_pytree(mean_update)
        sketch = CountSketch.draw(flat.size, rows, cols, seed)  # one draw a round, in the program
        momentum = hyper["fetch_momentum"] * state.momentum + sketch.sketch(flat)
        error = state.error + momentum
        delta = top_k(sketch.estimate(error), max(1, math.ceil(k * flat.size)))
        touched = sketch.touched(delta)  # the buckets S(Δ) writes to
        params = jax.tree.map(
            lambda p, u: p - hyper["server_lr"].astype(p.dtype) * u, state.params, unflatten(delta)
        )
        return ServerState(
            params, jnp.where(touched, 0, momentum), jnp.where(touched, 0, error)
        )

    def payload(params: Params) -> tuple[int, int]:
        return bytes_sent(identity(), params), 4 * rows * cols

    return dataclasses.replace(
        base,
        server_init=server_init,
        server_update=server_update,
        global_params=lambda state: state.params,
        hooks=(PayloadBytes(payload),),
    )
