"""Tests of fedjax_het.data.feature_skew: levels per client, rates, inputs untouched, registry."""

import numpy as np
import pytest

from fedjax_het.data import feature_skew

NUM_CLASSES = 10
NUM_CLIENTS = 5
RNG = np.random.default_rng(0)
X = RNG.uniform(0.2, 0.8, size=(1000, 8, 8)).astype(np.float32)
Y = RNG.integers(NUM_CLASSES, size=1000)
# Examples 0..899 in 5 clients of 180; 900..999 belong to nobody (e.g. a global test set).
PARTS = [np.arange(k * 180, (k + 1) * 180)[::-1].copy() for k in range(NUM_CLIENTS)]
UNASSIGNED = np.arange(900, 1000)

KIND_PARAMS = {
    "gaussian_noise": {"sigma": 0.1},
    "salt_pepper": {"rate": 0.2},
    "rotation": {"angle": 90.0},
    "label_flip": {"rate": 0.2},
    "label_permutation": {"num_permuted": 3},
}


def binomial_tolerance(trials: int, p: float, z: float = 5.0) -> float:
    """z standard deviations of a Binomial(trials, p) count."""
    return z * np.sqrt(trials * p * (1 - p))


# --- every registered transform --------------------------------------------------------------


def test_registry_holds_the_documented_transforms():
    assert set(feature_skew.FEATURE_TRANSFORMS) == set(KIND_PARAMS)


@pytest.mark.parametrize("kind", sorted(KIND_PARAMS))
def test_every_transform_leaves_inputs_and_unassigned_examples_untouched(kind):
    x, y = X.copy(), Y.copy()
    new_x, new_y = feature_skew.transform(kind, x, y, PARTS, seed=0, **KIND_PARAMS[kind])
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)
    assert new_x.shape == X.shape and new_x.dtype == X.dtype
    assert new_y.shape == Y.shape
    np.testing.assert_array_equal(new_x[UNASSIGNED], X[UNASSIGNED])
    np.testing.assert_array_equal(new_y[UNASSIGNED], Y[UNASSIGNED])
    assert not (np.array_equal(new_x, X) and np.array_equal(new_y, Y))


@pytest.mark.parametrize("kind", sorted(set(KIND_PARAMS) - {"rotation"}))
def test_every_random_transform_is_deterministic_in_seed(kind):
    params = KIND_PARAMS[kind]
    first = feature_skew.transform(kind, X, Y, PARTS, seed=1, **params)
    again = feature_skew.transform(kind, X, Y, PARTS, seed=1, **params)
    other = feature_skew.transform(kind, X, Y, PARTS, seed=2, **params)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_transform_rejects_an_unknown_kind_listing_the_choices():
    with pytest.raises(ValueError, match="unknown feature transform 'rotate'") as error:
        feature_skew.transform("rotate", X, Y, PARTS, seed=0, angle=90.0)
    assert all(kind in str(error.value) for kind in KIND_PARAMS)


def test_transform_rejects_an_unknown_parameter_naming_it_and_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown parameter 'std'") as error:
        feature_skew.transform("gaussian_noise", X, Y, PARTS, seed=0, std=0.1)
    assert "allowed: sigma" in str(error.value)


def test_transform_rejects_a_missing_required_parameter():
    with pytest.raises(ValueError, match="needs parameter.*angle"):
        feature_skew.transform("rotation", X, Y, PARTS, seed=0)


@pytest.mark.parametrize(
    ("kind", "params", "match"),
    [
        ("label_flip", {"rate": 1.5}, r"rate must lie in \[0.0, 1.0\]"),
        ("label_flip", {"rate": -0.1}, r"rate must lie in \[0.0, 1.0\]"),
        ("salt_pepper", {"rate": 2.0}, r"rate must lie in \[0.0, 1.0\]"),
        ("gaussian_noise", {"sigma": -1.0}, "sigma must lie in"),
        ("gaussian_noise", {"sigma": [0.1, 0.2]}, "sigma must be a scalar or 5 values"),
        ("label_permutation", {"num_permuted": 1}, "num_permuted must be 0 or at least 2"),
        ("label_permutation", {"num_permuted": 11}, "num_permuted must be an integer"),
        ("label_flip", {"rate": 0.1, "num_classes": 5}, r"y must lie in \[0, num_classes=5\)"),
    ],
)
def test_transforms_reject_bad_values_with_a_clear_message(kind, params, match):
    with pytest.raises(ValueError, match=match):
        feature_skew.transform(kind, X, Y, PARTS, seed=0, **params)


