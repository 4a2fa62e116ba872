"""Rounds whose schedule is computed inside the training loop (docs/design.md §5).

``simulate.run`` with a system plans the whole run before training, which is
right while timing does not depend on model values. Two things break that:

* **selection that learns** (Oort, power-of-choice, HDFL): a ``LearnedSelect``
  picks the cohort from the server's ``ClientRecord``: each client's last
  training loss, its last measured round time, and how often and when it was
  selected, aggregated and lost; a ``LearnedSelection`` also keeps its own
  state, reads each client's ``ClientReport`` (its profile: expected round
  seconds at mean speeds, dropout probability, examples of its task), and may
  ask for two measurements: a profile every ``profile_every`` rounds (the
  global model's arg-max class counts and the label counts over every client's
  training rows, under ``lax.cond``, before selecting) and squared per-example
  losses (``ClientRecord.loss_sq``: the round's global model on the examples
  each client trains, one forward pass beside training) and update alignments
  (``ClientRecord.alignment``: after training, one gradient pass per client);
* **per-client freezing** (the ``Freezing`` hook, FreezeFL): a
  client's upload, hence its finish time, depends on the layers it chose to
  freeze after a probe of local training.

An ``OnlineRound`` step does, in one jitted program: the selection's profile
(on its rounds); readiness at ``start + overhead``; selection; the freezing
probe (every selected client trains its first ``probe_steps`` steps, scores
each freeze depth and picks one);
``schedule.schedule_round`` with each client's upload bytes; training from
the row (steps done as step limits, failures at weight 0, the freeze mask
from the probe's end on); aggregation; and the record. The schedule rows are
the same ``Schedule`` fields ``system.schedule`` returns, so the accounting
and FLHetBench metrics read them unchanged.

Cost of freezing: a client at depth ``d`` uploads only the leaves it trains
and, after its probe, pays ``step_costs[d]`` of a full step (the FLOPs XLA
counts for the gradient of the layers still training, ``step_costs``); its
round uses the mean step time over the probe and the frozen steps. A sub-model's
width (``SubModel.costs``) scales its client's step time and bytes
as in the planned schedule (``training.costs.priced``). The probe
is simulated by training the probe steps twice (once to choose, once in the
round's training), which costs simulation time, not virtual time.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_het import rng
from fedjax_het.engine.algorithm import mean_loss
from fedjax_het.engine.cohort import run_cohort
from fedjax_het.engine.hooks import Freezing
from fedjax_het.engine.local import (
    ClientTask,
    DeviceSplit,
    client_batches,
    client_examples,
    local_update,
)
from fedjax_het.engine.round import Round, RunState, server_stream
from fedjax_het.models import layer_order
from fedjax_het.system.policy import RoundPolicy, num_selected
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.sampler import (
    ClientRecord,
    ClientReport,
    LearnedSelect,
    LearnedSelection,
    as_selection,
    layer_alignment,
)
from fedjax_het.system.schedule import (
    OK,
    Schedule,
    schedule_round,
    wait_for_ready,
)
from fedjax_het.training.client_record import class_counts, in_order, recorded
from fedjax_het.training.costs import client_costs, payload_bytes, priced
from fedjax_het.training.freeze_pricing import step_scale, upload_bytes
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
      selection: the learned selection's own state (``LearnedSelection.init``).
    """

    run: RunState
    clock: jax.Array
    soft_deadline: jax.Array
    record: ClientRecord
    selection: PyTree = ()


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


