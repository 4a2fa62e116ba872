"""Evaluation of the global model and per-client accuracy summaries."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.local import DeviceSplit
from fedjax_het.models import Model
from fedjax_het.typing import Params


def evaluate(
    model: Model, params: Params, split: DeviceSplit, row_client: jax.Array, *, batch_size: int
) -> dict[str, jax.Array]:
    """Loss and accuracy of ``params`` on every row of ``split``, overall and per client.

    Rows are evaluated in batches of ``batch_size`` under ``lax.map`` (the
    last batch padded and masked). Returns the example-weighted global loss and
    accuracy and per-client ``correct``, ``loss_sum`` and ``count`` [num_clients].
    """
    n = split.y.shape[0]
    num_batches = max(1, -(-n // batch_size))
    pad = num_batches * batch_size - n

    def padded(a):
        a = jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)])
        return a.reshape(num_batches, batch_size, *a.shape[1:])

    valid = padded(jnp.ones((n,), bool))

    def one_batch(inputs):
        x, y = inputs
        outputs = model.apply(params, x, train=False, key=None)
        return model.per_example_loss(outputs, y), jnp.argmax(outputs, -1) == y

    losses, correct = jax.lax.map(one_batch, (padded(split.x), padded(split.y)))
    losses = jnp.where(valid, losses, 0.0).reshape(-1)[:n]
    correct = jnp.where(valid, correct, False).reshape(-1)[:n].astype(jnp.float32)
    num_clients = split.count.shape[0]
    per_client = lambda v: jax.ops.segment_sum(v, row_client, num_segments=num_clients)  # noqa: E731
    return {
        "loss": jnp.sum(losses) / max(n, 1),
        "accuracy": jnp.sum(correct) / max(n, 1),
        "client_correct": per_client(correct),
        "client_loss_sum": per_client(losses),
        "client_count": split.count,
    }


def client_accuracy_summary(client_correct: np.ndarray, client_count: np.ndarray) -> dict[str, float]:
    """Distribution of per-client test accuracy over clients that have test examples.

    Returns mean, standard deviation (HDFL's good-intent fairness), 10th
    percentile and worst client, plus how many clients were evaluated.
    """
    has_test = client_count > 0
    acc = client_correct[has_test] / client_count[has_test]
    if acc.size == 0:
        nan = float("nan")
        return {"client_accuracy_mean": nan, "client_accuracy_std": nan,
                "client_accuracy_p10": nan, "client_accuracy_min": nan, "clients_evaluated": 0}
    return {
        "client_accuracy_mean": float(acc.mean()),
        "client_accuracy_std": float(acc.std()),
        "client_accuracy_p10": float(np.percentile(acc, 10)),
        "client_accuracy_min": float(acc.min()),
        "clients_evaluated": int(acc.size),
    }
