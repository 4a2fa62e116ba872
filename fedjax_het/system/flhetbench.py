"""FLHetBench's six Monte-Carlo heterogeneity metrics, on the schedule machinery.

Zhang et al., "FLHetBench: Benchmarking Device and State Heterogeneity in
Federated Learning", CVPR 2024, §3.3 (Eq. 1 and 2), computed as the authors'
released ``metric.py::monte_carlo_process`` does (notes §3.2; the paper's
Algorithms S1-S4 are in its missing supplement). No model is trained: a
client's round costs its communication only (compute is ignored, as in the
release), gated by its availability trace with work paused while the device
is not ready. Each round: the server spends ``overhead`` (t_break) seconds;
then ``min(m, #ready)`` clients are picked uniformly among the ready ones; an
empty round still counts as a round.

- R-metrics run ``rounds`` deadline rounds and count each client's successes
  ``S_i`` (finished within the deadline); with ``c = rounds * m / N`` (600 =
  S_ideal at the paper's constants, notes §8.22),

      R = ln(1 + sum_i min(S_i, c)) / ln(1 + c * N)            (Eq. 1, F = log(1 + x))

  lower means more heterogeneous. A deadline round ends once every started
  client has reported, i.e. at the deadline whenever one is late (the
  release's rule, notes §4.7, ``deadline_end="wait_deadline"``).
- T-metrics run readiness rounds (each ends at the ``1 - r`` quantile of the
  finish times, numpy "linear") until ``trips`` client trips (selections) are
  done, and normalise the simulated time ``t`` by an ideal run's:

      T = t / (trips * overhead / m)                            (notes §3.2)

  higher means more heterogeneous.
- Dev*: device speeds, every client always available. Inter*: speeds and
  traces. Stat*: traces only, every client with the same fixed cost ``tau``,
  averaged over a grid (discretised Eq. 2): ``tau`` in {10, 20, ..., deadline}
  for StatMC-R and {0, 10, ..., 240} for StatMC-T (the release's grids; one
  ``tau`` shared by all clients, as the release reads Eq. 2, notes §8.21).

Deviations from the release, by choice (documented here once):

- time is continuous; the release rounds every cost up to whole seconds and
  reads an interval [s, e] as e - s + 1 ready seconds (notes §8.17);
- speeds come from ``ClientProfiles`` (a fresh truncated-normal draw per
  transfer, download from ``down_*`` and upload from ``up_*``); the release
  draws both uniformly from the device's measured download list;
- randomness is JAX's (per round and client, ``schedule``'s streams), so a
  seed does not reproduce the release's numbers; statistics over seeds agree;
- the dropout hazard of the profiles is not used (the release has none);
- ``steps_needed`` (scalar or ``[N]``, default 0: the release's communication-only
  cost) adds each client's local compute, ``steps x step_time``, to the Dev* and
  Inter* metrics, so they can describe a training workload, not only a payload.

``PAYLOAD_BYTES`` is the release's 335,157 KiB (ViT-B/16, 85,800,194 float32
parameters) written so that, with speeds converted as kbit/s x 125 B/s
(``sources.BYTES_PER_SECOND["kbit/s"]``), transfer times equal the release's
``335157 / (kbps / 8)`` seconds: the release divides KiB by kB/s.

>>> import jax
>>> from fedjax_het.system.profiles import uniform_profiles
>>> clients = uniform_profiles(4, bandwidth=2 * PAYLOAD_BYTES / 60)  # 60 s per round trip
>>> mc = MonteCarlo(cohort_size=4, rounds=3, trips=8)
>>> float(dev_mc_r(clients, key=jax.random.key(0), mc=mc))  # everyone always succeeds
1.0
>>> float(dev_mc_t(clients, key=jax.random.key(0), mc=mc))  # 2 rounds of 20 + 60 s, over 2 x 20 s
4.0

Over 400 lines on purpose: the six metrics share the release's two Monte-Carlo loops (the R and
T runs) and their sampling; each metric is a few lines on top of them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.system import policy as policies
from fedjax_het.system.availability import ALWAYS
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import (
    OK,
    Schedule,
    plan_round,
    schedule,
    schedule_jit,
    select_among_ready,
)
from fedjax_het.typing import PRNGKey

PAYLOAD_BYTES = 335_157 * 1000.0  # the release's ViT-B/16 payload, see the module docstring
COST_STEP_S = 10.0  # spacing of the StatMC cost grids
STAT_R_MIN_COST_S = 10.0  # StatMC-R: {10, 20, ..., deadline}
STAT_T_MAX_COST_S = 240.0  # StatMC-T: {0, 10, ..., 240}


@dataclasses.dataclass(frozen=True)
class MonteCarlo:
    """Settings of the Monte-Carlo runs; the defaults are the paper's (notes §3.3).

    Attributes:
      cohort_size: ``m``, clients picked per round among the ready ones.
      rounds: rounds of an R-metric run.
      deadline: seconds a client has in an R-metric round (after the overhead).
      trips: selections a T-metric run completes.
      drop_share: ``r``: a T-metric round ends at the ``1 - r`` quantile of the finish times.
      overhead: ``t_break``, the server's seconds at the start of every round.
      payload: bytes each client downloads and uploads per round.
      cap: ``c`` of the R-metric; ``None``: ``rounds * cohort_size / N`` (600 here).
      max_rounds: a T-metric run gives up (``inf``) after this many rounds;
        ``None``: ``50 * ceil(trips / cohort_size)``.
      start: trace time of the first round (``RoundPolicy.start``); the release starts at 0.
    """

    cohort_size: int = 20
    rounds: int = 3000
    deadline: float | jax.Array = 120.0
    trips: int = 10_000
    drop_share: float | jax.Array = 0.2
    overhead: float | jax.Array = 20.0
    payload: float | jax.Array = PAYLOAD_BYTES
    cap: float | None = None
    max_rounds: int | None = None
    start: float | jax.Array = 0.0

    def __post_init__(self):
        for name in ("cohort_size", "rounds", "trips"):
            if getattr(self, name) < 1:
                raise ValueError(f"MonteCarlo.{name} must be >= 1, got {getattr(self, name)}")
        self.deadline_policy()  # the policy factories check the numbers
        self.readiness_policy()

    def deadline_policy(self) -> policies.RoundPolicy:
        """R-metric rounds: end once everyone reported, at the deadline if one is late (§4.7)."""
        return policies.deadline(
            self.deadline, deadline_end="wait_deadline", overhead=self.overhead,
            start=self.start,
        )

    def readiness_policy(self) -> policies.RoundPolicy:
        return policies.readiness(self.drop_share, overhead=self.overhead, start=self.start)


def participation_counts(s: Schedule, num_clients: int, *, successful: bool = True) -> jax.Array:
    """Per-client number of OK slots (``successful``) or of selections in a schedule, ``[N]``
    (int32; a host schedule, ``jax.device_get``'s, is counted in numpy: nothing compiles)."""
    counted = (s.outcome == OK) if successful else s.valid
    if isinstance(s.selected, np.ndarray):
        return np.bincount(s.selected[counted], minlength=num_clients).astype(np.int32)
    return (
        jnp.zeros((num_clients,), jnp.int32)
        .at[s.selected.ravel()]
        .add(counted.ravel().astype(jnp.int32))
    )


def r_metric(counts: jax.Array, cap: float | jax.Array) -> jax.Array:
    """Eq. 1: ``ln(1 + sum_i min(S_i, cap)) / ln(1 + cap * N)`` for successes ``counts [N]``."""
    counts = jnp.asarray(counts, float)
    return jnp.log1p(jnp.sum(jnp.minimum(counts, cap))) / jnp.log1p(cap * counts.shape[0])


def t_metric(seconds: jax.Array, mc: MonteCarlo) -> jax.Array:
    """Simulated seconds over an ideal run's: ``trips / cohort_size`` rounds of ``overhead``."""
    return seconds / (mc.trips * mc.overhead / mc.cohort_size)


def _deadline_rounds(profiles, policy, key, steps_needed, payload, cohort_size, rounds) -> Schedule:
    return schedule(
        profiles,
        policy,
        select_among_ready(profiles.num_clients, cohort_size),
        rounds=rounds,
        cohort_size=cohort_size,
        steps_needed=steps_needed,
        payload_down=payload,
        payload_up=payload,
        key=key,
    )


_deadline_schedule = jax.jit(_deadline_rounds, static_argnames=("cohort_size", "rounds"))


def deadline_run(
    profiles: ClientProfiles,
    *,
    key: PRNGKey,
    mc: MonteCarlo | None = None,
    steps_needed: int | jax.Array = 0,
) -> Schedule:
    """The R-metrics' run (``mc.rounds`` deadline rounds) on ``profiles`` as given, jitted.

    ``mc=None`` means ``MonteCarlo()``, the paper's constants (so in every function here).
    """
    mc = mc or MonteCarlo()
    return _deadline_schedule(
        profiles, mc.deadline_policy(), key, steps_needed, mc.payload, mc.cohort_size, mc.rounds
    )


def _readiness_rounds(
    profiles, policy, key, steps_needed, payload, cohort_size, trips, max_rounds
) -> jax.Array:
    select = select_among_ready(profiles.num_clients, cohort_size)

    def unfinished(carry):
        round_idx, _, done = carry
        return (done < trips) & (round_idx < max_rounds)

    def one_round(carry):
        round_idx, clock, done = carry
        row, clock = plan_round(
            profiles,
            policy,
            select,
            round_idx=round_idx,
            start=clock,
            key=key,
            cohort_size=cohort_size,
            steps_needed=steps_needed,
            payload_down=payload,
            payload_up=payload,
        )
        return round_idx + 1, clock, done + jnp.sum(row.valid, dtype=jnp.int32)

    clock0 = jnp.asarray(policy.start, profiles.step_time.dtype)
    _, clock, done = jax.lax.while_loop(unfinished, one_round, (jnp.int32(0), clock0, jnp.int32(0)))
    return jnp.where(done >= trips, clock - clock0, jnp.inf)


_READINESS_STATIC = ("cohort_size", "trips", "max_rounds")
_readiness_seconds = jax.jit(_readiness_rounds, static_argnames=_READINESS_STATIC)


def readiness_time(
    profiles: ClientProfiles,
    *,
    key: PRNGKey,
    mc: MonteCarlo | None = None,
    steps_needed: int | jax.Array = 0,
) -> jax.Array:
    """The T-metrics' run on ``profiles`` as given: seconds until ``mc.trips`` selections.

    Readiness rounds, a jitted ``lax.while_loop`` of ``plan_round`` (the rounds
    ``schedule`` produces with the same key), until the selections reach
    ``trips``; ``inf`` when ``max_rounds`` rounds pass first.
    """
    mc = mc or MonteCarlo()
    return _readiness_seconds(
        profiles, mc.readiness_policy(), key, steps_needed, mc.payload, *_t_sizes(mc)
    )


def _t_sizes(mc: MonteCarlo) -> tuple[int, int, int]:
    return mc.cohort_size, mc.trips, mc.max_rounds or 50 * -(-mc.trips // mc.cohort_size)


def _rows(
    profiles: ClientProfiles,
    payload: jax.Array,
    steps_needed: jax.Array,
    costs: jax.Array | None,
    device: bool,
    inter: bool,
) -> tuple[jax.Array, ...]:
    """The variants of ``profiles`` one batched run simulates, one row each: ``(step_time
    [V, N], trace [V, N], steps_needed [V, N], payload [V])``. In order: with ``device`` the
    speeds with every client always available (Dev*); with ``inter`` the speeds and the
    traces (Inter*); for each of ``costs`` the traces with every client costing that many
    seconds, carried as one local step of that time and no payload (Stat*). Built inside
    the jitted run (no eager operation compiles on its own)."""
    n = profiles.num_clients
    speeds = jnp.broadcast_to(jnp.asarray(steps_needed, jnp.int32), (n,))
    step, trace, steps, size = [], [], [], []
    for kept, traces in ((device, jnp.full((n,), ALWAYS, jnp.int32)), (inter, profiles.trace)):
        if kept:
            step, trace = [*step, profiles.step_time[None]], [*trace, traces[None]]
            steps, size = [*steps, speeds[None]], [*size, jnp.asarray(payload, float)[None]]
    if costs is not None:
        c = costs.shape[0]
        step.append(jnp.broadcast_to(costs.astype(profiles.step_time.dtype)[:, None], (c, n)))
        trace.append(jnp.broadcast_to(profiles.trace, (c, n)))
        steps.append(jnp.ones((c, n), jnp.int32))
        size.append(jnp.zeros((c,), float))
    return tuple(jnp.concatenate(parts) for parts in (step, trace, steps, size))


_ROWS = ("device", "inter")


def _r_rows(profiles, policy, key, payload, steps_needed, costs, cap, *, cohort_size, rounds,
            device, inter) -> jax.Array:  # fmt: skip
    """The R-metric of each row of ``_rows`` (one ``vmap`` of the deadline run), ``[V]``."""
    n, base = profiles.num_clients, profiles.replace(dropout=jnp.zeros_like(profiles.dropout))

    def one(step_time, trace, steps, payload):
        variant = base.replace(step_time=step_time, trace=trace)
        s = _deadline_rounds(variant, policy, key, steps, payload, cohort_size, rounds)
        return r_metric(participation_counts(s, n), cap)

    return jax.vmap(one)(*_rows(profiles, payload, steps_needed, costs, device, inter))


T_BATCH = 3  # T-metric rows per vmap: each batch's loop runs to its own longest row


def _t_rows(profiles, policy, key, payload, steps_needed, costs, *, cohort_size, trips,
            max_rounds, device, inter) -> jax.Array:  # fmt: skip
    """Seconds of the T-metric run of each row of ``_rows``, ``[V]``: ``T_BATCH`` rows a
    ``vmap``, the batches one after another (``lax.map``). A row's run ends when its trips
    are done, after 500 to 2,224 rounds in the README's example; one ``vmap`` of all rows
    ran every row to the longest, twice the rounds of batches of 3 (the same values)."""
    base = profiles.replace(dropout=jnp.zeros_like(profiles.dropout))

    def one(row):
        step_time, trace, steps, payload = row
        variant = base.replace(step_time=step_time, trace=trace)
        return _readiness_rounds(
            variant, policy, key, steps, payload, cohort_size, trips, max_rounds
        )

    rows = _rows(profiles, payload, steps_needed, costs, device, inter)
    count = rows[0].shape[0]
    batch = min(T_BATCH, count)
    padded = -(-count // batch) * batch  # no remainder batch: one body to compile
    rows = jax.tree.map(lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], padded - count, 0)]),
                        rows)
    return jax.lax.map(one, rows, batch_size=batch)[:count]


