"""DPCSM state sampler (FLHetBench §3.2), its ready-fraction score, and the state presets."""

import numpy as np
import pytest

from fedjax_het.sampling.dpcsm import dpcsm, ready_fraction_score
from fedjax_het.sampling.presets import (
    DEVICE_CASES,
    STATE_CASES,
    STATE_PRESETS,
    interplay_grid,
    sample_devices,
    sample_states,
)

# Released state cases, n = 100, seed 2022 (FLHetBench notes §2.4): alpha -> distinct traces,
# and the cluster sizes, largest first, as far as the notes list them.
RELEASED_DISTINCT = {0.5: 3, 1: 6, 2: 8, 3: 11, 4: 13, 5: 16, 10: 27, 20: 34, 50: 54, 100: 68}
RELEASED_SIZES = {
    1: [71, 22, 4, 1, 1, 1],
    4: [21, 19, 15, 12, 8, 7, 5, 5, 4, 1, 1, 1, 1],
    5: [19, 14, 13, 13, 10, 7, 4, 4, 4, 4, 3, 1],
    10: [13, 10, 10, 9, 8, 6, 5, 4],
}
DESCENDING = np.arange(710, 0, -1.0)  # a dummy descending score over 710 traces, as in the notes


def sizes_largest_first(ranks):
    return sorted(np.bincount(ranks)[np.bincount(ranks) > 0].tolist(), reverse=True)


def notes_pseudocode(score, n, alpha, start_rank, seed):
    """The released lazy stick-breaking, transcribed line by line from notes §2.4."""
    new = -1
    rng = np.random.default_rng(seed)
    keys = sorted(range(len(score)), key=lambda k: score[k], reverse=True)
    assignment = [0]
    b = rng.beta(1, alpha)
    remainder = 1 - b
    weights, options = [remainder, b], [new, 0]
    for _ in range(1, n):
        k = rng.choice(options, p=weights)
        if k == new:
            w = rng.beta(1, alpha) * remainder
            remainder -= w
            weights[0] = remainder
            options.append(len(options) - 1)
            weights.append(w)
            assignment.append(options[-1])
        else:
            assignment.append(int(k))
    return [keys[min(a + start_rank, len(keys) - 1)] for a in assignment]


# --- the released behaviour ---------------------------------------------------------------------


@pytest.mark.parametrize("alpha", sorted(RELEASED_DISTINCT))
def test_release_reproduces_the_released_distinct_counts(alpha):
    sample = dpcsm(DESCENDING, num_clients=100, alpha=alpha, seed=2022, variant="release")
    assert sample.num_distinct == RELEASED_DISTINCT[alpha]


@pytest.mark.parametrize("alpha", sorted(RELEASED_SIZES))
def test_release_reproduces_the_released_cluster_sizes(alpha):
    sample = dpcsm(DESCENDING, num_clients=100, alpha=alpha, seed=2022, variant="release")
    expected = RELEASED_SIZES[alpha]
    assert sizes_largest_first(sample.ranks)[: len(expected)] == expected


@pytest.mark.parametrize(("alpha", "start", "seed"), [(0.7, 0, 1), (3.0, 5, 2), (30.0, 40, 3)])
def test_release_matches_an_independent_transcription(alpha, start, seed):
    scores = np.random.default_rng(seed).random(60)
    sample = dpcsm(scores, num_clients=80, alpha=alpha, start_rank=start, seed=seed)
    assert sample.indices.tolist() == notes_pseudocode(scores, 80, alpha, start, seed)


def test_release_uses_consecutive_ranks_from_start_and_clips_at_the_last():
    sample = dpcsm(DESCENDING, num_clients=100, alpha=10.0, start_rank=7)
    used = np.unique(sample.ranks)
    assert used.tolist() == list(range(7, 7 + len(used)))
    few = dpcsm(np.array([3.0, 1.0, 2.0]), num_clients=100, alpha=10.0, start_rank=1)
    assert set(few.ranks.tolist()) == {1, 2}


# --- the paper's process ------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.5, 2.0, 6.0])
def test_paper_weights_follow_gem(alpha):
    # Under GEM(alpha), E[pi_start] = 1 / (1 + alpha) and the mean rank offset is alpha.
    seeds, n, size = range(300), 200, 3000
    scores = np.arange(size, 0, -1.0)
    offsets = np.stack(
        [dpcsm(scores, num_clients=n, alpha=alpha, seed=s, variant="paper").ranks for s in seeds]
    )
    assert abs(np.mean(offsets == 0) - 1 / (1 + alpha)) < 0.05
    assert abs(offsets.mean() - alpha) < 0.2 * alpha + 0.1


def test_paper_ranks_are_not_forced_to_be_consecutive():
    gaps = 0
    for seed in range(10):
        ranks = dpcsm(DESCENDING, num_clients=100, alpha=5.0, seed=seed, variant="paper").ranks
        used = np.unique(ranks)
        gaps += int(used[-1] - used[0] + 1 > len(used))
        assert used[0] >= 0 and used[-1] < len(DESCENDING)
    assert gaps > 0


