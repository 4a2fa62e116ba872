"""PNG plots of the system layer: timeline, availability heatmap, participation histogram."""

import types

import matplotlib.image
import numpy as np
import pytest

from fedjax_het.sampling.dpcsm import ready_fraction_score
from fedjax_het.system.availability import Availability
from fedjax_het.system.plots import (
    OUTCOME_COLORS,
    plot_availability,
    plot_participation,
    plot_timeline,
)
from fedjax_het.system.schedule import EMPTY, LATE, OK

DAY = 86400.0
MIN_BYTES = 5_000  # a blank or failed figure at these sizes is smaller


def check_png(path, figsize, dpi):
    assert path.stat().st_size > MIN_BYTES
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (round(figsize[1] * dpi), round(figsize[0] * dpi))
    packed = (image[..., :3] * 255).round().astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1])
    assert np.unique(packed).size > 3  # not one flat colour


def day_traces(seed, count):
    """Random traces with one-day periods and interval bounds on a 10-minute grid."""
    rng = np.random.default_rng(seed)
    traces = []
    for _ in range(count):
        starts = rng.choice(144, size=rng.integers(1, 8), replace=False) * 600.0
        traces.append(np.stack([starts, starts + rng.integers(1, 20, starts.size) * 600.0], -1))
    return traces


def test_availability_heatmap_matches_the_intervals(tmp_path):
    traces = day_traces(0, 6)
    av = Availability.from_intervals(traces, DAY)
    trace_ids = np.array([0, 1, 2, 3, 4, 5, -1, 2, 0, 5] * 3)
    figsize, dpi = (8.0, 5.0), 80
    path = tmp_path / "availability.png"
    ready = plot_availability(
        av, trace_ids, path, hours=48, resolution_s=600, figsize=figsize, dpi=dpi
    )
    check_png(path, figsize, dpi)
    times = np.arange(0.0, 48 * 3600.0, 600.0)
    assert ready.shape == (len(trace_ids), len(times))
    for row, trace in zip(ready, trace_ids):
        if trace == -1:
            assert row.all()
            continue
        # Independent check: position in the day inside any (possibly overlapping) interval.
        position = times % DAY
        expected = np.zeros(len(times), bool)
        for start, end in traces[trace]:
            expected |= (position >= start) & (position < min(end, DAY))
        np.testing.assert_array_equal(row, expected)
    # Two whole days on the interval grid: the heatmap's share is the trace's ready fraction.
    fraction = ready_fraction_score(traces, DAY)
    for row, trace in zip(ready, trace_ids):
        assert row.mean() == pytest.approx(1.0 if trace == -1 else fraction[trace])


def test_availability_heatmap_of_no_traces_is_all_ready(tmp_path):
    """``availability = "always"`` (the default) has an empty trace store; every client is ready."""
    av = Availability.from_intervals([], [])
    ready = plot_availability(av, np.full(4, -1), tmp_path / "a.png", hours=2, resolution_s=600)
    assert ready.shape == (4, 12) and ready.all()


def test_availability_rejects_bad_arguments(tmp_path):
    av = Availability.from_intervals(day_traces(1, 2), DAY)
    with pytest.raises(ValueError, match="trace_ids"):
        plot_availability(av, np.array([0, 2]), tmp_path / "a.png")
    with pytest.raises(ValueError, match="hours"):
        plot_availability(av, np.array([0]), tmp_path / "a.png", hours=0)


def fake_schedule(rounds=30, slots=6, clients=40, seed=0):
    rng = np.random.default_rng(seed)
    duration = rng.uniform(60.0, 140.0, rounds)
    clock = np.cumsum(duration + 20.0)
    valid = rng.random((rounds, slots)) < 0.9
    return types.SimpleNamespace(
        selected=np.stack([rng.choice(clients, slots, replace=False) for _ in range(rounds)]),
        valid=valid,
        outcome=np.where(valid, rng.choice(list(OUTCOME_COLORS), (rounds, slots)), EMPTY),
        start=clock - duration,
        duration=duration,
        clock=clock,
        finish=rng.uniform(0.0, 1.0, (rounds, slots)) * duration[:, None],
    )


def test_timeline_draws_the_lowest_selected_clients(tmp_path):
    schedule = fake_schedule()
    figsize, dpi = (9.0, 6.0), 90
    path = tmp_path / "timeline.png"
    shown = plot_timeline(schedule, path, max_clients=12, figsize=figsize, dpi=dpi)
    check_png(path, figsize, dpi)
    ever = sorted(set(schedule.selected[schedule.valid].tolist()))
    assert shown.tolist() == ever[:12]


def test_timeline_colours_slots_by_outcome(tmp_path):
    # Only "late" slots, drawn large: the late colour covers much of the plot, "OK" only its legend.
    schedule = fake_schedule(rounds=5, slots=3, clients=3)
    schedule.outcome = np.where(schedule.valid, LATE, EMPTY)
    schedule.finish = np.broadcast_to(schedule.duration[:, None], schedule.valid.shape)
    path = tmp_path / "late.png"
    plot_timeline(schedule, path)
    pixels = (matplotlib.image.imread(path)[..., :3] * 255).round().reshape(-1, 3)

    def share(hex_colour):
        rgb = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
        return np.mean(np.all(np.abs(pixels - rgb) <= 2, axis=1))

    assert share(OUTCOME_COLORS[LATE]) > 0.2
    assert share(OUTCOME_COLORS[OK]) < 0.01


def test_timeline_rejects_bad_arguments(tmp_path):
    schedule = fake_schedule()
    with pytest.raises(ValueError, match="max_clients"):
        plot_timeline(schedule, tmp_path / "t.png", max_clients=0)
    schedule.start = schedule.start[:-1]
    with pytest.raises(ValueError, match="start"):
        plot_timeline(schedule, tmp_path / "t.png")


def test_participation_histogram_reports_the_gini(tmp_path):
    counts = np.random.default_rng(2).poisson(30, 100) * (np.arange(100) % 3 > 0)
    figsize, dpi = (6.0, 4.0), 100
    path = tmp_path / "participation.png"
    value = plot_participation(counts, path, figsize=figsize, dpi=dpi)
    check_png(path, figsize, dpi)
    pairwise = np.abs(counts[:, None] - counts[None, :]).sum() / (
        2 * len(counts) ** 2 * counts.mean()
    )
    assert value == pytest.approx(pairwise)
    with pytest.raises(ValueError, match="counts"):
        plot_participation(np.array([1, -1]), path)


def test_timeline_of_a_schedule_with_no_client(tmp_path):
    schedule = fake_schedule(rounds=4, slots=3)
    schedule.valid = np.zeros_like(schedule.valid)
    schedule.outcome = np.full(schedule.valid.shape, EMPTY)
    path = tmp_path / "empty.png"
    assert plot_timeline(schedule, path).size == 0
    # the default figure: 10 x 6 inches at 100 dpi
    assert matplotlib.image.imread(path).shape[:2] == (600, 1000)
