"""GANDALF rebalancing: K-Means label groups, pinv augmentation counts, synthetic rows in the store.

Expected counts come from an independent float64 loop written here (per client,
per class, with ``math.log`` for the KL choice), not from the module.
"""

import math

import jax
import numpy as np
import pytest

from fedjax_het.data.federated import FederatedData
from fedjax_het.gandalf import rebalance


def reference_counts(n, mix, tau, j, cap):
    """Per-client loop of GANDALF §4.2: ``B = tau pinv(A) H``, trim to target, static top-up."""
    num_clients, num_classes = n.shape
    gan = np.zeros((num_clients, mix.shape[0], num_classes), dtype=np.int64)
    static = np.zeros((num_clients, num_classes), dtype=np.int64)
    for k in range(num_clients):
        p = [c / sum(n[k]) for c in n[k]]
        p = [0.999 * pc + 0.001 / num_classes for pc in p]
        kl = [sum(a * math.log(a / pc) for a, pc in zip(row, p) if a > 0) for row in mix]
        order = sorted(range(len(kl)), key=lambda g: (-kl[g], g))[:j]
        lack = [max(n[k]) - c for c in n[k]]
        target = [math.floor(tau * h + 0.5) for h in lack]
        a = np.array([[mix[g][c] for g in order] for c in range(num_classes)], dtype=np.float64)
        b = [max(0.0, tau * v) for v in np.linalg.pinv(a) @ np.array(lack, dtype=np.float64)]
        for c in range(num_classes):
            made = [math.floor(a[c, s] * b[s] + 0.5) for s in range(j)]
            for s in reversed(range(j)):
                cut = min(max(sum(made) - target[c], 0), made[s])
                made[s] -= cut
            for s, g in enumerate(order):
                gan[k, g, c] = made[s]
            static[k, c] = min(target[c] - sum(made), math.floor(cap * n[k][c]))
    return gan, static


def test_paper_figure_4_example():
    """4 hearts, 2 stars, no triangle; GAN1 makes stars, GAN2 triangles: B = [2, 4], tau 0.5: [1, 2]."""
    n = np.array([[4, 2, 0]])
    mix = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    full = rebalance.augmentation_counts(n, mix, tau=1.0)
    assert full.gan[0].tolist() == [[0, 2, 0], [0, 0, 4]]
    assert full.static.tolist() == [[0, 0, 0]]
    half = rebalance.augmentation_counts(n, mix, tau=0.5)
    assert half.gan[0].tolist() == [[0, 1, 0], [0, 0, 2]]
    assert half.target.tolist() == [[0, 1, 2]]


def test_static_cap_binds_at_twice_the_class_rows():
    """One uniform GAN: B = 19, 6 rows a class; class 1 lacks 3 more but holds 1 row, so 2 static."""
    counts = rebalance.augmentation_counts(np.array([[10, 1, 0]]), np.ones((1, 3)), tau=1.0)
    assert counts.gan[0, 0].tolist() == [0, 6, 6]  # class 0's 6 trimmed to its target 0
    assert counts.static.tolist() == [[0, 2, 0]]  # class 2 has no row to copy
    assert counts.target.tolist() == [[0, 9, 10]]


@pytest.mark.parametrize("tau", [1.0, 0.5, 0.07])
@pytest.mark.parametrize("j", [1, 2, 3])
def test_counts_match_reference_loop(tau, j):
    draws = np.random.default_rng(7)
    n = draws.integers(0, 40, size=(12, 5))
    n[:, 0] += 1  # every client holds a row
    n[3] = [0, 0, 30, 0, 0]  # one class only
    mix = draws.dirichlet(np.full(5, 0.5), size=3)
    mix[1] = [0.5, 0.5, 0.0, 0.0, 0.0]  # a GAN that never makes classes 2..4
    got = rebalance.augmentation_counts(n, mix, tau=tau, gans_per_client=j, static_cap=2.0)
    gan, static = reference_counts(n, mix, tau, j, 2.0)
    np.testing.assert_array_equal(got.gan, gan)
    np.testing.assert_array_equal(got.static, static)
    assert np.all(got.added <= got.target)
    assert np.all(got.static <= 2 * n)
    assert np.all(got.gan >= 0) and np.all(got.static >= 0)
    if j < 3:  # unchosen GANs make nothing
        for k in range(n.shape[0]):
            others = np.setdiff1d(np.arange(3), got.chosen[k])
            assert got.gan[k, others].sum() == 0


