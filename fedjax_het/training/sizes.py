"""Every size a config sets, priced before anything is built on it (issue "Nothing silent").

The memory planner (``engine.memory``) chooses the chunk of a round that will run; it prices
the round's program, not the arrays a run builds around it. A config can set sizes that no
device holds long before that program exists: the scan of ``local.steps`` (or of
``local.max_steps``, or the steps ``local.epochs`` asks of the largest client), the padded
evaluation batch (``engine.eval_batch_size``), a Bernoulli trace's slots
(``system.availability_slots``), the whole run's schedule (``rounds`` with a [system]), the
over-committed cohort (``policy.over_commit``) and the ring of models that stale updates
train from (``server.max_staleness``, ``policy.max_staleness``). ``check`` prices each as a
lower bound of the bytes it needs (the arrays it certainly builds, nothing of what XLA adds)
and refuses, in one line naming the key, a size whose bound does not fit the memory there is,
or whose count does not fit the int32 that indexes it. It runs once the data are built (the
sizes depend on its clients and rows) and before the system, the directory or any program.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.engine.client_store import available_memory, format_bytes
from fedjax_het.engine.memory import SAFETY
from fedjax_het.models import Model
from fedjax_het.schema import INT_BITS, ConfigError

INT_LIMIT = 2 ** (INT_BITS - 1)  # JAX indexes in int32
# Bytes per element of what each size certainly builds:
POSITION_BYTES = 13  # a local step's row: its int32 index, uint32 shuffle key, int32 row, mask
SLOT_BYTES = 12  # a Bernoulli trace slot: its float32 draw, start and end of its interval
SCHEDULE_BYTES = 16  # a scheduled slot: client id, steps, start and end (4 bytes each)


class Size(NamedTuple):
    """One priced size: the key that sets it, its value, what it builds, its count and bytes."""

    key: str
    value: Any
    what: str
    count: int
    bytes: int

    def setting(self) -> str:
        """``local.epochs = 1e+09``: the key and its value as the error names them (the key
        alone when it says both, ``value`` None)."""
        if self.value is None:
            return self.key
        value = f"{self.value:g}" if isinstance(self.value, float) else self.value
        return f"{self.key} = {value}"


def check(
    config: Mapping[str, Any], data: FederatedData, model: Model, work: LocalWork, cohort: int,
    *, planned: bool = True, free_bytes: int | None = None,
) -> None:
    """Raises a ConfigError naming the first size of ``config`` (resolved) that cannot run on
    ``data`` with ``model``: over int32, or a lower bound over ``SAFETY`` of ``free_bytes``
    (default: the device's free memory, ``client_store.available_memory``). ``planned``: the
    run's schedule is computed before training (not round by round, ``Timing.in_loop``)."""
    refuse(sizes(config, data, model, work, cohort, planned=planned), free_bytes)


def check_data(config: Mapping[str, Any], *, free_bytes: int | None = None) -> None:
    """Raises a ConfigError for a generated dataset (``data.name = "synthetic"``) whose
    examples would not fit: before it is generated, client by client."""
    if config["data"]["name"] != "synthetic":
        return
    table = config["data"]
    defaults = inspect.signature(leaf_synthetic).parameters
    clients = table["num_clients"]
    features = table.get("num_features", defaults["num_features"].default)
    rows = clients * defaults["min_size"].default  # every client has at least min_size
    elements = rows * features
    setting = f"data.num_clients = {clients} and data.num_features = {features}"
    what = f"at least {rows:,} examples of {features:,} features"
    refuse([Size(setting, None, what, elements, elements * 4)], free_bytes)


def refuse(priced: list[Size], free_bytes: int | None = None) -> None:
    """Raises a ConfigError naming the first of ``priced`` over int32 or over ``SAFETY`` of
    ``free_bytes`` (default: the device's free memory)."""
    free = available_memory().device_free if free_bytes is None else free_bytes
    for size in priced:
        if size.count >= INT_LIMIT:
            raise ConfigError(
                f"{size.setting()} makes {size.what}: {size.count:,} elements, beyond the int32 "
                f"that indexes them (< 2**{INT_BITS - 1})"
            )
        if size.bytes > SAFETY * free:
            raise ConfigError(
                f"{size.setting()} makes {size.what} of at least {format_bytes(size.bytes)}, "
                f"which does not fit the device ({format_bytes(free)} free)"
            )


def sizes(
    config: Mapping[str, Any], data: FederatedData, model: Model, work: LocalWork, cohort: int,
    *, planned: bool = True,
) -> list[Size]:
    """Every size ``config`` sets, priced (``check``); ``over_commit`` beyond the clients is
    refused here, since it cannot make sense at any size."""
    priced = [_local_steps(config, data, work), _evaluation(config, data)]
    system, policy = config.get("system") or {}, config.get("policy") or {}
    server = config.get("server") or {}
    slots = cohort
    if "over_commit" in policy:
        slots = _over_commit(policy["over_commit"], cohort, data.num_clients)
    if server.get("mode") == "async":
        slots = server["buffer_size"]
    if system.get("availability") == "bernoulli":
        count = data.num_clients * system["availability_slots"]
        priced.append(Size("system.availability_slots", system["availability_slots"],
                           "a Bernoulli trace", count, count * SLOT_BYTES))
    if (system or policy) and planned:
        count = config["rounds"] * slots
        priced.append(Size("rounds", config["rounds"], "the run's schedule", count,
                           count * SCHEDULE_BYTES))
    leaves = _abstract_params(model)
    params = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in leaves)
    largest = max((int(np.prod(leaf.shape)) for leaf in leaves), default=0)
    shape = ", ".join(f"{k} = {v}" for k, v in config["model"].items() if k != "name")
    priced.append(Size(f"model.name = {config['model']['name']!r}" + (f" with {shape}" if shape
                       else ""), None, "params", largest, params))
    for key, depth in _rings(config):
        priced.append(Size(key, depth - 1, f"a ring of {depth:,} models", depth, depth * params))
    return priced