@dataclasses.dataclass(frozen=True)
class OnlineRound:
    """A round with its schedule computed in the loop (see the module docstring).

    Attributes:
      round: the ``round.Round`` (model, algorithm, local work, chunk).
      policy: the round policy.
      select: the learned selection (``LearnedSelect`` or ``LearnedSelection``); it
        returns at least ``ceil(m * (1 + over_commit))`` ids.
      soft_deadline_ema: weight of the old value in ``OnlineState.soft_deadline``.
      profile_batch_size: rows per batch of the selection's profile and loss-square passes.
    """

    round: Round
    policy: RoundPolicy
    select: LearnedSelect | LearnedSelection
    soft_deadline_ema: float = 0.5
    profile_batch_size: int = 1024

    @property
    def selection(self) -> LearnedSelection:
        return as_selection(self.select)

    def init(self, run_state: RunState, num_clients: int) -> OnlineState:
        return OnlineState(
            run_state, jnp.asarray(self.policy.start, jnp.float32), jnp.float32(jnp.nan),
            ClientRecord.empty(num_clients), self.selection.init(num_clients),
        )

    def step(
        self, state: OnlineState, round_idx: jax.Array, inputs: RoundInputs
    ) -> tuple[OnlineState, tuple[dict[str, jax.Array], Schedule]]:
        """One round: ``(state, round) -> (state, (metrics, schedule row))``."""
        round_, policy, profiles = self.round, self.policy, inputs.profiles
        selection = self.selection
        m = round_.sampler.cohort_size
        broadcast = round_.algorithm.broadcast(state.run.server_state)
        costs = client_costs(round_.algorithm, round_.model, profiles.num_clients, inputs.train.x)
        payload = payload_bytes(round_.algorithm, round_.model, inputs.train.x, inputs.train.y)
        profiles, down, up = priced(profiles, *payload, costs)
        inputs = inputs.replace(profiles=profiles)
        start, ready = wait_for_ready(profiles, policy, state.clock)
        ids, valid, selection_state = self._select(state, round_idx, inputs, ready, down, up)
        valid = valid & (jnp.arange(ids.shape[0]) < num_selected(m, policy.over_commit))
        payload_up = jnp.full((profiles.num_clients,), up, jnp.float32)
        freezing = round_.algorithm.hook(Freezing)
        if freezing is not None:
            order = layer_order(round_.model, broadcast, inputs.train.x[:1])
            masks = freezing.depth_masks(in_order(broadcast, order))
            probe = jnp.ceil(freezing.probe_share * inputs.steps_needed).astype(jnp.int32)
            up_bytes = upload_bytes(broadcast, masks)  # [D]
            scale = step_scale(inputs.steps_needed, inputs.step_costs, probe)  # [N, D]
            fixed = down / profiles.down_mean  # [N]
            compute = (inputs.steps_needed * profiles.step_time)[:, None] * scale  # [N, D]
            # Expected round time of every client at every depth, at its mean speeds: [N, D].
            seconds = fixed[:, None] + compute + up_bytes[None, :] / profiles.up_mean[:, None]
            depth = self._depths(state, broadcast, ids, probe, seconds, round_idx, inputs, order)
            payload_up = payload_up.at[ids].set(up_bytes[depth])
            profiles = profiles.replace(
                step_time=profiles.step_time.at[ids].multiply(scale[ids, depth])
            )
        row, clock = schedule_round(
            profiles, policy, round_idx=round_idx, start=start, key=inputs.key,
            selected=ids, valid=valid, steps_needed=inputs.steps_needed, payload_down=down,
            payload_up=payload_up, cohort_size=m,
        )
        _, tasks = round_.cohort(round_idx, inputs.train, inputs.key, plan=row)
        if freezing is not None:
            tasks = tasks.replace(
                train_mask=jax.tree.map(lambda mask: mask[depth], masks), mask_from=probe[ids]
            )
        params = round_.algorithm.global_params(state.run.server_state)  # this round's, before
        loss_sq = None
        if selection.loss_squares:
            loss_sq = self._loss_squares(params, tasks, inputs.train)
        run_state, stats, metrics = round_.train_cohort(
            state.run, ids, tasks, inputs.hyper, inputs.train, server_stream(inputs.key, round_idx)
        )
        if freezing is not None and stats.work_kept is None:  # FreezeFL's L - n_k, over L
            stats = stats.replace(work_kept=1.0 - depth / jax.tree.leaves(masks)[0].shape[0])
        if costs is not None and costs.work_kept is not None:  # a sub-model's width
            stats = stats.replace(work_kept=jnp.asarray(costs.work_kept, jnp.float32)[ids])
        alignment = None
        if selection.update_alignment:
            moved = jax.tree.map(
                jnp.subtract, round_.algorithm.global_params(run_state.server_state), params
            )
            alignment = self._alignments(params, moved, tasks, inputs.train, stats)
        record = recorded(state.record, row, stats, policy.overhead, loss_sq, alignment)
        state = OnlineState(
            run_state, clock, self._soft_deadline(state.soft_deadline, row), record,
            selection_state,
        )
        return state, (metrics, row)

    def _select(
        self, state: OnlineState, round_idx, inputs: RoundInputs, ready, down: float, up: float
    ):
        """``(ids, valid, selection state)`` among the ``ready`` clients, after the
        selection's profile on its rounds."""
        profiles, selection = inputs.profiles, self.selection
        selection_state = state.selection
        if selection.profile is not None:
            params = self.round.algorithm.global_params(state.run.server_state)

            def profiled(s):
                predicted, actual = class_counts(
                    self.round.model, params, inputs.train, batch_size=self.profile_batch_size
                )
                return selection.profile(s, predicted, actual)

            selection_state = jax.lax.cond(
                round_idx % selection.profile_every == 0, profiled, lambda s: s, selection_state
            )
        select_key = rng.stream(rng.round_key(inputs.key, round_idx), "select")
        report = ClientReport(
            seconds=down / profiles.down_mean + inputs.steps_needed * profiles.step_time
            + up / profiles.up_mean,
            dropout=profiles.dropout,
            examples=self.round.spec.work.examples_to_process(inputs.train.count),
        )
        return selection.select(
            select_key, round_idx, ready, state.record, selection_state, report
        )

    def _loss_squares(self, params: Params, tasks: ClientTask, train: DeviceSplit) -> jax.Array:
        """``[S]`` sum of squared per-example losses of ``params`` on the examples each slot trains.

        The slots' batches are ``local.client_batches`` of the round's tasks (the same
        rows, steps and step limits as training); batches run under ``lax.map``.
        """
        spec, model = self.round.spec, self.round.model
        plain = ClientTask(tasks.client_id, tasks.weight, tasks.step_limit, tasks.key)

        def rows(task):
            indices, example_mask, num_steps = client_batches(spec, task, train)
            return indices, example_mask & (jnp.arange(spec.max_steps) < num_steps)[:, None]

        indices, active = jax.vmap(rows)(plain)  # [S, max_steps, batch]
        slots, steps, batch = indices.shape

        def one_batch(inputs):
            idx, act = inputs
            outputs = model.apply(params, train.x[idx], train=False, key=None)
            loss = model.per_example_loss(outputs, train.y[idx])
            return jnp.sum(jnp.where(act, jnp.square(loss), 0.0))

        sums = jax.lax.map(
            one_batch, (indices.reshape(-1, batch), active.reshape(-1, batch)),
            batch_size=max(1, self.profile_batch_size // batch),
        )
        return jnp.sum(sums.reshape(slots, steps), axis=1)

    def _alignments(
        self, params: Params, moved: Params, tasks: ClientTask, train: DeviceSplit, stats
    ) -> jax.Array:
        """``[S]`` ``layer_alignment(-steps_k m_k * grad F_k(params), moved)`` of every slot.

        ``grad F_k`` is the gradient of the mean loss of ``params`` (evaluation mode) over
        each of the client's examples once (``local.client_examples``), ``m_k`` its train
        mask (``ClientStats.trained``: the layers or units it trained), ``steps_k`` its
        local steps (``ClientStats.steps``) and ``moved``
        the round's change of the global model: the first-order estimate of the client's
        update (at a learning rate of 1) against the global update. Slots run ``chunk`` at
        a time under ``lax.map``.
        """
        spec, model = self.round.spec, self.round.model

        def one(slot):
            task, mask, slot_steps = slot
            examples = client_examples(spec, task, train)
            grad = jax.grad(lambda p: mean_loss(model, p, examples))(params)
            if mask is not None:
                grad = jax.tree.map(lambda g, m: g * m, grad, mask)
            return -slot_steps.astype(jnp.float32) * layer_alignment(grad, moved)

        plain = ClientTask(tasks.client_id, tasks.weight, tasks.step_limit, tasks.key)
        return jax.lax.map(one, (plain, stats.trained, stats.steps), batch_size=self.round.chunk)

    def _depths(self, state, broadcast, ids, probe, seconds, round_idx, inputs: RoundInputs,
                order: list[str]):  # fmt: skip
        """Each slot's freeze depth, chosen after its first ``probe`` steps (weight 0, no sums).

        The probe uses the round's training keys (``round.Round.cohort``), so it sees
        the same batches as the first steps of the training that follows; its update goes
        to ``choose`` with its layers in ``order`` (the forward pass's).
        """
        round_, freezing = self.round, self.round.algorithm.hook(Freezing)
        if freezing.probe_share == 0:  # a choice from timings alone (TimelyFL): no probe to run
            choose = lambda s: freezing.choose(None, s, state.soft_deadline, inputs.hyper)
            return jax.vmap(choose)(seconds[ids]).astype(jnp.int32)
        train_keys = rng.client_keys(inputs.key, round_idx, "train", ids)
        tasks = ClientTask(ids, jnp.zeros(ids.shape), probe[ids], train_keys)

        def probe_client(client_state, task):
            update, _, stats = local_update(
                round_.spec, inputs.hyper, broadcast, client_state, task, inputs.train
            )
            depth = freezing.choose(
                in_order(update, order), seconds[task.client_id], state.soft_deadline, inputs.hyper
            )
            return update, depth.astype(jnp.int32), stats

        cohort_states = round_.store.gather(state.run.client_states, ids)
        _, depth, _ = run_cohort(
            probe_client, cohort_states, tasks, round_.algorithm.aggregator, chunk=round_.chunk,
            mesh=round_.mesh,
        )
        return depth

    def _soft_deadline(self, old: jax.Array, row: Schedule) -> jax.Array:
        ok = row.outcome == OK
        mean = jnp.sum(jnp.where(ok, row.finish, 0)) / jnp.maximum(jnp.sum(ok), 1)
        observed = mean - self.policy.overhead.astype(mean.dtype)
        ema = self.soft_deadline_ema
        new = jnp.where(jnp.isnan(old), observed, ema * old + (1 - ema) * observed)
        return jnp.where(jnp.any(ok), new, old).astype(jnp.float32)

    def run_block(self, state: OnlineState, round_ids: jax.Array, inputs: RoundInputs):
        """The rounds ``round_ids`` as one ``lax.scan``; outputs (metrics, schedule rows)."""
        return jax.lax.scan(lambda s, r: self.step(s, r, inputs), state, round_ids)
