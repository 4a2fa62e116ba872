"""Shipped system profiles, the score -> step-time rule, synthetic generators and CSV loaders.

Expected counts and summaries come from the source READMEs (shared/data/*/README.md), not from
the code; the round trip against the source CSVs runs when ``../shared/data`` exists.
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.system import availability as avl
from fedjax_het.system import profiles as prof
from fedjax_het.system import sources as src
from fedjax_het.system import sources_csv as scsv
from fedjax_het.system import sources_synthetic as syn

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not present")
ASSETS = importlib.resources.files("fedjax_het.system") / "assets"

RULE = functools.partial(
    src.step_time_from_score,
    flops_per_example=2e6,
    batch_size=16,
    reference_score=5_063.0,
    reference_flops_per_s=4e9,
)
DAY = 86_400.0


def _rows(av: avl.Availability) -> list[np.ndarray]:
    """Each trace's ``[count, 2]`` intervals, read from the store's valid rows only."""
    start, end, offset, count = (np.asarray(a) for a in (av.start, av.end, av.offset, av.count))
    return [np.stack([start[o : o + c], end[o : o + c]], 1) for o, c in zip(offset, count)]


def _raw_npz(rule: str) -> dict[str, np.ndarray]:
    with (ASSETS / "flash_availability_2018.npz").open("rb") as f, np.load(f) as npz:
        return {k: npz[f"{rule}_{k}"] for k in ("start", "end", "count")}


# --- shipped assets -------------------------------------------------------------------------


def test_device_table_matches_documented_summary():
    table = src.load_devices()
    assert {v.shape for v in table.values()} == {(333,)}
    np.testing.assert_array_equal(table["row"], np.arange(333))
    assert len(set(table["model"].tolist())) == 307
    score = table["ai_score"]
    assert (score.min(), score.max(), np.median(score)) == (212, 76_206, 5_063)
    assert np.all(np.diff(score) <= 0)  # highest first
    assert np.sum(table["ram_gb"] > 2) == 254
    assert (table["cpu_f_ai_score"].min(), table["cpu_f_ai_score"].max()) == (105, 4_310)


def test_network_profiles_and_unit_conversion():
    kbit, kib, kb, kibit = (src.load_network(u) for u in ("kbit/s", "KiB/s", "kB/s", "Kibit/s"))
    assert {v.shape for v in kbit.values()} == {(19,)}
    assert kbit["down_mean"][2] == pytest.approx(2370.21 * 1000 / 8)  # profile 2 of the CSV
    assert kib["up_std"][18] == pytest.approx(157.727 * 1024)
    for name in kbit:
        np.testing.assert_allclose(kib[name] / kbit[name], 8.192)
        np.testing.assert_allclose(kb[name] / kbit[name], 8.0)
        np.testing.assert_allclose(kibit[name] / kbit[name], 1.024)
    raw_down = kbit["down_mean"] * 8 / 1000
    assert (raw_down.min(), raw_down.max()) == pytest.approx((2370.21, 17332.7))
    assert np.median(raw_down) == pytest.approx(4317.63)
    with pytest.raises(ValueError, match="unit"):
        src.load_network("Mbit/s")


@pytest.mark.parametrize(
    "rule, intervals, never", [("strict", 31_436, 610), ("loose", 28_664, 630)]
)
def test_traces_counts_and_never_ready(rule, intervals, never):
    av, ids = src.load_traces(rule)
    count = np.asarray(av.count)
    assert av.num_traces == 3_478 and count.sum() == intervals and np.sum(count == 0) == never
    np.testing.assert_array_equal(ids, np.arange(3_478))
    assert np.all(np.asarray(av.period) == 172_800.0)
    kept, kept_ids = src.load_traces(rule, drop_never_ready=True)
    assert kept.num_traces == 3_478 - never
    np.testing.assert_array_equal(kept_ids, np.flatnonzero(count > 0))
    np.testing.assert_array_equal(np.asarray(kept.count), count[count > 0])


def test_min_interval_and_dropping():
    raw = _raw_npz("strict")
    long = raw["end"] - raw["start"] >= 600
    client = np.repeat(np.arange(3_478), raw["count"])
    av, ids = src.load_traces("strict", min_interval=600.0, drop_never_ready=True)
    np.testing.assert_array_equal(ids, np.unique(client[long]))
    np.testing.assert_array_equal(np.asarray(av.start), raw["start"][long])
    assert np.all(np.asarray(av.end) - np.asarray(av.start) >= 600)
    with pytest.raises(ValueError, match="rule"):
        src.load_traces("charging")
    with pytest.raises(ValueError, match="min_interval"):
        src.load_traces("strict", min_interval=-1.0)


def test_traces_share_time_of_day_and_replay_cyclically():
    av, _ = src.load_traces("strict")
    hours = jnp.asarray([6.0, 26.5, 26.5 + 48.0], jnp.float32) * 3600
    share = jax.jit(
        jax.vmap(lambda t: jax.vmap(avl.is_ready, (None, 0, None))(av, jnp.arange(3_478), t).mean())
    )(hours)
    morning, night, night_next_cycle = np.asarray(share)
    assert 0.01 < morning < 0.06  # README: 2-4 % during hours 0-12
    assert 0.17 < night < 0.27  # README: about 22 % at hours 24-29
    assert night_next_cycle == night


@needs_shared
def test_assets_round_trip_against_shared_csvs():
    devices = SHARED / "flash_device_profiles"
    for name in ("ai_benchmark_devices.csv", "network_speed_profiles.csv"):
        assert (ASSETS / name).read_bytes() == (devices / name).read_bytes()
    with (devices / "ai_benchmark_devices.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    table = src.load_devices()
    for name, values in table.items():
        expected = [row[name].strip() for row in rows]
        if values.dtype.kind == "U":
            assert values.tolist() == expected
        else:
            np.testing.assert_array_equal(values, np.asarray(expected, np.float64))
    with (devices / "network_speed_profiles.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for name, values in src.load_network().items():
        np.testing.assert_allclose(values, [float(r[name]) * 125 for r in rows], rtol=1e-12)


@needs_shared
@pytest.mark.parametrize("rule", ["strict", "loose"])
def test_traces_round_trip_against_shared_csvs(rule):
    folder = SHARED / "flash_availability_2018"
    table = np.loadtxt(folder / f"availability_{rule}.csv", delimiter=",", skiprows=1)
    clients = np.loadtxt(folder / "clients.csv", delimiter=",", skiprows=1)
    av, _ = src.load_traces(rule)
    np.testing.assert_array_equal(np.asarray(av.start), table[:, 1])
    np.testing.assert_array_equal(np.asarray(av.end), table[:, 2])
    column = 3 if rule == "strict" else 4
    np.testing.assert_array_equal(np.asarray(av.count), clients[:, column])
    np.testing.assert_array_equal(
        np.bincount(table[:, 0].astype(int), minlength=3_478), clients[:, column]
    )


# --- compute: score -> seconds per step -------------------------------------------------------


def test_step_time_worked_example_and_direction():
    # 3 x 1e6 FLOPs x 32 examples = 9.6e7 FLOPs; twice the reference speed = 2e9 FLOP/s.
    got = src.step_time_from_score(
        10_000.0,
        flops_per_example=1e6,
        batch_size=32,
        reference_score=5_000.0,
        reference_flops_per_s=1e9,
    )
    assert got == pytest.approx(0.048)
    score = src.load_devices()["ai_score"]
    times = RULE(score)
    order = np.argsort(score)
    assert np.all(np.diff(times[order]) <= 0)  # faster device, shorter step
    np.testing.assert_allclose(times * score, 3 * 2e6 * 16 * 5_063.0 / 4e9)  # t ~ 1 / score
    assert RULE(5_063.0) == pytest.approx(3 * 2e6 * 16 / 4e9)  # the reference device
    np.testing.assert_allclose(jax.jit(RULE)(jnp.asarray(score[:5])), times[:5], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"score": 0.0}, "score"),
        ({"score": np.asarray([10.0, -1.0])}, "score"),
        ({"flops_per_example": 0.0}, "flops_per_example"),
        ({"batch_size": 0}, "batch_size"),
        ({"reference_score": -5.0}, "reference_score"),
        ({"reference_flops_per_s": 0.0}, "reference_flops_per_s"),
    ],
)
def test_step_time_rejects_bad_input(kwargs, match):
    args = {
        "score": 100.0,
        "flops_per_example": 1e6,
        "batch_size": 8,
        "reference_score": 5e3,
        "reference_flops_per_s": 1e9,
    }
    args.update(kwargs)
    score = args.pop("score")
    with pytest.raises(ValueError, match=match):
        src.step_time_from_score(score, **args)


# --- assembling ClientProfiles ---------------------------------------------------------------


@pytest.fixture(scope="module")
def traces():
    return src.load_traces("strict")[0]


def test_flash_profiles_with_given_rows(traces):
    n = 6
    device, network, trace = [0, 332, 5, 5, 100, 7], [18, 0, 3, 3, 17, 2], [0, 3_477, -1, 9, 9, 1]
    p = src.flash_profiles(
        jax.random.key(0),
        n,
        score_to_step_time=RULE,
        availability=traces,
        device_rows=np.asarray(device),
        network_rows=np.asarray(network),
        trace_rows=np.asarray(trace),
        dropout=0.25,
    )
    prof.validate(p)
    score = src.load_devices()["ai_score"][device]
    np.testing.assert_allclose(np.asarray(p.step_time), RULE(score), rtol=1e-6)
    with (ASSETS / "network_speed_profiles.csv").open("r") as f:
        raw = {r["profile"]: r for r in csv.DictReader(f)}
    for name in ("down_mean", "down_std", "up_mean", "up_std"):
        expected = [float(raw[str(k)][name]) * 125 for k in network]
        np.testing.assert_allclose(np.asarray(getattr(p, name)), expected, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(p.trace), trace)
    np.testing.assert_array_equal(np.asarray(p.dropout), np.full(n, 0.25, np.float32))


def test_flash_profiles_draws_balanced_rows_and_jits(traces):
    n = 38  # twice the 19 network profiles
    make = functools.partial(
        src.flash_profiles, num_clients=n, score_to_step_time=RULE, availability=traces
    )
    p = jax.jit(make)(jax.random.key(1))
    prof.validate(p)
    _, per_profile = np.unique(np.asarray(p.down_mean), return_counts=True)
    assert per_profile.tolist() == [2] * 19
    assert len(set(np.asarray(p.trace).tolist())) == n  # distinct traces while the pool lasts
    allowed = RULE(src.load_devices()["ai_score"]).astype(np.float32)
    assert np.all(np.isin(np.asarray(p.step_time), allowed))


def test_flash_profiles_rejects_bad_rows(traces):
    call = functools.partial(
        src.flash_profiles, jax.random.key(0), 3, score_to_step_time=RULE, availability=traces
    )
    with pytest.raises(ValueError, match="device_rows must have shape"):
        call(device_rows=np.arange(4))
    with pytest.raises(ValueError, match="network_rows must lie in"):
        call(network_rows=np.asarray([0, 1, 19]))
    with pytest.raises(ValueError, match="trace_rows must lie in"):
        call(trace_rows=np.asarray([0, -2, 1]))
    with pytest.raises(ValueError, match="score_column"):
        call(score_column="model")


def test_draw_rows_is_balanced_and_uniform():
    rows = np.asarray(src.draw_rows(jax.random.key(3), 30_003, 10))
    assert set(np.bincount(rows, minlength=10).tolist()) <= {3_000, 3_001}
    blocks = rows[:30_000].reshape(3_000, 10)
    assert np.all(np.sort(blocks, axis=1) == np.arange(10))  # each block is a permutation
    first = np.bincount(blocks[:, 0], minlength=10)  # uniform: 300 each, sd about 16
    assert np.all(np.abs(first - 300) < 100)


def test_assemble_profiles_broadcasts_and_checks_shapes():
    p = src.assemble_profiles(
        np.asarray([0.1, 0.2, 0.3]), down_mean=1e6, down_std=0.0, up_mean=[1.0, 2.0, 3.0], up_std=0
    )
    prof.validate(p)
    assert np.asarray(p.trace).tolist() == [-1, -1, -1]
    with pytest.raises(ValueError, match="up_mean"):
        src.assemble_profiles([0.1, 0.2], down_mean=1.0, down_std=0, up_mean=[1, 2, 3], up_std=0)
    with pytest.raises(ValueError, match="step_time"):
        src.assemble_profiles(0.1, down_mean=1.0, down_std=0, up_mean=1, up_std=0)
    with pytest.raises(ValueError, match="together"):
        src.assemble_profiles([0.1], down_mean=1, down_std=0, up_mean=1, up_std=0, trace=[0])


# --- synthetic generators --------------------------------------------------------------------


def test_lognormal_step_times_statistics():
    t = np.asarray(syn.lognormal_step_times(jax.random.key(5), 20_000, median=0.5, sigma=0.8))
    assert abs(np.mean(np.log(t)) - np.log(0.5)) < 0.03  # standard error 0.006
    assert abs(np.std(np.log(t)) - 0.8) < 0.02  # standard error 0.004
    same = syn.lognormal_step_times(
        jax.random.key(5), 4, median=jnp.asarray([1.0, 2, 3, 4]), sigma=0
    )
    np.testing.assert_allclose(np.asarray(same), [1, 2, 3, 4])
    with pytest.raises(ValueError, match="median"):
        syn.lognormal_step_times(jax.random.key(5), 3, median=-1.0, sigma=1.0)
    # A median of 0: every step is free (as step_time = 0 for identical devices).
    np.testing.assert_array_equal(syn.lognormal_step_times(jax.random.key(5), 3, median=0.0, sigma=1.0), 0)
    with pytest.raises(ValueError, match="sigma"):
        syn.lognormal_step_times(jax.random.key(5), 3, median=1.0, sigma=-1.0)


def test_exponential_dropout_statistics():
    d = np.asarray(syn.exponential_dropout(jax.random.key(6), 40_000, mean=0.4))
    assert np.all((d >= 0) & (d <= 1))
    # E[min(X, 1)] = mean (1 - exp(-1 / mean)) and P(X >= 1) = exp(-1 / mean) for X ~ Exp(mean).
    assert abs(d.mean() - 0.4 * (1 - np.exp(-2.5))) < 0.01
    assert abs(np.mean(d == 1.0) - np.exp(-2.5)) < 0.008
    with pytest.raises(ValueError, match="mean"):
        syn.exponential_dropout(jax.random.key(6), 3, mean=-0.1)


def test_bernoulli_availability_statistics_and_layout():
    n, slots = 2_000, 24
    av = syn.bernoulli_availability(jax.random.key(7), n, p=0.3, slots=slots, period=DAY)
    fraction = np.asarray(av.ready_per_period) / DAY
    assert abs(fraction.mean() - 0.3) < 0.012  # standard error 0.002
    rows = _rows(av)
    assert all(np.all(np.mod(r, DAY / slots) == 0) for r in rows)  # on the slot grid
    canonical = avl.Availability.from_intervals(rows, DAY)  # sorts and merges touching runs
    assert [r.tolist() for r in _rows(canonical)] == [r.tolist() for r in rows]
    np.testing.assert_allclose(
        np.asarray(canonical.ready_per_period), np.asarray(av.ready_per_period)
    )
    # Every query answers as on the canonical store, padding rows notwithstanding.
    trace = jnp.arange(200) % n
    t = jax.random.uniform(jax.random.key(8), (200,)) * 3 * DAY
    work = jax.random.uniform(jax.random.key(9), (200,)) * DAY / 4

    def queries(store):
        one = lambda k, s, w: (
            avl.is_ready(store, k, s),
            avl.ready_seconds(store, k, s),
            avl.finish_time(store, k, s, w),
            avl.finish_time_or_lost(store, k, s, w)[0],
            avl.next_ready(store, k, s),
        )
        return jax.vmap(one)(trace, t, work)

    both = jax.jit(lambda a, b: (queries(a), queries(b)))(av, canonical)
    for x, y in zip(*both):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=1e-6)


def test_bernoulli_extremes_errors_and_vmap_over_p():
    key = jax.random.key(10)
    none = syn.bernoulli_availability(key, 5, p=0.0, slots=4, period=DAY)
    assert np.asarray(none.count).tolist() == [0] * 5
    full = syn.bernoulli_availability(key, 5, p=1.0, slots=4, period=DAY)
    assert [r.tolist() for r in _rows(full)] == [[[0.0, DAY]]] * 5
    sweep = jax.jit(
        jax.vmap(
            lambda p: syn.bernoulli_availability(
                key, 500, p=p, slots=24, period=DAY
            ).ready_per_period.mean()
        )
    )
    np.testing.assert_allclose(
        np.asarray(sweep(jnp.asarray([0.1, 0.5, 0.9]))) / DAY, [0.1, 0.5, 0.9], atol=0.03
    )
    with pytest.raises(ValueError, match="p must be"):
        syn.bernoulli_availability(key, 3, p=1.5, slots=4, period=DAY)
    with pytest.raises(ValueError, match="slots"):
        syn.bernoulli_availability(key, 3, p=0.5, slots=0, period=DAY)
    with pytest.raises(ValueError, match="period"):
        syn.bernoulli_availability(key, 3, p=0.5, slots=4, period=0.0)
    with pytest.raises(ValueError, match=r"p must be a scalar or a \[3\] array"):
        syn.bernoulli_availability(key, 3, p=jnp.asarray([0.5, 0.5]), slots=4, period=DAY)


def test_window_availability_statistics_and_layout():
    n = 2_000
    av = syn.window_availability(jax.random.key(11), n, fraction=0.25, period=DAY)
    np.testing.assert_allclose(np.asarray(av.ready_per_period), DAY / 4, rtol=1e-5)
    rows = _rows(av)
    assert {len(r) for r in rows} == {1, 2}
    for r in rows:
        if len(r) == 2:  # the window wraps: [0, spill) and [phase, period)
            assert r[0, 0] == 0 and r[1, 1] == DAY and r[0, 1] < r[1, 0]
    canonical = avl.Availability.from_intervals(rows, DAY)
    assert [r.tolist() for r in _rows(canonical)] == [r.tolist() for r in rows]
    # A uniform phase: at any time of day, a quarter of the clients are ready.
    is_ready = jax.jit(jax.vmap(jax.vmap(avl.is_ready, (None, 0, None)), (None, None, 0)))
    share = np.asarray(is_ready(av, jnp.arange(n), jnp.asarray([0.0, 0.3, 0.7]) * DAY)).mean(1)
    assert np.all(np.abs(share - 0.25) < 0.05)  # standard error 0.01
    ends = syn.window_availability(
        jax.random.key(11), 3, fraction=jnp.asarray([0.0, 1.0, 0.5]), period=DAY
    )
    assert np.asarray(ends.count)[:2].tolist() == [0, 1]
    assert _rows(ends)[1].tolist() == [[0.0, DAY]]
    with pytest.raises(ValueError, match="fraction"):
        syn.window_availability(jax.random.key(11), 3, fraction=1.2, period=DAY)


# --- user CSVs -------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_intervals_csv_loads_merges_and_keeps_silent_clients(tmp_path):
    path = _write(
        tmp_path, "ready.csv", "client,start_s,end_s,note\n1,50,80,x\n1,10,50,y\n3,0,100,z\n"
    )
    av = scsv.load_intervals_csv(path, period=100.0, num_clients=5)
    assert [r.tolist() for r in _rows(av)] == [[], [[10.0, 80.0]], [], [[0.0, 100.0]], []]
    assert scsv.load_intervals_csv(path, period=100.0).num_traces == 4  # largest id + 1
    short = scsv.load_intervals_csv(path, period=100.0, min_interval=80.0)
    assert np.asarray(short.count).tolist() == [0, 0, 0, 1]


def test_step_times_csv_loads_seconds_or_scores(tmp_path):
    seconds = _write(tmp_path, "s.csv", "client,step_time_s\n1,0.5\n0,0.25\n")
    assert scsv.load_step_times_csv(seconds).tolist() == [0.25, 0.5]
    scores = _write(tmp_path, "a.csv", "client,ai_score\n0,5063\n1,212\n")
    got = scsv.load_step_times_csv(scores, num_clients=2, score_to_step_time=RULE)
    np.testing.assert_allclose(got, RULE(np.asarray([5063.0, 212.0])))


@pytest.mark.parametrize(
    "text, kwargs, message",
    [
        ("", {}, "empty file"),
        ("client,start_s\n0,1\n", {}, "missing column 'end_s'"),
        ("client,start_s,end_s\n0,1,2\n0,abc,5\n", {}, "line 3, column 'start_s': 'abc' is not"),
        ("client,start_s,end_s\n0,1,nan\n", {}, "line 2, column 'end_s'"),
        ("client,start_s,end_s\n0,1,2\n0,-5,5\n", {}, "line 3, column 'start_s': -5 is negative"),
        (
            "client,start_s,end_s\n0,20,10\n",
            {},
            "line 2, column 'end_s': end 10 is before start 20",
        ),
        ("client,start_s,end_s\n0,20,150\n", {}, "line 2, column 'end_s': 150 is past the period"),
        (
            "client,start_s,end_s\n0,1,2\n4,1,2\n",
            {"num_clients": 3},
            "line 3, column 'client': unknown client id 4",
        ),
        ("client,start_s,end_s\n1.5,1,2\n", {}, "line 2, column 'client': 1.5 is not a client id"),
        ("client,start_s,end_s\n-1,1,2\n", {}, "line 2, column 'client'"),
        ("client,start_s,end_s\n0,1\n", {}, "line 2, column 'end_s'"),
    ],
)
def test_intervals_csv_errors_name_file_line_and_column(tmp_path, text, kwargs, message):
    path = _write(tmp_path, "bad_ready.csv", text)
    with pytest.raises(ValueError, match="bad_ready.csv") as error:
        scsv.load_intervals_csv(path, period=100.0, **kwargs)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "text, kwargs, message",
    [
        ("step_time_s\n0.1\n", {}, "missing column 'client'"),
        ("client,speed\n0,1\n", {}, "exactly one of the columns"),
        ("client,step_time_s,ai_score\n0,1,2\n", {}, "exactly one of the columns"),
        ("client,ai_score\n0,100\n", {}, "score_to_step_time must be passed"),
        (
            "client,ai_score\n0,0\n",
            {"score_to_step_time": RULE},
            "line 2, column 'ai_score': 0 is not > 0",
        ),
        ("client,step_time_s\n0,fast\n", {}, "line 2, column 'step_time_s': 'fast' is not"),
        ("client,step_time_s\n0,-0.1\n", {}, "line 2, column 'step_time_s': -0.1 is negative"),
        ("client,step_time_s\n0,1\n0,2\n", {}, "line 3, column 'client': client 0 repeats"),
        ("client,step_time_s\n0,1\n2,2\n", {}, "no row for client(s) [1]"),
        ("client,step_time_s\n0,1\n", {"num_clients": 3}, "no row for client(s) [1, 2]"),
        (
            "client,step_time_s\n0,1\n5,1\n",
            {"num_clients": 3},
            "line 3, column 'client': unknown client id 5",
        ),
        ("client,step_time_s\n", {}, "no client rows"),
    ],
)
def test_step_times_csv_errors_name_file_line_and_column(tmp_path, text, kwargs, message):
    path = _write(tmp_path, "bad_speed.csv", text)
    with pytest.raises(ValueError, match="bad_speed.csv") as error:
        scsv.load_step_times_csv(path, **kwargs)
    assert message in str(error.value)