def test_transforms_reject_overlapping_or_out_of_range_parts():
    with pytest.raises(ValueError, match="more than one client"):
        feature_skew.gaussian_noise(X, Y, [np.arange(10), np.arange(5, 15)], seed=0)
    with pytest.raises(ValueError, match="outside"):
        feature_skew.gaussian_noise(X, Y, [np.array([1000])], seed=0)


# --- feature noise ---------------------------------------------------------------------------


def test_gaussian_noise_std_grows_linearly_with_the_client_index():
    noisy, _ = feature_skew.gaussian_noise(X, Y, PARTS, 0.2, seed=0)
    for k, part in enumerate(PARTS):
        expected = 0.2 * k / (NUM_CLIENTS - 1)
        noise = (noisy[part] - X[part]).astype(np.float64).ravel()
        if expected == 0:
            assert np.all(noise == 0)
            continue
        # The sample variance of m normals has standard error sigma^2 sqrt(2 / (m - 1)).
        tolerance = 5 * expected**2 * np.sqrt(2 / (noise.size - 1))
        assert abs(noise.var() - expected**2) < tolerance
        assert abs(noise.mean()) < 5 * expected / np.sqrt(noise.size)


def test_gaussian_noise_takes_per_client_levels():
    sigmas = [0.3, 0.0, 0.1, 0.0, 0.2]
    noisy, _ = feature_skew.gaussian_noise(X, Y, PARTS, sigmas, seed=0)
    stds = [np.std(noisy[part] - X[part]) for part in PARTS]
    np.testing.assert_allclose(stds, sigmas, atol=0.01)


def test_gaussian_noise_rejects_integer_images():
    with pytest.raises(ValueError, match="floating point"):
        feature_skew.gaussian_noise((X * 255).astype(np.uint8), Y, PARTS, seed=0)


def test_salt_pepper_corrupts_a_fraction_growing_with_the_client_index():
    noisy, _ = feature_skew.salt_pepper(X, Y, PARTS, 0.4, seed=0)
    for k, part in enumerate(PARTS):
        rate = 0.4 * k / (NUM_CLIENTS - 1)
        entries = X[part].size
        salt = np.count_nonzero(noisy[part] == 1.0)
        pepper = np.count_nonzero(noisy[part] == 0.0)
        changed = np.count_nonzero(noisy[part] != X[part])
        assert changed == salt + pepper  # X lies in [0.2, 0.8]: every hit is visible
        assert abs(salt - entries * rate / 2) <= binomial_tolerance(entries, rate / 2)
        assert abs(pepper - entries * rate / 2) <= binomial_tolerance(entries, rate / 2)


def test_salt_pepper_uses_the_given_values():
    images = np.full((20, 4, 4), 100, dtype=np.uint8)
    noisy, _ = feature_skew.salt_pepper(images, Y[:20], [np.arange(20)], [1.0], seed=0, high=255)
    assert set(np.unique(noisy).tolist()) == {0, 255}


# --- rotation --------------------------------------------------------------------------------


def test_rotation_ramps_angles_and_matches_rot90_at_right_angles():
    # Three clients, angle 180: the ramp gives 0, 90 and 180 degrees.
    parts = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    rotated, _ = feature_skew.rotation(X[:30], Y[:30], parts, 180.0, seed=0)
    np.testing.assert_array_equal(rotated[:10], X[:10])
    np.testing.assert_allclose(rotated[10:20], np.rot90(X[10:20], 1, axes=(1, 2)), atol=1e-5)
    np.testing.assert_allclose(rotated[20:30], np.rot90(X[20:30], 2, axes=(1, 2)), atol=1e-5)


