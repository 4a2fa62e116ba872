"""The asynchronous server's schedule: who arrives at each server event, from which model version.

FedBuff's server (Nguyen et al. 2022, "Federated Learning with Buffered
Asynchronous Aggregation", Algorithm 1; FLHetBench's asynchronous server,
notes §4.5) on the virtual clock, as a pure, jit-able function of the
profiles, the server's shape and the seed. docs/design.md §5: a client's update
depends only on the model version it downloaded, so the timing of the whole
run is computed apart from learning, like the synchronous ``schedule``; the
training ``scan`` (``fedjax_het.engine.round.Round`` with a ring of recent models)
then trains each event's arrivals from the versions this schedule names.

The model. The server keeps ``concurrency`` task slots busy. A free slot at
time ``t`` starts a task on a client drawn uniformly among those ready at
``t`` and not already running a task (FLHetBench: "ready at that moment and
not already running"); when none is, the slot waits until the next moment
one of them becomes ready (FLHetBench advances its clock in 20 s steps; this
jumps to the exact time). A task downloads the current model (version
``v``), trains the client's steps and uploads, all in ready seconds, exactly
as a synchronous slot does (``slot_timing.time_slots``: work
pauses while the device is not ready, or is lost when its ready interval
ends, and the client drops out with probability ``dropout[k]`` per task at a
uniform point of its work). A failed task frees its slot at the failure
(counted ``dropped``). A task that arrives ``tau = v_now - v`` versions late
with ``tau > max_staleness`` is discarded (counted ``discarded``; FedBuff's
and FLHetBench's bound). Every other arrival enters the buffer; when it
holds ``buffer_size`` (K) updates, the server aggregates: one server event,
after which the version is ``v_now + 1``. The slot freed by the K-th arrival
starts its next task after that aggregation, from the new version. Ties in
time go to the lower slot index.

Randomness: the run's ``d``-th task draws its client from
``fold_in(stream(key, "dispatch"), d)`` and its speeds and dropout from the
``"download"``, ``"upload"`` and ``"dropout"`` streams of that key folded
with the client id, so nothing depends on chunking or on how training is laid
out; training keys use the task index the same way (``EventSchedule.task``).

>>> import jax
>>> from fedjax_het.system import profiles as prof
>>> clients = prof.uniform_profiles(4, step_time=1.0)
>>> server = async_server(concurrency=2, buffer_size=2, max_staleness=3)
>>> s = async_schedule(clients, server, events=2, steps_needed=[1, 2, 3, 4], payload_down=0.0,
...                    payload_up=0.0, key=jax.random.key(0))
>>> s.valid.all().item(), s.version.tolist()
(True, [[0, 0], [0, 1]])

Over 400 lines on purpose: the event loop, task starts and arrivals share one scan carry;
split, the carry's fields would be defined far from the code that updates them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_het import rng
from fedjax_het.system import availability as avail
from fedjax_het.system.policy import ON_UNAVAILABLE, RoundPolicy, wait_all
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule_row import EMPTY, OK
from fedjax_het.system.slot_timing import per_client, time_slots
from fedjax_het.typing import PRNGKey


@struct.dataclass
class AsyncServer:
    """The shape of an asynchronous server. Build with ``async_server``.

    Attributes:
      start: virtual time (seconds into the availability traces) the run starts.
      concurrency: tasks running at once (FLHetBench: 100).
      buffer_size: updates per server event, K (FedBuff; FLHetBench: 20; FedAsync: 1).
      max_staleness: the largest staleness an update may have and still count
        (FLHetBench: 5); the ring of recent models holds ``max_staleness + 1``.
      on_unavailable: "pause" (work waits while the device is not ready) or
        "lost" (the task fails when the device's ready interval ends).
    """

    start: jax.Array
    concurrency: int = struct.field(pytree_node=False)
    buffer_size: int = struct.field(pytree_node=False)
    max_staleness: int = struct.field(pytree_node=False)
    on_unavailable: str = struct.field(pytree_node=False, default="pause")

    @property
    def ring_depth(self) -> int:
        """Model versions the training scan keeps: the current one and ``max_staleness`` older."""
        return self.max_staleness + 1


MODES = ("sync", "async")


def server_from_options(
    *, mode: str = "sync", concurrency: int = 100, buffer_size: int = 20, max_staleness: int = 5,
    start: float = 0.0, on_unavailable: str = "pause",
) -> AsyncServer | None:
    """The ``[server]`` table: None for the synchronous server (rounds; the ``[policy]``
    decides them), an ``async_server`` for ``mode = "async"`` (``start`` and
    ``on_unavailable`` come from the ``[policy]`` table). FLHetBench's asynchronous
    server used concurrency 100, K = 20, tau <= 5 (notes §4.5).

    Args:
      mode: "sync" (rounds) or "async" (server events: FedBuff's buffered server).
      concurrency: clients training at once on the asynchronous server, >= 1.
      buffer_size: K, the arrivals each server event aggregates, 1 to ``concurrency``.
      max_staleness: arrivals trained on a model more than this many versions old are
        discarded, >= 1.
      start, on_unavailable: the ``[policy]``'s.

    References:
      Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek and Huba, "Federated Learning with
      Buffered Asynchronous Aggregation" (AISTATS 2022), Algorithm 1.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    server = async_server(concurrency=concurrency, buffer_size=buffer_size,
                          max_staleness=max_staleness, start=start, on_unavailable=on_unavailable)
    return server if mode == "async" else None


def async_server(
    *, concurrency: int, buffer_size: int, max_staleness: int, start: float = 0.0,
    on_unavailable: str = "pause",
) -> AsyncServer:
    """An ``AsyncServer``, validated (one-line errors).

    >>> async_server(concurrency=10, buffer_size=20, max_staleness=5)
    Traceback (most recent call last):
    ...
    ValueError: buffer_size (20) must not exceed concurrency (10): the server would wait forever
    """
    for name, value, low in (
        ("concurrency", concurrency, 1), ("buffer_size", buffer_size, 1),
        ("max_staleness", max_staleness, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            extra = " (an asynchronous server needs stale updates)" if name == "max_staleness" else ""
            raise ValueError(f"{name} must be an integer >= {low}{extra}, got {value!r}")
    if buffer_size > concurrency:
        raise ValueError(
            f"buffer_size ({buffer_size}) must not exceed concurrency ({concurrency}): "
            "the server would wait forever"
        )
    if not np.isfinite(start) or start < 0:
        raise ValueError(f"start must be a finite number of seconds >= 0, got {start}")
    if on_unavailable not in ON_UNAVAILABLE:
        raise ValueError(f"on_unavailable must be one of {ON_UNAVAILABLE}, got {on_unavailable!r}")
    return AsyncServer(
        jnp.asarray(start, float), int(concurrency), int(buffer_size), int(max_staleness),
        on_unavailable,
    )


@struct.dataclass
class EventSchedule:
    """The arrivals of ``E`` server events of ``K`` slots each (one event: no ``E`` axis).

    The slot fields match ``schedule.Schedule``'s, so a training round reads either.

    Attributes:
      selected: int32 ``[E, K]`` client of each buffered update.
      valid: bool ``[E, K]`` the slot holds an update (False only when the run stalled:
        no task could ever arrive again).
      outcome: int32 ``[E, K]`` OK where valid, else EMPTY.
      steps_done: int32 ``[E, K]`` local steps the task trained (its whole task).
      version: int32 ``[E, K]`` model version the task downloaded; staleness is the
        event index minus it.
      task: int32 ``[E, K]`` the task's index in the run (its training key's "round").
      arrival: ``[E, K]`` virtual time the update arrived.
      start: ``[E]`` virtual time of the previous event (the run's start for the first).
      duration: ``[E]`` ``clock - start``.
      clock: ``[E]`` virtual time of the event (its K-th arrival).
      dropped: int32 ``[E]`` tasks that failed since the previous event.
      discarded: int32 ``[E]`` arrivals discarded as too stale since the previous event.
      dispatched: int32 ``[E]`` tasks started since the previous event.
      in_flight: int32 ``[E]`` tasks running just after the event.
      bytes_down: ``[E]`` bytes downloaded by the tasks that ended since the previous event.
      bytes_up: ``[E]`` bytes uploaded by them (arrivals only, discarded ones included).
      stalled: bool ``[E]`` the event has fewer than K updates (see ``valid``).
    """

    selected: jax.Array
    valid: jax.Array
    outcome: jax.Array
    steps_done: jax.Array
    version: jax.Array
    task: jax.Array
    arrival: jax.Array
    start: jax.Array
    duration: jax.Array
    clock: jax.Array
    dropped: jax.Array
    discarded: jax.Array
    dispatched: jax.Array
    in_flight: jax.Array
    bytes_down: jax.Array
    bytes_up: jax.Array
    stalled: jax.Array


@struct.dataclass
class _Slots:
    """The task slots, ``[C]`` each; an inactive slot starts a task at its ``end``."""

    active: jax.Array
    client: jax.Array
    version: jax.Array
    task: jax.Array
    steps: jax.Array
    end: jax.Array
    ok: jax.Array  # the task ends by arriving (else it fails at ``end``)
    down: jax.Array  # bytes its download moves, counted when it ends
    up: jax.Array


@struct.dataclass
class _Server:
    clock: jax.Array
    version: jax.Array
    tasks: jax.Array  # tasks dispatched so far
    busy: jax.Array  # [N] runs a task now
    slots: _Slots


@struct.dataclass
class _Buffer:
    """One event's accumulation: ``[K]`` updates and the counts since the previous event."""

    size: jax.Array
    client: jax.Array
    version: jax.Array
    task: jax.Array
    steps: jax.Array
    arrival: jax.Array
    dropped: jax.Array
    discarded: jax.Array
    dispatched: jax.Array
    bytes_down: jax.Array
    bytes_up: jax.Array
    pops: jax.Array


def async_schedule(
    profiles: ClientProfiles,
    server: AsyncServer,
    *,
    events: int,
    steps_needed: jax.Array,
    payload_down: jax.Array,
    payload_up: jax.Array,
    key: PRNGKey,
    max_pops: int | None = None,
) -> EventSchedule:
    """The arrivals of ``events`` server events: a ``lax.scan`` over events.

    Jit-able (``events``, ``max_pops`` and the server's static fields static) and
    ``vmap``-able over keys and profile numbers.

    Args:
      profiles: the population (``[N]`` arrays); ``N >= concurrency``.
      server: the server's shape (``async_server``).
      events: number of server events ``E``.
      steps_needed: scalar or ``[N]`` local steps of each client's task.
      payload_down, payload_up: scalar or ``[N]`` bytes of a task's download and upload.
      key: the run's root key.
      max_pops: task endings one event may process before it is cut short and
        marked ``stalled`` (default ``64 * (concurrency + buffer_size)``; an event
        needs K arrivals plus the failures, discards and waits between them).

    Returns:
      An ``EventSchedule`` with ``[E]`` and ``[E, K]`` fields.
    """
    n, c, k = profiles.num_clients, server.concurrency, server.buffer_size
    if events < 1:
        raise ValueError(f"events must be >= 1, got {events}")
    if c > n:
        raise ValueError(f"concurrency ({c}) must not exceed the number of clients ({n})")
    dtype = profiles.step_time.dtype
    run = _Run(
        profiles=profiles,
        server=server,
        max_pops=64 * (c + k) if max_pops is None else max_pops,
        needed=per_client(steps_needed, n, "steps_needed", jnp.int32),
        bytes_down=per_client(payload_down, n, "payload_down", dtype),
        bytes_up=per_client(payload_up, n, "payload_up", dtype),
        av=avail.queryable(profiles.availability),
        timing=wait_all(on_unavailable=server.on_unavailable),  # whole tasks, no deadline
        dispatch_stream=rng.stream(key, "dispatch"),
        everyone=jnp.arange(n, dtype=jnp.int32),
    )
    start = jnp.asarray(server.start, dtype)
    zeros_c = jnp.zeros((c,), jnp.int32)
    state = _Server(
        clock=start, version=jnp.int32(0), tasks=jnp.int32(0), busy=jnp.zeros((n,), bool),
        slots=_Slots(
            active=jnp.zeros((c,), bool), client=zeros_c, version=zeros_c, task=zeros_c,
            steps=zeros_c, end=jnp.full((c,), start), ok=jnp.zeros((c,), bool),
            down=jnp.zeros((c,), dtype), up=jnp.zeros((c,), dtype),
        ),
    )  # fmt: skip
    _, rows = jax.lax.scan(functools.partial(_one_event, run), state, None, length=events)
    return rows


class _Run(NamedTuple):
    """What every step of ``async_schedule``'s scan reads: the population and the server."""

    profiles: ClientProfiles
    server: AsyncServer
    max_pops: int
    needed: jax.Array  # [N] local steps of each client's task
    bytes_down: jax.Array  # [N]
    bytes_up: jax.Array  # [N]
    av: avail.Availability  # queryable
    timing: RoundPolicy  # how a task's work meets the device's availability
    dispatch_stream: PRNGKey
    everyone: jax.Array  # [N] client ids


def _dispatch(run: _Run, state: _Server, slot: jax.Array, t: jax.Array) -> _Server:
    """Starts a task on ``slot`` at ``t``, or leaves it waiting for a client to become ready."""
    profiles, av, n = run.profiles, run.av, run.profiles.num_clients
    ready = jax.vmap(avail.is_ready, in_axes=(None, 0, None))(av, profiles.trace, t)
    eligible = ready & ~state.busy
    key_d = rng.round_key(run.dispatch_stream, state.tasks)
    scores = jax.random.uniform(rng.stream(key_d, "select"), (n,))
    client = jnp.argmax(jnp.where(eligible, scores, -1.0)).astype(jnp.int32)
    ids = client[None]
    task = time_slots(
        profiles, run.timing, key_d, ids, av, jnp.full((1,), t, profiles.step_time.dtype),
        needed=run.needed[ids], bytes_down=run.bytes_down[ids], bytes_up=run.bytes_up[ids],
    )  # fmt: skip
    fails = jnp.isfinite(task.fail[0])
    started = jnp.any(eligible)
    idle = ~state.busy & ~ready
    wake = jnp.min(jnp.where(
        idle, jax.vmap(avail.next_ready, in_axes=(None, 0, None))(av, profiles.trace, t), jnp.inf
    ))  # fmt: skip
    s = state.slots
    put = lambda field, value, wait: field.at[slot].set(jnp.where(started, value, wait))
    slots = _Slots(
        active=s.active.at[slot].set(started),
        client=put(s.client, client, s.client[slot]),
        version=put(s.version, state.version, s.version[slot]),
        task=put(s.task, state.tasks, s.task[slot]),
        steps=put(s.steps, run.needed[client], 0),
        end=put(s.end, t + jnp.where(fails, task.fail[0], task.done[0]), wake),
        ok=put(s.ok, ~fails, False),
        down=put(s.down, jnp.where(~fails | (task.fail_progress[0] >= task.down[0]),
                                   run.bytes_down[client], 0.0), 0.0),
        up=put(s.up, jnp.where(fails, 0.0, run.bytes_up[client]), 0.0),
    )  # fmt: skip
    return state.replace(
        tasks=state.tasks + started.astype(jnp.int32),
        busy=state.busy | ((run.everyone == client) & started),
        slots=slots,
    )


def _pop(run: _Run, carry: tuple[_Server, _Buffer]) -> tuple[_Server, _Buffer]:
    """The earliest task ending: its arrival enters the buffer (or is discarded, or it failed),
    and its slot starts the next task (after the aggregation, when the buffer is full)."""
    state, buf = carry
    k = run.server.buffer_size
    s = state.slots
    slot = jnp.argmin(s.end).astype(jnp.int32)
    t = s.end[slot]
    active = s.active[slot]
    arrives = active & s.ok[slot]
    accept = arrives & (state.version - s.version[slot] <= run.server.max_staleness)
    at = jnp.minimum(buf.size, k - 1)
    keep = lambda field, value: field.at[at].set(jnp.where(accept, value, field[at]))
    buf = buf.replace(
        size=buf.size + accept.astype(jnp.int32),
        client=keep(buf.client, s.client[slot]),
        version=keep(buf.version, s.version[slot]),
        task=keep(buf.task, s.task[slot]),
        steps=keep(buf.steps, s.steps[slot]),
        arrival=keep(buf.arrival, t),
        dropped=buf.dropped + (active & ~s.ok[slot]).astype(jnp.int32),
        discarded=buf.discarded + (arrives & ~accept).astype(jnp.int32),
        bytes_down=buf.bytes_down + jnp.where(active, s.down[slot], 0.0),
        bytes_up=buf.bytes_up + jnp.where(arrives, s.up[slot], 0.0),
        pops=buf.pops + 1,
    )
    state = state.replace(
        clock=t,
        busy=state.busy & ~((run.everyone == s.client[slot]) & active),
        slots=s.replace(active=s.active.at[slot].set(False)),
    )
    full = buf.size == k
    tasks_before = state.tasks
    state = jax.lax.cond(
        full,
        # The K-th arrival: the slot restarts after the aggregation, from the new version.
        lambda st: st.replace(slots=st.slots.replace(end=st.slots.end.at[slot].set(t))),
        lambda st: _dispatch(run, st, slot, t),
        state,
    )
    return state, buf.replace(dispatched=buf.dispatched + state.tasks - tasks_before)


def _going(run: _Run, carry: tuple[_Server, _Buffer]) -> jax.Array:
    """Whether the event goes on: its buffer is not full, a task can still end, and it has
    not run out of pops."""
    state, buf = carry
    return (
        (buf.size < run.server.buffer_size)
        & jnp.isfinite(jnp.min(state.slots.end))
        & (buf.pops < run.max_pops)
    )


def _one_event(run: _Run, state: _Server, _) -> tuple[_Server, EventSchedule]:
    """Task endings until the buffer holds K updates: the server's next event and its row."""
    k, dtype = run.server.buffer_size, run.profiles.step_time.dtype
    zeros_k = jnp.zeros((k,), jnp.int32)
    buf = _Buffer(
        size=jnp.int32(0), client=zeros_k, version=zeros_k, task=zeros_k, steps=zeros_k,
        arrival=jnp.zeros((k,), dtype), dropped=jnp.int32(0), discarded=jnp.int32(0),
        dispatched=jnp.int32(0), bytes_down=jnp.zeros((), dtype),
        bytes_up=jnp.zeros((), dtype), pops=jnp.int32(0),
    )  # fmt: skip
    before = state.clock
    state, buf = jax.lax.while_loop(
        functools.partial(_going, run), functools.partial(_pop, run), (state, buf)
    )
    valid = jnp.arange(k) < buf.size
    row = EventSchedule(
        selected=buf.client, valid=valid,
        outcome=jnp.where(valid, OK, EMPTY).astype(jnp.int32),
        steps_done=jnp.where(valid, buf.steps, 0), version=buf.version, task=buf.task,
        arrival=buf.arrival, start=before, duration=state.clock - before, clock=state.clock,
        dropped=buf.dropped, discarded=buf.discarded, dispatched=buf.dispatched,
        in_flight=jnp.sum(state.slots.active).astype(jnp.int32),
        bytes_down=buf.bytes_down, bytes_up=buf.bytes_up, stalled=buf.size < k,
    )  # fmt: skip
    return state.replace(version=state.version + 1), row


def staleness(schedule: EventSchedule) -> jax.Array:
    """``[E, K]`` staleness of each slot's update: its event index minus its version."""
    events = jnp.arange(schedule.version.shape[0], dtype=jnp.int32)[:, None]
    return jnp.where(schedule.valid, events - schedule.version, 0)