def test_static_only_without_gans():
    n = np.array([[5, 2, 0], [1, 1, 8]])
    counts = rebalance.augmentation_counts(n, None, tau=1.0)
    assert counts.gan.shape == (2, 0, 3)
    assert counts.static.tolist() == [[0, 3, 0], [2, 2, 0]]


def test_class_counts_match_a_loop():
    draws = np.random.default_rng(0)
    ys = [draws.integers(0, 4, size=s) for s in (3, 9, 1, 6)]
    data = FederatedData.from_client_arrays([np.zeros((len(y), 2)) for y in ys], ys, num_classes=4)
    got = rebalance.class_counts(data.train, 4)
    expected = [[int(np.sum(y == c)) for c in range(4)] for y in ys]
    assert got.tolist() == expected


def test_kmeans_groups_identical_mixes_together():
    """Three planted label mixes, four clients each (different sizes, shuffled order)."""
    prototypes = np.array([[8, 1, 1, 0], [0, 1, 1, 8], [2, 3, 3, 2]])
    draws = np.random.default_rng(3)
    planted = draws.permutation(np.repeat(np.arange(3), 4))
    scale = draws.integers(1, 5, size=planted.size)
    counts = prototypes[planted] * scale[:, None]
    for seed in range(4):
        groups = rebalance.label_groups(counts, 3, seed)
        for p in range(3):
            assert np.unique(groups[planted == p]).size == 1
        assert np.unique(groups).size == 3
        assert groups[0] == 0  # numbered by first client
        np.testing.assert_array_equal(groups, rebalance.label_groups(counts, 3, seed))


def test_kmeans_groups_noisy_mixes_by_nearest_prototype():
    prototypes = np.array([[90, 5, 5], [5, 90, 5], [5, 5, 90]])
    draws = np.random.default_rng(1)
    planted = np.repeat(np.arange(3), 5)
    counts = prototypes[planted] + draws.integers(0, 6, size=(15, 3))
    groups = rebalance.label_groups(counts, 3, seed=0)
    for p in range(3):
        assert np.unique(groups[planted == p]).size == 1
    mix = rebalance.group_mix(counts, groups)
    np.testing.assert_allclose(mix.sum(1), 1.0, rtol=0, atol=1e-12)


def fake_generator(g):
    """Rows ``[label, g, 0]`` for class ``label``: which GAN and class made a row is visible."""

    def generate(key, labels):
        del key
        labels = np.asarray(labels, dtype=np.float32)
        return np.stack([labels, np.full_like(labels, g), np.zeros_like(labels)], axis=1)

    return generate


def small_data():
    draws = np.random.default_rng(2)
    sizes, mixes = (12, 7, 20, 3), ([0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.4, 0.5, 0.1], [1, 0, 0])
    xs, ys = [], []
    for k, (size, p) in enumerate(zip(sizes, mixes)):
        y = draws.choice(3, size=size, p=p)
        xs.append(np.stack([y, np.full(size, 100 + k), np.arange(size)], axis=1).astype(np.float32))
        ys.append(y)
    test_ys = [np.array([0, 1])] * 4
    return FederatedData.from_client_arrays(
        xs, ys, test_xs=[np.zeros((2, 3))] * 4, test_ys=test_ys, num_classes=3
    )


