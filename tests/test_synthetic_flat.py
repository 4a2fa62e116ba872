"""Tests of fedjax_het.data.synthetic_flat: LEAF Synthetic(alpha, beta) drawn under jit.

Its draws are not leaf_synthetic's, so the checks are distributional, against the closed forms
of FedProx §5.1 (sizes, feature means, model means, labels) and against leaf_synthetic itself
(two-sample tests), plus exact ones: a client's rows do not depend on the block size or on the
population, and train and test are disjoint rows of the same clients.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_het import rng
from fedjax_het.data.synthetic import leaf_synthetic
from fedjax_het.data.synthetic_flat import client_models, leaf_synthetic_flat

N, D, C = 2000, 8, 4
OPTIONS = {
    "alpha": 0.5,
    "beta": 2.0,
    "num_features": D,
    "num_classes": C,
    "size_mean": 3.0,
    "size_sigma": 0.5,
}
SEED = 3


@pytest.fixture(scope="module")
def train():
    return leaf_synthetic_flat(N, seed=SEED, block=512, **OPTIONS)


@pytest.fixture(scope="module")
def test_split():
    return leaf_synthetic_flat(N, seed=SEED, block=512, split="test", **OPTIONS)


@pytest.fixture(scope="module")
def models():
    ids = jnp.arange(N, dtype=jnp.int32)
    w, b, v = client_models(rng.seed_key(SEED), ids, 0.5, 2.0, D, C, False)
    return np.asarray(w, np.float64), np.asarray(b, np.float64), np.asarray(v, np.float64)


def within(value: float, expected: float, standard_error: float) -> bool:
    return abs(value - expected) <= 5 * standard_error


def test_layout_dtypes_and_the_test_split_rule(train, test_split):
    for split in (train, test_split):
        assert split.x.dtype == np.float32 and split.y.dtype == np.int32
        assert split.x.shape == (int(split.count.sum()), D)
        np.testing.assert_array_equal(split.offset[1:], np.cumsum(split.count)[:-1])
        assert split.offset[0] == 0 and 0 <= split.y.min() and split.y.max() < C
    sizes = train.count + test_split.count
    expected_test = np.minimum(sizes - 1, np.maximum(1, [round(0.2 * s) for s in sizes]))
    np.testing.assert_array_equal(test_split.count, expected_test)


def test_sizes_follow_the_rounded_lognormal(train, test_split):
    # P(size <= s) = P(10 + rint(L) <= s) = P(L < s - 9.5) = Phi((log(s - 9.5) - 3) / 0.5).
    sizes = train.count + test_split.count
    assert sizes.min() >= 10
    for s in (20, 25, 30, 40, 60):
        p = stats.norm.cdf((np.log(s - 9.5) - 3.0) / 0.5)
        assert within(np.mean(sizes <= s), p, np.sqrt(p * (1 - p) / N)), s


@pytest.mark.parametrize("split_name", ["train", "test"])
def test_rows_are_the_clients_feature_mean_plus_scaled_unit_noise(
    split_name, train, test_split, models
):
    split = train if split_name == "train" else test_split
    owner = split.client_ids
    z = (split.x - models[2][owner]) / np.arange(1, D + 1) ** -0.6
    n = z.shape[0]
    for j in range(D):
        assert within(z[:, j].mean(), 0.0, 1 / np.sqrt(n)), j
        assert within(z[:, j].var(), 1.0, np.sqrt(2 / n)), j
    assert abs(np.corrcoef(z[:, 0], z[:, 1])[0, 1]) <= 5 / np.sqrt(n)


def test_model_and_feature_means_spread_as_alpha_and_beta(models):
    # W_k = u_k + N(0,1), b_k = u_k + N(0,1), u_k ~ N(0, alpha^2); v_k = B_k + N(0,1),
    # B_k ~ N(0, beta^2): var(mean W_k) = alpha^2 + 1/(C d), cov(mean W_k, mean b_k) = alpha^2,
    # var(mean v_k) = beta^2 + 1/d, var(v_kj) = beta^2 + 1.
    w, b, v = models
    mean_w, mean_b, mean_v = w.mean(axis=(1, 2)), b.mean(axis=1), v.mean(axis=1)
    for value, variance in (
        (mean_w.var(), 0.25 + 1 / (C * D)),
        (mean_v.var(), 4.0 + 1 / D),
        (v[:, 0].var(), 5.0),
    ):
        assert within(value, variance, variance * np.sqrt(2 / N))
    assert within(np.cov(mean_w, mean_b)[0, 1], 0.25, np.sqrt(0.3 * 0.5 / N))


def test_labels_are_the_argmax_of_the_clients_own_model(train, models):
    w, b, _ = models
    owner = train.client_ids
    logits = np.einsum("rd,rcd->rc", train.x.astype(np.float64), w[owner]) + b[owner]
    disagree = train.y != logits.argmax(axis=1)
    ordered = np.sort(logits, axis=1)
    gap = ordered[:, -1] - ordered[:, -2]
    assert disagree.mean() <= 1e-3
    assert np.all(gap[disagree] <= 1e-4 * np.abs(ordered[disagree, -1]).clip(1.0))


def majority_share(y: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per client, the share of its examples with its most common label."""
    starts = np.concatenate([[0], np.cumsum(count)[:-1]])
    return np.array([np.bincount(y[s : s + n]).max() / n for s, n in zip(starts, count)])


