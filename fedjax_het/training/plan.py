"""The schedule of a run, computed before any training (docs/design.md §5, §6).

The static shape of local training (``local_spec``) and each client's full task
(``steps_needed``); the schedule of a synchronous run (``plan_run``; ``plan_runs`` vmaps
it over a sweep's systems) or of an asynchronous server's events (``plan_events``); and
the numbers the round is sized by before it compiles: how clients are selected
(``selection_slots``), how many a round writes (``written_slots``) and how many model
versions it keeps (``ring_depth``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.local import NO_STEP_LIMIT, LocalSpec, planned_steps
from fedjax_het.models import Model
from fedjax_het.schema import ConfigError
from fedjax_het.system import events as event_schedule
from fedjax_het.system import schedule as scheduling
from fedjax_het.system.availability import ALWAYS
from fedjax_het.system.policy import num_selected
from fedjax_het.system.sampler import Sampler
from fedjax_het.system.schedule import Schedule
from fedjax_het.system.setup import System
from fedjax_het.training.costs import client_costs, payload_bytes, priced
from fedjax_het.typing import PRNGKey


def local_spec(
    model: Model,
    algorithm: FederatedAlgorithm,
    data: FederatedData,
    work: LocalWork,
    *,
    unroll: int = 1,
    precision: str = "float32",
) -> LocalSpec:
    """The static shape of local training for ``data``: steps capped by its largest client."""
    max_count = int(data.train.count.max())
    return LocalSpec(
        model, algorithm, work, work.static_steps(max_count), max_count, unroll, precision
    )


def steps_needed(spec: LocalSpec, count: np.ndarray) -> np.ndarray:
    """``[N]`` local steps each client's full task takes (its epochs or steps, capped); one
    small program, not an eager operation (each compiles on its own) per step of the sum."""
    return np.asarray(_steps_needed(spec, jnp.asarray(count, jnp.int32)), np.int32)


@functools.partial(jax.jit, static_argnums=0)
def _steps_needed(spec: LocalSpec, count: jax.Array) -> jax.Array:
    return planned_steps(spec, count, jnp.int32(NO_STEP_LIMIT))


def plan_run(
    system: System,
    data: FederatedData,
    spec: LocalSpec,
    sampler: Sampler,
    *,
    rounds: int,
    key: PRNGKey,
) -> Schedule:
    """The schedule of a whole run, before any training (docs/design.md §5).

    Payload: every parameter, as stored, both ways (no compression or freezing); an
    algorithm's ``SubModel.costs`` (sub-models) scale each client's bytes and step time.
    Selection: the run's sampler, as without a system, when every client is
    always available (or the policy ignores availability) and there is no
    over-commitment, so a homogeneous system reproduces the plain run;
    otherwise uniform among the clients the policy allows (the ready ones),
    with ``ceil(m * (1 + over_commit))`` slots for a cohort of ``m``.
    """
    plans = plan_runs([system], data, spec, sampler, rounds=rounds, keys=key[None])
    return jax.tree.map(lambda a: jnp.asarray(np.asarray(a)[0]), plans)


def plan_runs(
    systems: Sequence[System],
    data: FederatedData,
    spec: LocalSpec,
    sampler: Sampler,
    *,
    rounds: int,
    keys: PRNGKey,
) -> Schedule:
    """``plan_run`` of each ``(systems[i], keys[i])`` as one ``vmap``-ed program.

    The systems may differ in every per-client number and policy number; they
    must share the availability store (index different traces of it), the
    policy's kind and switches, and the way clients are selected.
    """
    for system in systems:
        _check_population(system, data)
    down, up = payload_bytes(spec.algorithm, spec.model, data.train.x, data.train.y)
    m = sampler.cohort_size
    selectors = {selection_slots(system, sampler, data.num_clients) for system in systems}
    if len(selectors) > 1:
        raise ValueError(
            "the systems select clients in different ways (some need availability-aware "
            "selection or over-commitment, some not); sweep them separately"
        )
    profiles, policy = _stack_systems(systems)
    costs = client_costs(spec.algorithm, spec.model, data.num_clients, data.train.x)
    profiles, down, up = priced(profiles, down, up, costs)
    slots = selectors.pop()
    select = sampler if slots is None else scheduling.select_among_ready(data.num_clients, slots)
    make = functools.partial(
        scheduling.schedule,
        select=select,
        rounds=rounds,
        cohort_size=m,
        steps_needed=jnp.asarray(steps_needed(spec, data.train.count)),
        payload_down=down,
        payload_up=up,
    )
    axes = jax.tree.map(lambda _: 0, profiles.replace(availability=None))
    batched = jax.vmap(
        lambda profiles, policy, key: make(profiles, policy, key=key), in_axes=(axes, 0, 0)
    )
    plans = scheduling.schedule_jit(batched)(profiles, policy, keys)
    for i, system in enumerate(systems):
        _check_someone_ready(system, jax.tree.map(lambda a, i=i: a[i], plans))
    return plans


def _check_someone_ready(system: System, rows: Schedule) -> None:
    """Refuses a planned run in which, from some round on, no client will ever be ready
    again."""
    stuck = scheduling.never_ready(system.profiles, system.policy, rows)
    if stuck is not None:
        raise ConfigError(_never_ready(stuck, float(rows.start[stuck])))


def check_ready_at_start(system: System) -> None:
    """Refuses a run whose schedule is computed in the loop when no client is ever ready from
    its first round's start on (``policy.start``): the planned runs' refusal for round 0,
    known before training."""
    policy = system.policy
    if policy.availability_aware and scheduling.nobody_ready_after(
        system.profiles, policy, float(policy.start)
    ):
        raise ConfigError(_never_ready(0, float(policy.start)))


def _never_ready(round_idx: int, at: float) -> str:
    return (
        f"no client is ever ready again from round {round_idx} on (virtual time {at:.0f} s): "
        "the availability traces have no ready window left; check system.availability "
        "(or its trace file) and policy.start"
    )


def _check_population(system: System, data: FederatedData) -> None:
    if system.profiles.num_clients != data.num_clients:
        raise ValueError(
            f"system profiles describe {system.profiles.num_clients} clients but the data has "
            f"{data.num_clients}"
        )


def plan_events(
    system: System,
    data: FederatedData,
    spec: LocalSpec,
    server: event_schedule.AsyncServer,
    *,
    events: int,
    key: PRNGKey,
) -> event_schedule.EventSchedule:
    """The arrivals of an asynchronous run's ``events`` server events, before any training.

    Payload: every parameter, as stored, both ways, priced as ``plan_run``'s; the
    system's profiles give every task's timing (its policy is not used: the
    server has none of rounds, deadlines or over-commitment).
    """
    _check_population(system, data)
    down, up = payload_bytes(spec.algorithm, spec.model, data.train.x, data.train.y)
    costs = client_costs(spec.algorithm, spec.model, data.num_clients, data.train.x)
    profiles, down, up = priced(system.profiles, down, up, costs)
    make = functools.partial(
        event_schedule.async_schedule,
        events=events,
        payload_down=down,
        payload_up=up,
        steps_needed=jnp.asarray(steps_needed(spec, data.train.count)),
    )
    return jax.jit(make)(profiles, server, key=key)


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
        traced = lambda xs: any(isinstance(x, jax.core.Tracer) for x in xs)
        stack = lambda *xs: jnp.stack(xs) if traced(xs) else np.stack(xs)  # numpy: no compile
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


def written_slots(
    sampler: Sampler, system: System | None, server: event_schedule.AsyncServer | None
) -> int | None:
    """Clients a round writes at most: the asynchronous server's buffer, or the cohort's
    over-committed slots (and as many stale arrivals, for a policy with stale tasks);
    None: the cohort."""
    if server is not None:
        return server.buffer_size
    if system is None:
        return None
    slots = int(num_selected(sampler.cohort_size, system.policy.over_commit))
    return slots + (sampler.cohort_size if system.policy.max_staleness else 0)