_R_STATIC, _T_STATIC = ("cohort_size", "rounds", *_ROWS), (*_READINESS_STATIC, *_ROWS)
# Jitted so that they nest in a caller's jit; ``all_metrics``, a top-level call by nature,
# compiles them with ``SCHEDULE_COMPILE`` (options a nested jit may not have).
_JITTED = {
    False: (jax.jit(_r_rows, static_argnames=_R_STATIC),
            jax.jit(_t_rows, static_argnames=_T_STATIC)),
    True: (schedule_jit(_r_rows, static_argnames=_R_STATIC),
           schedule_jit(_t_rows, static_argnames=_T_STATIC)),
}


def r_values(
    profiles: ClientProfiles,
    *,
    key: PRNGKey,
    mc: MonteCarlo | None = None,
    device: bool = False,
    inter: bool = False,
    costs: jax.Array | None = None,
    steps_needed: int | jax.Array = 0,
    top_level: bool = False,
) -> jax.Array:
    """The R-metric (Eq. 1) of each variant ``_rows`` makes of ``profiles``, ``[V]``
    (``top_level``: not inside a caller's ``jit``, compiled with ``SCHEDULE_COMPILE``)."""
    mc = mc or MonteCarlo()
    cap = mc.rounds * mc.cohort_size / profiles.num_clients if mc.cap is None else mc.cap
    return _JITTED[top_level][0](
        profiles, mc.deadline_policy(), key, mc.payload, steps_needed, costs, cap,
        cohort_size=mc.cohort_size, rounds=mc.rounds, device=device, inter=inter,
    )  # fmt: skip