def test_same_distribution_as_leaf_synthetic_and_the_check_can_tell_beta(train):
    flat = majority_share(train.y, train.count)

    def reference(beta: float) -> tuple[np.ndarray, np.ndarray]:
        data = leaf_synthetic(N, seed=0, **{**OPTIONS, "beta": beta})
        count = np.array([y.size for y in data.train_y])
        return majority_share(np.concatenate(data.train_y), count), count

    same, same_count = reference(2.0)
    assert stats.ks_2samp(flat, same).pvalue > 1e-3
    assert stats.ks_2samp(train.count, same_count).pvalue > 1e-3
    other, _ = reference(0.5)
    assert stats.ks_2samp(flat, other).pvalue < 1e-6


def test_a_clients_rows_do_not_depend_on_block_size_or_population(train):
    small = leaf_synthetic_flat(300, seed=SEED, block=37, **OPTIONS)
    rows = int(small.count.sum())
    np.testing.assert_array_equal(small.count, train.count[:300])
    np.testing.assert_array_equal(small.x, train.x[:rows])
    np.testing.assert_array_equal(small.y, train.y[:rows])
    other = leaf_synthetic_flat(300, seed=SEED + 1, block=37, **OPTIONS)
    assert not np.array_equal(other.x[:10], small.x[:10])


def test_iid_shares_one_model_and_centres_the_features():
    options = {**OPTIONS, "alpha": 0.0, "beta": 0.0}
    data = leaf_synthetic_flat(400, seed=SEED, iid=True, block=512, **options)
    w, b, v = client_models(rng.seed_key(SEED), jnp.arange(2), 0.0, 0.0, D, C, True)
    np.testing.assert_array_equal(w[0], w[1])
    assert not np.any(np.asarray(v))
    logits = data.x.astype(np.float64) @ np.asarray(w[0], np.float64).T + np.asarray(b[0])
    assert np.mean(data.y == logits.argmax(axis=1)) >= 0.999
    assert np.all(np.abs(data.x.mean(axis=0)) <= 5 / np.sqrt(data.x.shape[0]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_clients": 0}, "num_clients must be >= 1"),
        ({"split": "val"}, "split must be one of"),
        ({"block": 0}, "block must be >= 1"),
        ({"iid": True}, "iid=True is the alpha = beta = 0 variant"),
        ({"size_mean": 60.0}, "more than int32 offsets address"),
    ],
)
def test_bad_arguments_raise_one_line(overrides, message):
    arguments = {"num_clients": 10, "seed": 0, **OPTIONS, **overrides}
    with pytest.raises(ValueError, match=message) as error:
        leaf_synthetic_flat(**arguments)
    assert "\n" not in str(error.value)