@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_augment_keeps_real_rows_and_adds_exactly_the_counts(tau):
    data = small_data()
    n = rebalance.class_counts(data.train, 3)
    mix = np.array([[0.5, 0.5, 0.0], [0.0, 0.2, 0.8]])
    counts = rebalance.augmentation_counts(n, mix, tau=tau)
    out = rebalance.augment(
        data, counts, [fake_generator(0), fake_generator(1)], key=jax.random.key(0)
    )
    train = out.data.train
    assert out.origin.shape == (train.y.size,)
    assert out.data.test is data.test
    np.testing.assert_array_equal(train.count, data.train.count + counts.added.sum(1))
    np.testing.assert_array_equal(train.offset[1:], np.cumsum(train.count)[:-1])
    for k in range(data.num_clients):
        x_old, y_old = data.train.client(k)
        x_new, y_new = train.client(k)
        origin = out.origin[train.offset[k] : train.offset[k] + train.count[k]]
        real = len(y_old)
        np.testing.assert_array_equal(x_new[:real], x_old)
        np.testing.assert_array_equal(y_new[:real], y_old)
        assert np.all(origin[:real] == rebalance.REAL)
        assert np.all(out.synthetic[train.offset[k] : train.offset[k] + real] == 0)
        gan_rows = origin == rebalance.GAN
        static_rows = origin == rebalance.STATIC
        assert np.all(origin[real:] != rebalance.REAL)
        for g in range(2):
            for c in range(3):
                made = gan_rows & (x_new[:, 1] == g) & (y_new == c)
                assert made.sum() == counts.gan[k, g, c]
                assert np.all(x_new[made, 0] == c)
        for c in range(3):
            copies = x_new[static_rows & (y_new == c)]
            assert len(copies) == counts.static[k, c]
            assert np.all(copies[:, 1] == 100 + k)  # copied from this client's own rows
            sources = copies[:, 2].astype(int)
            assert np.all(y_old[sources] == c)
            assert np.bincount(sources).max(initial=0) <= 2  # each source at most twice
    again = rebalance.augment(
        data, counts, [fake_generator(0), fake_generator(1)], key=jax.random.key(0)
    )
    np.testing.assert_array_equal(again.data.train.x, train.x)


def test_augment_static_only_and_real_generators_shape():
    data = small_data()
    counts = rebalance.augmentation_counts(rebalance.class_counts(data.train, 3), None, tau=1.0)
    out = rebalance.augment(data, counts, None, key=jax.random.key(1))
    assert np.all(out.origin[out.synthetic] == rebalance.STATIC)
    np.testing.assert_array_equal(
        rebalance.class_counts(out.data.train, 3),
        rebalance.class_counts(data.train, 3) + counts.static,
    )


def test_bad_inputs():
    n = np.array([[3, 1], [0, 4]])
    mix = np.array([[0.5, 0.5]])
    for tau in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="tau"):
            rebalance.augmentation_counts(n, mix, tau=tau)
    with pytest.raises(ValueError, match="gans_per_client"):
        rebalance.augmentation_counts(n, mix, tau=0.5, gans_per_client=2)
    with pytest.raises(ValueError, match="gan_mix"):
        rebalance.augmentation_counts(n, np.ones((1, 3)), tau=0.5)
    with pytest.raises(ValueError, match="non-negative"):
        rebalance.augmentation_counts(np.array([[3, -1]]), mix, tau=0.5)
    with pytest.raises(ValueError, match="hold no rows"):
        rebalance.augmentation_counts(np.array([[0, 0], [1, 1]]), mix, tau=0.5)
    with pytest.raises(ValueError, match="M_g"):
        rebalance.label_groups(n, 0, seed=0)
    with pytest.raises(ValueError, match="distinct label mixes"):
        rebalance.label_groups(np.array([[3, 1], [6, 2]]), 2, seed=0)
    data = small_data()
    counts = rebalance.augmentation_counts(
        rebalance.class_counts(data.train, 3), np.ones((2, 3)), tau=1.0
    )
    with pytest.raises(ValueError, match="generators is None"):
        rebalance.augment(data, counts, None, key=jax.random.key(0))
    with pytest.raises(ValueError, match="2 GANs"):
        rebalance.augment(data, counts, [fake_generator(0)], key=jax.random.key(0))
    with pytest.raises(ValueError, match="clients"):
        rebalance.augment(
            data,
            rebalance.augmentation_counts(n, mix, tau=1.0),
            [fake_generator(0)],
            key=jax.random.key(0),
        )