def t_values(
    profiles: ClientProfiles,
    *,
    key: PRNGKey,
    mc: MonteCarlo | None = None,
    device: bool = False,
    inter: bool = False,
    costs: jax.Array | None = None,
    steps_needed: int | jax.Array = 0,
    top_level: bool = False,
) -> jax.Array:
    """The T-metric of each variant ``_rows`` makes of ``profiles``, ``[V]`` (``top_level``:
    as ``r_values``)."""
    mc = mc or MonteCarlo()
    cohort_size, trips, max_rounds = _t_sizes(mc)
    seconds = _JITTED[top_level][1](
        profiles, mc.readiness_policy(), key, mc.payload, steps_needed, costs,
        cohort_size=cohort_size, trips=trips, max_rounds=max_rounds, device=device, inter=inter,
    )  # fmt: skip
    return t_metric(np.asarray(seconds) if top_level else seconds, mc)


def _cost_grid(costs, first: float, last) -> jax.Array:
    if costs is not None:
        return costs if isinstance(costs, jax.Array) else np.asarray(costs, float)
    try:
        last = float(last)
    except jax.errors.ConcretizationTypeError as traced:
        raise ValueError("costs must be given when the deadline is traced") from traced
    return np.arange(first, last + COST_STEP_S / 2, COST_STEP_S)