def test_rotation_takes_per_client_angles_and_channels_last_images():
    images = X[:20, :, :, np.newaxis].repeat(3, axis=-1)
    parts = [np.arange(0, 10), np.arange(10, 20)]
    rotated, _ = feature_skew.rotation(images, Y[:20], parts, [270.0, -90.0], seed=0)
    expected = np.rot90(images, 3, axes=(1, 2))
    np.testing.assert_allclose(rotated, expected, atol=1e-5)


def test_rotation_keeps_the_centre_pixel_of_an_odd_image():
    images = RNG.uniform(size=(4, 9, 9)).astype(np.float32)
    rotated, _ = feature_skew.rotation(images, Y[:4], [np.arange(4)], [37.0], seed=0)
    np.testing.assert_allclose(rotated[:, 4, 4], images[:, 4, 4], rtol=1e-5)
    assert not np.allclose(rotated, images)


def test_rotation_rejects_flat_features():
    with pytest.raises(ValueError, match=r"\[N, H, W\]"):
        feature_skew.rotation(X.reshape(1000, 64), Y, PARTS, 90.0, seed=0)


# --- label noise and label preference --------------------------------------------------------


def test_label_flip_happens_at_the_requested_rate_to_other_classes():
    rate = 0.3
    _, noisy = feature_skew.label_flip(X, Y, PARTS, rate, seed=0)
    total_flips = 0
    for part in PARTS:
        flips = np.count_nonzero(noisy[part] != Y[part])
        assert abs(flips - part.size * rate) <= binomial_tolerance(part.size, rate)
        total_flips += flips
    assigned = sum(part.size for part in PARTS)
    assert abs(total_flips - assigned * rate) <= binomial_tolerance(assigned, rate)


def test_label_flip_picks_the_new_class_uniformly_among_the_others():
    y = np.zeros(20000, dtype=int)
    _, noisy = feature_skew.label_flip(None, y, [np.arange(20000)], 1.0, seed=0, num_classes=5)
    counts = np.bincount(noisy, minlength=5)
    assert counts[0] == 0
    assert np.all(np.abs(counts[1:] - 5000) <= binomial_tolerance(20000, 0.25))


def test_label_flip_takes_per_client_rates():
    rates = [0.0, 0.5, 0.0, 1.0, 0.1]
    _, noisy = feature_skew.label_flip(X, Y, PARTS, rates, seed=0)
    for part, rate in zip(PARTS, rates):
        flips = np.count_nonzero(noisy[part] != Y[part])
        assert abs(flips - part.size * rate) <= binomial_tolerance(part.size, rate)


def test_label_flip_rejects_a_single_class():
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
        feature_skew.label_flip(None, np.zeros(5, dtype=int), [np.arange(5)], 0.5, seed=0)


@pytest.mark.parametrize("num_permuted", [2, 3, 10])
def test_label_permutation_cycles_exactly_num_permuted_classes_per_client(num_permuted):
    _, relabelled = feature_skew.label_permutation(X, Y, PARTS, num_permuted, seed=0)
    cycles = []
    for part in PARTS:
        pairs = set(zip(Y[part].tolist(), relabelled[part].tolist()))
        mapping = dict(pairs)
        assert len(mapping) == len(pairs)  # a function of the old label
        moved = {old for old, new in mapping.items() if old != new}
        assert len(moved) == num_permuted
        assert {mapping[c] for c in moved} == moved  # a permutation of the moved classes
        start, steps, current = min(moved), 0, mapping[min(moved)]
        while current != start:  # ... and a single cycle through all of them
            current, steps = mapping[current], steps + 1
        assert steps == num_permuted - 1
        cycles.append(frozenset(moved))
    assert num_permuted == NUM_CLASSES or len(set(cycles)) > 1


def test_label_permutation_of_zero_classes_changes_nothing():
    _, relabelled = feature_skew.label_permutation(X, Y, PARTS, 0, seed=0)
    np.testing.assert_array_equal(relabelled, Y)
