"""GANDALF's mediators: groups that train one model client to client, with fault tolerance.

Chou, Chang, Chou, "A GAN-based Data Augmentation Framework for Federated
Learning on Non-IID Data" (GANDALF), phase 3 ("Training user model", §3.2,
§4.3, Algorithms 3 and 4) and its fault tolerance (§3.4, §5.5, Table 2).
Astraea's rebalancing mediators use the same grouping idea.

Grouping (``kl_groups``, Algorithm 4): groups of at most ``ceil(K / M_c)``
clients are filled one after another, each time adding the client ``c``
that minimises ``D_KL(P_m + P_c || P_u)``, the divergence of the group's
pooled class mix from uniform.

A synchronous round (Algorithm 3): every group starts from the global model
``w_r``; its mediator passes the weights client to client for ``E_m`` passes
(each member trains its ``E`` local epochs once per pass); the server takes

    w_{r+1} = Σ_m (n_m / n) w_m,   n = Σ_m n_m,

over the groups in which somebody trained, ``n_m`` being the examples of the
members that trained at least once this round. In this module the groups'
deltas ``w_r - w_m`` are averaged with weights ``n_m`` and handed to the
algorithm's ``server_update`` (FedAvg's server SGD at rate 1 gives the rule
above; a server optimizer gives its FedAvgM/FedAdam analogue). A round in
which nobody trained leaves the server state as it was. The groups run as one
``vmap`` (or ``lax.map`` in chunks of groups) of a ``lax.scan`` over the
group's slots; a padding or failed slot passes the weights through
unchanged, so the next member trains from the last holder's weights. Slot
``(client k, pass e)`` trains with key ``fold_in(client_keys(key, r, "train",
k), e)``: nothing depends on the grouping, the group order or the chunking.

Timing and failures. Each slot's client works ``down + steps * step_time +
up`` ready seconds (the weights in, its local steps, the weights out; speeds
drawn as ``system.schedule`` draws them, per client and pass on the
"download", "upload" and "dropout" streams), pausing while its device is not
ready (FLHetBench's ``F_i(t, d)``). A slot fails when its client is not ready
when asked (UNAVAILABLE), drops out (``profiles.dropout``, at a point drawn
uniformly over its work: DROPPED), or would need more than the maximum wait
``T_R`` (LATE). A group's duration is the sum of its slots' costs, a round's
the longest group's, and the virtual clock adds the rounds up (availability
is queried at each slot's own start).

With fault tolerance (``heartbeat`` given; §3.4):
  - training order: before each slot the mediator picks, among the members
    not yet trained in this pass, the one that completed the fewest local
    training tasks so far (a participation table kept in ``MediatorState``;
    ties: group order), so each client trains at most once a pass;
  - heartbeat: a client that is gone (unavailable, or dropped) is noticed
    ``heartbeat`` seconds after it fell silent; a client that is alive but
    slow keeps sending heartbeats and is given up at ``T_R``. A failed slot
    costs ``min(silent_since + heartbeat, T_R)`` (UNAVAILABLE: silent from 0;
    DROPPED: from its drop), LATE costs ``T_R``;
  - rollback: the next client gets the weights from the last client that
    completed training, so a failure costs time, never the group's progress.

Without fault tolerance (``heartbeat=None``), as §5.5 describes the baseline:
the mediators use the fixed group order every pass and "wait for the response
of clients for a maximum waiting time threshold T_R. Once the waiting time
threshold is reached, mediators will skip the client from the training round
and move on to the next client in the fixed training sequence." So every
failed slot costs the whole ``T_R`` (Table 2's caption: the dropout rate is
"the fraction of client requests exceeding the max wait T_R without FT"), and
the skipped client's work is lost but not the group's: the paper says the
group moves on, not that it restarts, so the next client trains from the last
completed weights here too. The two modes differ in time (heartbeats) and in
order (balanced or fixed), not in what a failure does to the model.

.. warning:: Not modelled: the paper's per-round cap on a client's tasks and
   its minimum interval between two tasks of a client (here each member trains
   at most once per pass); the Gaussian noise of Algorithm 3, line 9 (use
   ``fedjax_het.transforms.privacy`` for DP); the GAN phases 1-2. Each hand-over counts
   as the sender's upload plus the receiver's download.

>>> import numpy as np
>>> kl_groups(np.array([[9, 1], [1, 9], [8, 2], [2, 8]]), group_size=2).members.tolist()
[[2, 3], [0, 1]]
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_het import rng
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import (
    FederatedAlgorithm,
    delta_update,
    start_from_broadcast,
    weighted_mean,
)
from fedjax_het.engine.local import NO_STEP_LIMIT, ClientTask, DeviceSplit, LocalSpec, local_update
from fedjax_het.engine.round import device_split, server_stream
from fedjax_het.models import Model
from fedjax_het.system import availability as avail
from fedjax_het.system.profiles import ClientProfiles, transfer_time, uniform_profiles, validate
from fedjax_het.system.schedule import DROPPED, EMPTY, LATE, OK, UNAVAILABLE
from fedjax_het.training.metrics import evaluate
from fedjax_het.training.online import payload_bytes
from fedjax_het.typing import Hyper, Params, PRNGKey, ServerState

# ---- grouping --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Groups:
    """Clients grouped under mediators, padded to a rectangle.

    Attributes:
      members: int32 ``[M, G]`` client ids, in each group's order (padding: 0).
      mask: bool ``[M, G]`` which entries are members.
    """

    members: np.ndarray
    mask: np.ndarray

    def __post_init__(self):
        members, mask = np.asarray(self.members), np.asarray(self.mask)
        if members.ndim != 2 or members.shape != mask.shape:
            raise ValueError(
                f"members and mask must be [M, G] of one shape, got {members.shape} and {mask.shape}"
            )
        if not np.all(mask.any(axis=1)):
            raise ValueError(f"group {int(np.argmin(mask.any(axis=1)))} is empty")
        ids = members[mask.astype(bool)]
        if np.any(ids < 0) or len(np.unique(ids)) != len(ids):
            raise ValueError("group members must be distinct client ids >= 0")
        object.__setattr__(self, "members", np.where(mask, members, 0).astype(np.int32))
        object.__setattr__(self, "mask", mask.astype(bool))

    @property
    def num_groups(self) -> int:
        return int(self.members.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.members.shape[1])


def kl_divergence_to_uniform(counts: np.ndarray) -> np.ndarray:
    """``D_KL(p || uniform)`` of the class mix ``p = counts / Σ counts`` over the last axis (0 log 0 = 0)."""
    counts = np.asarray(counts, np.float64)
    p = counts / np.maximum(counts.sum(axis=-1, keepdims=True), 1e-300)
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0) * counts.shape[-1]), 0.0)
    return terms.sum(axis=-1)


def kl_groups(
    class_counts: np.ndarray, *, group_size: int | None = None, num_groups: int | None = None
) -> Groups:
    """Greedy grouping towards a uniform class mix (GANDALF, Algorithm 4).

    Groups are filled one at a time up to ``group_size`` clients (or
    ``ceil(K / num_groups)``, Algorithm 4's cap); each step adds the remaining
    client whose counts bring the group's pooled class mix closest to uniform in
    ``D_KL(P_m + P_c || P_u)`` (ties: the lowest id). The last group may be
    smaller; with ``num_groups`` that does not divide ``K`` there may be fewer
    groups than asked (Algorithm 4 fixes the cap, not the count).

    .. note:: ``P`` are class counts, so the group's mix is that of its pooled
       data; the paper's equal-sized clients make counts and distributions agree.

    Args:
      class_counts: ``[K, C]`` examples of each class held by each client.
      group_size, num_groups: give exactly one.

    Returns:
      ``Groups`` with ``members`` in the order they were added.
    """
    counts = np.asarray(class_counts, np.float64)
    if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
        raise ValueError(f"class_counts must be [K, C] with K, C >= 1, got shape {counts.shape}")
    if np.any(counts < 0) or np.any(counts.sum(axis=1) <= 0):
        raise ValueError("class_counts must be >= 0 with at least one example per client")
    num_clients = counts.shape[0]
    if (group_size is None) == (num_groups is None):
        raise ValueError("give group_size or num_groups, not both or neither")
    if num_groups is not None:
        if not 1 <= num_groups <= num_clients:
            raise ValueError(f"num_groups must be in [1, {num_clients}], got {num_groups}")
        group_size = math.ceil(num_clients / num_groups)
    if not 1 <= group_size <= num_clients:
        raise ValueError(f"group_size must be in [1, {num_clients}], got {group_size}")
    left = list(range(num_clients))
    groups = []
    while left:
        pooled, group = np.zeros(counts.shape[1]), []
        while left and len(group) < group_size:
            divergence = kl_divergence_to_uniform(pooled + counts[left])
            chosen = left.pop(int(np.argmin(divergence)))
            group.append(chosen)
            pooled = pooled + counts[chosen]
        groups.append(group)
    members = np.zeros((len(groups), group_size), np.int32)
    mask = np.zeros(members.shape, bool)
    for m, group in enumerate(groups):
        members[m, : len(group)], mask[m, : len(group)] = group, True
    return Groups(members, mask)


# ---- one round -------------------------------------------------------------------------


@struct.dataclass
class Timing:
    """The traced numbers of a mediator round (a sweep may vary them).

    Attributes:
      max_wait: ``T_R``, seconds a mediator waits for a client before it counts as failed.
      heartbeat: seconds of silence after which a gone client is noticed (``inf``:
        only at ``T_R``, the baseline without fault tolerance).
      payload_down, payload_up: bytes of the weights a client receives and sends.
    """

    max_wait: jax.Array
    heartbeat: jax.Array
    payload_down: jax.Array
    payload_up: jax.Array


def timing(
    max_wait: float,
    *,
    heartbeat: float | None = None,
    payload_down: float = 0.0,
    payload_up: float = 0.0,
) -> Timing:
    """A validated ``Timing``.

    Args:
      max_wait: ``T_R`` in seconds, > 0 and finite.
      heartbeat: the heartbeat timeout in ``[0, T_R]`` seconds; None (the baseline
        without fault tolerance): failures are noticed only at ``T_R``.
      payload_down, payload_up: bytes of the weights in and out of a client
        (``online.payload_bytes``).
    """
    if not 0 < max_wait < math.inf:
        raise ValueError(f"max_wait (T_R) must be > 0 seconds and finite, got {max_wait}")
    if heartbeat is not None and not 0 <= heartbeat <= max_wait:
        raise ValueError(f"heartbeat must be in [0, max_wait={max_wait}] seconds, got {heartbeat}")
    if not (0 <= payload_down < math.inf and 0 <= payload_up < math.inf):
        raise ValueError(f"payloads must be finite bytes >= 0, got {payload_down}, {payload_up}")
    as32 = lambda v: jnp.asarray(v, jnp.float32)
    return Timing(
        as32(max_wait),
        as32(math.inf if heartbeat is None else heartbeat),
        as32(payload_down),
        as32(payload_up),
    )


@struct.dataclass
class GroupPlan:
    """Who trains in each slot of each group this round, and what it cost (``S = E_m G``).

    Attributes:
      client: int32 ``[M, S]`` client of each slot (0 in an empty slot).
      position: int32 ``[M, S]`` the client's position in its group's members.
      outcome: int32 ``[M, S]`` OK, UNAVAILABLE, LATE, DROPPED or EMPTY (``system.schedule``'s codes).
      seconds: ``[M, S]`` what each slot cost its group.
      duration: ``[M]`` each group's round, the sum of its slots' costs.
    """

    client: jax.Array
    position: jax.Array
    outcome: jax.Array
    seconds: jax.Array
    duration: jax.Array

    @property
    def trained(self) -> jax.Array:
        return self.outcome == OK


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
      fault_tolerant: balanced order and heartbeats (see the module docstring).
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
        if algorithm.client_finalize is not delta_update or algorithm.client_start is not (
            start_from_broadcast
        ):
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
        size, av = members.shape[1], avail.queryable(profiles.availability)
        key_r = rng.round_key(key, round_idx)
        streams = [rng.stream(key_r, name) for name in ("download", "upload", "dropout")]
        needed = self.steps(count)

        def slot_costs(k, e, t):
            """Outcome and cost of client ``k``'s pass ``e``, asked at ``t`` seconds into the round."""
            down_key, up_key, drop_key = (
                jax.random.fold_in(rng.client_key(s, k), e) for s in streams
            )
            down = transfer_time(
                down_key, times.payload_down, profiles.down_mean[k], profiles.down_std[k]
            )
            up = transfer_time(up_key, times.payload_up, profiles.up_mean[k], profiles.up_std[k])
            work = down + needed[k] * profiles.step_time[k] + up
            draws = jax.random.uniform(drop_key, (2,), work.dtype)
            t_abs, trace = start + t, profiles.trace[k]
            ready = avail.is_ready(av, trace, t_abs)
            walls = (
                jax.vmap(avail.finish_time, in_axes=(None, None, None, 0))(
                    av, trace, t_abs, jnp.stack([work, draws[1] * work])
                )
                - t_abs
            )
            done, dropped_at = walls[0], walls[1]
            drops = (draws[0] < profiles.dropout[k]) & (dropped_at <= times.max_wait)
            outcome = jnp.select(
                [~ready, drops, done > times.max_wait], [UNAVAILABLE, DROPPED, LATE], OK
            )
            silent_since = jnp.where(outcome == UNAVAILABLE, 0.0, dropped_at)
            gone = (outcome == UNAVAILABLE) | (outcome == DROPPED)
            failed = times.max_wait
            if self.fault_tolerant:
                failed = jnp.where(
                    gone, jnp.minimum(silent_since + times.heartbeat, failed), failed
                )
            return outcome, jnp.where(outcome == OK, done, failed)

        def one_group(ids, is_member, counts):
            def slot(carry, s):
                t, counts, used = carry
                e, j = s // size, s % size
                used = jnp.where(j == 0, ~is_member, used)  # a new pass
                if self.fault_tolerant:  # least-trained first, ties in group order
                    rank = jnp.where(
                        used, jnp.iinfo(jnp.int32).max, counts * size + jnp.arange(size)
                    )
                    position = jnp.argmin(rank).astype(jnp.int32)
                else:
                    position = j.astype(jnp.int32)
                valid = is_member[position] & ~used[position]
                k = jnp.where(valid, ids[position], 0)
                outcome, cost = slot_costs(k, e, t)
                outcome = jnp.where(valid, outcome, EMPTY)
                cost = jnp.where(valid, cost, 0.0)
                counts = counts.at[position].add((outcome == OK).astype(jnp.int32))
                used = used.at[position].set(True)
                return (t + cost, counts, used), (k, position, outcome, cost)

            init = (jnp.zeros((), profiles.step_time.dtype), counts, ~is_member)
            (t, _, _), (k, position, outcome, cost) = jax.lax.scan(
                slot, init, jnp.arange(self.passes * size, dtype=jnp.int32)
            )
            return GroupPlan(k, position, outcome.astype(jnp.int32), cost, t)

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


# ---- a run -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MediatorHistory:
    """What ``run_mediator`` returns.

    Attributes:
      params: the final global model.
      participation: ``[N]`` local training tasks each client completed.
      round_metrics: ``{name: [R]}`` of every round: duration, clock, requests (slots
        that asked a client), failures (Table 2's dropout rate is failures / requests
        without fault tolerance), waited (seconds spent on failed slots, summed over
        groups), participants (clients that trained), examples, train_loss.
      plans: the ``GroupPlan`` of every round, stacked ``[R, ...]`` (numpy).
      evaluations: one dict per evaluation: round (rounds done), clock, loss, accuracy.
    """

    params: Params
    participation: np.ndarray
    round_metrics: dict[str, np.ndarray]
    plans: GroupPlan
    evaluations: list[dict[str, float]]


def run_mediator(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    groups: Groups,
    *,
    rounds: int,
    work: LocalWork,
    max_wait: float,
    heartbeat: float | None = None,
    passes: int = 1,
    profiles: ClientProfiles | None = None,
    hyper: dict[str, float] | None = None,
    seed: int = 0,
    start: float = 0.0,
    eval_every: int = 1,
    eval_batch_size: int = 256,
    chunk: int | None = None,
) -> MediatorHistory:
    """GANDALF's phase-3 training (Algorithm 3) for ``rounds`` rounds, in ``lax.scan`` blocks.

    Args:
      data: the federated data (with a test split, on which the global model is evaluated).
      model: the user model.
      algorithm: its client optimizer and server step; it must use fedavg's client hooks.
      groups: the mediators' groups (``kl_groups``).
      rounds: synchronization rounds ``R``.
      work: each client's local work per task (the paper's ``E`` epochs).
      max_wait: ``T_R`` in seconds.
      heartbeat: fault tolerance with this heartbeat timeout (seconds, <= ``T_R``);
        None: the baseline without it (module docstring).
      passes: ``E_m``.
      profiles: the clients' system profiles; None: uniform, instantaneous, no failures.
      hyper: the algorithm's hyperparameters (defaults for the rest).
      seed: the run's root key is ``rng.seed_key(seed)``.
      start: virtual time of round 0's start (seconds into the availability traces).
      eval_every: rounds per ``lax.scan`` block, each followed by an evaluation.
      eval_batch_size: test rows per evaluation batch.
      chunk: groups per ``vmap`` (None: all).
    """
    if rounds < 1 or eval_every < 1:
        raise ValueError(f"rounds and eval_every must be >= 1, got {rounds} and {eval_every}")
    if data.test is None:
        raise ValueError("run_mediator needs a test split to evaluate; build the data with one")
    num_clients = data.num_clients
    largest = int(groups.members[groups.mask].max())
    if largest >= num_clients:
        raise ValueError(f"groups name client {largest} but the data has {num_clients} clients")
    profiles = uniform_profiles(num_clients) if profiles is None else profiles
    validate(profiles)
    if profiles.num_clients != num_clients:
        raise ValueError(f"profiles hold {profiles.num_clients} clients, the data {num_clients}")
    max_count = int(data.train.count.max())
    spec = LocalSpec(model, algorithm, work, work.static_steps(max_count), max_count)
    mediator = Mediator(spec, passes, fault_tolerant=heartbeat is not None, chunk=chunk)
    key, hyper = rng.seed_key(seed), algorithm.hyper(hyper)
    params = model.init(rng.stream(key, "init"))
    down, up = payload_bytes(algorithm, params)
    times = timing(max_wait, heartbeat=heartbeat, payload_down=down, payload_up=up)
    state = MediatorState(
        algorithm.server_init(params, hyper, num_clients),
        jnp.zeros((num_clients,), jnp.int32),
        jnp.float32(start),
    )
    train, test = device_split(data.train), device_split(data.test)
    row_client = jnp.asarray(data.test.client_ids)
    members, mask = jnp.asarray(groups.members), jnp.asarray(groups.mask)

    @jax.jit
    def block(state, round_ids, members, mask, profiles, times, hyper, train, key):
        def one(state, round_idx):
            state, plan, metrics = mediator.step(
                state, round_idx, members, mask, profiles, times, hyper, train, key
            )
            return state, (plan, metrics)

        return jax.lax.scan(one, state, round_ids)

    @jax.jit
    def evaluate_(server_state, test, row_client):
        params = algorithm.global_params(server_state)
        return evaluate(model, params, test, row_client, batch_size=eval_batch_size)

    plans, metrics, evaluations = [], [], []
    for first in range(0, rounds, eval_every):
        round_ids = jnp.arange(first, min(first + eval_every, rounds), dtype=jnp.int32)
        state, (plan, block_metrics) = block(
            state, round_ids, members, mask, profiles, times, hyper, train, key
        )
        plans.append(jax.device_get(plan))
        metrics.append(jax.device_get(block_metrics))
        ev = jax.device_get(evaluate_(state.server_state, test, row_client))
        evaluations.append({
            "round": int(round_ids[-1]) + 1, "clock": float(state.clock),
            "loss": float(ev["loss"]), "accuracy": float(ev["accuracy"]),
        })  # fmt: skip
    concat = lambda *parts: np.concatenate(parts)
    return MediatorHistory(
        params=jax.device_get(algorithm.global_params(state.server_state)),
        participation=np.asarray(state.participation),
        round_metrics=jax.tree.map(concat, *metrics),
        plans=jax.tree.map(concat, *plans),
        evaluations=evaluations,
    )