def stat_r_costs(mc: MonteCarlo | None = None, costs: jax.Array | None = None) -> jax.Array:
    """StatMC-R's grid: ``costs``, else {10, 20, ..., deadline} (the release's)."""
    return _cost_grid(costs, STAT_R_MIN_COST_S, (mc or MonteCarlo()).deadline)


def stat_t_costs(costs: jax.Array | None = None) -> jax.Array:
    """StatMC-T's grid: ``costs``, else {0, 10, ..., 240} (the release's, not in the paper)."""
    return _cost_grid(costs, 0.0, STAT_T_MAX_COST_S)


def dev_mc_r(profiles, *, key, mc=None, steps_needed=0) -> jax.Array:
    """DevMC-R: the R-metric (Eq. 1) of the device speeds, everyone always available."""
    return r_values(profiles, key=key, mc=mc, device=True, steps_needed=steps_needed)[0]


def inter_mc_r(profiles, *, key, mc=None, steps_needed=0) -> jax.Array:
    """InterMC-R: the R-metric (Eq. 1) of device speeds and availability traces together."""
    return r_values(profiles, key=key, mc=mc, inter=True, steps_needed=steps_needed)[0]


def dev_mc_t(profiles, *, key, mc=None, steps_needed=0) -> jax.Array:
    """DevMC-T: the T-metric of the device speeds, everyone always available."""
    return t_values(profiles, key=key, mc=mc, device=True, steps_needed=steps_needed)[0]


