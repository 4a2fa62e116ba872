"""One mediator round as a pure function: plan the slots, train the groups, aggregate.

GANDALF (Chou, Chang, Chou), Algorithm 3, as ``fedjax_het.gandalf.mediator``'s
docstring states it: every group starts from the global model ``w_r``; its
mediator passes the weights client to client for ``E_m`` passes, a padding or
failed slot passing them through unchanged; the server takes

    w_{r+1} = Σ_m (n_m / n) w_m,   n = Σ_m n_m,

over the groups in which somebody trained, through the algorithm's
``server_update`` on the groups' deltas ``w_r - w_m`` averaged with weights
``n_m``. The groups run as one ``vmap`` (or ``lax.map`` in chunks of groups) of
a ``lax.scan`` over the group's slots (``slots.plan_group`` for their order and
costs).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het import rng
from fedjax_het.engine.algorithm import delta_update, start_from_broadcast, weighted_mean
from fedjax_het.engine.local import NO_STEP_LIMIT, ClientTask, DeviceSplit, LocalSpec, local_update
from fedjax_het.engine.round import server_stream
from fedjax_het.gandalf.slots import GroupPlan, Timing, plan_group, slot_costs
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import EMPTY, OK
from fedjax_het.typing import Hyper, Params, PRNGKey, ServerState


@struct.dataclass
class MediatorState:
    """Everything that changes between rounds.

    Attributes:
      server_state: the algorithm's server state (the global model).
      participation: int32 ``[N]`` local training tasks each client completed so far.
      clock: virtual seconds at the end of the last round.
    """

    server_state: ServerState
    participation: jax.Array
    clock: jax.Array


@dataclasses.dataclass(frozen=True)
class Mediator:
    """The static description of a mediator round; ``step`` is the pure round function.

    Attributes:
      spec: local training (model, algorithm, local work) of every slot.
      passes: ``E_m``, mediator epochs: passes of the weights over each group.
      fault_tolerant: balanced order and heartbeats (``mediator``'s docstring).
      chunk: groups per ``vmap`` (``lax.map`` over chunks); None: all groups in one.
    """

    spec: LocalSpec
    passes: int = 1
    fault_tolerant: bool = True
    chunk: int | None = None

    def __post_init__(self):
        if self.passes < 1:
            raise ValueError(f"passes (E_m) must be >= 1, got {self.passes}")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 or None, got {self.chunk}")
        algorithm = self.spec.algorithm
        local = algorithm.local
        if local.finalize is not delta_update or local.start is not start_from_broadcast:
            raise ValueError(
                f"{algorithm.name}: the mediator passes trained weights on, so clients must start "
                "from what they receive and send start - params (fedavg's client hooks)"
            )

    def steps(self, count: jax.Array) -> jax.Array:
        """Local steps of a client of ``count`` examples (as ``local.client_batches`` counts them)."""
        batch = self.spec.work.batch_size
        examples = self.spec.work.examples_to_process(count)
        return jnp.minimum((examples + batch - 1) // batch, self.spec.max_steps)

    def _over_groups(self, fn, *xs):
        """``fn`` over the leading group axis: one ``vmap`` or chunks of ``chunk`` groups."""
        if self.chunk is None:
            return jax.vmap(fn)(*xs)
        return jax.lax.map(lambda args: fn(*args), xs, batch_size=self.chunk)

    def plan(
        self,
        members: jax.Array,
        mask: jax.Array,
        profiles: ClientProfiles,
        times: Timing,
        participation: jax.Array,
        count: jax.Array,
        *,
        round_idx: jax.Array,
        start: jax.Array,
        key: PRNGKey,
    ) -> GroupPlan:
        """Each group's training order, failures and costs for round ``round_idx`` from ``start``.

        ``members``, ``mask``: ``Groups``' arrays; ``count``: ``[N]`` examples per
        client. Depends on the profiles, ``times``, the participation table and
        the key, never on model values.
        """
        slot_cost = slot_costs(
            profiles,
            times,
            self.steps(count),
            round_idx=round_idx,
            start=start,
            key=key,
            fault_tolerant=self.fault_tolerant,
        )
        one_group = functools.partial(
            plan_group,
            slot_cost=slot_cost,
            passes=self.passes,
            fault_tolerant=self.fault_tolerant,
            clock_dtype=profiles.step_time.dtype,
        )
        return self._over_groups(one_group, members, mask, participation[members])

    def train_groups(
        self,
        hyper: Hyper,
        params: Params,
        plan: GroupPlan,
        train: DeviceSplit,
        *,
        round_idx: jax.Array,
        key: PRNGKey,
    ) -> tuple[Params, jax.Array, jax.Array]:
        """Each group's weights after its slots: ``(params [M, ...], loss_sum [M], examples [M])``.

        Slot by slot, a client that trains starts from the weights the last
        one passed on; any other slot passes them through unchanged.
        """
        size = plan.client.shape[1] // self.passes
        passes = jnp.arange(plan.client.shape[1], dtype=jnp.int32) // size
        train_stream = rng.stream(rng.round_key(key, round_idx), "train")

        def one_group(clients, trained):
            def slot(carry, inputs):
                weights, loss_sum, examples = carry
                k, e, trains = inputs
                task = ClientTask(
                    client_id=k,
                    weight=jnp.float32(1),
                    step_limit=jnp.where(trains, NO_STEP_LIMIT, 0),
                    key=jax.random.fold_in(rng.client_key(train_stream, k), e),
                )
                update, _, stats = local_update(self.spec, hyper, weights, (), task, train)
                weights = jax.tree.map(lambda w, u: jnp.where(trains, w - u, w), weights, update)
                loss_sum = loss_sum + jnp.where(trains, stats.loss_sum, 0)
                return (weights, loss_sum, examples + jnp.where(trains, stats.examples, 0)), None

            loss0 = jnp.zeros((), jax.tree.leaves(params)[0].dtype)
            (weights, loss_sum, examples), _ = jax.lax.scan(
                slot, (params, loss0, jnp.zeros((), jnp.int32)), (clients, passes, trained)
            )
            return weights, loss_sum, examples

        return self._over_groups(one_group, plan.client, plan.trained)

    def apply(
        self,
        state: MediatorState,
        plan: GroupPlan,
        members: jax.Array,
        mask: jax.Array,
        hyper: Hyper,
        train: DeviceSplit,
        *,
        round_idx: jax.Array,
        key: PRNGKey,
    ) -> tuple[MediatorState, dict[str, jax.Array]]:
        """Trains the groups as ``plan`` says, aggregates ``Σ_m (n_m / n) w_m``, advances the clock."""
        algorithm = self.spec.algorithm
        params = algorithm.broadcast(state.server_state)
        models, loss_sum, examples = self.train_groups(
            hyper, params, plan, train, round_idx=round_idx, key=key
        )
        size = members.shape[1]
        at = plan.position[:, :, None] == jnp.arange(size)[None, None]  # [M, S, G]
        took_part = jnp.any(plan.trained[:, :, None] & at, axis=1) & mask  # trained at least once
        n_m = jnp.sum(jnp.where(took_part, train.count[members], 0), axis=1).astype(jnp.float32)
        deltas = jax.tree.map(lambda p, w: p[None] - w, params, models)
        rule = weighted_mean()
        shares = jax.vmap(lambda d, n: rule.contribute(d, n, None))(deltas, n_m)
        aggregate = rule.finalize(jax.tree.map(lambda s: jnp.sum(s, axis=0), shares))
        updated = algorithm.server_update(
            state.server_state, aggregate, hyper, server_stream(key, round_idx)
        )
        anyone = jnp.any(n_m > 0)
        server_state = jax.tree.map(
            lambda new, old: jnp.where(anyone, new, old), updated, state.server_state
        )
        participation = state.participation.at[plan.client.reshape(-1)].add(
            plan.trained.reshape(-1).astype(jnp.int32)
        )
        duration = jnp.max(plan.duration)
        failed = (plan.outcome != OK) & (plan.outcome != EMPTY)
        total = jnp.sum(examples)
        metrics = {
            "duration": duration,
            "clock": state.clock + duration,
            "requests": jnp.sum(plan.outcome != EMPTY).astype(jnp.int32),
            "failures": jnp.sum(failed).astype(jnp.int32),
            "waited": jnp.sum(jnp.where(failed, plan.seconds, 0.0)),
            "participants": jnp.sum(took_part).astype(jnp.int32),
            "examples": total,
            "train_loss": jnp.sum(loss_sum) / jnp.maximum(total, 1).astype(loss_sum.dtype),
        }
        return MediatorState(server_state, participation, state.clock + duration), metrics

    def step(
        self,
        state: MediatorState,
        round_idx: jax.Array,
        members: jax.Array,
        mask: jax.Array,
        profiles: ClientProfiles,
        times: Timing,
        hyper: Hyper,
        train: DeviceSplit,
        key: PRNGKey,
    ) -> tuple[MediatorState, GroupPlan, dict[str, jax.Array]]:
        """One round: plan the groups (``Groups``' arrays) from the profiles, then train and
        aggregate."""
        plan = self.plan(
            members,
            mask,
            profiles,
            times,
            state.participation,
            train.count,
            round_idx=round_idx,
            start=state.clock,
            key=key,
        )
        state, metrics = self.apply(
            state, plan, members, mask, hyper, train, round_idx=round_idx, key=key
        )
        return state, plan, metrics