def _local_steps(config: Mapping[str, Any], data: FederatedData, work: LocalWork) -> Size:
    """One client's scan of local steps: ``static_steps x batch_size`` rows, named by the key
    that sets the steps."""
    max_count = int(np.max(data.train.count)) if data.num_clients else 0
    steps = work.static_steps(max_count)
    local = config["local"]
    key = next(k for k in ("max_steps", "steps", "epochs", "batch_size") if k in local)
    positions = steps * work.batch_size
    what = f"{steps:,} local steps of {work.batch_size} rows"
    return Size(f"local.{key}", local[key], what, positions + max_count,
                positions * POSITION_BYTES)


def _evaluation(config: Mapping[str, Any], data: FederatedData) -> Size:
    """The test split padded to whole evaluation batches (``metrics.evaluate``)."""
    split = data.test if data.test is not None else data.train
    batch = config["engine"]["eval_batch_size"]
    rows = max(1, -(-split.y.shape[0] // batch)) * batch
    row_bytes = int(np.prod(split.x.shape[1:])) * split.x.dtype.itemsize + split.y.dtype.itemsize
    return Size("engine.eval_batch_size", batch, "padded evaluation batches", rows,
                rows * (row_bytes + 1))


def _over_commit(over_commit: float, cohort: int, num_clients: int) -> int:
    """The slots ``ceil(m (1 + over_commit))`` (``policy.num_selected``, in Python: no int32
    wrap), refused beyond the clients of the data."""
    slots = math.ceil(cohort * (1.0 + over_commit) - 1e-4)
    if slots > num_clients:
        most = num_clients / cohort - 1.0
        raise ConfigError(
            f"policy.over_commit = {over_commit:g} selects ceil({cohort} x (1 + {over_commit:g}))"
            f" = {slots:,} clients a round, more than the {num_clients} clients of the data; "
            f"at most {most:.4g} with sampler.clients_per_round = {cohort}"
        )
    return slots


def _rings(config: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(key, models kept)`` of the rings of past models a run keeps (``plan.ring_depth``)."""
    server, policy = config.get("server") or {}, config.get("policy") or {}
    rings = []
    if server.get("mode") == "async":
        rings.append(("server.max_staleness", server["max_staleness"] + 1))
    if policy.get("max_staleness"):
        rings.append(("policy.max_staleness", policy["max_staleness"] + 1))
    return rings


def _abstract_params(model: Model) -> list:
    """The shapes of ``model``'s params (``jax.eval_shape``: nothing is computed)."""
    return jax.tree.leaves(jax.eval_shape(model.init, jax.random.key(0)))
