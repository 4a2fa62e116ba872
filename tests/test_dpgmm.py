"""DPGMM device sampler (FLHetBench §3.1) and the device presets."""

import numpy as np
import pytest

from fedjax_het.sampling.dpgmm import dpgmm
from fedjax_het.sampling.presets import DEVICE_CASES, DEVICE_PRESETS, sample_devices

GRID = np.linspace(0.0, 1e5, 2001)  # a dense database: snapping to a device barely moves a mean
VARIANTS = ["paper", "release"]


def concentration(variant, alpha, k):
    """Per-component Dirichlet parameter: alpha / K in the paper, alpha in the release."""
    return alpha / k if variant == "paper" else alpha


def expected_nonempty(k, a, n):
    """E[#components drawn at least once] for n draws from pi ~ Dir(a, ..., a) over k.

    Each pi_k ~ Beta(a, (k - 1) a), so P(component unused) = E[(1 - pi_k)^n]
    = prod_{j < n} ((k - 1) a + j) / (k a + j).
    """
    j = np.arange(n)
    return k * (1.0 - np.prod(((k - 1) * a + j) / (k * a + j)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_deterministic_per_seed_with_indices_in_range(variant):
    speeds = np.random.default_rng(0).lognormal(10.0, 0.5, 333)
    run = lambda seed: dpgmm(
        speeds, num_clients=200, num_devices=30, sigma=0.5, seed=seed, variant=variant
    )
    a, b, c = run(1), run(1), run(2)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)
    assert a.indices.dtype == np.int32 and a.indices.shape == (200,)
    assert a.indices.min() >= 0 and a.indices.max() < 333
    assert a.components.min() >= 0 and a.components.max() < 30
    assert a.num_distinct == len(set(a.indices.tolist())) <= len(set(a.components.tolist()))
    assert a.mean == pytest.approx(speeds[a.indices].mean())
    assert a.std == pytest.approx(speeds[a.indices].std())


@pytest.mark.parametrize(
    ("variant", "k", "alpha", "n"),
    [
        ("release", 50, 1000.0, 100),  # the released cases: 44 distinct devices of 100 clients
        ("release", 20, 0.5, 100),
        ("paper", 50, 1000.0, 100),
        ("paper", 50, 5.0, 100),
        ("paper", 20, 2.0, 200),
    ],
)
def test_used_components_match_the_dirichlet_closed_form(variant, k, alpha, n):
    runs = [
        dpgmm(GRID, num_clients=n, num_devices=k, sigma=0.3, alpha=alpha, seed=s, variant=variant)
        for s in range(150)
    ]
    used = np.mean([np.unique(r.components).size for r in runs])
    expected = expected_nonempty(k, concentration(variant, alpha, k), n)
    assert abs(used - expected) < 0.6


def test_release_gives_each_used_component_its_own_device():
    for seed in range(20):
        r = dpgmm(GRID, num_clients=100, num_devices=50, sigma=0.3, seed=seed)
        assert r.num_distinct == np.unique(r.components).size


@pytest.mark.parametrize("variant", VARIANTS)
def test_more_distinct_devices_as_alpha_and_k_grow(variant):
    def distinct(k, alpha):
        return np.mean(
            [
                dpgmm(
                    GRID,
                    num_clients=100,
                    num_devices=k,
                    sigma=0.3,
                    alpha=alpha,
                    seed=s,
                    variant=variant,
                ).num_distinct
                for s in range(20)
            ]
        )

    assert distinct(10, 1000.0) < distinct(30, 1000.0) < distinct(80, 1000.0)
    assert distinct(50, 0.5) < distinct(50, 20.0) < distinct(50, 1000.0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_mean_speed_follows_mu0(variant):
    mu0 = 30000.0  # away from the database mean of 50,000
    means = [
        dpgmm(
            GRID, num_clients=5000, num_devices=200, sigma=0.1, mu0=mu0, seed=s, variant=variant
        ).mean
        for s in range(5)
    ]
    assert (
        abs(np.mean(means) - mu0) < 800.0
    )  # sd of one run's mean ~ 0.1 * sigma0 / sqrt(200) ~ 200


@pytest.mark.parametrize("variant", VARIANTS)
def test_spread_matches_the_mixture_variance(variant):
    # E[population variance] = (1 - 1/n) (sigma sigma0)^2 (1 - E[sum pi^2]), E[sum pi^2] = (a+1)/(Ka+1)
    # for pi ~ Dir(a, ..., a) (notes §1.5, derived); alpha = 5, K = 20 separates the variants.
    k, alpha, n, sigma = 20, 5.0, 500, 0.1
    a = concentration(variant, alpha, k)
    expected = (1 - 1 / n) * (sigma * GRID.std()) ** 2 * (1 - (a + 1) / (k * a + 1))
    variances = [
        dpgmm(
            GRID, num_clients=n, num_devices=k, sigma=sigma, alpha=alpha, seed=s, variant=variant
        ).std
        ** 2
        for s in range(400)
    ]
    assert np.mean(variances) == pytest.approx(expected, rel=0.1)


def test_sigma_zero_variants_differ():
    speeds = np.random.default_rng(4).uniform(0.0, 100.0, 300)
    mu0 = 40.0
    by_distance = np.argsort(np.abs(speeds - mu0))
    paper = dpgmm(speeds, num_clients=100, num_devices=50, sigma=0.0, mu0=mu0, variant="paper")
    assert set(paper.indices.tolist()) == {by_distance[0]}  # every component snaps to one device
    release = dpgmm(speeds, num_clients=100, num_devices=50, sigma=0.0, mu0=mu0, variant="release")
    # the release takes devices without replacement: the d devices nearest mu0
    assert set(release.indices.tolist()) == set(by_distance[: release.num_distinct].tolist())
    assert release.num_distinct > 30


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -2.0}, "alpha"),
        ({"num_devices": 0}, "num_devices"),
        ({"num_devices": 11}, "num_devices"),  # release: more components than devices
        ({"num_clients": 0}, "num_clients"),
        ({"sigma": -0.1}, "sigma"),
        ({"mu0": float("nan")}, "mu0"),
        ({"variant": "fast"}, "variant"),
        ({"device_speeds": np.zeros((0,))}, "device_speeds"),
        ({"device_speeds": np.array([1.0, np.inf])}, "device_speeds"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    args = {"device_speeds": np.arange(10.0), "num_clients": 5, "num_devices": 3, "sigma": 1.0}
    args |= kwargs
    with pytest.raises(ValueError, match=match):
        dpgmm(args.pop("device_speeds"), **args)


def test_paper_variant_allows_more_components_than_devices():
    r = dpgmm(np.arange(10.0), num_clients=50, num_devices=40, sigma=1.0, variant="paper")
    assert r.num_distinct <= 10


# --- presets --------------------------------------------------------------------------------------


def test_device_presets_spread_as_documented():
    mu0 = GRID.mean()
    for case in DEVICE_CASES[1:3]:  # case4's spread reaches past the database's ends
        a = concentration("release", case.alpha, case.num_devices)
        factor = (1 - 1 / 100) * (1 - (a + 1) / (case.num_devices * a + 1))
        variances = [sample_devices(case, GRID, seed=s).std ** 2 for s in range(100)]
        assert np.mean(variances) == pytest.approx(factor * (case.spread * mu0) ** 2, rel=0.1)
    case1 = sample_devices(DEVICE_CASES[0], GRID)
    nearest = np.argsort(np.abs(GRID - mu0), kind="stable")[: case1.num_distinct]
    assert set(case1.indices.tolist()) == set(nearest.tolist())
    spreads = [
        p.spread
        for p in (DEVICE_PRESETS["mild"], DEVICE_PRESETS["middle"], DEVICE_PRESETS["severe"])
    ]
    assert spreads == sorted(spreads)
