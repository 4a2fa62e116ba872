"""What the in-loop schedule learns about its clients (``system.sampler.ClientRecord``): the
record after each round (``recorded``), the profile of every client's labels and predictions
(``class_counts``) and the forward-pass order of a model's layers (``in_order``), for the
selections that learn (Oort, power-of-choice, HDFL, FreezeFL's, RBCS-F)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fedjax_het.engine.local import DeviceSplit
from fedjax_het.models import Model
from fedjax_het.system.sampler import ClientRecord
from fedjax_het.system.schedule import EMPTY, OK, UNAVAILABLE, Schedule
from fedjax_het.typing import Params


def class_counts(
    model: Model, params: Params, split: DeviceSplit, *, batch_size: int
) -> tuple[jax.Array, jax.Array]:
    """``(predicted, actual)``, ``[N, C]`` each: per client, its rows by arg-max output, by label.

    Rows belong to clients in order (``ClientArrays.client_ids``); they run in
    batches of ``batch_size`` under ``lax.map``, the last padded and masked.
    """
    n, num_clients = split.y.shape[0], split.count.shape[0]
    num_batches = max(1, -(-n // batch_size))
    rows = jnp.arange(num_batches * batch_size).reshape(num_batches, batch_size)

    apply = functools.partial(model.apply, train=False, key=None)
    num_classes = jax.eval_shape(apply, params, split.x[:1]).shape[-1]
    predicted = jax.lax.map(
        lambda idx: jnp.argmax(apply(params, split.x[jnp.minimum(idx, n - 1)]), -1), rows
    ).reshape(num_batches * batch_size, *split.y.shape[1:])[:n]
    owner = jnp.repeat(jnp.arange(num_clients), split.count, total_repeat_length=n)
    owned = jnp.arange(n) < jnp.sum(split.count)
    positions = math.prod(split.y.shape[1:])

    def counts(classes):  # a sequence label counts once per position
        classes = jnp.clip(classes.reshape(n, positions), 0, num_classes - 1)
        cells = owner[:, None] * num_classes + classes
        weight = jnp.broadcast_to(owned[:, None], cells.shape).astype(jnp.float32)
        flat = jax.ops.segment_sum(weight.reshape(-1), cells.reshape(-1), num_clients * num_classes)
        return flat.reshape(num_clients, num_classes)

    return counts(predicted), counts(split.y)


def recorded(
    record: ClientRecord, row: Schedule, stats, overhead, loss_sq: jax.Array | None,
    alignment: jax.Array | None = None,
) -> ClientRecord:
    """``record`` after a round: losses of clients that computed, times of those that finished,
    the work kept and the update alignment of those whose update counted."""
    ids, valid, round_idx = row.selected, row.valid, row.version
    started = valid & (row.outcome != UNAVAILABLE) & (row.outcome != EMPTY)
    ok = valid & (row.outcome == OK)
    examples = jnp.maximum(stats.examples, 1)
    computed = started & (stats.examples > 0)

    def put(field, new, where):
        return field.at[ids].set(jnp.where(where, new, field[ids]))

    return ClientRecord(
        loss=put(record.loss, stats.loss_sum / examples, computed),
        seconds=put(record.seconds, row.finish - overhead, ok),
        selected=put(record.selected, record.selected[ids] + 1, valid),
        aggregated=put(record.aggregated, record.aggregated[ids] + 1, ok),
        lost=put(record.lost, record.lost[ids] + 1, started & ~ok),
        loss_sq=record.loss_sq if loss_sq is None else put(
            record.loss_sq, loss_sq / examples, computed
        ),
        examples=put(record.examples, stats.examples.astype(jnp.int32), computed),
        work_kept=put(
            record.work_kept, 1.0 if stats.work_kept is None else stats.work_kept, ok
        ),
        alignment=record.alignment if alignment is None else put(record.alignment, alignment, ok),
        last_selected=put(record.last_selected, round_idx, valid),
        last_aggregated=put(record.last_aggregated, round_idx, ok),
    )


def in_order(tree: dict, order: list[str]) -> dict:
    """``tree``'s layers as a dict in ``order`` (``models.layer_order``): what a ``Freezing``
    hook iterates, depth 0 the input side."""
    return {name: tree[name] for name in order}
