"""GANDALF phase 1: one conditional WGAN-GP per label group, passed client to client.

Chou, Chang and Chou, "A GAN-based Data Augmentation Framework for Federated
Learning on Non-IID Data" (GANDALF; notes: dace-gandalf-freezefl §B.1),
Algorithm 1. One GAN (``wgan.wgan_gp``) per K-Means group
(``rebalance.label_groups``) visits its clients one after the other; at each
client the generator takes ``T_g = 3`` steps, each after ``T_d = 2`` critic
steps, on batches of that client's data (``WGANGP.client_visit``: a visit is
``T_g * T_d`` critic and ``T_g`` generator steps). :func:`train_sequential`
runs this as a ``lax.scan`` over the group's member slots (padding slots
masked: the state passes through unchanged) and ``vmap`` over groups;
:func:`generators` turns the trained GANs into ``rebalance.Generator`` hooks.

Decisions where the paper is silent or differs:

- **Small clients.** Clients with fewer than two examples are skipped (one
  example gives the critic nothing to interpolate against but itself); a group
  with no client left is an error.
- **Stopping.** The paper passes the GAN on "until the model converges"
  (flat losses); here a fixed number of ``passes`` over the group's members,
  in client-id order (the paper's mediator picks the next available client).

The GAN itself (``WGANGP``, ``wgan_gp``, ``gradient_penalty``, ``GANState``,
``GANMetrics``) lives in ``fedjax_het.gandalf.wgan`` and is re-exported here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_het import rng
from fedjax_het.data.federated import ClientArrays
from fedjax_het.gandalf.rebalance import Generator
from fedjax_het.gandalf.wgan import WGANGP, GANMetrics, GANState, gradient_penalty, wgan_gp
from fedjax_het.typing import Params, PRNGKey

__all__ = [
    "WGANGP",
    "GANMetrics",
    "GANState",
    "generators",
    "gradient_penalty",
    "group_members",
    "train_sequential",
    "wgan_gp",
]


def group_members(groups: np.ndarray, count: np.ndarray, *, min_examples: int = 2) -> np.ndarray:
    """``[G, S]`` client ids of each group in id order, padded with -1; small clients left out.

    Clients with fewer than ``min_examples`` rows are skipped (see the module
    docstring); a group left with no client raises.
    """
    groups, count = np.asarray(groups), np.asarray(count)
    if groups.shape != count.shape or groups.ndim != 1:
        raise ValueError(f"groups {groups.shape} must be [num_clients] like count {count.shape}")
    if groups.size == 0 or groups.min() < 0:
        raise ValueError("groups must hold one group id >= 0 per client")
    members = [
        np.flatnonzero((groups == g) & (count >= min_examples)) for g in range(groups.max() + 1)
    ]
    empty = [g for g, ids in enumerate(members) if ids.size == 0]
    if empty:
        raise ValueError(
            f"group(s) {empty} have no client with >= {min_examples} examples to train a GAN on"
        )
    slots = max(ids.size for ids in members)
    padded = np.full((len(members), slots), -1, dtype=np.int32)
    for g, ids in enumerate(members):
        padded[g, : ids.size] = ids
    return padded


def train_sequential(
    gan: WGANGP,
    train: ClientArrays,
    groups: np.ndarray,
    *,
    key: PRNGKey,
    passes: int = 1,
    batch_size: int = 256,
) -> tuple[GANState, GANMetrics]:
    """One GAN per group, passed client to client ``passes`` times (GANDALF Algorithm 1).

    Args:
      gan: the GAN (``gan.features`` must equal the flattened example size).
      train: the clients' training rows.
      groups: ``[num_clients]`` group id of every client, e.g. from
        ``rebalance.label_groups``; groups are ``0 .. max``.
      key: root key; group ``g`` starts from ``fold_in(stream(key, "gan_init"), g)``
        and client ``k``'s visit in pass ``p`` draws from
        ``fold_in(fold_in(stream(key, "gan_train"), p), k)``.
      passes: sweeps over each group's members, in client-id order.
      batch_size: rows per critic or generator batch (256 in GANDALF).

    Returns:
      ``(states, metrics)``: the ``[G, ...]`` stacked GANs and ``[G, passes * S]``
      metrics of every member slot of every pass (NaN at padding slots).
    """
    if passes < 1 or batch_size < 1:
        raise ValueError(f"passes and batch_size must be >= 1, got {passes}, {batch_size}")
    features = int(np.prod(train.x.shape[1:], dtype=np.int64))
    if features != gan.features:
        raise ValueError(f"examples have {features} features but the GAN has {gan.features}")
    if train.y.size and (train.y.min() < 0 or train.y.max() >= gan.num_classes):
        raise ValueError(f"labels must lie in [0, {gan.num_classes}) for this GAN")
    members = group_members(groups, train.count)
    x = jnp.asarray(train.x.reshape(train.x.shape[0], features), jnp.float32)
    return _train_groups(
        gan,
        x,
        jnp.asarray(train.y),
        jnp.asarray(train.offset),
        jnp.asarray(train.count),
        jnp.asarray(members),
        key,
        passes,
        batch_size,
    )


@functools.partial(jax.jit, static_argnums=(0, 7, 8))
def _train_groups(gan, x, y, offset, count, members, key, passes, batch_size):
    init_stream = rng.stream(key, "gan_init")
    train_stream = rng.stream(key, "gan_train")
    passes_idx = jnp.repeat(jnp.arange(passes), members.shape[1])

    def one_group(group_id, member_ids):
        slots = jnp.tile(member_ids, passes)

        def visit(state, slot):
            pass_idx, client = slot
            active = client >= 0
            client = jnp.maximum(client, 0)
            visit_key = rng.client_key(rng.round_key(train_stream, pass_idx), client)
            trained, metrics = gan.client_visit(
                state, x, y, offset[client], count[client], visit_key, batch_size
            )
            state = jax.tree.map(lambda new, old: jnp.where(active, new, old), trained, state)
            metrics = jax.tree.map(lambda m: jnp.where(active, m, jnp.nan), metrics)
            return state, metrics

        state = gan.init(rng.client_key(init_stream, group_id))
        return lax.scan(visit, state, (passes_idx, slots))

    return jax.vmap(one_group)(jnp.arange(members.shape[0]), members)


def generators(gan: WGANGP, states: GANState) -> list[Generator]:
    """One ``rebalance.Generator`` per group of ``train_sequential``'s stacked ``states``.

    Each call draws its latents from its key. Label arrays are padded to the
    next power of two (with label 0) so that few shapes compile; the padded
    rows are dropped.
    """
    num_groups = jax.tree.leaves(states.generator)[0].shape[0]
    return [
        functools.partial(
            _generate_padded, gan, jax.tree.map(lambda p, g=g: p[g], states.generator)
        )
        for g in range(num_groups)
    ]


def _generate_padded(gan: WGANGP, generator: Params, key: PRNGKey, labels) -> jax.Array:
    labels = np.asarray(labels, dtype=np.int32)
    if labels.size == 0:
        return jnp.zeros((0, gan.features), jnp.float32)
    padded = np.zeros(1 << int(labels.size - 1).bit_length(), dtype=np.int32)
    padded[: labels.size] = labels
    return _generate_jit(gan, generator, key, padded)[: labels.size]


@functools.partial(jax.jit, static_argnums=0)
def _generate_jit(gan, generator, key, labels):
    return gan.generate(generator, key, labels)
