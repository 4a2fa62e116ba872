"""FLHetBench's Monte-Carlo metrics: cases computed by hand, an independent loop, directions.

The runs here select every ready client (m = N), so S_i and t follow from
arithmetic written out in the comments, and ``np_monte_carlo``, a plain-Python
transcription of the released procedure (notes §3.2), needs no random draw:
speeds are deterministic (std 0) except where a test says. Selection among
the ready (m < N) is tested in test_schedule.py and on the FLASH traces here.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.data.diagnostics import gini
from fedjax_het.system import flhetbench as fb
from fedjax_het.system.availability import Availability
from fedjax_het.system.profiles import ClientProfiles, uniform_profiles

try:  # the shipped FLASH traces (another part of the layer)
    from fedjax_het.system import sources
except ImportError:
    sources = None

PAYLOAD = fb.PAYLOAD_BYTES
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # for the programs compiled here


def make_profiles(round_trip, trace, availability, *, dropout=0.0, std=0.0) -> ClientProfiles:
    """Clients whose download + upload of ``PAYLOAD`` take ``round_trip`` s at the mean speeds."""
    n = len(round_trip)
    speed = jnp.asarray(2 * PAYLOAD / np.asarray(round_trip, np.float64), jnp.float32)
    return ClientProfiles(
        step_time=jnp.ones((n,), jnp.float32),  # the metrics ignore compute
        down_mean=speed,
        down_std=std * speed,
        up_mean=speed,
        up_std=std * speed,
        trace=jnp.asarray(trace, jnp.int32),
        dropout=jnp.full((n,), dropout, jnp.float32),
        availability=availability,
    )


N = 8


def flash_traces(count: int):
    """The ``count`` shipped FLASH traces most often ready, and ``count`` ready about 3 %."""
    if sources is None:
        return [], []
    av, _ = sources.load_traces("strict")
    share = np.asarray(av.ready_per_period) / np.asarray(av.period)
    order = np.argsort(share)
    rows = [*order[-count:], *order[np.searchsorted(share[order], 0.03) :][:count]]
    offset, number = np.asarray(av.offset), np.asarray(av.count)
    start, end = np.asarray(av.start), np.asarray(av.end)
    cut = [slice(offset[k], offset[k] + number[k]) for k in rows]
    return [np.stack([start[c], end[c]], axis=1) for c in cut], [float(av.period[k]) for k in rows]


# Every test draws from one library of traces (one shape, so one compiled run per metric kind).
PERIOD = 1000.0
_RANDOM = np.sort(np.random.default_rng(1).uniform(0, PERIOD, (3, 4)), axis=1).reshape(3, 2, 2)
_FLASH, _FLASH_PERIODS = flash_traces(N)
TRACES = [
    [[0, 60]],  # 0: ready [0, 60) of every 100 s (the hand-computed cases)
    [],  # 1: never ready
    [[0, 450], [500, 950]],  # 2: ready 90 % of the time
    [[0, 250], [500, 750]],  # 3: 50 %
    [[0, 50], [500, 550]],  # 4: 10 %
    *_RANDOM,  # 5, 6, 7: two random intervals each
    *_FLASH,  # 8 ... 8 + N - 1: FLASH, often ready; 8 + N ... 8 + 2N - 1: FLASH, rarely
]
STORE = Availability.from_intervals(
    [np.asarray(x, np.float64).reshape(-1, 2) for x in TRACES],
    [100.0] + [PERIOD] * 7 + _FLASH_PERIODS,
)
MC = fb.MonteCarlo(cohort_size=N, rounds=40, trips=80, deadline=90.0)  # m = N: all ready picked


# ------------------------------------------------------------------ hand-computed, m = N = 8


def test_device_metrics_by_hand():
    p = make_profiles([30.0, 60.0, 100.0, 150.0] * 2, [0, 1, 2, -1] * 2, STORE, dropout=0.5)
    key, mc = jax.random.key(0), fb.MonteCarlo(cohort_size=N, rounds=40, trips=80, deadline=120.0)
    # Deadline 120 s: the 150 s clients never succeed, the others always: S = 40 = c = 40 * 8 / 8.
    as_run = p.replace(trace=jnp.full(N, -1, jnp.int32), dropout=jnp.zeros(N))  # what dev runs
    counts = fb.participation_counts(fb.deadline_run(as_run, key=key, mc=mc), N)
    np.testing.assert_array_equal(counts, [40, 40, 40, 0] * 2)
    expected_r = math.log(1 + 6 * 40) / math.log(1 + 40 * 8)
    np.testing.assert_allclose(fb.dev_mc_r(p, key=key, mc=mc), expected_r, rtol=1e-6)
    # Readiness: the 0.8 quantile of [30, 30, 60, 60, 100, 100, 150, 150] is at position
    # 7 * 0.8 = 5.6: 100 + 0.6 * 50 = 130; 10 rounds of 20 + 130 s make the 80 trips, and the
    # ideal is 80 * 20 / 8 = 200 s.
    np.testing.assert_allclose(fb.dev_mc_t(p, key=key, mc=mc), 10 * 150.0 / 200.0, rtol=1e-6)
    np.testing.assert_allclose(gini(counts), 0.25, rtol=1e-6)  # sum|xi-xj| = 960 / (2*8*240)


def test_state_metrics_by_hand():
    # Clients 0-3 are always ready; 4-7 only in [0, 60) of every 100 s (trace 0).
    p = make_profiles([50.0] * N, [-1] * 4 + [0] * 4, STORE, dropout=0.5)
    key, mc = jax.random.key(1), fb.MonteCarlo(cohort_size=N, rounds=40, trips=80, deadline=80.0)
    # R, tau = 30: work starts at t0 = 20 (4-7 ready, done at 50), 70 (4-7 not ready), 120, ...
    # so S = 40 for 0-3 and 20 for 4-7; c = 40.
    # R, tau = 50: 4-7 work 40 s until 60, resume at 100, finish at 110: 90 s > 80, late, and
    # the round waits for the deadline: t0 = 20, 120, 220, ... S = 40 for 0-3 and 0 for 4-7.
    r30 = math.log(1 + 4 * 40 + 4 * 20) / math.log(1 + 320)
    r50 = math.log(1 + 4 * 40) / math.log(1 + 320)
    np.testing.assert_allclose(
        fb.stat_mc_r(p, key=key, mc=mc, costs=[30.0, 50.0]), (r30 + r50) / 2, rtol=1e-6
    )
    np.testing.assert_allclose(fb.inter_mc_r(p, key=key, mc=mc), r50, rtol=1e-6)  # 50 s of comm
    np.testing.assert_allclose(fb.dev_mc_r(p, key=key, mc=mc), 1.0, rtol=1e-6)
    # T, tau = 30: rounds of 8 and 4 trips alternate, ending 30 s after t0 = 20, 70, ...: after
    # 12 rounds 72 trips at 600 s; round 13 (t0 = 620) reaches 80 at 650 s. Ideal: 200 s.
    # T, tau = 50: 4-7 always take 90 s when ready (at positions 20, 30, 40 or 50 of their
    # 100 s); the 0.8 quantile of [50] * 4 + [90] * 4 is 90. Work starts at t0 = 20, 130, 240,
    # 350 (8 trips each), 460 (position 60, not ready: 4 trips, 50 s), 530, 640, 750, 860
    # (position 60 again), 930, 1040: 80 trips, at 1040 + 90 = 1130 s.
    np.testing.assert_allclose(
        fb.stat_mc_t(p, key=key, mc=mc, costs=[30.0, 50.0]), (650 + 1130) / 2 / 200, rtol=1e-5
    )
    np.testing.assert_allclose(fb.inter_mc_t(p, key=key, mc=mc), 1130 / 200, rtol=1e-5)
    np.testing.assert_allclose(fb.dev_mc_t(p, key=key, mc=mc), 10 * 70 / 200, rtol=1e-5)
    # Nobody ever ready: no success, and the T-run gives up after max_rounds.
    never = p.replace(trace=jnp.ones(N, jnp.int32))
    assert fb.inter_mc_r(never, key=key, mc=mc) == 0.0
    assert fb.inter_mc_t(never, key=key, mc=mc) == np.inf


# ------------------------------------------------------------ an independent loop of notes §3.2


def np_ready(trace, t):
    if trace < 0:
        return True
    period = float(STORE.period[trace])
    return any(s <= t % period < e for s, e in TRACES[trace])


def np_finish(trace, t, work):
    """F_i(t, d): ``work`` ready seconds from ``t``, paused while not ready."""
    if trace < 0:
        return t + work
    period, left = float(STORE.period[trace]), work
    while True:
        cycle, pos = divmod(t, period)
        for s, e in TRACES[trace]:
            if e > pos:
                begin = max(pos, s)
                if e - begin >= left:
                    return cycle * period + begin + left
                left -= e - begin
        t = (cycle + 1) * period


def np_monte_carlo(traces, round_trip, mc, strategy):
    """``monte_carlo_process`` of the release (notes §3.2) with m >= N: everyone ready goes.

    Returns S_i and the clock after each round (deadline), or the time the trips are done.
    """
    t, successes, clocks, trips = 0.0, np.zeros(len(traces), int), [], 0
    for _ in range(mc.rounds if strategy == "deadline" else 10**6):
        t += mc.overhead
        chosen = [i for i in range(len(traces)) if np_ready(traces[i], t)]
        costs = [np_finish(traces[i], t, round_trip[i]) - t for i in chosen]
        if strategy == "deadline":
            for i, cost in zip(chosen, costs):
                successes[i] += cost <= mc.deadline
            t = max([t + min(cost, mc.deadline) for cost in costs], default=t)
            clocks.append(t)
        else:
            if chosen:
                t = float(np.percentile([t + cost for cost in costs], 100 * (1 - mc.drop_share)))
            trips += len(chosen)
            if trips >= mc.trips:
                return t
    return successes, np.asarray(clocks)


def test_against_the_release_loop_on_a_random_case():
    rng = np.random.default_rng(0)
    traces = rng.choice([-1, 5, 6, 7], N)
    round_trip = rng.uniform(20.0, 140.0, N)
    p = make_profiles(round_trip, traces, STORE)
    key = jax.random.key(3)

    s = fb.deadline_run(p, key=key, mc=MC)
    successes, clocks = np_monte_carlo(traces, round_trip, MC, "deadline")
    np.testing.assert_array_equal(fb.participation_counts(s, N), successes)
    on_host = fb.participation_counts(jax.device_get(s), N)  # counted in numpy
    assert isinstance(on_host, np.ndarray) and on_host.dtype == np.int32
    np.testing.assert_array_equal(on_host, successes)
    np.testing.assert_array_equal(fb.participation_counts(jax.device_get(s), N, successful=False),
                                  fb.participation_counts(s, N, successful=False))
    np.testing.assert_allclose(s.clock, clocks, rtol=1e-5)
    assert 0 < successes.sum() < MC.rounds * N and np.any(~np.asarray(s.valid))  # not trivial
    cap = MC.rounds * N / N
    expected_r = math.log1p(np.minimum(successes, cap).sum()) / math.log1p(cap * N)
    np.testing.assert_allclose(fb.inter_mc_r(p, key=key, mc=MC), expected_r, rtol=1e-6)

    seconds = np_monte_carlo(traces, round_trip, MC, "readiness")
    ideal = MC.trips * MC.overhead / MC.cohort_size
    np.testing.assert_allclose(fb.inter_mc_t(p, key=key, mc=MC), seconds / ideal, rtol=1e-5)


def test_float64_metrics_match_the_release_loop_to_1e_12():
    """Under x64, float64 profiles and traces give the release loop's numbers to 1e-12: the
    policy's numbers (``drop_share``, deadline, overhead) are float64 too (float32(0.2) would
    move the round-end quantile by ~1e-8), and the T run's selection count stays int32."""
    rng = np.random.default_rng(0)
    traces = rng.choice([-1, 5, 6, 7], N)
    round_trip = rng.uniform(20.0, 140.0, N)
    mc = fb.MonteCarlo(cohort_size=N, rounds=40, trips=80, deadline=90.1, drop_share=0.3,
                       overhead=20.3)  # fmt: skip
    with jax.enable_x64(True):
        store = Availability.from_intervals(
            [np.asarray(x, np.float64).reshape(-1, 2) for x in TRACES],
            [100.0] + [PERIOD] * 7 + _FLASH_PERIODS,
            dtype=np.float64,
        )
        p = make_profiles(round_trip, traces, store)
        p = jax.tree.map(lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, p)
        speed = jnp.asarray(2 * PAYLOAD / round_trip)  # float64, not make_profiles' float32
        p = p.replace(down_mean=speed, up_mean=speed)
        key = jax.random.key(3)
        s = fb.deadline_run(p, key=key, mc=mc)
        successes, clocks = np_monte_carlo(traces, round_trip, mc, "deadline")
        np.testing.assert_array_equal(fb.participation_counts(s, N), successes)
        assert s.clock.dtype == jnp.float64
        np.testing.assert_allclose(s.clock, clocks, rtol=1e-12)
        seconds = np_monte_carlo(traces, round_trip, mc, "readiness")
        ideal = mc.trips * mc.overhead / mc.cohort_size
        t = fb.inter_mc_t(p, key=key, mc=mc)
        assert t.dtype == jnp.float64
        np.testing.assert_allclose(t, seconds / ideal, rtol=1e-12)


