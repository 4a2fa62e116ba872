"""One round of federated training as a pure function (DESIGN.md §8).

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

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh

from fedjax_het import rng
from fedjax_het.algorithm import ClientStats, FederatedAlgorithm
from fedjax_het.client_store import ON_DEVICE, ClientStore
from fedjax_het.cohort import run_cohort
from fedjax_het.data.federated import ClientArrays
from fedjax_het.local import NO_STEP_LIMIT, ClientTask, DeviceSplit, LocalSpec, local_update
from fedjax_het.models import Model
from fedjax_het.sampler import Sampler
from fedjax_het.system.schedule import OK, Schedule
from fedjax_het.typing import ClientState, Hyper, PRNGKey, ServerState


@struct.dataclass
class RunState:
    """Everything that changes between rounds."""

    server_state: ServerState
    client_states: ClientState  # as the round's store holds them: [num_clients, ...] or HostRows


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
        tasks = ClientTask(
            client_id=ids,
            weight=jnp.where(counts, weight, 0.0),
            step_limit=step_limit,
            key=rng.client_keys(key, round_idx, "train", ids),
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
        state, _, metrics = self.train_cohort(
            state, ids, tasks, hyper, train, server_stream(key, round_idx)
        )
        return state, metrics

    def train_cohort(
        self, state: RunState, ids: jax.Array, tasks: ClientTask, hyper: Hyper, train: DeviceSplit,
        server_key: PRNGKey | None = None,
    ) -> tuple[RunState, ClientStats, dict[str, jax.Array]]:
        """Trains the slots ``tasks`` (clients ``ids``), aggregates and updates the server
        (with ``server_key``, ``server_stream(key, round)``, for its randomness).

        Returns the new state, every slot's ``ClientStats`` and the round's
        metrics (with the algorithm's ``server_metrics``).
        """
        algorithm = self.algorithm
        broadcast = algorithm.broadcast(state.server_state)
        client_fn = functools.partial(local_update, self.spec, hyper, broadcast, data=train)
        cohort_states = self.store.gather(state.client_states, ids)
        sums, new_states, stats = run_cohort(
            client_fn, cohort_states, tasks, algorithm.aggregator, chunk=self.chunk,
            mesh=self.mesh, drop_nonfinite=self.drop_nonfinite,
        )
        server_state = algorithm.server_update(
            state.server_state, algorithm.aggregator.finalize(sums), hyper, server_key
        )
        nonfinite = (tasks.weight > 0) & ~stats.finite
        counted = (tasks.weight > 0) & ~(nonfinite & self.drop_nonfinite)
        client_states = self.store.scatter(state.client_states, ids, new_states, counted)
        kept = ~(nonfinite & self.drop_nonfinite)  # a dropped update's loss is left out too
        examples = jnp.sum(jnp.where(kept, stats.examples, 0))
        metrics = {
            "train_loss": jnp.sum(jnp.where(kept, stats.loss_sum, 0)) / jnp.maximum(examples, 1),
            "participants": jnp.sum(counted).astype(jnp.int32),
            "examples": examples,
            "nonfinite_updates": jnp.sum(nonfinite).astype(jnp.int32),
        }
        if algorithm.server_metrics is not None:
            metrics.update(algorithm.server_metrics(server_state))
        return RunState(server_state, client_states), stats, metrics


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
    store: ClientStore = ON_DEVICE,
) -> RunState:
    """Initial global model from ``stream(key, "init")`` and every client's initial state."""
    params = model.init(rng.stream(key, "init"))
    client_states = store.init(algorithm.client_init(params), num_clients)
    return RunState(algorithm.server_init(params, hyper, num_clients), client_states)
