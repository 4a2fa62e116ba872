"""Tests of fedjax_het.data.partitioners: exact cover, determinism, skew direction, guards."""

import numpy as np
import pytest

from fedjax_het.data import partitioners

NUM_CLASSES = 10
LABELS = np.random.default_rng(0).integers(NUM_CLASSES, size=5000)


def assert_exact_cover(parts: list[np.ndarray], num_examples: int) -> None:
    for part in parts:
        assert part.dtype == np.int64
    assigned = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(assigned), np.arange(num_examples))


def assert_same_split(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for part_a, part_b in zip(a, b):
        np.testing.assert_array_equal(part_a, part_b)


def mean_js_distance_to_global(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean Jensen-Shannon divergence (nats) of each client's label distribution to the pooled one."""
    counts = partitioners.label_histogram(parts, labels, NUM_CLASSES).astype(np.float64)
    client = counts / counts.sum(axis=1, keepdims=True)
    pooled = np.broadcast_to(counts.sum(axis=0) / counts.sum(), client.shape)
    middle = (client + pooled) / 2

    def kl_to_middle(p: np.ndarray) -> np.ndarray:
        ratio = np.divide(p, middle, out=np.ones_like(p), where=p > 0)
        return (p * np.log(ratio)).sum(axis=1)

    return float(np.mean((kl_to_middle(client) + kl_to_middle(pooled)) / 2))


def test_iid_covers_every_example_once_in_equal_sizes():
    parts = partitioners.iid(1003, 10, seed=0)
    assert_exact_cover(parts, 1003)
    assert {part.size for part in parts} == {100, 101}


def test_iid_is_deterministic_in_seed():
    assert_same_split(partitioners.iid(500, 7, seed=3), partitioners.iid(500, 7, seed=3))
    assert not np.array_equal(
        partitioners.iid(500, 7, seed=3)[0], partitioners.iid(500, 7, seed=4)[0]
    )


def test_iid_rejects_no_clients():
    with pytest.raises(ValueError, match="num_clients"):
        partitioners.iid(10, 0, seed=0)


@pytest.mark.parametrize("beta", [0.1, 1.0, 100.0, float("inf")])
def test_dirichlet_covers_every_example_once(beta):
    parts = partitioners.dirichlet_label_skew(LABELS, 20, beta, seed=0)
    assert len(parts) == 20
    assert_exact_cover(parts, LABELS.size)


def test_dirichlet_is_deterministic_in_seed():
    split = partitioners.dirichlet_label_skew(LABELS, 20, 0.5, seed=1)
    assert_same_split(split, partitioners.dirichlet_label_skew(LABELS, 20, 0.5, seed=1))
    other = partitioners.dirichlet_label_skew(LABELS, 20, 0.5, seed=2)
    assert not all(np.array_equal(a, b) for a, b in zip(split, other))


def test_dirichlet_indices_within_a_client_are_shuffled():
    client = partitioners.dirichlet_label_skew(LABELS, 5, 1.0, seed=0)[0]
    assert not np.all(np.diff(client) > 0)


def test_smaller_beta_gives_more_label_skew():
    distances = [
        mean_js_distance_to_global(
            partitioners.dirichlet_label_skew(LABELS, 20, beta, seed=0), LABELS
        )
        for beta in (0.1, 1.0, 100.0)
    ]
    assert distances[0] > distances[1] > distances[2]
    assert distances[2] < 0.01


def test_infinite_beta_gives_every_client_an_equal_share_of_every_class():
    parts = partitioners.dirichlet_label_skew(LABELS, 10, float("inf"), seed=0)
    counts = partitioners.label_histogram(parts, LABELS, NUM_CLASSES)
    class_totals = np.bincount(LABELS, minlength=NUM_CLASSES)
    assert np.all(np.abs(counts - class_totals / 10) <= 1)


def test_dirichlet_min_size_guard_redraws_until_every_client_is_large_enough():
    unguarded = partitioners.dirichlet_label_skew(LABELS, 20, 0.1, seed=0, min_size=0)
    guarded = partitioners.dirichlet_label_skew(LABELS, 20, 0.1, seed=0, min_size=50)
    assert min(part.size for part in unguarded) < 50
    assert min(part.size for part in guarded) >= 50


def test_dirichlet_raises_naming_min_size_when_it_cannot_be_met():
    labels = np.arange(500) % 10
    with pytest.raises(ValueError, match="min_size=10") as error:
        partitioners.dirichlet_label_skew(labels, 50, 0.001, seed=0, min_size=10, max_tries=5)
    assert "50 clients" in str(error.value)


def test_dirichlet_rejects_more_required_examples_than_exist():
    with pytest.raises(ValueError, match="min_size"):
        partitioners.dirichlet_label_skew(np.zeros(99, dtype=int), 10, 1.0, seed=0)


@pytest.mark.parametrize(
    ("labels", "num_clients", "beta", "argument"),
    [
        (LABELS, 10, 0.0, "beta"),
        (LABELS, 10, -1.0, "beta"),
        (LABELS, 10, float("nan"), "beta"),
        (LABELS, 0, 1.0, "num_clients"),
        (LABELS.reshape(50, 100), 10, 1.0, "labels"),
        (LABELS.astype(np.float32), 10, 1.0, "labels"),
        (LABELS - 1, 10, 1.0, "labels"),
    ],
)
def test_dirichlet_rejects_invalid_arguments(labels, num_clients, beta, argument):
    with pytest.raises(ValueError, match=argument):
        partitioners.dirichlet_label_skew(labels, num_clients, beta, seed=0)


def test_split_like_covers_every_test_example_once():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.3, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=2000)
    test_parts = partitioners.split_like(train_parts, LABELS, test_labels, seed=0)
    assert len(test_parts) == 20
    assert_exact_cover(test_parts, test_labels.size)


def test_split_like_is_deterministic_in_seed():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.3, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=2000)
    split = partitioners.split_like(train_parts, LABELS, test_labels, seed=5)
    assert_same_split(split, partitioners.split_like(train_parts, LABELS, test_labels, seed=5))
    other = partitioners.split_like(train_parts, LABELS, test_labels, seed=6)
    assert not all(np.array_equal(a, b) for a, b in zip(split, other))


