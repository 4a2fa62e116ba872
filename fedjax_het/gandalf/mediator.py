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
members that trained at least once this round. Here the groups'
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

The pieces: ``grouping`` (``kl_groups``), ``slots`` (``Timing``, each slot's
order, outcome and cost), ``mediator_round`` (``Mediator``, the pure round
function); this module runs them round after round (``run_mediator``) and
re-exports their names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import rng
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.local import DeviceSplit, LocalSpec
from fedjax_het.engine.round import device_split
from fedjax_het.gandalf.grouping import Groups, kl_divergence_to_uniform, kl_groups
from fedjax_het.gandalf.mediator_round import Mediator, MediatorState
from fedjax_het.gandalf.slots import GroupPlan, Timing, timing
from fedjax_het.models import Model
from fedjax_het.system.profiles import ClientProfiles, uniform_profiles, validate
from fedjax_het.training import checkpoint, interrupt
from fedjax_het.training import progress as progress_bar
from fedjax_het.training.costs import payload_bytes
from fedjax_het.training.metrics import evaluate
from fedjax_het.typing import Params

__all__ = [
    "Continuation",
    "GroupPlan",
    "Groups",
    "Mediator",
    "MediatorHistory",
    "MediatorState",
    "Timing",
    "kl_divergence_to_uniform",
    "kl_groups",
    "run_mediator",
    "timing",
]


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
      done: rounds done.
    """

    params: Params
    participation: np.ndarray
    round_metrics: dict[str, np.ndarray]
    plans: GroupPlan
    evaluations: list[dict[str, float]]
    done: int


@dataclasses.dataclass(frozen=True)
class Continuation:
    """How a mediator run goes on from a checkpoint and keeps what it computes.

    SIGINT and SIGTERM stop the run after the block of rounds it is computing
    (``interrupt.deferred``), as ``training.loop.train_loop`` does.

    Attributes:
      loaded: the checkpoint to continue from (None: from round 0); it holds the
        ``MediatorState`` ("state/"), the rounds' plans and metrics ("plans/", "metrics/")
        and the evaluations (manifest), as ``save`` writes them.
      on_eval: called with each new evaluation (a dict as in ``MediatorHistory``).
      save: ``(done, arrays, evaluations)``: writes a checkpoint of ``arrays`` (the
        state's, plans' and metrics' leaves by name) after ``done`` rounds: at the first
        block end past each multiple of ``checkpoint_every`` (0: never), at the end,
        and on a signal.
      checkpoint_every: rounds between checkpoints.
    """

    loaded: checkpoint.Loaded | None = None
    on_eval: Callable[[dict[str, float]], Any] = lambda line: None
    save: Callable[[int, dict[str, np.ndarray], list], Any] | None = None
    checkpoint_every: int = 0


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
    continuation: Continuation = Continuation(),
    progress: bool = True,
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
      continuation: a checkpoint to continue from, and what to write as the run goes.
      progress: a bar of the rounds done, with the test accuracy of the last evaluation.
    """
    profiles = _checked_profiles(data, groups, profiles, rounds=rounds, eval_every=eval_every)
    num_clients = data.num_clients
    max_count = int(data.train.count.max())
    spec = LocalSpec(model, algorithm, work, work.static_steps(max_count), max_count)
    mediator = Mediator(spec, passes, fault_tolerant=heartbeat is not None, chunk=chunk)
    key, hyper = rng.seed_key(seed), algorithm.hyper(hyper)
    params = model.init(rng.stream(key, "init"))
    down, up = payload_bytes(algorithm, model, data.train.x, data.train.y)
    times = timing(max_wait, heartbeat=heartbeat, payload_down=down, payload_up=up)
    state = MediatorState(
        algorithm.server_init(params, hyper, num_clients),
        jnp.zeros((num_clients,), jnp.int32),
        jnp.float32(start),
    )
    train, test = device_split(data.train), device_split(data.test)
    row_client = jnp.asarray(data.test.client_ids)
    members, mask = jnp.asarray(groups.members), jnp.asarray(groups.mask)
    inputs = (members, mask, profiles, times, hyper, train, key)
    return _run_blocks(
        mediator,
        state,
        inputs,
        test,
        row_client,
        rounds=rounds,
        eval_every=eval_every,
        eval_batch_size=eval_batch_size,
        continuation=continuation,
        progress=progress,
    )


def _checked_profiles(
    data: FederatedData,
    groups: Groups,
    profiles: ClientProfiles | None,
    *,
    rounds: int,
    eval_every: int,
) -> ClientProfiles:
    """``run_mediator``'s inputs checked; the profiles to use (None: uniform)."""
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
    return profiles


def _run_blocks(
    mediator: Mediator,
    state: MediatorState,
    inputs: tuple,
    test: DeviceSplit,
    row_client: jax.Array,
    *,
    rounds: int,
    eval_every: int,
    eval_batch_size: int,
    continuation: Continuation,
    progress: bool,
) -> MediatorHistory:
    """``rounds`` rounds from ``state`` (or from ``continuation.loaded``) in ``lax.scan``
    blocks ending at multiples of ``eval_every``, each followed by an evaluation of the
    global model on ``test``; on SIGINT or SIGTERM raises ``interrupt.Interrupted`` after
    the block it is computing (and ``continuation.save``).

    ``inputs``: ``(members, mask, profiles, times, hyper, train, key)``, what every round
    takes besides its state and index.
    """
    algorithm, go = mediator.spec.algorithm, continuation
    block, evaluate_ = _programs(mediator, eval_batch_size)
    done, rows, evaluations = 0, [], []
    if go.loaded is not None:
        like = jax.eval_shape(block, state, jnp.arange(1, dtype=jnp.int32), *inputs)[1]
        state, rows, evaluations, done = _restored(go.loaded, state, like)
    bar = progress_bar.bar(
        rounds, desc="mediator rounds", unit="round", progress=progress, initial=done
    )
    with interrupt.deferred() as pending:
        saved_at, stopped = done, None
        while done < rounds:
            stopped = pending.agreed()
            if stopped is not None:
                break
            size = min(eval_every - done % eval_every, rounds - done)
            round_ids = jnp.arange(done, done + size, dtype=jnp.int32)
            state, block_rows = block(state, round_ids, *inputs)
            rows.append(jax.device_get(block_rows))
            before, done = done, done + size
            ev = jax.device_get(evaluate_(state.server_state, test, row_client))
            evaluations.append({
                "round": done, "clock": float(state.clock),
                "loss": float(ev["loss"]), "accuracy": float(ev["accuracy"]),
            })  # fmt: skip
            go.on_eval(evaluations[-1])
            bar.update(size)
            bar.set_postfix_str(progress_bar.accuracy(evaluations[-1]["accuracy"]))
            due = go.checkpoint_every and done // go.checkpoint_every > before // go.checkpoint_every
            if go.save is not None and (due or done == rounds):
                go.save(done, _arrays(state, rows), evaluations)
                saved_at = done
        if stopped is None and done == rounds:  # a signal during the last block: acted on too
            stopped = pending.agreed()
        if go.save is not None and stopped is not None and saved_at != done:
            go.save(done, _arrays(state, rows), evaluations)
    bar.close()
    plans, metrics = _concat(rows) if rows else (None, {})
    history = MediatorHistory(
        params=jax.device_get(algorithm.global_params(state.server_state)),
        participation=np.asarray(state.participation),
        round_metrics=metrics,
        plans=plans,
        evaluations=evaluations,
        done=done,
    )
    if stopped is not None:
        raise interrupt.Interrupted(stopped, done, history if done else None, trained=done > 0)
    return history


def _programs(mediator: Mediator, eval_batch_size: int) -> tuple[Callable, Callable]:
    """The jitted block of rounds and the jitted evaluation of a run."""
    model, algorithm = mediator.spec.model, mediator.spec.algorithm

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

    return block, evaluate_


def _concat(rows: list) -> Any:
    """The blocks' ``(plans, metrics)`` joined along the round axis."""
    return jax.tree.map(lambda *parts: np.concatenate(parts), *rows)


def _arrays(state: MediatorState, rows: list) -> dict[str, np.ndarray]:
    """A checkpoint's arrays: the state's, and the rounds' plans and metrics so far."""
    plans, metrics = _concat(rows)
    return {
        **checkpoint.leaves("state", state),
        **checkpoint.leaves("plans", plans),
        **checkpoint.leaves("metrics", metrics),
    }


def _restored(loaded: checkpoint.Loaded, fresh: MediatorState, like: Any) -> tuple:
    """``(state, rows, evaluations, done)`` from a checkpoint ``_arrays`` wrote; ``fresh``
    and ``like`` (one round's plans and metrics) give the shapes (CheckpointError naming
    the first leaf that differs: another model, grouping or population)."""
    done = loaded.done
    grown = lambda s: jax.ShapeDtypeStruct((done, *s.shape[1:]), s.dtype)
    plans = checkpoint.restore(jax.tree.map(grown, like[0]), loaded.group("plans"), "plans")
    metrics = checkpoint.restore(jax.tree.map(grown, like[1]), loaded.group("metrics"), "metrics")
    evaluations = list(loaded.manifest["evaluations"])
    return loaded.tree("state", fresh), [(plans, metrics)], evaluations, done
