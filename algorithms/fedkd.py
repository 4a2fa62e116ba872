"""FedKD: a shared mentee and a private mentor per client, taught by adaptive mutual distillation.

Wu, Wu, Lyu, Huang and Xie, "Communication-efficient federated learning via knowledge
distillation" (Nature Communications 13, 2032, 2022), §Methods. Client ``k`` keeps a private
mentor ``t_k`` (its client state) and receives the shared mentee ``s`` (the global model). On
each batch, with ``y_t``/``y_s`` the two models' predicted distributions and ``L^t_t``,
``L^t_s`` their task (cross-entropy) losses, the paper's Eqs. (1)-(2) and (5)-(6) give

    L_t = L^t_t + KL(y_s || y_t) / (L^t_t + L^t_s)          (the mentor's loss)
    L_s = L^t_s + KL(y_t || y_s) / (L^t_t + L^t_s)          (the mentee's loss)

and each model takes an SGD step on its own loss: the other model's prediction is a target
(no gradient flows into it) and the adaptive denominator is a weight. The client uploads the
mentee's update ``Δ = s - s_k`` compressed by truncated SVD (Eq. 7): every 2-D leaf ``Δ ≈
U_r Σ_r V_rᵀ``, sent as ``r (m + n + 1)`` floats, the other leaves whole. The server averages
the reconstructed updates and steps along them as FedAvg does (server_lr 1: Eq. 9's mean).
Its ``PayloadBytes`` hook reports those factor bytes, so the simulated upload time follows
the rank.

>>> algorithm = fedkd(rank_share=0.25)
>>> sorted(algorithm.hyper())
['client_lr', 'server_lr']
>>> import jax, jax.numpy as jnp
>>> algorithm.hook(PayloadBytes).count({"w": jnp.zeros((8, 4)), "b": jnp.zeros(4)})  # r = 1
(144, 68)

Decisions the paper leaves open, made here:

- The mentee has the mentor's architecture (as FLHetBench ran it, ``flhetbench-notes.md``
  §5.5); the paper's mentee is smaller. The mentor starts from the initial global model.
- Only the output distillation is kept; the hidden-state and attention losses ``L^h`` of
  Eqs. (3)-(4) need a model's internals, which ``Model`` does not expose.
- The rank is ``r = ceil(rank_share * min(m, n))``, fixed for the run, because upload bytes
  are priced per run (the ``PayloadBytes`` hook). The paper keeps the smallest rank whose
  energy exceeds ``T(t)``, rising from 0.95 to 0.98 over training: rank varies per round and
  client. The download is the whole mentee (FLHetBench's accounting), not the paper's
  compressed aggregate.
- The KL is taken per example (over the last axis, averaged over any sequence axis) and
  averaged over the batch's kept examples, like the task loss.

.. warning:: Client states hold a whole model per client (``[num_clients, ...params]``).
.. warning:: The reported training loss is the mentee's cross-entropy ``L^t_s`` alone.
.. warning:: A client never counted keeps its initial mentor (the initial global model).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het.algorithms import optimizers
from fedjax_het.algorithms.fedavg import ServerState, fedavg
from fedjax_het.engine.algorithm import Batches, FederatedAlgorithm, LocalContext
from fedjax_het.engine.hooks import PayloadBytes, Personalized, attach
from fedjax_het.models import Model
from fedjax_het.typing import Batch, ClientState, Hyper, Params, PRNGKey, Update


@struct.dataclass
class FedKDParams:
    """What a FedKD client trains: the shared mentee ``s`` and its private mentor ``t``."""

    mentee: Params
    mentor: Params


def start_pair(
    model: Model, broadcast: Params, mentor: ClientState, batches: Batches, hyper: Hyper,
    key: PRNGKey,
) -> tuple[FedKDParams, ClientState]:
    """Local training starts from ``(s, t_k)``."""
    del model, batches, hyper, key
    return FedKDParams(broadcast, mentor), mentor


def per_example_kl(target_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """``KL(softmax(target) || softmax(logits))`` per example: summed over the last axis and
    averaged over any axes between the batch and it (a sequence's positions)."""
    log_p = jax.nn.log_softmax(target_logits)
    kl = jnp.sum(jnp.exp(log_p) * (log_p - jax.nn.log_softmax(logits)), axis=-1)
    return kl.reshape(kl.shape[0], -1).mean(axis=1)


def fedkd_loss(
    model: Model, params: FedKDParams, batch: Batch, ctx: LocalContext, hyper: Hyper, key: PRNGKey
) -> jax.Array:
    """``L_s + L_t`` with each model's gradient from its own loss; its value is ``L^t_s``."""
    del ctx, hyper
    x, y, mask = batch
    out_s = model.apply(params.mentee, x, train=True, key=key)
    out_t = model.apply(params.mentor, x, train=True, key=key)
    ce_s, ce_t = model.loss(out_s, y, mask), model.loss(out_t, y, mask)
    weight = jax.lax.stop_gradient(ce_s + ce_t)
    kl_s = per_example_kl(jax.lax.stop_gradient(out_t), out_s)  # the mentee learns y_t
    kl_t = per_example_kl(jax.lax.stop_gradient(out_s), out_t)  # the mentor learns y_s
    m = mask.astype(kl_s.dtype)
    kl_mean = jnp.sum((kl_s + kl_t) * m) / jnp.maximum(jnp.sum(m), 1)
    distill = jnp.where(weight > 0, kl_mean / jnp.where(weight > 0, weight, 1), 0)  # 0 if empty
    rest = ce_t + distill
    return ce_s + (rest - jax.lax.stop_gradient(rest))


def kept_rank(shape: tuple[int, ...], rank_share: float) -> int:
    """``r = ceil(rank_share * min(m, n))`` (at least 1) for a 2-D leaf."""
    return max(1, math.ceil(rank_share * min(shape)))


def svd_truncate(delta: jax.Array, rank_share: float) -> jax.Array:
    """``U_r Σ_r V_rᵀ`` of a 2-D ``delta`` (Eq. 7); other leaves as they are."""
    if delta.ndim != 2:
        return delta
    r = kept_rank(delta.shape, rank_share)
    u, s, vt = jnp.linalg.svd(delta, full_matrices=False)
    return (u[:, :r] * s[None, :r]) @ vt[:r]


def upload_floats(shape: tuple[int, ...], rank_share: float) -> int:
    """Floats a leaf's upload holds: ``r (m + n + 1)`` for a matrix, else all of it."""
    if len(shape) != 2:
        return math.prod(shape)
    return kept_rank(shape, rank_share) * (shape[0] + shape[1] + 1)


def own_model(state: ServerState, mentor: ClientState) -> Params:
    """Client ``k``'s mentor ``t_k``, its personal model."""
    del state
    return mentor


def fedkd(
    *, rank_share: float = 0.25, client_lr: float = 0.05, server_lr: float = 1.0
) -> FederatedAlgorithm:
    """FedKD with the mentee's 2-D updates cut to ``ceil(rank_share * min(m, n))`` singular
    values before upload.

    Args:
      rank_share: share of each matrix's full rank kept in the upload, in (0, 1]; 1 sends the
        update exactly (at more bytes than the matrix itself). Structural: it sets the bytes.
      client_lr, server_lr: the clients' and the server's learning rates (traced as
        ``client_lr`` and ``server_lr``).

    References:
      Wu, Wu, Lyu, Huang and Xie, "Communication-efficient federated learning via knowledge
      distillation", Nature Communications 13, 2032 (2022), Eqs. (1), (2), (5)-(7), (9).
    """
    if not 0 < rank_share <= 1:
        raise ValueError(f"fedkd rank_share must be in (0, 1], got {rank_share}")

    def send_mentee(
        params: FedKDParams, ctx: LocalContext, hyper: Hyper
    ) -> tuple[Update, ClientState]:
        del hyper
        delta = jax.tree.map(lambda s, p: s - p, ctx.start.mentee, params.mentee)
        return jax.tree.map(lambda d: svd_truncate(d, rank_share), delta), params.mentor

    def payload(params: Params) -> tuple[int, int]:
        shapes = [tuple(leaf.shape) for leaf in jax.tree.leaves(params)]
        down = 4 * sum(math.prod(shape) for shape in shapes)
        return down, 4 * sum(upload_floats(shape, rank_share) for shape in shapes)

    base = fedavg(
        client_optimizer=optimizers.sgd("client", lr=client_lr),
        server_optimizer=optimizers.sgd("server", lr=server_lr),
        local_loss=fedkd_loss,
        client_init=lambda params: params,
        client_start=start_pair,
        client_finalize=send_mentee,
        name="fedkd",
    )
    return attach(base, Personalized(own_model), PayloadBytes(payload))
