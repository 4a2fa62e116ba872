"""Tests of fedjax_het.data.synthetic: LEAF Synthetic(alpha, beta) shapes, determinism, skew."""

import numpy as np
import pytest

from fedjax_het.data import synthetic


def mean_client_label_entropy(labels_per_client: list[np.ndarray], num_classes: int) -> float:
    """Mean over clients of the entropy (nats) of the client's label distribution."""
    entropies = []
    for labels in labels_per_client:
        shares = np.bincount(labels, minlength=num_classes) / labels.size
        shares = shares[shares > 0]
        entropies.append(-(shares * np.log(shares)).sum())
    return float(np.mean(entropies))


def test_shapes_dtypes_and_label_range():
    data = synthetic.leaf_synthetic(
        12, alpha=0.5, beta=0.5, seed=0, num_features=7, num_classes=4, test_fraction=0.25
    )
    assert data.num_clients == 12
    for field in (data.train_x, data.train_y, data.test_x, data.test_y):
        assert len(field) == 12
    for train_x, train_y, test_x, test_y in zip(
        data.train_x, data.train_y, data.test_x, data.test_y
    ):
        assert train_x.dtype == test_x.dtype == np.float32
        assert train_y.dtype == test_y.dtype == np.int32
        assert train_x.shape == (train_y.size, 7)
        assert test_x.shape == (test_y.size, 7)
        assert test_y.size >= 1 and train_y.size >= 1
        assert abs(test_y.size - 0.25 * (train_y.size + test_y.size)) <= 1
        for labels in (train_y, test_y):
            assert labels.min() >= 0 and labels.max() < 4


def test_default_sizes_have_a_median_near_65_and_a_heavy_tail():
    data = synthetic.leaf_synthetic(300, alpha=0.0, beta=0.0, seed=0, num_features=2)
    sizes = np.array([x.shape[0] + t.shape[0] for x, t in zip(data.train_x, data.test_x)])
    assert sizes.min() >= 10
    assert 50 <= np.median(sizes) <= 80
    assert sizes.max() > 4 * np.median(sizes)


def test_same_seed_gives_identical_data_and_different_seed_does_not():
    first = synthetic.leaf_synthetic(5, alpha=1.0, beta=1.0, seed=3)
    again = synthetic.leaf_synthetic(5, alpha=1.0, beta=1.0, seed=3)
    other = synthetic.leaf_synthetic(5, alpha=1.0, beta=1.0, seed=4)
    for field in ("train_x", "train_y", "test_x", "test_y"):
        for a, b in zip(getattr(first, field), getattr(again, field)):
            np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first.train_x[0][:5], other.train_x[0][:5])


def test_larger_beta_concentrates_each_clients_labels():
    entropy_at_beta_0 = mean_client_label_entropy(
        synthetic.leaf_synthetic(50, alpha=0.0, beta=0.0, seed=0).train_y, 10
    )
    entropy_at_beta_5 = mean_client_label_entropy(
        synthetic.leaf_synthetic(50, alpha=0.0, beta=5.0, seed=0).train_y, 10
    )
    assert entropy_at_beta_5 < entropy_at_beta_0 - 0.1


def test_non_iid_clients_hold_far_fewer_classes_than_iid_clients():
    non_iid = synthetic.leaf_synthetic(50, alpha=0.0, beta=0.0, seed=0)
    iid = synthetic.leaf_synthetic(50, alpha=0.0, beta=0.0, seed=0, iid=True)
    assert (
        mean_client_label_entropy(iid.train_y, 10)
        > mean_client_label_entropy(non_iid.train_y, 10) + 0.5
    )


def test_alpha_shifts_every_logit_equally_so_labels_do_not_depend_on_it():
    small = synthetic.leaf_synthetic(20, alpha=0.0, beta=1.0, seed=0)
    large = synthetic.leaf_synthetic(20, alpha=10.0, beta=1.0, seed=0)
    for a, b in zip(small.train_y + small.test_y, large.train_y + large.test_y):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("overrides", "argument"),
    [
        ({"num_clients": 0}, "num_clients"),
        ({"alpha": -0.1}, "alpha"),
        ({"beta": -1.0}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"num_classes": 1}, "num_classes"),
        ({"min_size": 1}, "min_size"),
        ({"iid": True}, "iid"),
    ],
)
def test_invalid_arguments_raise(overrides, argument):
    arguments = {"num_clients": 3, "alpha": 0.5, "beta": 0.5, "seed": 0} | overrides
    with pytest.raises(ValueError, match=argument):
        synthetic.leaf_synthetic(**arguments)
