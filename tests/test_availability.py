"""Availability queries against an independent float64 reference on random traces.

The reference never uses the store's arrays: each trace is drawn as integer interval
endpoints, turned into a per-second 0/1 grid (cell ``c`` is ``[c, c + 1)``), and the grid's runs
are the canonical merged intervals. Queries are then answered by brute force (is the position
inside a run?) or by walking the runs forward in time, cycle after cycle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.system import availability as avl

PERIOD = 1000
RNG = np.random.default_rng(20260523)


def _raw_trace(rng: np.random.Generator, kind: str) -> np.ndarray:
    """``[n, 2]`` integer intervals, unsorted, possibly overlapping, touching or past the period."""
    if kind == "never":
        return np.zeros((0, 2))
    if kind == "always":
        return np.asarray([[0, PERIOD]])
    if kind == "edges":  # ready at the end and at the start of the period: not joined by wrap
        return np.asarray([[PERIOD - 50, PERIOD + 30], [0, 40], [500, 500]])
    n = int(rng.integers(1, 25))
    start = rng.integers(0, PERIOD, n)
    end = start + rng.integers(0, 120, n)  # zero-length and past-the-period ends included
    pairs = np.stack([start, end], 1)
    touching = np.asarray([[pairs[0, 1], pairs[0, 1] + 7]])  # shares an endpoint with row 0
    return rng.permutation(np.concatenate([pairs, touching]))


def _runs(raw: np.ndarray, min_interval: float = 0.0) -> np.ndarray:
    """Canonical intervals of a trace: the runs of its per-second grid, at least min_interval."""
    grid = np.zeros(PERIOD + 2, bool)
    for s, e in raw.astype(int):
        grid[1 + max(s, 0) : 1 + min(e, PERIOD)] = True
    edges = np.flatnonzero(np.diff(grid.astype(int)))
    runs = edges.reshape(-1, 2).astype(np.float64)
    return runs[runs[:, 1] - runs[:, 0] >= max(min_interval, 1e-9)].reshape(-1, 2)


KINDS = ["never", "always", "edges"] + ["random"] * 9
RAW = [_raw_trace(RNG, kind) for kind in KINDS]
RUNS = [_runs(raw) for raw in RAW]


def _ready(runs, t):
    pos = t % PERIOD
    return bool(np.any((runs[:, 0] <= pos) & (pos < runs[:, 1])))


def _ready_seconds(runs, t):
    cycle, pos = divmod(t, PERIOD)
    total = np.sum(runs[:, 1] - runs[:, 0])
    return cycle * total + np.sum(np.clip(pos - runs[:, 0], 0, runs[:, 1] - runs[:, 0]))


def _walk(runs, t):
    """Intervals (absolute times) that end after ``t``, in time order, forever."""
    cycle = np.floor(t / PERIOD)
    while True:
        for s, e in runs:
            if cycle * PERIOD + e > t:
                yield cycle * PERIOD + s, cycle * PERIOD + e
        cycle += 1


def _finish(runs, t0, work):
    if work <= 0:
        return t0
    if len(runs) == 0:
        return np.inf
    left = work
    for s, e in _walk(runs, t0):
        begin = max(s, t0)
        if left <= e - begin:
            return begin + left
        left -= e - begin


def _finish_or_lost(runs, t0, work):
    until = t0
    if _ready(runs, t0):
        until = next(e for s, e in _walk(runs, t0) if s <= t0)
    done = t0 + work
    return (until, True) if done > until else (done, False)


def _next_ready(runs, t):
    if _ready(runs, t):
        return t
    if len(runs) == 0:
        return np.inf
    return next(s for s, _ in _walk(runs, t) if s >= t)


def _reference(trace, t, work):
    """All six queries for one (trace, t, work) point; trace -1 is always available."""
    if trace == avl.ALWAYS:
        return (True, t, t + work, t + work, False, t)
    runs = RUNS[trace]
    finish, lost = _finish_or_lost(runs, t, work)
    return (
        _ready(runs, t),
        _ready_seconds(runs, t),
        _finish(runs, t, work),
        finish,
        lost,
        _next_ready(runs, t),
    )


def _queries(av, trace, t, work):
    finish, lost = avl.finish_time_or_lost(av, trace, t, work)
    return (
        avl.is_ready(av, trace, t),
        avl.ready_seconds(av, trace, t),
        avl.finish_time(av, trace, t, work),
        finish,
        lost,
        avl.next_ready(av, trace, t),
    )


def _points():
    """Random and boundary (trace, t, work) points; times are multiples of 1/8 (exact floats)."""
    n = 600
    trace = RNG.integers(-1, len(RUNS), n)
    t = RNG.integers(0, 5 * PERIOD * 8, n) / 8
    work = RNG.integers(0, 3 * PERIOD * 8, n) / 8
    work[::7] = 0.0
    points = list(zip(trace.tolist(), t.tolist(), work.tolist()))
    for k, runs in enumerate(RUNS):
        total = float(np.sum(runs[:, 1] - runs[:, 0]))
        for s, e in runs:
            for cycle in (1, 3):
                base = cycle * PERIOD
                # at a start, at an end, finishing exactly at the end, a full cycle of work
                points += [(k, base + s, e - s), (k, base + e, 1.0), (k, base + s, total)]
                points += [(k, base + s - 0.5, e - s + 0.5), (k, base + e - 1, 1.0)]
    return points


POINTS = _points()


@pytest.fixture(scope="module")
def store():
    return avl.Availability.from_intervals(RAW, PERIOD)


@pytest.fixture(scope="module")
def batched(store):
    trace, t, work = (np.asarray(c) for c in zip(*POINTS))
    query = jax.jit(jax.vmap(_queries, in_axes=(None, 0, 0, 0)))
    out = query(store, jnp.asarray(trace, jnp.int32), jnp.asarray(t, jnp.float32), work)
    return [np.asarray(o) for o in out]


NAMES = ["is_ready", "ready_seconds", "finish_time", "lost_finish", "lost", "next_ready"]


@pytest.mark.parametrize("q", range(len(NAMES)), ids=NAMES)
def test_queries_match_reference(batched, q):
    expected = np.asarray([_reference(*p)[q] for p in POINTS], np.float64)
    found = batched[q].astype(np.float64)
    bad = ~np.isclose(found, expected, rtol=0, atol=1e-3) & ~(np.isinf(found) & np.isinf(expected))
    assert not bad.any(), [(POINTS[i], found[i], expected[i]) for i in np.flatnonzero(bad)[:5]]


def test_finish_time_wraps_and_never_ready(batched):
    # Work spanning several cycles, and traces that are never ready, occur in the sample.
    trace, t, work = (np.asarray(c) for c in zip(*POINTS))
    finish = batched[2]
    never = trace == KINDS.index("never")
    assert np.all(np.isinf(finish[never & (work > 0)]))
    assert np.all(finish[never & (work == 0)] == t[never & (work == 0)])
    assert np.any(finish[~never & (trace >= 0)] > t[~never & (trace >= 0)] + PERIOD)


_QUERY_ONE = jax.jit(_queries)  # one client, unbatched; compiled once for the module


def _query_one(store, trace, t, work):
    return _QUERY_ONE(store, jnp.int32(trace), jnp.float32(t), jnp.float32(work))


def test_scalar_jit_path_matches_vmap(store, batched):
    for i in range(0, len(POINTS), 97):
        trace, t, work = POINTS[i]
        out = _query_one(store, trace, t, work)
        for q, value in enumerate(out):
            np.testing.assert_allclose(np.float64(value), batched[q][i].astype(np.float64))


def test_half_open_and_wrap_at_period_edge(store):
    k = KINDS.index("edges")  # intervals [0, 40) and [950, 1000)
    assert bool(_query_one(store, k, 950.0, 0.0)[0])
    assert not bool(_query_one(store, k, 40.0, 0.0)[0])
    assert bool(_query_one(store, k, 1000.0, 0.0)[0])  # = position 0 of cycle 1
    # Pause: 60 s of work from 980 runs 20 s, wraps, then 40 s: done at 1040.
    _, seconds, finish, lost_finish, lost, _ = _query_one(store, k, 980.0, 60.0)
    assert float(finish) == 1040.0 and float(seconds) == 40.0 + 30.0
    # Lost: the interval ending at the period is not joined with the next cycle's first.
    assert bool(lost) and float(lost_finish) == 1000.0


def test_merging_matches_grid_runs(store):
    count = np.asarray(store.count)
    offset = np.asarray(store.offset)
    for k, runs in enumerate(RUNS):
        rows = slice(offset[k], offset[k] + count[k])
        got = np.stack([np.asarray(store.start)[rows], np.asarray(store.end)[rows]], 1)
        np.testing.assert_array_equal(got, runs)
        lengths = runs[:, 1] - runs[:, 0]
        np.testing.assert_allclose(
            np.asarray(store.ready_before)[rows], np.cumsum(lengths) - lengths
        )
        assert float(store.ready_per_period[k]) == lengths.sum()


@pytest.mark.parametrize("min_interval", [5.0, 30.0, 200.0])
def test_min_interval_drops_short_runs_after_merging(min_interval):
    av = avl.Availability.from_intervals(RAW, PERIOD, min_interval=min_interval)
    count, offset = np.asarray(av.count), np.asarray(av.offset)
    for k, raw in enumerate(RAW):
        expected = _runs(raw, min_interval)
        rows = slice(offset[k], offset[k] + count[k])
        np.testing.assert_array_equal(np.asarray(av.start)[rows], expected[:, 0])
        np.testing.assert_array_equal(np.asarray(av.end)[rows], expected[:, 1])


def test_from_intervals_rejects_bad_input():
    with pytest.raises(ValueError, match="ends before it starts"):
        avl.Availability.from_intervals([np.asarray([[10.0, 5.0]])], PERIOD)
    with pytest.raises(ValueError, match=">= 0"):
        avl.Availability.from_intervals([np.asarray([[-1.0, 5.0]])], PERIOD)
    with pytest.raises(ValueError, match="period"):
        avl.Availability.from_intervals([np.asarray([[1.0, 5.0]])], 0.0)
