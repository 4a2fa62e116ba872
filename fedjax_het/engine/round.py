"""One round of federated training as a pure function (docs/design.md §3).

``Round.step`` selects the cohort (or reads it from a schedule row), trains
it as a chunked ``vmap`` (``cohort.run_cohort``), aggregates and updates the
server. ``simulate`` runs rounds in ``lax.scan`` blocks; ``online`` wraps the
same round with a schedule computed in the loop. Randomness is
``fold_in(seed, round)`` then ``fold_in(.., client_id)`` on named streams,
never dependent on chunking.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh

from fedjax_het import rng
from fedjax_het.data.federated import ClientArrays
from fedjax_het.engine.algorithm import ClientStats, FederatedAlgorithm
from fedjax_het.engine.client_store import ON_DEVICE, ClientStore, DeviceStore
from fedjax_het.engine.cohort import StateTable, counted_slots, run_cohort
from fedjax_het.engine.groups import run_grouped
from fedjax_het.engine.hooks import (
    CohortProbe,
    DenseLevels,
    ServerMetrics,
    SubModel,
    UpdateBase,
)
from fedjax_het.engine.local import (
    NO_STEP_LIMIT,
    ClientTask,
    DeviceSplit,
    LocalSpec,
    local_update,
    planned_steps,
    probe_client,
)
from fedjax_het.models import Model
from fedjax_het.system.sampler import Sampler
from fedjax_het.system.schedule import OK, Schedule
from fedjax_het.typing import ClientState, Hyper, PRNGKey, PyTree, ServerState


@struct.dataclass
class RunState:
    """Everything that changes between rounds."""

    server_state: ServerState
    client_states: ClientState  # as the round's store holds them: [num_clients, ...] or HostRows
    ring: PyTree | None = None  # [ring_depth, ...] broadcasts of recent versions (Round.ring_depth)


@dataclasses.dataclass(frozen=True)
class Round:
    """The static description of one round; ``step`` is the pure round function."""

    model: Model
    algorithm: FederatedAlgorithm
    sampler: Sampler
    spec: LocalSpec
    chunk: int
    weighting: str = "examples"
    store: ClientStore = ON_DEVICE
    mesh: Mesh | None = None  # shard the cohort over these devices (cohort.run_cohort)
    drop_nonfinite: bool = False  # non-finite updates enter at weight 0 (cohort.run_cohort)
    ring_depth: int = 0  # > 0: slots train from the plan's versions, kept in RunState.ring
    proportional: bool = True  # skip idle chunks, bound chunks' steps (cohort.run_cohort)

    def cohort(
        self, round_idx: jax.Array, train: DeviceSplit, key: PRNGKey, plan: Schedule | None = None
    ) -> tuple[jax.Array, ClientTask]:
        """The selected ids ``[m]`` and their tasks for round ``round_idx``.

        Without a ``plan`` the sampler selects and everyone trains fully. With
        one (a round of ``system.schedule``) the plan's slots are the cohort: a
        slot trains its ``steps_done`` steps and counts only when its outcome
        is OK (others get weight 0 and no steps).
        """
        if plan is None:
            ids = self.sampler.select(rng.stream(rng.round_key(key, round_idx), "select"), round_idx)
            counts = jnp.ones(ids.shape, bool)
            step_limit = jnp.full(ids.shape, NO_STEP_LIMIT, jnp.int32)
        else:
            ids = plan.selected
            counts = plan.valid & (plan.outcome == OK)
            step_limit = jnp.where(counts, plan.steps_done, 0)
        size = train.count[ids].astype(jnp.float32)
        weight = size if self.weighting == "examples" else jnp.ones_like(size)
        if plan is None:
            keys = rng.client_keys(key, round_idx, "train", ids)
        else:  # the round a slot's task started in (a stale task's), or an async plan's task
            task = getattr(plan, "task", plan.version)
            keys = jax.vmap(lambda t, k: rng.client_keys(key, t, "train", k[None])[0])(task, ids)
        tasks = ClientTask(
            client_id=ids, weight=jnp.where(counts, weight, 0.0), step_limit=step_limit, key=keys
        )
        return ids, tasks

    def step(
        self,
        state: RunState,
        round_idx: jax.Array,
        hyper: Hyper,
        train: DeviceSplit,
        key: PRNGKey,
        plan: Schedule | None = None,
    ) -> tuple[RunState, dict[str, jax.Array]]:
        """One round: ``(state, round) -> (state, per-round metrics)``."""
        ids, tasks = self.cohort(round_idx, train, key, plan)
        version = None if plan is None or not self.ring_depth else plan.version
        state, _, metrics = self.train_cohort(
            state, ids, tasks, hyper, train, server_stream(key, round_idx),
            stale=None if version is None else (round_idx, version),
        )
        if self.ring_depth:
            state = state.replace(ring=push(state.ring, round_idx + 1, self.algorithm.broadcast(
                state.server_state)))
        return state, metrics

    def train_cohort(
        self, state: RunState, ids: jax.Array, tasks: ClientTask, hyper: Hyper, train: DeviceSplit,
        server_key: PRNGKey | None = None, stale: tuple[jax.Array, jax.Array] | None = None,
    ) -> tuple[RunState, ClientStats, dict[str, jax.Array]]:
        """Trains the slots ``tasks`` (clients ``ids``), aggregates and updates the server
        (with ``server_key``, ``server_stream(key, round)``, for its randomness).

        ``stale = (round_idx, version [m])``: each slot trains from the broadcast of
        its version, held in ``state.ring``, and reports its staleness
        ``round_idx - version`` (``stale_client_fn``). None: every slot trains from
        the current broadcast. An algorithm with a ``probe`` (Mime) first gets its
        statistic of the slots attached to the server state (``probed``).

        Returns the new state, every slot's ``ClientStats`` and the round's
        metrics (with the algorithm's ``server_metrics``).
        """
        algorithm = self.algorithm
        if algorithm.hook(CohortProbe) is not None:
            probed = self.probed(state.server_state, tasks, hyper, train, stale)
            state = state.replace(server_state=probed)
        broadcast = algorithm.broadcast(state.server_state)
        steps = planned_steps(self.spec, train.count[ids], tasks.step_limit)
        groups = self.dense_levels(stale is None and tasks.train_mask is None)
        # A synchronous cohort's ids are distinct: its states are read and written in the
        # table chunk by chunk. Stale slots may repeat a client; devices and the host
        # store gather the cohort's rows first and scatter them after.
        in_place = (stale is None and self.mesh is None and isinstance(self.store, DeviceStore)
                    and groups is None)
        table = StateTable(state.client_states, ids, self.store) if in_place else None
        if stale is None:
            client_fn = functools.partial(local_update, self.spec, hyper, broadcast, data=train)
            inputs = None if in_place else self.store.gather(state.client_states, ids)
        else:
            round_idx, version = stale
            client_fn = stale_client_fn(self.spec, hyper, state.ring, broadcast, train)
            inputs = (self.store.gather(state.client_states, ids), version % self.ring_depth,
                      round_idx - version)
        if groups is not None:
            sums, new_states, stats = run_grouped(
                [groups.client_fn(level, self.spec, hyper, broadcast, train)
                 for level in range(groups.num_levels)],
                groups.levels(broadcast, ids), inputs, tasks, algorithm.aggregator,
                chunk=self.chunk, steps=steps, drop_nonfinite=self.drop_nonfinite,
                proportional=self.proportional,
            )
        else:
            sums, new_states, stats = run_cohort(
                client_fn, inputs, tasks, algorithm.aggregator, chunk=self.chunk,
                mesh=self.mesh, drop_nonfinite=self.drop_nonfinite, steps=steps, table=table,
                proportional=self.proportional,
            )
        server_state = algorithm.server_update(
            state.server_state, algorithm.aggregator.finalize(sums), hyper, server_key
        )
        nonfinite = (tasks.weight > 0) & ~stats.finite
        counted = counted_slots(tasks.weight, stats.finite, self.drop_nonfinite)
        client_states = new_states if in_place else self.store.scatter(
            state.client_states, ids, new_states, counted)
        kept = ~(nonfinite & self.drop_nonfinite)  # a dropped update's loss is left out too
        examples = jnp.sum(jnp.where(kept, stats.examples, 0))
        metrics = {
            "train_loss": jnp.sum(jnp.where(kept, stats.loss_sum, 0)) / jnp.maximum(examples, 1),
            "participants": jnp.sum(counted).astype(jnp.int32),
            "examples": examples,
            "nonfinite_updates": jnp.sum(nonfinite).astype(jnp.int32),
        }
        if stale is not None:
            counted_staleness = jnp.where(counted, stats.staleness, 0)
            metrics["staleness_mean"] = jnp.sum(counted_staleness) / jnp.maximum(
                metrics["participants"], 1)
            metrics["staleness_max"] = jnp.max(counted_staleness)
        if (reported := algorithm.hook(ServerMetrics)) is not None:
            metrics.update(reported.metrics(server_state))
        return RunState(server_state, client_states, state.ring), stats, metrics

    def dense_levels(self, fresh: bool) -> DenseLevels | None:
        """The algorithm's ``DenseLevels`` when its width levels run as dense programs
        (``engine.groups``): a fresh synchronous cohort with no train masks, one device,
        a model that can be cut (``Model.at_width``); else None (masks)."""
        submodel = self.algorithm.hook(SubModel)
        groups = None if submodel is None else submodel.groups
        one_device = self.mesh is None or self.mesh.size == 1
        usable = fresh and one_device and self.spec.model.at_width is not None
        return groups if usable else None

    def probed(
        self, server_state: ServerState, tasks: ClientTask, hyper: Hyper, train: DeviceSplit,
        stale: tuple[jax.Array, jax.Array] | None = None,
    ) -> ServerState:
        """``server_state`` with the algorithm's ``CohortProbe`` statistic of the slots ``tasks``
        at its model attached: every slot measured (``local.probe_client``), then aggregated at
        the slots' weights. Refused (when traced) for slots that train from older models."""
        probe = self.algorithm.hook(CohortProbe)
        if stale is not None:
            raise ValueError(
                f"{self.algorithm.name} gathers a statistic of the cohort at the current model "
                "before training: slots that train from older models (an asynchronous server, "
                "stale tasks) cannot use it"
            )
        broadcast = self.algorithm.broadcast(server_state)
        measure = functools.partial(probe_client, self.spec, hyper, broadcast, data=train)
        sums, _, _ = run_cohort(
            measure, None, tasks, probe.aggregator, chunk=self.chunk, mesh=self.mesh,
            drop_nonfinite=self.drop_nonfinite,
        )
        return probe.attach(server_state, probe.aggregator.finalize(sums))


def stale_client_fn(
    spec: LocalSpec, hyper: Hyper, ring: PyTree, current: PyTree, train: DeviceSplit
) -> Callable:
    """One slot's round when slots train from different model versions.

    The returned ``((client_state, ring_position, staleness), task) -> (update,
    client_state, stats)`` trains from ``ring[ring_position]`` (gathered inside
    the chunk's ``vmap``, so memory stays ``chunk x params``) and sets
    ``stats.staleness``. With the algorithm's ``UpdateBase("current")`` hook the
    update is measured against ``current`` (the server's model now) instead of
    the slot's own start: ``u + (current - start)`` (FedAsync's mixing of models).
    """
    base = spec.algorithm.hook(UpdateBase)
    relative_to_current = base is not None and base.base == "current"

    def one(inputs, task):
        client_state, position, staleness = inputs
        start = jax.tree.map(lambda r: r[position], ring)
        update, client_state, stats = local_update(spec, hyper, start, client_state, task, data=train)
        if relative_to_current:
            update = jax.tree.map(lambda u, c, s: u + (c - s).astype(u.dtype), update, current, start)
        return update, client_state, stats.replace(staleness=staleness)

    return one


def new_ring(broadcast: PyTree, depth: int) -> PyTree:
    """A ring of ``depth`` copies of ``broadcast`` (every version before the first is version 0)."""
    return jax.tree.map(lambda b: jnp.broadcast_to(b, (depth, *jnp.shape(b))), broadcast)


def push(ring: PyTree, version: jax.Array, broadcast: PyTree) -> PyTree:
    """``ring`` with ``broadcast`` as version ``version`` (position ``version % depth``)."""
    return jax.tree.map(lambda r, b: r.at[version % r.shape[0]].set(b), ring, broadcast)


def device_split(split: ClientArrays) -> DeviceSplit:
    """The flat store on the device: float features as float32, token ids as int32."""
    integer = np.issubdtype(split.x.dtype, np.integer)
    return DeviceSplit(
        x=jnp.asarray(split.x, jnp.int32 if integer else jnp.float32),
        y=jnp.asarray(split.y, jnp.int32),
        offset=jnp.asarray(split.offset, jnp.int32),
        count=jnp.asarray(split.count, jnp.int32),
    )


def server_stream(key: PRNGKey, round_idx: jax.Array) -> PRNGKey:
    """The server's key for round ``round_idx``: the "server" stream of ``fold_in(seed, round)``."""
    return rng.stream(rng.round_key(key, round_idx), "server")


def init_state(
    model: Model, algorithm: FederatedAlgorithm, num_clients: int, hyper: Hyper, key: PRNGKey,
    store: ClientStore = ON_DEVICE, ring_depth: int = 0,
) -> RunState:
    """Initial global model from ``stream(key, "init")``, every client's initial state and,
    with ``ring_depth``, the ring of recent broadcasts (all version 0)."""
    params = model.init(rng.stream(key, "init"))
    client_states = store.init(algorithm.client_init(params), num_clients)
    server_state = algorithm.server_init(params, hyper, num_clients)
    ring = new_ring(algorithm.broadcast(server_state), ring_depth) if ring_depth else None
    return RunState(server_state, client_states, ring)