# ------------------------------------------------------------------------------------ directions


def spread(width):
    """Round trips spread evenly over 70 +- width seconds."""
    return 70.0 + width * np.linspace(-1.0, 1.0, N)


def test_more_heterogeneity_gives_lower_r_and_higher_t():
    key = jax.random.key(5)
    always = [-1] * N
    # Deadline 90 s: nobody, 1 and 3 of the 8 clients are too slow.
    devices = [make_profiles(spread(w), always, STORE) for w in (0.0, 25.0, 50.0)]
    dev_r = [float(fb.dev_mc_r(p, key=key, mc=MC)) for p in devices]
    dev_t = [float(fb.dev_mc_t(p, key=key, mc=MC)) for p in devices]
    assert dev_r[0] == 1.0 and dev_r[0] > dev_r[1] > dev_r[2], dev_r
    assert dev_t[0] < dev_t[1] < dev_t[2], dev_t

    costs = [20.0, 60.0]
    states = [make_profiles(spread(0.0), [k] * N, STORE) for k in (2, 3, 4)]  # 90, 50, 10 %
    stat_r = [float(fb.stat_mc_r(p, key=key, mc=MC, costs=costs)) for p in states]
    stat_t = [float(fb.stat_mc_t(p, key=key, mc=MC, costs=costs)) for p in states]
    assert stat_r[0] > stat_r[1] > stat_r[2], stat_r
    assert stat_t[0] < stat_t[1] < stat_t[2], stat_t

    mild = make_profiles(spread(25.0), [2] * N, STORE)
    severe = make_profiles(spread(50.0), [3, 4] * (N // 2), STORE)
    assert fb.inter_mc_r(mild, key=key, mc=MC) > fb.inter_mc_r(severe, key=key, mc=MC)
    assert fb.inter_mc_t(mild, key=key, mc=MC) < fb.inter_mc_t(severe, key=key, mc=MC)


def test_vmap_over_seeds_equals_separate_runs():
    p = make_profiles(spread(50.0), [2, 3, 4, -1] * 2, STORE, std=0.3)
    keys = jax.random.split(jax.random.key(9), 2)
    batched = jax.jit(
        jax.vmap(lambda k: fb.inter_mc_t(p, key=k, mc=MC)), compiler_options=FAST_COMPILE
    )(keys)
    separate = [fb.inter_mc_t(p, key=k, mc=MC) for k in keys]
    np.testing.assert_allclose(batched, separate, rtol=1e-6)
    assert batched[0] != batched[1]


def test_participation_counts_and_gini_by_hand():
    p = make_profiles([30.0, 60.0, 100.0, 150.0] * 2, [-1, 0, 1, 2] * 2, STORE)
    s = fb.deadline_run(p, key=jax.random.key(0), mc=MC)
    selected = fb.participation_counts(s, N, successful=False)
    ready = [[np_ready(trace, float(t0)) for trace in [-1, 0, 1, 2] * 2] for t0 in s.start + 20]
    np.testing.assert_array_equal(selected, np.sum(ready, axis=0))  # m = N: all ready go
    np.testing.assert_array_equal(selected[2], 0)  # never ready
    assert gini(jnp.zeros(3)) == 0.0
    x = np.array([3.0, 0.0, 1.0, 7.0])
    pairs = np.abs(x[:, None] - x[None, :]).sum() / (2 * len(x) * x.sum())
    np.testing.assert_allclose(gini(x), pairs, rtol=1e-6)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="MonteCarlo.cohort_size must be >= 1"):
        fb.MonteCarlo(cohort_size=0)
    with pytest.raises(ValueError, match=r"drop_share must be in \(0, 1\)"):
        fb.MonteCarlo(drop_share=1.5)
    with pytest.raises(ValueError, match="deadline must be > 0"):
        fb.MonteCarlo(deadline=0.0)
    assert fb.MonteCarlo().rounds * fb.MonteCarlo().cohort_size / 100 == 600  # S_ideal


@pytest.mark.skipif(sources is None, reason="fedjax_het.system.sources is not there")
def test_shipped_flash_traces_order_by_ready_share():
    key, costs = jax.random.key(2), [30.0]
    often, rarely = (make_profiles(spread(0.0), 8 + k * N + np.arange(N), STORE) for k in (0, 1))
    assert fb.stat_mc_r(often, key=key, mc=MC, costs=costs) > fb.stat_mc_r(
        rarely, key=key, mc=MC, costs=costs
    )
    assert fb.stat_mc_t(often, key=key, mc=MC, costs=costs) < fb.stat_mc_t(
        rarely, key=key, mc=MC, costs=costs
    )


def test_steps_needed_adds_local_compute_to_the_device_metrics():
    clients = uniform_profiles(4, step_time=1.0, bandwidth=2 * fb.PAYLOAD_BYTES / 60)
    mc = fb.MonteCarlo(cohort_size=4, rounds=3, trips=8)  # 60 s of transfers, a 120 s deadline
    key = jax.random.key(0)
    assert float(fb.dev_mc_r(clients, key=key, mc=mc, steps_needed=50)) == 1.0  # 110 s fits
    assert float(fb.dev_mc_r(clients, key=key, mc=mc, steps_needed=70)) == 0.0  # 130 s never does
    # T: 2 readiness rounds of 20 s overhead + 60 s + 50 s, over the ideal 2 x 20 s.
    assert float(fb.dev_mc_t(clients, key=key, mc=mc, steps_needed=50)) == pytest.approx(6.5)
