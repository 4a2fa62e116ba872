"""Rounds whose schedule is computed inside the training loop (DESIGN.md §7, last paragraph).

``simulate.run`` with a system plans the whole run before training, which is
right while timing does not depend on model values. Two things break that:

* **selection that learns** (Oort, power-of-choice, HDFL): a ``LearnedSelect``
  picks the cohort from the server's ``ClientRecord``: each client's last
  training loss, its last measured round time, and how often it was
  selected, aggregated and lost;
* **per-client freezing** (``FederatedAlgorithm.freezing``, FreezeFL): a
  client's upload, hence its finish time, depends on the layers it chose to
  freeze after a probe of local training.

An ``OnlineRound`` step does, in one jitted program: readiness at ``start +
overhead``; selection; the freezing probe (every selected client trains its
first ``probe_steps`` steps, scores each freeze depth and picks one);
``schedule.schedule_round`` with each client's upload bytes; training from
the row (steps done as step limits, failures at weight 0, the freeze mask
from the probe's end on); aggregation; and the record. The schedule rows are
the same ``Schedule`` fields ``system.schedule`` returns, so the accounting
and FLHetBench metrics read them unchanged.

Cost of freezing: a client at depth ``d`` uploads only the leaves it trains
and, after its probe, pays ``step_costs[d]`` of a full step (the FLOPs XLA
counts for the gradient of the layers still training, ``step_costs``); its
round uses the mean step time over the probe and the frozen steps. The probe
is simulated by training the probe steps twice (once to choose, once in the
round's training), which costs simulation time, not virtual time.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_het import rng
from fedjax_het.algorithm import LocalContext
from fedjax_het.cohort import run_cohort
from fedjax_het.local import ClientTask, DeviceSplit, LocalSpec, local_update
from fedjax_het.round import Round, RunState
from fedjax_het.sampler import ClientRecord, LearnedSelect
from fedjax_het.system import availability as avail
from fedjax_het.system.policy import RoundPolicy, num_selected
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import EMPTY, OK, UNAVAILABLE, Schedule, schedule_round
from fedjax_het.typing import Hyper, Params, PRNGKey, PyTree


@struct.dataclass
class OnlineState:
    """The run state plus what the in-loop schedule carries between rounds.

    Attributes:
      run: the ``round.RunState``.
      clock: virtual time the next round starts.
      soft_deadline: running mean (EMA) of the mean finish time of the counted clients
        of each round; NaN before the first (FreezeFL's ``T_r``).
      record: the ``ClientRecord``.
    """

    run: RunState
    clock: jax.Array
    soft_deadline: jax.Array
    record: ClientRecord


def upload_bytes(params: Params, masks: PyTree | None = None) -> jax.Array:
    """Bytes of ``params`` sent up: every leaf, or per depth ``[D]`` the leaves ``masks`` train."""
    if masks is None:
        return jnp.float32(sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params)))
    sizes = jax.tree.map(lambda p, m: m * (p.size * p.dtype.itemsize), params, masks)
    return sum(jax.tree.leaves(sizes))


@struct.dataclass
class RoundInputs:
    """The traced inputs every online round reads.

    Attributes:
      hyper: the algorithm's hyperparameters.
      train: the training store.
      key: the run's root key.
      profiles: the population's system profiles.
      steps_needed: ``[N]`` local steps of each client's full task.
      step_costs: ``[D]`` cost of a local step at each freeze depth relative to depth 0
        (``step_costs``); ``[1]`` without freezing.
    """

    hyper: Hyper
    train: DeviceSplit
    key: PRNGKey
    profiles: ClientProfiles
    steps_needed: jax.Array
    step_costs: jax.Array


def step_costs(spec: LocalSpec, hyper: Hyper, train: DeviceSplit, masks: PyTree) -> np.ndarray:
    """``[D]`` FLOPs of one local step at each freeze depth, over depth 0's.

    XLA's cost analysis of the gradient of the local loss with respect to
    the leaves that train at that depth: a frozen input-side layer needs no
    weight gradient and no backward pass below it, which XLA removes. Ones
    (no saving) where the backend reports no FLOP count.
    """
    broadcast = spec.model.init(jax.random.key(0))
    leaves, treedef = jax.tree.flatten(broadcast)
    trains = np.asarray([np.asarray(m) for m in jax.tree.leaves(masks)]) > 0  # [leaves, D]
    batch = (
        jnp.zeros((spec.work.batch_size, *train.x.shape[1:]), train.x.dtype),
        jnp.zeros((spec.work.batch_size, *train.y.shape[1:]), train.y.dtype),
        jnp.ones((spec.work.batch_size,), bool),
    )

    def flops(depth: int) -> float | None:
        kept = [i for i in range(len(leaves)) if trains[i, depth]]

        def loss(trained):
            values = list(leaves)
            for i, value in zip(kept, trained):
                values[i] = value
            params = jax.tree.unflatten(treedef, values)
            ctx = LocalContext(
                broadcast, broadcast, spec.algorithm.client_init(broadcast), jnp.int32(0),
                jnp.int32(1),
            )
            return spec.algorithm.local_loss(
                spec.model, params, batch, ctx, hyper, jax.random.key(0)
            )

        analysis = jax.jit(jax.grad(loss)).lower([leaves[i] for i in kept]).compile()
        analysis = analysis.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        return (analysis or {}).get("flops")

    counts = [flops(d) for d in range(trains.shape[1])]
    if any(c is None or c <= 0 for c in counts):
        return np.ones(len(counts), np.float32)
    return (np.asarray(counts) / counts[0]).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class OnlineRound:
    """A round with its schedule computed in the loop (see the module docstring).

    Attributes:
      round: the ``round.Round`` (model, algorithm, local work, chunk).
      policy: the round policy.
      select: the learned selection (``LearnedSelect``); it returns at least
        ``ceil(m * (1 + over_commit))`` ids.
      soft_deadline_ema: weight of the old value in ``OnlineState.soft_deadline``.
    """

    round: Round
    policy: RoundPolicy
    select: LearnedSelect
    soft_deadline_ema: float = 0.5

    def init(self, run_state: RunState, num_clients: int) -> OnlineState:
        return OnlineState(
            run_state, jnp.asarray(self.policy.start, jnp.float32), jnp.float32(jnp.nan),
            ClientRecord.empty(num_clients),
        )

    def step(
        self, state: OnlineState, round_idx: jax.Array, inputs: RoundInputs
    ) -> tuple[OnlineState, tuple[dict[str, jax.Array], Schedule]]:
        """One round: ``(state, round) -> (state, (metrics, schedule row))``."""
        round_, policy, profiles = self.round, self.policy, inputs.profiles
        m = round_.sampler.cohort_size
        ids, valid = self._select(state, round_idx, inputs)
        valid = valid & (jnp.arange(ids.shape[0]) < num_selected(m, policy.over_commit))
        broadcast = round_.algorithm.broadcast(state.run.server_state)
        full = upload_bytes(broadcast)
        payload_up = jnp.full((profiles.num_clients,), full)
        freezing = round_.algorithm.freezing
        if freezing is not None:
            masks = freezing.depth_masks(broadcast)
            probe = jnp.ceil(freezing.probe_share * inputs.steps_needed).astype(jnp.int32)
            up_bytes = upload_bytes(broadcast, masks)  # [D]
            scale = _step_scale(inputs, probe)  # [N, D]
            fixed = full / profiles.down_mean  # [N]
            compute = (inputs.steps_needed * profiles.step_time)[:, None] * scale  # [N, D]
            # Expected round time of every client at every depth, at its mean speeds: [N, D].
            seconds = fixed[:, None] + compute + up_bytes[None, :] / profiles.up_mean[:, None]
            depth = self._depths(state, broadcast, ids, probe, seconds, round_idx, inputs)
            payload_up = payload_up.at[ids].set(up_bytes[depth])
            profiles = profiles.replace(
                step_time=profiles.step_time.at[ids].multiply(scale[ids, depth])
            )
        row, clock = schedule_round(
            profiles, policy, round_idx=round_idx, start=state.clock, key=inputs.key,
            selected=ids, valid=valid, steps_needed=inputs.steps_needed, payload_down=full,
            payload_up=payload_up, cohort_size=m,
        )
        _, tasks = round_.cohort(round_idx, inputs.train, inputs.key, plan=row)
        if freezing is not None:
            tasks = tasks.replace(
                train_mask=jax.tree.map(lambda mask: mask[depth], masks), mask_from=probe[ids]
            )
        run_state, stats, metrics = round_.train_cohort(
            state.run, ids, tasks, inputs.hyper, inputs.train
        )
        state = OnlineState(
            run_state, clock, self._soft_deadline(state.soft_deadline, row),
            _recorded(state.record, row, stats, policy.overhead),
        )
        return state, (metrics, row)

    def _select(self, state: OnlineState, round_idx, inputs: RoundInputs):
        profiles = inputs.profiles
        if self.policy.availability_aware:
            ready = jax.vmap(avail.is_ready, in_axes=(None, 0, None))(
                avail.queryable(profiles.availability), profiles.trace,
                state.clock + self.policy.overhead,
            )
        else:
            ready = jnp.ones((profiles.num_clients,), bool)
        select_key = rng.stream(rng.round_key(inputs.key, round_idx), "select")
        return self.select(select_key, round_idx, ready, state.record)

    def _depths(self, state, broadcast, ids, probe, seconds, round_idx, inputs: RoundInputs):
        """Each slot's freeze depth, chosen after its first ``probe`` steps (weight 0, no sums).

        The probe uses the round's training keys (``round.Round.cohort``), so it sees
        the same batches as the first steps of the training that follows.
        """
        round_, freezing = self.round, self.round.algorithm.freezing
        train_keys = rng.client_keys(inputs.key, round_idx, "train", ids)
        tasks = ClientTask(ids, jnp.zeros(ids.shape), probe[ids], train_keys)

        def probe_client(client_state, task):
            update, _, stats = local_update(
                round_.spec, inputs.hyper, broadcast, client_state, task, inputs.train
            )
            depth = freezing.choose(
                update, seconds[task.client_id], state.soft_deadline, inputs.hyper
            )
            return update, depth.astype(jnp.int32), stats

        cohort_states = round_.store.gather(state.run.client_states, ids)
        _, depth, _ = run_cohort(
            probe_client, cohort_states, tasks, round_.algorithm.aggregator, chunk=round_.chunk
        )
        return depth

    def _soft_deadline(self, old: jax.Array, row: Schedule) -> jax.Array:
        ok = row.outcome == OK
        mean = jnp.sum(jnp.where(ok, row.finish, 0)) / jnp.maximum(jnp.sum(ok), 1)
        observed = mean - self.policy.overhead
        ema = self.soft_deadline_ema
        new = jnp.where(jnp.isnan(old), observed, ema * old + (1 - ema) * observed)
        return jnp.where(jnp.any(ok), new, old).astype(jnp.float32)

    def run_block(self, state: OnlineState, round_ids: jax.Array, inputs: RoundInputs):
        """The rounds ``round_ids`` as one ``lax.scan``; outputs (metrics, schedule rows)."""
        return jax.lax.scan(lambda s, r: self.step(s, r, inputs), state, round_ids)


def _step_scale(inputs: RoundInputs, probe: jax.Array) -> jax.Array:
    """``[N, D]`` mean step time at each depth over depth 0's: probe steps at full cost."""
    needed = jnp.maximum(inputs.steps_needed, 1)[:, None]
    probed = jnp.minimum(probe, inputs.steps_needed)[:, None]
    return (probed + (needed - probed) * inputs.step_costs[None, :]) / needed


def _recorded(record: ClientRecord, row: Schedule, stats, overhead) -> ClientRecord:
    """``record`` after a round: losses of clients that computed, times of those that finished."""
    ids, valid = row.selected, row.valid
    started = valid & (row.outcome != UNAVAILABLE) & (row.outcome != EMPTY)
    ok = valid & (row.outcome == OK)
    loss = stats.loss_sum / jnp.maximum(stats.examples, 1)
    computed = started & (stats.examples > 0)

    def put(field, new, where):
        return field.at[ids].set(jnp.where(where, new, field[ids]))

    return ClientRecord(
        loss=put(record.loss, loss, computed),
        seconds=put(record.seconds, row.finish - overhead, ok),
        selected=put(record.selected, record.selected[ids] + 1, valid),
        aggregated=put(record.aggregated, record.aggregated[ids] + 1, ok),
        lost=put(record.lost, record.lost[ids] + 1, started & ~ok),
    )
