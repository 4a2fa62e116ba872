"""GANDALF phase 1: one conditional WGAN-GP per label group, passed client to client.

Chou, Chang and Chou, "A GAN-based Data Augmentation Framework for Federated
Learning on Non-IID Data" (GANDALF; notes: dace-gandalf-freezefl §B.1),
Algorithm 1. One GAN (``wgan.wgan_gp``) per K-Means group
(``rebalance.label_groups``) visits its clients one after the other; at each
client the generator takes ``T_g = 3`` steps, each after ``T_d = 2`` critic
steps, on batches of that client's data (``WGANGP.client_visit``: a visit is
``T_g * T_d`` critic and ``T_g`` generator steps). :func:`train_sequential`
runs this as a ``lax.scan`` over the group's member slots (padding slots
masked: the state passes through unchanged) and ``vmap`` over groups, the
slots split into calls of one compiled program (a progress bar moves after
each; the split changes no bit); :func:`generators` turns the trained GANs
into ``rebalance.Generator`` hooks.

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
from fedjax_het.training import progress as progress_bar
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
    progress: bool = False,
    visits_per_call: int | None = None,
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
      progress: a bar of the visits (``passes * S`` member slots, the groups side by
        side) with the critic's mean Wasserstein estimate of the last ones.
      visits_per_call: member slots per call of the one compiled program (the bar moves
        after each); None: about 1/25 of them. The GANs are the same bits whatever it is.

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
    if visits_per_call is not None and visits_per_call < 1:
        raise ValueError(f"visits_per_call must be >= 1 or None, got {visits_per_call}")
    members = group_members(groups, train.count)
    x = jnp.asarray(train.x.reshape(train.x.shape[0], features), jnp.float32)
    rows = (x, jnp.asarray(train.y), jnp.asarray(train.offset), jnp.asarray(train.count))
    visits = members.shape[1] * passes
    chunk = visits_per_call or -(-visits // _CALLS)
    states = _init_groups(gan, key, members.shape[0])
    bar = progress_bar.bar(
        visits, desc=f"GAN phase ({members.shape[0]} groups)", unit="visit", progress=progress
    )
    parts = []
    for first in range(0, visits, chunk):
        slots = _visit_slots(members, passes, first, chunk)
        states, metrics = _train_visits(gan, states, *rows, *slots, key, batch_size)
        parts.append(jax.device_get(metrics))
        done = min(chunk, visits - first)
        bar.update(done)
        bar.set_postfix_str(f"wasserstein={np.nanmean(parts[-1].wasserstein[:, :done]):.3f}")
    bar.close()
    metrics = jax.tree.map(lambda *m: np.concatenate(m, axis=1)[:, :visits], *parts)
    return states, metrics


_CALLS = 25
"""Calls of the visits program a GAN phase is split into by default (fewer if fewer visits)."""


def _visit_slots(
    members: np.ndarray, passes: int, first: int, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """``([chunk] pass index, [G, chunk] client id)`` of visits ``first : first + chunk`` of
    the ``passes * S`` member slots in order, padded with client -1 (no visit) past the end."""
    size = members.shape[1]
    order = np.arange(first, first + chunk)
    inside = order < size * passes
    pass_idx = np.where(inside, order // size, 0).astype(np.int32)
    clients = np.where(inside, members[:, order % size], -1).astype(np.int32)
    return jnp.asarray(pass_idx), jnp.asarray(clients)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_groups(gan, key, num_groups):
    init_stream = rng.stream(key, "gan_init")
    return jax.vmap(lambda g: gan.init(rng.client_key(init_stream, g)))(jnp.arange(num_groups))


@functools.partial(jax.jit, static_argnums=(0, 9))
def _train_visits(gan, states, x, y, offset, count, pass_idx, clients, key, batch_size):
    """The ``[G]`` GANs after the visits ``(pass_idx [V], clients [G, V])`` (client -1: the
    state passes through, metrics NaN): ``vmap`` over groups of a ``lax.scan`` over visits."""
    train_stream = rng.stream(key, "gan_train")

    def one_group(state, member_ids):
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

        return lax.scan(visit, state, (pass_idx, member_ids))

    return jax.vmap(one_group)(states, clients)


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