def test_split_like_gives_no_test_examples_of_classes_a_client_never_trained_on():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 20, 0.1, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=2000)
    test_parts = partitioners.split_like(train_parts, LABELS, test_labels, seed=0)
    train_counts = partitioners.label_histogram(train_parts, LABELS, NUM_CLASSES)
    test_counts = partitioners.label_histogram(test_parts, test_labels, NUM_CLASSES)
    assert np.any(train_counts == 0)
    assert np.all(test_counts[train_counts == 0] == 0)


def test_split_like_test_labels_follow_each_clients_train_labels():
    train_parts = partitioners.dirichlet_label_skew(LABELS, 10, 0.3, seed=0)
    test_labels = np.random.default_rng(1).integers(NUM_CLASSES, size=5000)
    test_parts = partitioners.split_like(train_parts, LABELS, test_labels, seed=0)
    train_counts = partitioners.label_histogram(train_parts, LABELS, NUM_CLASSES)
    test_counts = partitioners.label_histogram(test_parts, test_labels, NUM_CLASSES)
    for train_row, test_row in zip(train_counts, test_counts):
        assert np.corrcoef(train_row, test_row)[0, 1] > 0.9


def test_split_like_spreads_classes_nobody_trained_on_over_all_clients():
    train_labels = np.repeat([0, 1], 50)
    train_parts = [np.arange(0, 50), np.arange(50, 100)]
    test_labels = np.full(400, 2)
    test_parts = partitioners.split_like(train_parts, train_labels, test_labels, seed=0)
    assert_exact_cover(test_parts, 400)
    assert all(part.size > 150 for part in test_parts)


def test_label_histogram_counts_each_clients_labels():
    labels = np.array([0, 1, 1, 2, 2, 2])
    counts = partitioners.label_histogram([np.array([0, 3]), np.array([1, 2, 4, 5])], labels, 4)
    np.testing.assert_array_equal(counts, [[1, 0, 1, 0], [0, 2, 2, 0]])


def test_label_histogram_rejects_labels_beyond_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        partitioners.label_histogram([np.array([0])], np.array([0, 5]), 3)
