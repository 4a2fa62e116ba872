"""The run loop (docs/design.md §3).

A round (``fedjax_het.engine.round``) is one jitted program: select the cohort,
train it (chunked ``vmap``), aggregate, update the server. Rounds run as
``lax.scan`` blocks of ``eval_every`` rounds; between blocks the host
evaluates, logs, draws the progress bar and writes results.
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjax_het import results, rng
from fedjax_het.data import diagnostics
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import client_store, memory
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.cohort import client_mesh
from fedjax_het.engine.local import (
    NO_STEP_LIMIT,
    DeviceSplit,
    LocalSpec,
    hyper_dtype,
    planned_steps,
    run_model,
)
from fedjax_het.engine.round import Round, RunState, device_split, init_state
from fedjax_het.models import Model
from fedjax_het.system import events as event_schedule
from fedjax_het.system import schedule as scheduling
from fedjax_het.system.availability import ALWAYS
from fedjax_het.system.policy import num_selected
from fedjax_het.system.sampler import LearnedSelect, Sampler
from fedjax_het.system.schedule import Schedule
from fedjax_het.system.setup import System
from fedjax_het.training import checkpoint, compilation, distributed, interrupt, online
from fedjax_het.training.divergence import NONFINITE, Diverged, Divergence, first_divergence
from fedjax_het.training.metrics import (
    EventAccounting,
    ScheduleAccounting,
    client_accuracy_summary,
    evaluate,
    evaluate_personal,
    event_accounting,
    schedule_accounting,
    time_to_accuracy,
)
from fedjax_het.typing import Hyper, Params, PRNGKey, PyTree


@dataclasses.dataclass
class History:
    """What a run produced.

    Attributes:
      metrics: one dict per evaluation (round 0 and every ``eval_every`` rounds).
      round_metrics: per-round arrays ``[rounds]``: train_loss, participants, examples.
      client_accuracy: ``[num_clients]`` last per-client test accuracy of the global model
        (NaN: no test rows).
      params: the final global model.
      state: the final ``RunState``.
      summary: final figures, compile and run time, rounds / virtual time / wall time to
        each target accuracy, where the client states lived (``client_state_placement``:
        device, host or none) and the bytes they held at the end (``client_state_bytes``:
        every client's on the device, the written rows on the host), and (with a system)
        totals of time, bytes and work.
      schedule: the run's schedule when it had a system, else None.
      out_dir: where results were written, or None.
      personal_accuracy: ``[num_clients]`` last test accuracy of each client's own model
        (algorithms with ``personal_params``), else None.
    """

    metrics: list[dict[str, Any]]
    round_metrics: dict[str, np.ndarray]
    client_accuracy: np.ndarray
    params: Params
    state: RunState
    summary: dict[str, Any]
    schedule: Schedule | None = None
    out_dir: Path | None = None
    personal_accuracy: np.ndarray | None = None


def local_spec(
    model: Model, algorithm: FederatedAlgorithm, data: FederatedData, work: LocalWork, *,
    unroll: int = 1, precision: str = "float32",
) -> LocalSpec:
    """The static shape of local training for ``data``: steps capped by its largest client."""
    max_count = int(data.train.count.max())
    return LocalSpec(
        model, algorithm, work, work.static_steps(max_count), max_count, unroll, precision
    )


def steps_needed(spec: LocalSpec, count: np.ndarray) -> np.ndarray:
    """``[N]`` local steps each client's full task takes (its epochs or steps, capped)."""
    count = jnp.asarray(count, jnp.int32)
    return np.asarray(planned_steps(spec, count, jnp.int32(NO_STEP_LIMIT)), np.int32)


def plan_run(
    system: System, data: FederatedData, spec: LocalSpec, sampler: Sampler, *, rounds: int,
    key: PRNGKey,
) -> Schedule:
    """The schedule of a whole run, before any training (docs/design.md §5).

    Payload: every parameter, as stored, both ways (no compression or freezing).
    Selection: the run's sampler, as without a system, when every client is
    always available (or the policy ignores availability) and there is no
    over-commitment, so a homogeneous system reproduces the plain run;
    otherwise uniform among the clients the policy allows (the ready ones),
    with ``ceil(m * (1 + over_commit))`` slots for a cohort of ``m``.
    """
    plans = plan_runs([system], data, spec, sampler, rounds=rounds, keys=key[None])
    return jax.tree.map(lambda a: a[0], plans)


def plan_runs(
    systems: Sequence[System], data: FederatedData, spec: LocalSpec, sampler: Sampler, *,
    rounds: int, keys: PRNGKey,
) -> Schedule:
    """``plan_run`` of each ``(systems[i], keys[i])`` as one ``vmap``-ed program.

    The systems may differ in every per-client number and policy number; they
    must share the availability store (index different traces of it), the
    policy's kind and switches, and the way clients are selected.
    """
    for system in systems:
        _check_population(system, data)
    down, up = online.payload_bytes(spec.algorithm, jax.eval_shape(spec.model.init, keys[0]))
    m = sampler.cohort_size
    selectors = {selection_slots(system, sampler, data.num_clients) for system in systems}
    if len(selectors) > 1:
        raise ValueError(
            "the systems select clients in different ways (some need availability-aware "
            "selection or over-commitment, some not); sweep them separately"
        )
    profiles, policy = _stack_systems(systems)
    slots = selectors.pop()
    select = sampler if slots is None else scheduling.select_among_ready(data.num_clients, slots)
    make = functools.partial(
        scheduling.schedule, select=select, rounds=rounds, cohort_size=m,
        steps_needed=jnp.asarray(steps_needed(spec, data.train.count)),
        payload_down=down, payload_up=up,
    )
    axes = jax.tree.map(lambda _: 0, profiles.replace(availability=None))
    batched = jax.vmap(
        lambda profiles, policy, key: make(profiles, policy, key=key), in_axes=(axes, 0, 0)
    )
    return jax.jit(batched)(profiles, policy, keys)


def _check_population(system: System, data: FederatedData) -> None:
    if system.profiles.num_clients != data.num_clients:
        raise ValueError(
            f"system profiles describe {system.profiles.num_clients} clients but the data has "
            f"{data.num_clients}"
        )


def plan_events(
    system: System, data: FederatedData, spec: LocalSpec, server: event_schedule.AsyncServer, *,
    events: int, key: PRNGKey,
) -> event_schedule.EventSchedule:
    """The arrivals of an asynchronous run's ``events`` server events, before any training.

    Payload: every parameter, as stored, both ways (as ``plan_run``); the
    system's profiles give every task's timing (its policy is not used: the
    server has none of rounds, deadlines or over-commitment).
    """
    _check_population(system, data)
    down, up = online.payload_bytes(spec.algorithm, jax.eval_shape(spec.model.init, key))
    make = functools.partial(
        event_schedule.async_schedule, events=events, payload_down=down, payload_up=up,
        steps_needed=jnp.asarray(steps_needed(spec, data.train.count)),
    )
    return jax.jit(make)(system.profiles, server, key=key)


def ring_depth(system: System | None, server: event_schedule.AsyncServer | None) -> int:
    """Model versions a run keeps for slots that train from older ones: the asynchronous
    server's, or ``max_staleness + 1`` for a policy with stale tasks; 0 for neither."""
    if server is not None:
        return server.ring_depth
    staleness = 0 if system is None else system.policy.max_staleness
    return staleness + 1 if staleness else 0


def selection_slots(system: System, sampler: Sampler, num_clients: int) -> int | None:
    """None to select with ``sampler``, else the slots of uniform selection among the ready."""
    m = sampler.cohort_size
    slots = min(int(num_selected(m, system.policy.over_commit)), num_clients)
    always = bool(np.all(np.asarray(system.profiles.trace) == ALWAYS))
    return None if slots == m and (always or not system.policy.availability_aware) else slots


def _stack_systems(systems: Sequence[System]):
    """The systems' profiles (one shared availability store) and policies, stacked."""
    stores = [jax.tree.leaves(s.profiles.availability) for s in systems]
    if any(
        len(a) != len(stores[0]) or not all(np.array_equal(x, y) for x, y in zip(a, stores[0]))
        for a in stores[1:]
    ):
        raise ValueError("the systems must share one availability store (index its traces)")
    try:
        stack = lambda *xs: jnp.stack(xs)
        profiles = jax.tree.map(
            stack, *[s.profiles.replace(availability=None) for s in systems]
        ).replace(availability=systems[0].profiles.availability)
        policy = jax.tree.map(stack, *[s.policy for s in systems])
    except ValueError as error:
        raise ValueError(
            f"the systems must share the policy kind and switches and the number of clients: "
            f"{error}"
        ) from None
    return profiles, policy


@dataclasses.dataclass(frozen=True)
class Setup:
    """A validated simulation: the round, its traced inputs, and the evaluation data."""

    data: FederatedData
    round: Round
    hyper: Hyper
    train: DeviceSplit
    test: DeviceSplit
    test_row_client: jax.Array
    eval_batch_size: int
    max_test_count: int
    state_plan: client_store.StatePlan
    chunk_plan: memory.ChunkPlan

    @classmethod
    def build(
        cls, data: FederatedData, model: Model, algorithm: FederatedAlgorithm, sampler: Sampler, *,
        rounds: int, work: LocalWork, hyper: Mapping[str, float] | None, eval_every: int,
        chunk: int | None, unroll: int, weighting: str, eval_batch_size: int,
        client_state: str = "auto", slots: int | None = None, runs: int = 1,
        precision: str = "float32", devices: int | None = None, nonfinite: str = "stop",
        ring_depth: int = 0,
    ) -> Setup:
        """Checks the arguments ``run`` and ``sweep`` share and builds the round.

        The client states' placement and the chunk size are planned here, before
        anything compiles (``memory.plan_memory``; a round that cannot fit is refused
        with one line): ``slots`` (default: the
        cohort size) clients a round at most, ``runs`` runs held at once, each
        device running its share of the slots. ``ring_depth`` > 0 keeps that many recent
        broadcasts for slots that train from older versions (``Round.ring_depth``).
        """
        if sampler.num_clients != data.num_clients:
            raise ValueError(
                f"sampler draws from {sampler.num_clients} clients but the data has "
                f"{data.num_clients}"
            )
        if rounds < 1 or eval_every < 1:
            raise ValueError(f"rounds and eval_every must be >= 1, got {rounds} and {eval_every}")
        if weighting not in ("examples", "uniform"):
            raise ValueError(f"weighting must be 'examples' or 'uniform', got {weighting!r}")
        if data.test is None:
            raise ValueError("run needs a test split to evaluate; build the data with one")
        if nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite must be 'stop' or 'drop', got {nonfinite!r}")
        model = run_model(model, precision)
        mesh = client_mesh(devices)
        num_devices = 1 if mesh is None else mesh.size
        spec = local_spec(model, algorithm, data, work, unroll=unroll, precision=precision)
        hyper_ = algorithm.hyper(hyper, dtype=hyper_dtype(precision))
        train, test = device_split(data.train), device_split(data.test)
        resident = client_store.tree_bytes(test)
        if ring_depth:
            params = jax.eval_shape(model.init, jax.random.key(0))
            ring = jax.eval_shape(algorithm.broadcast, jax.eval_shape(
                lambda p: algorithm.server_init(p, hyper_, data.num_clients), params))
            resident += ring_depth * client_store.tree_bytes(ring)
        state_plan, chunk_plan = memory.plan_memory(
            spec, hyper_, train, num_clients=data.num_clients, rounds=rounds,
            slots=slots or sampler.cohort_size, placement=client_state, runs=runs,
            devices=num_devices, chunk=chunk, resident=resident, in_place=not ring_depth,
        )
        round_ = Round(
            model, algorithm, sampler, spec, chunk=chunk_plan.chunk, weighting=weighting,
            store=state_plan.store(mesh), mesh=mesh, drop_nonfinite=nonfinite == "drop",
            ring_depth=ring_depth,
        )
        return cls(
            data, round_, hyper_, train, test, jnp.asarray(data.test.client_ids), eval_batch_size,
            int(data.test.count.max(initial=0)), state_plan, chunk_plan,
        )

    def init(self, key: PRNGKey, *, cells: bool = False, hyper: Hyper | None = None) -> RunState:
        """The initial state (one per key of ``key [cells]`` with ``cells``).

        ``hyper``: the hyperparameters, stacked ``[cells]`` with ``cells`` (each cell its
        own); None: this setup's, for every cell.
        """
        r = self.round
        init = functools.partial(
            init_state, r.model, r.algorithm, self.data.num_clients, store=r.store,
            ring_depth=r.ring_depth,
        )
        init = jax.vmap(init) if cells else init
        return self.on_mesh(jax.jit(init)(self._hyper(key, cells, hyper), key))

    def on_mesh(self, state: PyTree) -> PyTree:
        """``state`` placed as the round's blocks return it: every array on the round's
        mesh, replicated unless the client store shards it (so the first block compiles
        for the same input shardings as the later ones)."""
        mesh = self.round.mesh
        if mesh is None:
            return state
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        on_mesh = lambda x: (
            x if isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.mesh == mesh
            else jax.device_put(x, replicated)
        )
        return jax.tree.map(on_mesh, state)

    def _hyper(self, key: PRNGKey, cells: bool, hyper: Hyper | None) -> Hyper:
        """``hyper``, else this setup's own (with ``cells``: repeated along ``key``'s cell axis)."""
        if hyper is not None:
            return hyper
        if not cells:
            return self.hyper
        return jax.tree.map(lambda h: jnp.broadcast_to(h, (key.shape[0], *h.shape)), self.hyper)

    def run_block(
        self, state: RunState, round_ids: jax.Array, plans: Schedule | None, hyper: Hyper,
        train: DeviceSplit, key: PRNGKey,
    ) -> tuple[RunState, dict[str, jax.Array]]:
        """The rounds ``round_ids`` as one ``lax.scan`` (one row of ``plans`` each).

        The arrays are arguments, not the fields of ``self``, so that ``jit``
        traces them instead of baking the dataset into the program.
        """

        def one(state, inputs):
            round_idx, plan = inputs
            return self.round.step(state, round_idx, hyper, train, key, plan)

        return jax.lax.scan(one, state, (round_ids, plans))

    def evaluate(self, state: RunState, test: DeviceSplit, row_client: jax.Array):
        """The global model on every test row; with a personal model, each client's own too."""
        round_, algorithm = self.round, self.round.algorithm
        params = algorithm.global_params(state.server_state)
        ev = evaluate(round_.model, params, test, row_client, batch_size=self.eval_batch_size)
        if algorithm.personal_params is not None:

            def params_of(ids):
                states = round_.store.gather(state.client_states, ids)
                personal = functools.partial(algorithm.personal_params, state.server_state)
                return jax.vmap(personal)(states)

            ev["personal_correct"], ev["personal_loss_sum"] = evaluate_personal(
                round_.model, params_of, test, max_count=self.max_test_count,
                chunk=max(1, self.eval_batch_size // max(self.max_test_count, 1)),
            )
        return ev

    def programs(
        self, key: PRNGKey, *, cells: bool = False, hyper: Hyper | None = None,
        cell_batch: int | None = None, donate: bool = True,
    ) -> tuple[Callable, Callable]:
        """Jitted ``block(state, round_ids, plans)`` and ``evaluate(state)``.

        With ``cells`` every argument but the round ids carries a leading axis
        of independent runs (``key`` and ``hyper`` too: each cell has its own
        hyperparameters, see ``init``) and both map over it: ``cell_batch``
        cells at a time as one ``vmap``, the batches one after another
        (``lax.map``); None: every cell in one ``vmap``. The jitted functions
        are made once per setup and mode, so calls with other keys or
        hyperparameters of the same shapes (a sweep's chunks of cells) reuse
        one compilation.

        ``donate``: ``block`` takes its state's buffers for the new state (the
        client-state table is updated in place, never copied), so a state passed
        to it must not be used again; False keeps it (a benchmark repeating a block).
        """
        mode = (cells, cell_batch, donate)
        if mode not in self._jitted:
            block, evaluate_ = self.run_block, self.evaluate
            if cells:
                block = self._over_cells(block, (0, None, 0, 0, None, 0), cell_batch)
                evaluate_ = self._over_cells(evaluate_, (0, None, None), cell_batch)
            self._jitted[mode] = jax.jit(block, donate_argnums=0 if donate else ()), jax.jit(
                evaluate_)
        block, evaluate_ = self._jitted[mode]
        hyper = self._hyper(key, cells, hyper)
        return (
            lambda state, ids, plans: block(state, ids, plans, hyper, self.train, key),
            lambda state: evaluate_(state, self.test, self.test_row_client),
        )

    @functools.cached_property
    def _jitted(self) -> dict[tuple[bool, int | None, bool], tuple[Callable, Callable]]:
        """``programs``' jitted functions by mode ``(cells, cell_batch, donate)``."""
        return {}

    @staticmethod
    def _over_cells(fn: Callable, in_axes: tuple[int | None, ...], batch: int | None) -> Callable:
        """``fn`` over the leading cell axis of the arguments whose ``in_axes`` is 0:
        one ``vmap``, or ``lax.map`` over batches of ``batch`` cells (``batch`` 1: no
        ``vmap`` at all, so each cell computes bitwise what ``fn`` alone computes;
        a ``vmap`` of one may pick other matrix-product kernels)."""
        if batch is None:
            return jax.vmap(fn, in_axes=in_axes)

        @functools.wraps(fn)
        def over_cells(*args):
            def one(cell_args):
                given = iter(cell_args)
                return fn(*(next(given) if axis == 0 else a for a, axis in zip(args, in_axes)))

            mapped = tuple(a for a, axis in zip(args, in_axes) if axis == 0)
            return jax.lax.map(one, mapped, batch_size=None if batch == 1 else batch)

        return over_cells


class Recorder:
    """One run's evaluation lines, results directory and final ``History``."""

    def __init__(
        self, start: float, accounting: ScheduleAccounting | None, *,
        out_dir: str | Path | None = None, config: Mapping[str, Any] | None = None,
        data: FederatedData | None = None,
        on_eval: Callable[[dict[str, Any]], None] | None = None, drop_nonfinite: bool = False,
        overwrite: bool = False, resume: bool = False,
    ):
        self.start, self.accounting, self.on_eval = start, accounting, on_eval
        self.drop_nonfinite = drop_nonfinite
        self.divergence: Divergence | None = None
        self.interrupted: int | None = None
        self.checkpoint: checkpoint.Saved | None = None  # the last one written
        self.wall_before = 0.0  # wall seconds of the run before it was resumed
        self.evaluations: list[dict[str, Any]] = []
        self.per_round: list[dict[str, np.ndarray]] = []
        writes = out_dir is not None and distributed.writes_results()
        self.writer = (
            results.RunWriter(out_dir, config, overwrite=overwrite, resume=resume) if writes
            else None
        )
        self.report_of = data if self.writer else None  # written after the first block

    def write_report(self) -> None:
        """The partition's diagnostics (``data_summary.json``, ``label_heatmap.png``), once:
        after the first block (so that they do not delay the first round) or at the end."""
        data, self.report_of = self.report_of, None
        if data is not None:
            self.writer.write(
                "data_summary.json", lambda path: diagnostics.save_report(data, path.parent)
            )

    def records(self, prefix: str) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """What a checkpoint keeps of this recorder: per-round arrays (named under
        ``prefix``) and the evaluation lines."""
        arrays = {
            f"{prefix}/{k}": np.concatenate([b[k] for b in self.per_round])
            for k in (self.per_round[0] if self.per_round else {})
        }
        return arrays, self.evaluations

    def restore(self, arrays: Mapping[str, np.ndarray], evaluations: list[dict[str, Any]],
                wall_before: float) -> None:
        """Continues from a checkpoint's ``records``: the metrics file is rewritten to them
        (dropping any line the interrupted run wrote after its checkpoint)."""
        self.per_round = [dict(arrays)] if arrays else []
        self.evaluations = list(evaluations)
        self.wall_before = wall_before
        if self.writer:
            self.writer.rewrite_metrics(self.evaluations)

    def record(self, done: int, block_metrics: dict[str, np.ndarray] | None, ev) -> bool:
        """Logs the evaluation ``ev`` after ``done`` rounds (``block_metrics``: the last block).

        Returns whether the run diverged in this block (``divergence.first_divergence``;
        the first divergence is kept in ``self.divergence``).
        """
        if block_metrics is not None:
            self.per_round.append(block_metrics)
            if self.divergence is None:
                self.divergence = first_divergence(
                    done, block_metrics, ev, drop_nonfinite=self.drop_nonfinite
                )
        line = {
            "round": done,
            "wall_s": round(self.wall_before + time.perf_counter() - self.start, 4),
            "train_loss": float(np.mean(block_metrics["train_loss"])) if block_metrics else None,
            "participants": int(block_metrics["participants"][-1]) if block_metrics else 0,
            "nonfinite_updates": int(np.sum(block_metrics["nonfinite_updates"]))
            if block_metrics else 0,
            "test_loss": float(ev["loss"]),
            "test_accuracy": float(ev["accuracy"]),
            **client_accuracy_summary(ev["client_correct"], ev["client_count"]),
            **(client_accuracy_summary(ev["personal_correct"], ev["client_count"],
                                       "personal_accuracy") if "personal_correct" in ev else {}),
            **(self.accounting.upto(done) if self.accounting else {}),
        }
        self.evaluations.append(line)
        if self.writer:
            self.writer.append(line)
        if self.on_eval:
            self.on_eval(line)
        if block_metrics is not None:
            self.write_report()
        return self.divergence is not None

    @property
    def status(self) -> str:
        """"diverged", "interrupted" or "completed"."""
        if self.divergence is not None:
            return "diverged"
        return "completed" if self.interrupted is None else "interrupted"

    def history(
        self, state: RunState, ev, setup: Setup, *, plans: Schedule | None,
        targets: Sequence[float], timing: Mapping[str, float], hyper: Hyper | None = None,
    ) -> History:
        """The run's ``History`` from the final ``state`` and evaluation ``ev`` (``hyper``: the
        run's hyperparameters, when they are not ``setup``'s: a sweep's cell)."""
        self.write_report()
        round_metrics = {k: np.concatenate([b[k] for b in self.per_round]) for k in self.per_round[0]}
        if self.accounting:
            round_metrics.update(self.accounting.per_round)
        with np.errstate(invalid="ignore", divide="ignore"):
            client_accuracy = ev["client_correct"] / ev["client_count"]
            personal = ev.get("personal_correct")
            personal_accuracy = None if personal is None else personal / ev["client_count"]
        evaluations, final = self.evaluations, self.evaluations[-1]
        summary = {
            "rounds": final["round"],
            "final_test_accuracy": final["test_accuracy"],
            "final_test_loss": final["test_loss"],
            "best_test_accuracy": max(e["test_accuracy"] for e in evaluations),
            **{k: final[k] for k in final if k.startswith(("client_accuracy", "personal_accuracy"))},
            **timing,
            "chunk": setup.round.chunk,
            "chunk_plan": setup.chunk_plan.describe(),
            "devices": 1 if setup.round.mesh is None else setup.round.mesh.size,
            "backend": jax.default_backend(),
            "matmul_precision": compilation.matmul_precision_in_effect(),
            "compile_cache": compilation.record(),
            "client_state_placement": setup.state_plan.placement,
            "client_state_bytes": setup.state_plan.held_bytes(setup.round.store),
            "to_accuracy": time_to_accuracy(evaluations, targets),
            "status": self.status,
            **({"diverged": dataclasses.asdict(self.divergence)} if self.divergence else {}),
            **({"interrupted": {"signal": signal.Signals(self.interrupted).name,
                                "round": final["round"]}} if self.interrupted else {}),
            **({"checkpoint": {"round": self.checkpoint.done, "bytes": self.checkpoint.bytes,
                               "seconds": round(self.checkpoint.seconds, 4)}}
               if self.checkpoint else {}),
            **(self.accounting.totals() if self.accounting else {}),
        }
        algorithm = setup.round.algorithm
        if algorithm.report is not None:
            values = {k: float(v) for k, v in (setup.hyper if hyper is None else hyper).items()}
            summary.update(algorithm.report(values, setup.data.num_clients, final["round"]))
        history = History(
            evaluations, round_metrics, client_accuracy,
            algorithm.global_params(state.server_state), state, summary, schedule=plans,
            personal_accuracy=personal_accuracy,
        )
        if self.writer:
            history.out_dir = self.writer.out_dir
            if isinstance(self.accounting, EventAccounting):
                self.writer.write("async.png", self.accounting.plot)
            self.writer.finish(history)
        return history


@dataclasses.dataclass(frozen=True)
class LoopEnd:
    """Where ``train_loop`` stopped: the state, its evaluation, the first block's time
    (compile included; None if no block ran), rounds done, and the signal that
    interrupted the loop (None: it ran to the end or diverged)."""

    state: Any
    ev: Any
    compile_s: float | None
    done: int
    interrupted: int | None = None


def train_loop(
    state: RunState, *, rounds: int, eval_every: int, block: Callable, evaluate: Callable,
    plans: Schedule | None, on_eval: Callable[[int, Any, Any], bool | None], progress: bool,
    round_axis: int = 0, done: int = 0, save: Callable[[int, Any], None] | None = None,
    checkpoint_every: int = 0, unit: str = "round",
) -> LoopEnd:
    """Runs ``block`` over blocks of ``eval_every`` rounds, evaluating after each.

    ``block(state, round_ids, block_plans)`` and ``evaluate(state)`` are jitted
    (and may carry a leading axis of several runs, ``round_axis = 1`` on the
    plans then); ``on_eval(done, block_metrics, ev)`` gets host arrays and
    stops the loop by returning True (a diverged run).

    ``done``: rounds already done (a resumed run; ``state`` is its state then, and
    blocks keep their boundaries at multiples of ``eval_every``, so every block is
    the one the uninterrupted run computes). ``save(done, state)`` writes a
    checkpoint: at the first block end at or past each multiple of
    ``checkpoint_every`` rounds (0: never), at the end, and when SIGINT or SIGTERM
    arrives (``interrupt.deferred``: the loop stops after the current block).
    ``unit`` names a round on the progress bar ("event" for an asynchronous server).
    """
    with interrupt.deferred() as pending:
        ev = jax.device_get(evaluate(state))
        if done == 0:
            on_eval(0, None, ev)
        compile_s, saved_at, stopped = None, done, None
        bar = tqdm(total=rounds, initial=done, desc=f"{unit}s", unit=unit, disable=not progress,
                   leave=True)
        while done < rounds:
            stopped = pending.agreed()  # once per block, at the same point in every process
            if stopped is not None:
                break
            size = min(eval_every - done % eval_every, rounds - done)
            round_ids = jnp.arange(done, done + size, dtype=jnp.int32)
            rows = (slice(None),) * round_axis + (slice(done, done + size),)
            block_plans = None if plans is None else jax.tree.map(lambda a, rows=rows: a[rows], plans)
            t0 = time.perf_counter()
            state, block_metrics = block(state, round_ids, block_plans)
            block_metrics = jax.device_get(block_metrics)
            compile_s = time.perf_counter() - t0 if compile_s is None else compile_s
            before, done = done, done + size
            ev = jax.device_get(evaluate(state))
            stop = on_eval(done, block_metrics, ev)
            bar.update(size)
            bar.set_postfix(acc=f"{float(np.mean(np.atleast_1d(ev['accuracy']))):.3f}")
            if stop:
                break
            due = checkpoint_every and done // checkpoint_every > before // checkpoint_every
            if save is not None and (due or done == rounds):
                save(done, state)
                saved_at = done
        if save is not None and stopped is not None and saved_at != done:
            save(done, state)
        bar.close()
    return LoopEnd(state, ev, compile_s, done, stopped)


@compilation.engine_options
def run(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    sampler: Sampler,
    *,
    rounds: int,
    work: LocalWork,
    hyper: Mapping[str, float] | None = None,
    seed: int = 0,
    eval_every: int = 10,
    chunk: int | None = None,
    unroll: int = 1,
    weighting: str = "examples",
    eval_batch_size: int = 1024,
    progress: bool = True,
    out_dir: str | Path | None = None,
    config: Mapping[str, Any] | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    system: System | None = None,
    select: LearnedSelect | None = None,
    targets: Sequence[float] = (0.5, 0.6, 0.7, 0.8),
    client_state: str = "auto",
    devices: int | None = None,
    precision: str = "float32",
    nonfinite: str = "stop",
    checkpoint_every: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    server: event_schedule.AsyncServer | None = None,
    matmul_precision: str = compilation.DEFAULT_MATMUL_PRECISION,
    compile_cache: bool = True,
) -> History:
    """Simulates ``rounds`` rounds of federated training and evaluates every ``eval_every``.

    Args:
      data: the federated dataset; its test split gives global and per-client accuracy.
      model, algorithm, sampler: what to train, how, and who takes part.
      rounds: number of rounds.
      work: local work per selected client (batch size, epochs or steps).
      hyper: overrides of the algorithm's traced hyperparameters.
      seed: the run's root seed.
      eval_every: rounds per ``lax.scan`` block between evaluations.
      chunk: clients per ``vmap`` chunk (None: ``cohort.auto_chunk``'s preference, lowered
        to what fits the device's free memory, ``memory.plan_chunk``). Either way a
        round that cannot fit is refused with one line before compiling.
      unroll: local-step scan unrolling.
      weighting: "examples" (FedAvg's n_k) or "uniform".
      eval_batch_size: rows per evaluation batch.
      progress: show a progress bar.
      out_dir: write ``config.toml``, ``metrics.jsonl``, ``summary.json`` and
        ``curves.png`` there (process 0 only, in a multi-process run).
      config: the resolved config to record in ``out_dir`` (the CLI passes its own).
      on_eval: called with each evaluation's metrics dict.
      system: device and state heterogeneity (``fedjax_het.system.setup.System``).
        The whole run's schedule is computed first (``system.schedule``, no
        training); training then follows it: selected clients, partial work as
        step masks, failed clients at weight 0. Adds the virtual clock, outcome
        counts, bytes and wasted work to the metrics.
      select: a selection that learns (``sampler.LearnedSelect``, e.g.
        ``sampling.power_of_choice``), given the server's per-client record. It,
        and an algorithm with ``freezing`` (FreezeFL), need a ``system``; the
        schedule is then computed round by round inside the training loop
        (``fedjax_het.training.online``) instead of before it.
      targets: test accuracies whose first round, virtual time and wall time
        the summary reports (``to_accuracy``).
      client_state: where an algorithm's per-client states live: "device",
        "host" (only the rows of clients ever selected, in host memory, moved
        in and out of the round by callbacks; bit-identical results) or "auto"
        (the device when they fit comfortably, else the host). A state that
        fits nowhere is refused before compiling (``client_store.plan_client_state``).
      devices: shard each cohort over this many of ``jax.devices()`` (None: all of
        them; after ``jax.distributed.initialize``, every host's). Results match one
        device up to float summation order; ``DeviceStore`` client states are sharded
        by client too.
      precision: "float32"; "bfloat16" for local training in bfloat16 with float32
        master params and aggregation (``local.compute_model``); "float64" for the whole
        run in float64: params, hyperparameters, training, aggregation and evaluation
        (``local.run_model``; needs ``jax_enable_x64``), on the float32 run's schedule
        (the simulated network still carries float32 updates).
      nonfinite: "stop": a round whose training loss, or a client's update, is not
        finite (or a global model whose test loss is not) ends the run after its
        block: the results so far are written, ``summary["status"]`` is "diverged"
        and :class:`~fedjax_het.training.divergence.Diverged` is raised (its ``history`` holds
        them). "drop": non-finite client updates enter at weight 0 and are counted
        (``nonfinite_updates``); a non-finite loss or model still stops the run.
      checkpoint_every: with ``out_dir``, write ``out_dir/checkpoint.npz``
        (``fedjax_het.training.checkpoint``) at the first evaluation at or past every multiple
        of this many rounds (0: only at the end and on an interrupt).
      resume: continue the run in ``out_dir`` from its checkpoint: the results are bit
        for bit those of the uninterrupted run (wall times aside). Refused
        (``checkpoint.CheckpointError``) if ``config`` differs from the checkpoint's
        or the checkpoint's arrays do not fit this run.
      overwrite: write into an ``out_dir`` that already holds files (refused otherwise,
        ``results.OutDirError``).
      server: an asynchronous server (``system.events.async_server``; needs a ``system``):
        ``rounds`` are then server events, each aggregating the server's ``buffer_size``
        arrivals, each trained from the model version it downloaded (``plan_events``, a ring
        of ``max_staleness + 1`` recent models). The metrics add applied, discarded and
        dropped updates, concurrency and staleness (``metrics.EventAccounting``).
      matmul_precision: "highest", "high" or "default": ``jax.default_matmul_precision``
        while the run traces its programs (``fedjax_het.training.compilation``; on CPU all three
        are the same arithmetic, on GPU "default" is TF32 and "high" bf16x3).
      compile_cache: keep compiled programs in the persistent compilation cache
        (``compilation.cache_dir()``), so that the next process running the same config
        loads them instead of compiling; False: the cache off for this process.
        ``summary["compile_cache"]`` counts what the run compiled and loaded.

    Returns:
      A :class:`History`.

    Raises:
      Diverged: the run diverged (see ``nonfinite``).
      Interrupted: SIGINT or SIGTERM stopped the run after a block; the checkpoint
        and results were written (``interrupt.Interrupted``, its ``history`` holds them).
      NotWritten: some result files could not be written (``results.NotWritten``).
    """
    slots = None  # clients a round writes at most: the cohort, or its over-committed slots
    if server is not None:
        if system is None:
            raise ValueError("an asynchronous server runs on device timings; give run a system")
        if select is not None or algorithm.freezing is not None:
            raise ValueError(
                "an asynchronous server takes neither a learned select nor an algorithm that "
                f"freezes by device timing ({algorithm.name}); run them with a synchronous server"
            )
        slots = server.buffer_size
    elif system is not None:
        slots = int(num_selected(sampler.cohort_size, system.policy.over_commit))
        slots += sampler.cohort_size if system.policy.max_staleness else 0  # stale arrivals
    setup = Setup.build(
        data, model, algorithm, sampler, rounds=rounds, work=work, hyper=hyper,
        eval_every=eval_every, chunk=chunk, unroll=unroll, weighting=weighting,
        eval_batch_size=eval_batch_size, client_state=client_state, slots=slots,
        precision=precision, devices=devices, nonfinite=nonfinite,
        ring_depth=ring_depth(system, server),
    )
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
    if resume and out_dir is None:
        raise ValueError("resume continues the run in out_dir; give run its out_dir")
    key = rng.seed_key(seed)
    if resume and config is not None:  # before the Recorder rewrites config.toml
        checkpoint.check_config(out_dir, config)
    recorder = Recorder(
        time.perf_counter(), None, out_dir=out_dir, config=config, data=data, on_eval=on_eval,
        drop_nonfinite=nonfinite == "drop", overwrite=overwrite, resume=resume,
    )
    loop = functools.partial(
        train_loop, rounds=rounds, eval_every=eval_every, progress=progress,
        checkpoint_every=checkpoint_every, unit="round" if server is None else "event",
    )
    resumed = load_checkpoint(out_dir, [recorder]) if resume else None
    if select is not None or algorithm.freezing is not None:
        if system is not None and system.policy.max_staleness:
            raise ValueError("stale tasks (policy.max_staleness) run with a schedule computed "
                             "before training: not with a learned select or in-round freezing")
        if system is None:
            raise ValueError(
                f"a learned select and {algorithm.name}'s freezing choose from device timings; "
                "give run a system"
            )
        end, plans = _run_online(setup, system, select, key, recorder, loop, out_dir, config,
                                 resumed)
    else:
        plans = None
        if server is not None:
            plans = plan_events(system, data, setup.round.spec, server, events=rounds, key=key)
            recorder.accounting = event_accounting(
                plans, setup.round.spec, data.train.count, data.num_clients, server.max_staleness
            )
        elif system is not None:
            plans = plan_run(system, data, setup.round.spec, sampler, rounds=rounds, key=key)
            recorder.accounting = schedule_accounting(
                plans, setup.round.spec, data.train.count, data.num_clients
            )
        block, evaluate_ = setup.programs(key)
        state = setup.init(key)
        if resumed is not None:
            state = restore_state(resumed, state, setup.round.store)
        end = loop(
            state, block=block, evaluate=evaluate_, plans=plans, on_eval=recorder.record,
            save=checkpointer(out_dir, config, [recorder], setup.round.store, dict),
            done=0 if resumed is None else resumed.done,
        )
    return _finish(recorder, end, setup, plans, targets)


def _finish(recorder: Recorder, end: LoopEnd, setup: Setup, plans: Schedule | None,
            targets: Sequence[float]) -> History:
    """``run``'s History from where its loop ended; raises what ended it early."""
    recorder.interrupted = end.interrupted
    timing = {
        "wall_s": round(recorder.wall_before + time.perf_counter() - recorder.start, 3),
        "first_block_s_with_compile": None if end.compile_s is None else round(end.compile_s, 3),
    }
    history = recorder.history(end.state, end.ev, setup, plans=plans, targets=targets,
                               timing=timing)
    if recorder.divergence is not None:
        raise Diverged(recorder.divergence, history)
    if end.interrupted is not None:
        raise interrupt.Interrupted(end.interrupted, end.done, history)
    return history


def checkpointer(
    out_dir: str | Path | None, config: Mapping[str, Any] | None, recorders: Sequence[Recorder],
    store: client_store.ClientStore, extra: Callable[[], dict[str, np.ndarray]],
) -> Callable[[int, Any], None] | None:
    """``train_loop``'s ``save``: the run state, the host-held client rows, the
    recorders' records and ``extra()`` as ``out_dir/checkpoint.npz`` (None: no ``out_dir``).

    A checkpoint that cannot be written (a full disk) is reported by the run's
    ``NotWritten`` at the end; the previous one stays.
    """
    if out_dir is None:
        return None

    def save(done: int, state: Any) -> None:
        arrays = {**checkpoint.leaves("state", state), **store.host_rows(), **extra()}
        evaluations = []
        for j, recorder in enumerate(recorders):
            records, lines = recorder.records(f"records{j}")
            arrays.update(records)
            evaluations.append(lines)
        first = recorders[0]
        manifest = {
            "config": results.to_toml(config or {}), "evaluations": evaluations,
            "wall_s": first.wall_before + time.perf_counter() - first.start,
        }
        try:
            saved = checkpoint.save(out_dir, done=done, arrays=arrays, manifest=manifest)
        except OSError as err:
            for recorder in recorders:
                if recorder.writer:
                    recorder.writer.missing[checkpoint.FILE] = f"round {done}: {err.strerror}"
            return
        for recorder in recorders:
            recorder.checkpoint = saved

    return save


def load_checkpoint(out_dir: str | Path, recorders: Sequence[Recorder]) -> checkpoint.Loaded:
    """The checkpoint in ``out_dir``, its records restored into ``recorders`` (check the
    config first, ``checkpoint.check_config``, before a recorder rewrites it)."""
    loaded = checkpoint.load(out_dir)
    for j, recorder in enumerate(recorders):
        recorder.restore(loaded.group(f"records{j}"), loaded.manifest["evaluations"][j],
                         loaded.manifest["wall_s"])
    return loaded


def restore_state(loaded: checkpoint.Loaded, like: Any, store: client_store.ClientStore) -> Any:
    """The checkpoint's run state, placed like ``like`` (a fresh ``init``), and the
    store's host rows."""
    jax.block_until_ready(like)  # a HostStore's init empties its table; restore after it
    store.restore_host_rows(loaded.group("host"))
    return loaded.tree("state", like)


def _run_online(
    setup: Setup, system: System, select: LearnedSelect | None, key: PRNGKey,
    recorder: Recorder, loop: Callable[..., LoopEnd], out_dir: str | Path | None,
    config: Mapping[str, Any] | None, resumed: checkpoint.Loaded | None,
) -> tuple[LoopEnd, Schedule]:
    """``run``'s loop with the schedule computed in the loop; returns where it ended and
    the schedule rows it produced (a checkpoint keeps them)."""
    data, spec = setup.data, setup.round.spec
    sampler = setup.round.sampler
    slots = selection_slots(system, sampler, data.num_clients)
    if select is None:  # as plan_run selects, so that a run and its online twin agree
        plain = scheduling.as_select_fn(
            sampler if slots is None else scheduling.select_among_ready(data.num_clients, slots)
        )
        select = lambda key, round_idx, ready, record: plain(key, round_idx, ready)
    program = online.OnlineRound(setup.round, system.policy, select)
    costs = np.ones(1, np.float32)
    freezing = setup.round.algorithm.freezing
    if freezing is not None:
        masks = freezing.depth_masks(setup.round.model.init(rng.stream(key, "init")))
        costs = online.step_costs(spec, setup.hyper, setup.train, masks)
    inputs = online.RoundInputs(
        setup.hyper, setup.train, key, system.profiles,
        jnp.asarray(steps_needed(spec, data.train.count)), jnp.asarray(costs),
    )
    block_fn = jax.jit(program.run_block)
    _, evaluate_ = setup.programs(key)
    rows: list[Schedule] = []

    def account():
        recorder.accounting = schedule_accounting(
            _concat(rows), spec, data.train.count, data.num_clients
        )

    def record(done, block_output, ev):
        metrics = None
        if block_output is not None:
            metrics, row = block_output
            rows.append(row)
            account()
        return recorder.record(done, metrics, ev)

    state = setup.on_mesh(program.init(setup.init(key), data.num_clients))
    if resumed is not None:
        state = restore_state(resumed, state, setup.round.store)
        stored = resumed.group("schedule")
        if stored:
            rows.append(Schedule(**{name.lstrip("."): jnp.asarray(a) for name, a in stored.items()}))
            account()
    end = loop(
        state, block=lambda state, ids, _: block_fn(state, ids, inputs),
        evaluate=lambda state: evaluate_(state.run), plans=None, on_eval=record,
        save=checkpointer(
            out_dir, config, [recorder], setup.round.store,
            lambda: checkpoint.leaves("schedule", _concat(rows)) if rows else {},
        ),
        done=0 if resumed is None else resumed.done,
    )
    return dataclasses.replace(end, state=end.state.run), _concat(rows) if rows else None


def _concat(rows: Sequence[Schedule]) -> Schedule:
    return jax.tree.map(lambda *blocks: jnp.concatenate(blocks), *rows)