# --- both variants --------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_deterministic_per_seed_and_consistent_with_ranking(variant):
    scores = np.random.default_rng(0).random(200)
    a = dpcsm(scores, num_clients=300, alpha=4.0, start_rank=10, seed=5, variant=variant)
    b = dpcsm(scores, num_clients=300, alpha=4.0, start_rank=10, seed=5, variant=variant)
    c = dpcsm(scores, num_clients=300, alpha=4.0, start_rank=10, seed=6, variant=variant)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)
    assert a.indices.dtype == np.int32 and a.indices.shape == (300,)
    assert a.ranks.min() >= 10 and a.ranks.max() < 200
    np.testing.assert_array_equal(scores[a.indices], np.sort(scores)[::-1][a.ranks])
    assert a.num_distinct == len(set(a.indices.tolist()))
    assert a.mean_score == pytest.approx(scores[a.indices].mean())


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_smaller_alpha_concentrates_on_top_ranks(variant):
    def mean_offset(alpha):
        runs = [
            dpcsm(DESCENDING, num_clients=100, alpha=alpha, seed=s, variant=variant)
            for s in range(30)
        ]
        return np.mean([r.ranks.mean() for r in runs]), np.mean([r.num_distinct for r in runs])

    (off_1, dist_1), (off_5, dist_5), (off_20, dist_20) = map(mean_offset, (1.0, 5.0, 20.0))
    assert off_1 < off_5 < off_20
    assert dist_1 < dist_5 < dist_20


@pytest.mark.parametrize("variant", ["paper", "release"])
def test_start_rank_shifts_to_worse_traces(variant):
    scores = np.random.default_rng(1).random(500)
    means = [
        dpcsm(scores, num_clients=100, alpha=3.0, start_rank=s, variant=variant).mean_score
        for s in (0, 100, 300)
    ]
    assert means[0] > means[1] > means[2]
    top = dpcsm(scores, num_clients=100, alpha=3.0, start_rank=300, variant=variant)
    assert np.all(scores[top.indices] <= np.sort(scores)[::-1][300])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"num_clients": 0}, "num_clients"),
        ({"start_rank": -1}, "start_rank"),
        ({"start_rank": 10}, "start_rank"),
        ({"variant": "lazy"}, "variant"),
        ({"scores": np.array([])}, "scores"),
        ({"scores": np.array([1.0, np.nan])}, "scores"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    args = {"scores": np.arange(10.0), "num_clients": 5, "alpha": 1.0} | kwargs
    with pytest.raises(ValueError, match=match):
        dpcsm(args.pop("scores"), **args)


# --- ready-fraction score ---------------------------------------------------------------------------


def test_ready_fraction_matches_a_per_second_count():
    rng = np.random.default_rng(3)
    period = 1000
    traces = []
    for _ in range(20):
        starts = rng.integers(0, 1200, size=rng.integers(0, 8))
        traces.append(np.stack([starts, starts + rng.integers(0, 300, size=starts.size)], -1))
    expected = []
    for pairs in traces:
        second = np.arange(period)
        ready = np.zeros(period, bool)
        for s, e in pairs:
            ready |= (second >= s) & (second < e)
        expected.append(ready.mean())
    np.testing.assert_allclose(ready_fraction_score(traces, period), expected, atol=1e-12)


def test_ready_fraction_bad_inputs():
    with pytest.raises(ValueError, match="period"):
        ready_fraction_score([np.array([[0, 1]])], 0.0)
    with pytest.raises(ValueError, match="ends before"):
        ready_fraction_score([np.array([[5, 1]])], 10.0)


# --- presets --------------------------------------------------------------------------------------


def test_state_presets_reproduce_the_released_cases():
    for case, alpha in zip(STATE_CASES, (1, 4, 5, 10)):
        sample = sample_states(case, DESCENDING)
        expected = RELEASED_SIZES[alpha]
        assert sizes_largest_first(sample.ranks)[: len(expected)] == expected
        assert sample.ranks.min() == int(case.start_fraction * len(DESCENDING))
    assert (
        STATE_PRESETS["severe"].alpha < STATE_PRESETS["middle"].alpha < STATE_PRESETS["mild"].alpha
    )


def test_interplay_grid_crosses_the_four_cases():
    speeds = np.random.default_rng(0).lognormal(10.0, 0.5, 333)
    scores = np.random.default_rng(1).random(710)
    grid = interplay_grid(speeds, scores, num_clients=100)
    assert grid.devices.shape == grid.traces.shape == (4, 100)
    cells = list(grid.cells())
    assert [(i, j) for i, j, _, _ in cells] == [(i, j) for i in range(4) for j in range(4)]
    for i, j, devices, traces in cells:
        np.testing.assert_array_equal(devices, sample_devices(DEVICE_CASES[i], speeds).indices)
        np.testing.assert_array_equal(traces, sample_states(STATE_CASES[j], scores).indices)