def inter_mc_t(profiles, *, key, mc=None, steps_needed=0) -> jax.Array:
    """InterMC-T: the T-metric of device speeds and availability traces together."""
    return t_values(profiles, key=key, mc=mc, inter=True, steps_needed=steps_needed)[0]


def stat_mc_r(profiles, *, key, mc=None, costs=None) -> jax.Array:
    """StatMC-R: the R-metric of the traces alone, averaged over fixed client costs (Eq. 2).

    Every client costs ``tau`` ready seconds a round, for each ``tau`` in
    ``costs`` (default ``stat_r_costs``), all in one ``vmap``.
    """
    return jnp.mean(r_values(profiles, key=key, mc=mc, costs=stat_r_costs(mc, costs)))


def stat_mc_t(profiles, *, key, mc=None, costs=None) -> jax.Array:
    """StatMC-T: the T-metric of the traces alone, averaged over fixed client costs
    (default ``stat_t_costs``), all in one ``vmap``."""
    return jnp.mean(t_values(profiles, key=key, mc=mc, costs=stat_t_costs(costs)))


def all_metrics(
    profiles: ClientProfiles, *, key: PRNGKey, mc: MonteCarlo | None = None, states: bool = True
) -> dict[str, jax.Array]:
    """The six metrics (without ``states``: DevMC and InterMC only) in two programs: one
    ``vmap`` of the R run over Dev, Inter and StatMC-R's costs, one of the T run likewise,
    compiled and run side by side (a thread each: XLA compiles without the GIL)."""
    r_costs = stat_r_costs(mc) if states else None
    t_costs = stat_t_costs() if states else None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        rows = {"key": key, "mc": mc, "device": True, "inter": True, "top_level": True}
        r = pool.submit(r_values, profiles, costs=r_costs, **rows)
        t = jax.block_until_ready(t_values(profiles, costs=t_costs, **rows))
        r = np.asarray(r.result())
    t = np.asarray(t)  # on the host: slicing and means here compile nothing
    out = {"DevMC-R": r[0], "InterMC-R": r[1], "DevMC-T": t[0], "InterMC-T": t[1]}
    if states:
        out |= {"StatMC-R": np.mean(r[2:]), "StatMC-T": np.mean(t[2:])}
    return out
