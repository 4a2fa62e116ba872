"""Memory-aware chunking: the largest chunk of clients that fits the device (docs/design.md §8).

A round's device memory is, per run, what its chunk program holds plus the
cohort's arrays, and once, the data store:

    need(chunk) = resident + data + runs x (fixed + cohort x slot + chunk x per_client)

* ``per_client`` and ``fixed``: the slope and intercept of the memory of one
  chunk, ``vmap(local_update)`` over ``c`` clients (``memory_estimate``: source
  "xla", the compiled programs at ``c`` = 2 and 4, or "analytic", sums of
  shapes; "xla" on a backend without the analysis falls back to twice the
  analytic sums, and the plan's line says so).
* ``slot``: per cohort slot, its task, its state gathered and written back,
  and its stats (exact, from ``eval_shape``).
* ``data``: the training split, shared by a sweep's cells (not multiplied by
  ``runs``); ``fixed`` is the rest of the intercept plus the server state.

The chunk is the backend's preference (``step_cost.preferred_chunk``, the rules
of ``cohort.auto_chunk``: on CPU 1 for a convolutional model and a small
``vmap`` otherwise; on accelerators the whole cohort, or about ``WORK_CHUNKS``
work-sorted chunks when the clients' work varies), lowered to what fits in
``safety`` of the free memory, as a power of two (``cohort.effective_chunk``:
chunks are whole subtrees of the cohort's reduction tree) unless the whole
cohort fits in one. With source "xla" the straight line is only the first
guess: the chosen chunk's own program is compiled and its measured bytes
(``Compiled.memory_analysis()``) replace the line's; while they do not fit, the
chunk is halved and compiled again (at W2/1,000 on an H200 the line chose
chunk 1,000 and XLA then asked for 73.55 GiB). An explicit chunk wins but is
checked too; a round that cannot fit even one client per chunk is refused with
one line, before the round's program is built or compiled.

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

import jax
import jax.numpy as jnp

from fedjax_het.engine import memory_estimate, step_cost
from fedjax_het.engine.client_store import (
    StatePlan,
    available_memory,
    format_bytes,
    plan_client_state,
    tree_bytes,
)
from fedjax_het.engine.cohort import effective_chunk
from fedjax_het.engine.local import DeviceSplit, LocalSpec
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
      source: "xla" (compiled memory analysis), "analytic" (``eval_shape`` sums) or
        ``memory_estimate.NO_ANALYSIS``.
      measured_bytes: source "xla": the compiled program of ``chunk`` clients, per run,
        the data store excluded (it takes the place of ``fixed + chunk x per_client``).
      halved: the larger chunks whose compiled programs did not fit, with their need.
      step: the step cost the backend's preference was given (work varies on an accelerator).
      requested: the chunk asked for (``engine.chunk``), 0: none.
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
    measured_bytes: int | None = None
    halved: tuple[tuple[int, int], ...] = ()
    step: step_cost.StepCost | None = None
    requested: int = 0
    conv: str | None = None

    def need(self, chunk: int) -> int:
        """Bytes the round needs with ``chunk`` clients per chunk, on the straight line."""
        return self._total(self.fixed_bytes + chunk * self.per_client_bytes)

    @property
    def needed(self) -> int:
        """Bytes the round needs with its chunk: the compiled program's where it was measured."""
        if self.measured_bytes is None:
            return self.need(self.chunk)
        return self._total(self.measured_bytes)

    def _total(self, chunk_program: int) -> int:
        return self.data_bytes + self.runs * (chunk_program + self.cohort * self.slot_bytes)

    def describe(self) -> str:
        """One line: the chunk, the estimate it came from, the memory it uses, the compiled
        program's measure and the step cost it was chosen with."""
        runs = f" x {self.runs} runs" if self.runs > 1 else ""
        asked = self.requested not in (0, self.chunk) and self.requested < self.cohort
        rounded = (f" (engine.chunk = {self.requested} rounded to a power of two: chunks are "
                   "whole subtrees of the cohort's reduction tree)") if asked else ""
        line = (
            f"chunk {self.chunk} of {self.cohort}{rounded} ({self.source}: "
            f"{format_bytes(self.per_client_bytes)} per client, {format_bytes(self.fixed_bytes)} fixed, "
            f"{format_bytes(self.slot_bytes)} per slot{runs}, {format_bytes(self.data_bytes)} data) needs "
            f"{format_bytes(self.needed)} of {format_bytes(self.free_bytes)} free"
        )
        if self.measured_bytes is not None:
            line += f"; compiled chunk program {format_bytes(self.measured_bytes)}"
            over = ", ".join(f"chunk {c} needs {format_bytes(b)}" for c, b in self.halved)
            line += f" (halved: {over})" if over else ""
        if self.step is not None:
            line += f"; work varies: {self.step.describe()}"
        if self.conv:
            line += f"; convolutions as {self.conv}"
        return line


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
      cap: most clients per chunk when choosing; None: ``step_cost.preferred_chunk``.
      resident: other bytes held on the device throughout (the test split,
        device client states from ``client_store.plan_client_state``).
      free_bytes: the device's free memory; None: ``client_store.available_memory()``.
      safety: share of ``free_bytes`` the round may use.
      source: "xla", "analytic", or "auto": XLA's analysis on accelerators,
        the analytic sum on CPU (chunk 1 by preference, and compiling a CNN
        probe on XLA:CPU takes seconds).
      in_place: client states read and written in their table (``cohort.StateTable``).
      work_varies: the clients' steps may differ (``step_cost.preferred_chunk``).

    Raises:
      ValueError: (one line) bad arguments, or a round that does not fit with
        one client per chunk (or with the explicit ``chunk``).
    """
    _check(source, cohort, runs, chunk, cap, safety)
    if source == "auto":
        source = "analytic" if step_cost.planning_backend() == "cpu" else "xla"
    leaves, treedef = jax.tree.flatten(_abstract((hyper, train)))
    leaves = tuple(leaves)
    estimate = memory_estimate.estimate(spec, num_clients, source, in_place, treedef, leaves)
    free = available_memory().device_free if free_bytes is None else free_bytes
    plan = ChunkPlan(
        chunk=1, requested=chunk or 0,
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
    explicit, cost = chunk is not None, None
    if chunk is None:
        chunk, cost = _first_guess(plan, budget, spec, train, cap, work_varies)
    plan = dataclasses.replace(plan, chunk=effective_chunk(chunk, cohort), step=cost)
    if plan.source == "xla":
        args = (spec, hyper, train, num_clients, treedef, leaves)
        plan = _fit_compiled(plan, _compiled_measure(*args), budget, halve=not explicit)
    if plan.needed > budget:
        raise ValueError(
            f"the round does not fit the device: {plan.describe()}, over the {safety:.0%} "
            f"({format_bytes(budget)}) it may use; use a smaller cohort or chunk, more devices, fewer "
            f"sweep cells, less data or a smaller model, or client_state='host'"
        )
    return plan


def _check(source: str, cohort: int, runs: int, chunk, cap, safety: float) -> None:
    """Refuses bad arguments of ``plan_chunk`` (ValueError, one line)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    at_least_one = (cohort, runs, *(n for n in (chunk, cap) if n is not None))
    if min(at_least_one) < 1 or not 0 < safety <= 1:
        raise ValueError(
            f"cohort, runs, chunk and cap must be >= 1 and safety in (0, 1], got cohort {cohort}, "
            f"runs {runs}, chunk {chunk}, cap {cap}, safety {safety}"
        )


