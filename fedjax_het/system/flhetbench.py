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
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.system import policy as policies
from fedjax_het.system.availability import ALWAYS
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import OK, Schedule, plan_round, schedule, select_among_ready
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
    """Per-client number of OK slots (``successful``) or of selections in a schedule, ``[N]``."""
    counted = (s.outcome == OK) if successful else s.valid
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


@functools.partial(jax.jit, static_argnames=("cohort_size", "rounds"))
def _deadline_schedule(profiles, policy, key, steps_needed, payload, *, cohort_size, rounds):
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
        profiles,
        mc.deadline_policy(),
        key,
        steps_needed,
        mc.payload,
        cohort_size=mc.cohort_size,
        rounds=mc.rounds,
    )


@functools.partial(jax.jit, static_argnames=("cohort_size", "trips", "max_rounds"))
def _readiness_seconds(
    profiles, policy, key, steps_needed, payload, *, cohort_size, trips, max_rounds
):
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
        return round_idx + 1, clock, done + jnp.sum(row.valid)

    clock0 = jnp.asarray(policy.start, profiles.step_time.dtype)
    _, clock, done = jax.lax.while_loop(unfinished, one_round, (jnp.int32(0), clock0, jnp.int32(0)))
    return jnp.where(done >= trips, clock - clock0, jnp.inf)


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
        profiles,
        mc.readiness_policy(),
        key,
        steps_needed,
        mc.payload,
        cohort_size=mc.cohort_size,
        trips=mc.trips,
        max_rounds=mc.max_rounds or 50 * -(-mc.trips // mc.cohort_size),
    )


def _mc_profiles(profiles: ClientProfiles, *, traces: bool, cost=None) -> ClientProfiles:
    """The profiles the metrics simulate: no dropout, traces kept or not, optional fixed cost.

    A fixed cost ``tau`` (StatMC) is carried as one local step of ``tau`` s and
    no payload, so every metric runs the same compiled program on other numbers.
    """
    n = profiles.num_clients
    if not traces:
        profiles = profiles.replace(trace=jnp.full((n,), ALWAYS, jnp.int32))
    if cost is not None:
        profiles = profiles.replace(step_time=jnp.broadcast_to(jnp.asarray(cost, float), (n,)))
    return profiles.replace(dropout=jnp.zeros((n,), profiles.dropout.dtype))


def _r(profiles: ClientProfiles, key: PRNGKey, mc, steps_needed=0) -> jax.Array:
    mc = mc or MonteCarlo()
    s = deadline_run(profiles, key=key, mc=mc, steps_needed=steps_needed)
    n = profiles.num_clients
    cap = mc.rounds * mc.cohort_size / n if mc.cap is None else mc.cap
    return r_metric(participation_counts(s, n), cap)


def _t(profiles: ClientProfiles, key: PRNGKey, mc, steps_needed=0) -> jax.Array:
    mc = mc or MonteCarlo()
    return t_metric(readiness_time(profiles, key=key, mc=mc, steps_needed=steps_needed), mc)


def _mean_over_costs(metric, profiles, key, mc, costs) -> jax.Array:
    """Mean of ``metric`` with every client at a fixed cost, over ``costs`` (one program:
    the runs at each cost are one ``vmap``, not a copy of the run per cost)."""
    mc = dataclasses.replace(mc or MonteCarlo(), payload=0.0)
    values = jax.vmap(
        lambda cost: metric(_mc_profiles(profiles, traces=True, cost=cost), key, mc, steps_needed=1)
    )(jnp.asarray(costs))
    return jnp.mean(values)


def _cost_grid(costs, first: float, last) -> jax.Array:
    if costs is not None:
        return jnp.asarray(costs, float)
    try:
        last = float(last)
    except jax.errors.ConcretizationTypeError as traced:
        raise ValueError("costs must be given when the deadline is traced") from traced
    return jnp.asarray(np.arange(first, last + COST_STEP_S / 2, COST_STEP_S), float)


def _dev_or_inter(name: str, run: Callable, *, traces: bool, doc: str) -> Callable[..., jax.Array]:
    """The Dev* (``traces=False``) or Inter* (``traces=True``) metric ``name`` computed by ``run``.

    ``run`` is ``_r`` or ``_t``; the metric runs it on the profiles without
    dropout, their traces replaced by ``ALWAYS`` (Dev*) or kept (Inter*).
    """

    def metric(
        profiles: ClientProfiles,
        *,
        key: PRNGKey,
        mc: MonteCarlo | None = None,
        steps_needed: int | jax.Array = 0,
    ) -> jax.Array:
        return run(_mc_profiles(profiles, traces=traces), key, mc, steps_needed)

    metric.__name__ = metric.__qualname__ = name
    metric.__doc__ = doc
    return metric


dev_mc_r = _dev_or_inter(
    "dev_mc_r", _r, traces=False,
    doc="DevMC-R: the R-metric (Eq. 1) of the device speeds, everyone always available.",
)
inter_mc_r = _dev_or_inter(
    "inter_mc_r", _r, traces=True,
    doc="InterMC-R: the R-metric (Eq. 1) of device speeds and availability traces together.",
)
dev_mc_t = _dev_or_inter(
    "dev_mc_t", _t, traces=False,
    doc="DevMC-T: the T-metric of the device speeds, everyone always available.",
)
inter_mc_t = _dev_or_inter(
    "inter_mc_t", _t, traces=True,
    doc="InterMC-T: the T-metric of device speeds and availability traces together.",
)


def stat_mc_r(
    profiles: ClientProfiles,
    *,
    key: PRNGKey,
    mc: MonteCarlo | None = None,
    costs: jax.Array | None = None,
) -> jax.Array:
    """StatMC-R: the R-metric of the traces alone, averaged over fixed client costs (Eq. 2).

    Every client costs ``tau`` ready seconds a round, for each ``tau`` in
    ``costs`` (default {10, 20, ..., deadline}, the release's grid).
    """
    grid = _cost_grid(costs, STAT_R_MIN_COST_S, (mc or MonteCarlo()).deadline)
    return _mean_over_costs(_r, profiles, key, mc, grid)


def stat_mc_t(
    profiles: ClientProfiles,
    *,
    key: PRNGKey,
    mc: MonteCarlo | None = None,
    costs: jax.Array | None = None,
) -> jax.Array:
    """StatMC-T: the T-metric of the traces alone, averaged over fixed client costs.

    ``costs`` defaults to {0, 10, ..., 240} s, the release's grid (not in the paper).
    """
    return _mean_over_costs(_t, profiles, key, mc, _cost_grid(costs, 0.0, STAT_T_MAX_COST_S))
