"""Memory-aware chunking: the largest chunk of clients that fits the device (docs/design.md §3).

A round's device memory is, per run, what its chunk program holds plus the
cohort's arrays, and once, the data store:

    need(chunk) = resident + data + runs x (fixed + cohort x slot + chunk x per_client)

* ``per_client`` and ``fixed``: the slope and intercept of the memory of one
  chunk, ``vmap(local_update)`` over ``c`` clients. Source "xla" compiles
  (never runs) that program at ``c`` = 2 and 4 on abstract inputs and reads
  ``memory_analysis()`` (arguments + outputs + temporaries - aliased). Sizes 2
  and 4, not 1 and 2: ``run_cohort`` runs chunk 1 without ``vmap``, and the
  FEMNIST CNN's size-1 program lies off the line (37.8 MB from 1 to 2 clients,
  50.4 MB per client from 2 on). Source "analytic" adds up shapes from
  ``jax.eval_shape``: one client's inputs and outputs, the batch it gathers
  (one step's: the step loop gathers as it goes; an algorithm whose
  ``client_start`` reads every batch, IFCA's or q-FFL's, holds ``max_steps``
  of them, which only "xla" sees), two params-sized buffers (trained params and
  gradients), the optimizer state and the residuals the backward pass of one
  batch keeps; ``tests/test_memory.py`` holds it at 1-2x XLA's figure.
* ``slot``: per cohort slot, its task, its state gathered and written back,
  and its stats (exact, from ``eval_shape``).
* ``data``: the training split, shared by a sweep's cells (not multiplied by
  ``runs``); ``fixed`` is the rest of the intercept plus the server state.

The chunk is the backend's preference (``cohort.auto_chunk``: on CPU 1 for a
convolutional model and a small ``vmap`` otherwise; on accelerators the whole
cohort), lowered to what fits in ``safety`` of the free memory, as a power of
two (``cohort.effective_chunk``: chunks are whole subtrees of the cohort's
reduction tree) unless the whole cohort fits in one. An explicit chunk wins but
is checked too; a round that cannot fit even one client per chunk is refused
with one line, before the round's program is built or compiled.

>>> from fedjax_het import models
>>> from fedjax_het.algorithms import fedavg
>>> from fedjax_het.data import LocalWork
>>> from fedjax_het.engine.local import LocalSpec
>>> model, algorithm, work = models.logistic_regression((5,), 3), fedavg(), LocalWork(batch_size=4)
>>> spec = LocalSpec(model, algorithm, work, max_steps=2, max_count=8)
>>> train = abstract_split(rows=64, example=(5,), num_clients=8)
>>> plan = plan_chunk(spec, algorithm.hyper(), train, num_clients=8, cohort=4, cap=4,
...                   free_bytes=10**9, source="analytic")
>>> plan.chunk, plan.source
(4, 'analytic')
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fedjax_het.engine.client_store import (
    StatePlan,
    available_memory,
    format_bytes,
    plan_client_state,
    tree_bytes,
)
from fedjax_het.engine.cohort import auto_chunk, effective_chunk
from fedjax_het.engine.local import ClientTask, DeviceSplit, LocalSpec, local_update
from fedjax_het.models import Model
from fedjax_het.schema import ConfigError
from fedjax_het.typing import Hyper

SOURCES = ("auto", "xla", "analytic")
SAFETY = 0.8  # share of the free memory a round may plan to use (allocator slack, evaluation)


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """The chunk a round runs with and the memory it was chosen from (bytes).

    Attributes:
      chunk: clients per ``vmap``.
      per_client_bytes: what one more client in a chunk costs.
      fixed_bytes: per run, what the chunk program holds for any chunk size
        (broadcast, hyperparameters, server state), the data store excluded.
      slot_bytes: per cohort slot: task, state in and out, stats.
      data_bytes: held once: the training split plus the caller's ``resident`` bytes.
      cohort: slots per device.
      runs: runs held at once (a sweep's cells).
      free_bytes: the device's free memory.
      safety: share of ``free_bytes`` the plan may use.
      source: "xla" (compiled memory analysis) or "analytic" (``eval_shape`` sums).
      conv: how the model's convolutions run (``conv_impl_for``); None: it offers no choice.
    """

    chunk: int
    per_client_bytes: int
    fixed_bytes: int
    slot_bytes: int
    data_bytes: int
    cohort: int
    runs: int
    free_bytes: int
    safety: float
    source: str
    conv: str | None = None

    def need(self, chunk: int) -> int:
        """Bytes the round needs with ``chunk`` clients per chunk."""
        per_run = self.fixed_bytes + self.cohort * self.slot_bytes + chunk * self.per_client_bytes
        return self.data_bytes + self.runs * per_run

    def describe(self) -> str:
        """One line: the chunk, the estimate it came from and the memory it uses."""
        runs = f" x {self.runs} runs" if self.runs > 1 else ""
        return (
            f"chunk {self.chunk} of {self.cohort} ({self.source}: "
            f"{format_bytes(self.per_client_bytes)} per client, {format_bytes(self.fixed_bytes)} fixed, "
            f"{format_bytes(self.slot_bytes)} per slot{runs}, {format_bytes(self.data_bytes)} data) needs "
            f"{format_bytes(self.need(self.chunk))} of {format_bytes(self.free_bytes)} free"
            + (f"; convolutions as {self.conv}" if self.conv else "")
        )


@dataclasses.dataclass(frozen=True)
class _Estimate:
    per_client: int
    fixed: int
    slot: int
    source: str


def plan_chunk(
    spec: LocalSpec,
    hyper: Hyper,
    train: DeviceSplit,
    *,
    num_clients: int,
    cohort: int,
    runs: int = 1,
    chunk: int | None = None,
    cap: int | None = None,
    resident: int = 0,
    free_bytes: int | None = None,
    safety: float = SAFETY,
    source: str = "auto",
    in_place: bool = False,
    work_varies: bool = False,
) -> ChunkPlan:
    """Chooses (or checks) the chunk size of a round from its memory.

    Args:
      spec: the round's static local training (model, algorithm, steps).
      hyper: the traced hyperparameters (values or shapes).
      train: the training split on the device, as arrays or ``ShapeDtypeStruct`` s.
      num_clients: the population N (the server state may depend on it).
      cohort: slots each device runs per round (``ceil(slots / devices)``).
      runs: runs held at once (a sweep's cells); each holds its own chunk.
      chunk: the user's chunk: kept (capped at ``cohort``) if it fits, else refused.
      cap: most clients per chunk when choosing; None: ``preferred_chunk``.
      resident: other bytes held on the device throughout (the test split,
        device client states from ``client_store.plan_client_state``).
      free_bytes: the device's free memory; None: ``client_store.available_memory()``.
      safety: share of ``free_bytes`` the round may use.
      source: "xla", "analytic", or "auto": XLA's analysis on accelerators,
        the analytic sum on CPU (chunk 1 by preference, and compiling a CNN
        probe on XLA:CPU takes seconds).
      in_place: client states read and written in their table (``cohort.StateTable``).
      work_varies: the clients' steps may differ (``preferred_chunk``).

    Raises:
      ValueError: (one line) bad arguments, or a round that does not fit with
        one client per chunk (or with the explicit ``chunk``).
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    at_least_one = (cohort, runs, *(n for n in (chunk, cap) if n is not None))
    if min(at_least_one) < 1 or not 0 < safety <= 1:
        raise ValueError(
            f"cohort, runs, chunk and cap must be >= 1 and safety in (0, 1], got cohort {cohort}, "
            f"runs {runs}, chunk {chunk}, cap {cap}, safety {safety}"
        )
    if source == "auto":
        source = "analytic" if jax.default_backend() == "cpu" else "xla"
    leaves, treedef = jax.tree.flatten(_abstract((hyper, train)))
    estimate = _estimate(spec, num_clients, source, in_place, treedef, tuple(leaves))
    free = available_memory().device_free if free_bytes is None else free_bytes
    plan = ChunkPlan(
        chunk=1,
        per_client_bytes=estimate.per_client,
        fixed_bytes=estimate.fixed,
        slot_bytes=estimate.slot,
        data_bytes=tree_bytes(train) + resident,
        cohort=cohort,
        runs=runs,
        free_bytes=free,
        safety=safety,
        source=estimate.source,
    )
    budget = safety * free
    if chunk is None:
        fits = int((budget - plan.need(0)) // max(runs * plan.per_client_bytes, 1))
        preferred = preferred_chunk(spec, train, cohort, work_varies) if cap is None else cap
        chunk = max(1, min(preferred, cohort, fits))
    plan = dataclasses.replace(plan, chunk=effective_chunk(chunk, cohort))
    if plan.need(plan.chunk) > budget:
        raise ValueError(
            f"the round does not fit the device: {plan.describe()}, over the {safety:.0%} "
            f"({format_bytes(budget)}) it may use; use a smaller cohort or chunk, more devices, fewer "
            f"sweep cells, less data or a smaller model, or client_state='host'"
        )
    return plan


def plan_memory(
    spec: LocalSpec,
    hyper: Hyper,
    train: DeviceSplit,
    *,
    num_clients: int,
    rounds: int,
    slots: int,
    placement: str = "auto",
    runs: int = 1,
    devices: int = 1,
    chunk: int | None = None,
    resident: int = 0,
    in_place: bool = True,
    free_bytes: int | None = None,
    work_varies: bool = False,
) -> tuple[StatePlan, ChunkPlan]:
    """Where a round keeps its client states and the chunk it runs, planned together.

    "auto" keeps the states on the device when the whole round fits there with
    them (``plan_chunk``: XLA's memory analysis of the chunk program on
    accelerators), else on the host; "device" and "host" are checked where they
    are. Refused in one line, before anything compiles, when nothing fits.

    Args:
      spec, hyper, train, num_clients, runs, chunk, work_varies: as ``plan_chunk``.
      rounds, slots: a run writes at most ``rounds x slots`` clients' states.
      placement: "auto", "device" or "host" (``client_store.PLACEMENTS``).
      devices: devices the slots and the device states are sharded over.
      resident: other bytes on each device throughout (test split, ring of broadcasts).
      in_place: the round may read and write device states in place
        (``cohort.StateTable``: one device, distinct ids in a cohort).
      free_bytes: the device's free memory; None: ``client_store.available_memory()``.
    """
    free = available_memory().device_free if free_bytes is None else free_bytes
    errors = []
    for where in ("device", "host") if placement == "auto" else (placement,):
        try:
            state = plan_client_state(
                spec.algorithm, spec.model, num_clients=num_clients, rounds=rounds, slots=slots,
                placement=where, runs=runs, devices=devices,
                memory=lambda: dataclasses.replace(available_memory(), device_free=free),
            )  # fmt: skip
            on_device = state.placement == "device"
            chunk_plan = plan_chunk(
                spec, hyper, train, num_clients=num_clients, cohort=-(-slots // devices),
                runs=runs, chunk=chunk, free_bytes=free,
                resident=resident + (state.device_bytes // devices if on_device else 0),
                in_place=in_place and on_device and devices == 1, work_varies=work_varies,
            )  # fmt: skip
            return state, chunk_plan
        except ValueError as error:
            errors.append(f"on the {where}: {error}" if placement == "auto" else str(error))
    raise ConfigError("; ".join(errors))


def preferred_chunk(
    spec: LocalSpec, train: DeviceSplit, cohort: int, work_varies: bool = False
) -> int:
    """The backend's chunk for this model before memory is counted (``cohort.auto_chunk``),
    told whether the model convolves (XLA:CPU runs batched convolutions slowly) and, when
    the clients' work varies on an accelerator, the FLOPs of one client's step."""
    flops = step_flops(spec, train) if work_varies and jax.default_backend() != "cpu" else None
    return auto_chunk(cohort, convolutional=convolutional(spec.model, train.x), step_flops=flops)


def step_flops(spec: LocalSpec, train: DeviceSplit) -> float:
    """One client's local step in floating-point operations: XLA's count of the forward
    pass on one example (the lowered program, never compiled), x 3 for the backward pass,
    x the batch size."""
    example = jax.ShapeDtypeStruct((1, *train.x.shape[1:]), train.x.dtype)
    params = jax.eval_shape(spec.model.init, jax.random.key(0))
    forward = jax.jit(lambda p, x: spec.model.apply(p, x, train=True, key=jax.random.key(0)))
    cost = forward.lower(params, example).cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost  # a list of one in older JAX
    return 3.0 * max(float(cost.get("flops", 0.0)), 1.0) * spec.work.batch_size


def convolutional(model: Model, x: jax.Array) -> bool:
    """Whether ``model``'s forward pass on a batch like ``x`` holds a convolution."""
    example = jax.ShapeDtypeStruct((1, *x.shape[1:]), x.dtype)
    params = jax.eval_shape(model.init, jax.random.key(0))
    closed = jax.make_jaxpr(lambda p, x: model.apply(p, x, train=True, key=jax.random.key(0)))(
        params, example
    )
    return "conv_general_dilated" in _primitives(closed.jaxpr)


def _primitives(jaxpr) -> set[str]:
    """The names of every primitive in ``jaxpr`` and the jaxprs nested in its equations."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _primitives(inner)
    return names


def abstract_split(
    *, rows: int, example: tuple[int, ...], num_clients: int, dtype=jnp.float32
) -> DeviceSplit:
    """The shapes of a training split of ``rows`` examples of shape ``example``."""
    shape = lambda s, d=jnp.int32: jax.ShapeDtypeStruct(s, d)
    return DeviceSplit(
        shape((rows, *example), dtype), shape((rows,)), shape((num_clients,)), shape((num_clients,))
    )


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree)


@functools.lru_cache(maxsize=32)
def _estimate(
    spec: LocalSpec, num_clients: int, source: str, in_place: bool, treedef, leaves
) -> _Estimate:
    """The memory terms of one round, cached by its static description and input shapes."""
    hyper, train = jax.tree.unflatten(treedef, leaves)
    algorithm = spec.algorithm
    params = jax.eval_shape(spec.model.init, jax.random.key(0))
    server = jax.eval_shape(lambda p, h: algorithm.server_init(p, h, num_clients), params, hyper)
    broadcast = jax.eval_shape(algorithm.broadcast, server)
    state = jax.eval_shape(algorithm.client_init, params)
    client_fn = functools.partial(local_update, spec)
    outputs = jax.eval_shape(client_fn, hyper, broadcast, state, _tasks(), train)
    # A slot's task and stats; its state read and written beside the table too, unless
    # the table is read and written in place (then the rows are the chunk's, below).
    slot = tree_bytes((_tasks(), outputs[2] if in_place else (state, outputs[1:])))
    if source == "xla":
        at = {c: _compiled_bytes(spec, hyper, broadcast, train, state, c) for c in (2, 4)}
        if None not in at.values():
            per_client = (at[4] - at[2]) // 2
            fixed = at[2] - 2 * per_client - tree_bytes(train) + tree_bytes(server)
            return _Estimate(per_client, max(fixed, 0), slot, "xla")
    x, y = (
        jax.ShapeDtypeStruct((spec.work.batch_size, *a.shape[1:]), a.dtype)
        for a in (train.x, train.y)
    )
    batches = tree_bytes((x, y))  # one step's batch, gathered inside the step loop
    optimizer_state = jax.eval_shape(
        lambda h, p: algorithm.client_optimizer(h).init(p), hyper, params
    )
    per_client = (
        tree_bytes((state, _tasks(), outputs))
        + batches
        + 2 * tree_bytes(params)
        + tree_bytes(optimizer_state)
        + tree_bytes(_residuals(spec, params, x, y))
    )
    return _Estimate(per_client, tree_bytes((hyper, broadcast, server)), slot, "analytic")


def _tasks(*shape: int) -> ClientTask:
    """The shapes of tasks ``[*shape]`` as ``Round.cohort`` builds them (no shape: one client)."""
    s = lambda d: jax.ShapeDtypeStruct(shape, d)
    return ClientTask(s(jnp.int32), s(jnp.float32), s(jnp.int32), s(jax.random.key(0).dtype))


def _compiled_bytes(spec, hyper, broadcast, train, state, c: int) -> int | None:
    """XLA's memory for ``vmap(local_update)`` over ``c`` clients; None without an analysis."""

    def chunk_program(hyper, broadcast, train, states, tasks):
        return jax.vmap(functools.partial(local_update, spec, hyper, broadcast, data=train))(
            states, tasks
        )

    states = jax.tree.map(lambda s: jax.ShapeDtypeStruct((c, *s.shape), s.dtype), state)
    compiled = jax.jit(chunk_program).lower(hyper, broadcast, train, states, _tasks(c)).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )


def _residuals(spec: LocalSpec, params, x, y):
    """The arrays the backward pass of the model's loss on one batch keeps (their shapes)."""
    model = spec.model

    def loss(p, x, y):
        outputs = model.apply(p, x, train=True, key=jax.random.key(0))
        return model.loss(outputs, y, jnp.ones(y.shape[:1], bool))

    return jax.eval_shape(lambda p, x, y: jax.vjp(lambda q: loss(q, x, y), p)[1], params, x, y)