def _first_guess(
    plan: ChunkPlan, budget: float, spec: LocalSpec, train: DeviceSplit, cap, work_varies: bool
) -> tuple[int, step_cost.StepCost | None]:
    """The backend's preference (or ``cap``), lowered to what the straight line fits, and the
    step cost the preference was given."""
    fits = int((budget - plan.need(0)) // max(plan.runs * plan.per_client_bytes, 1))
    cost = None
    if cap is None:
        cap, cost = step_cost.preferred_chunk(spec, train, plan.cohort, work_varies)
    return max(1, min(cap, plan.cohort, fits)), cost


def _compiled_measure(spec, hyper, train, num_clients, treedef, leaves):
    """``chunk -> bytes`` of the compiled chunk program per run: the program (the training
    split among its arguments is counted once, in ``data_bytes``) and the server state."""
    extra = memory_estimate.server_bytes(spec, hyper, num_clients) - tree_bytes(train)
    return lambda c: (
        extra + memory_estimate.chunk_program_bytes(spec, num_clients, treedef, leaves, c)
    )


def _fit_compiled(plan: ChunkPlan, measure, budget: float, *, halve: bool) -> ChunkPlan:
    """``plan`` with its chunk program's compiled bytes (``measure(chunk)``, per run, data
    excluded); with ``halve``, the chunk halved (to a power of two) and compiled again while
    the measured need is over ``budget``. Each size compiles once (``chunk_program_bytes``
    is cached), on abstract inputs, never run."""
    halved = []
    while True:
        measured = dataclasses.replace(
            plan, measured_bytes=measure(plan.chunk), halved=tuple(halved)
        )
        if measured.needed <= budget or plan.chunk == 1 or not halve:
            return measured
        halved.append((plan.chunk, measured.needed))
        plan = dataclasses.replace(plan, chunk=1 << ((plan.chunk - 1).bit_length() - 1))


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
