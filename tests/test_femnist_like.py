"""The FEMNIST-shaped generated data: shapes, determinism, ragged writers, learnable classes,
bad options refused, and its name in the config."""

import numpy as np
import pytest

from fedjax_het.data import catalog
from fedjax_het.data.femnist_like import NUM_CLASSES, femnist_like
from fedjax_het.front import config
from fedjax_het.schema import ConfigError


@pytest.fixture(scope="module")
def data():
    return femnist_like(40, seed=3)


def test_shapes_classes_and_splits(data):
    assert data.num_clients == 40 and data.num_classes == NUM_CLASSES == 62
    for split in (data.train, data.test):
        assert split.x.shape[1:] == (28, 28, 1) and split.x.dtype == np.float32
        assert split.y.dtype == np.int32 and 0 <= split.y.min() and split.y.max() < 62
        assert np.all(np.isfinite(split.x))
        np.testing.assert_array_equal(split.offset[1:], np.cumsum(split.count)[:-1])
        assert split.count.sum() == split.x.shape[0]
    total = data.train.count + data.test.count
    assert np.all(data.test.count >= 1) and np.all(data.train.count >= 1)
    # a tenth of each writer's images, rounded, is its test split
    np.testing.assert_array_equal(data.test.count, np.maximum(1, np.rint(0.1 * total)))


def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(data):
    again = femnist_like(40, seed=3)
    for a, b in ((data.train, again.train), (data.test, again.test)):
        for field in ("x", "y", "offset", "count"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(femnist_like(40, seed=4).train.y[:50], data.train.y[:50])


def test_writers_are_ragged_like_leaf():
    sizes = femnist_like(400, seed=0, noise=0.0).train.count
    # LogNormal with mean 220 (train + test) and a coefficient of variation of 0.4
    assert 170 < sizes.mean() < 225 and 0.25 < sizes.std() / sizes.mean() < 0.55
    assert sizes.min() < 0.6 * sizes.mean() < 1.6 * sizes.mean() < sizes.max()


def test_classes_are_learnable_by_their_nearest_prototype(data):
    """Without a writer's shift, each image is nearest its own class's mean image."""
    plain = femnist_like(40, seed=3, shift=0)
    x, y = plain.train.x.reshape(-1, 784), plain.train.y
    means = np.stack([x[y == c].mean(0) if np.any(y == c) else np.zeros(784) for c in range(62)])
    xt, yt = plain.test.x.reshape(-1, 784), plain.test.y
    nearest = np.argmin(((xt[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert np.mean(nearest == yt) > 0.5  # chance is 1/62


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("num_clients", 0, "num_clients must be >= 1, got 0"),
        ("min_size", 1, "min_size must be >= 2"),
        ("mean_size", 5.0, "mean_size must be >= min_size (10), got 5.0"),
        ("test_fraction", 1.0, "test_fraction must be in (0, 1), got 1.0"),
        ("shift", 14, "shift must be in [0, 13], got 14"),
        ("noise", float("nan"), "noise must be >= 0, got nan"),
    ],
)
def test_bad_sizes_and_options_are_refused_in_one_line(option, value, message):
    kwargs = {"num_clients": 3, option: value}
    with pytest.raises(ValueError) as error:
        femnist_like(**kwargs)
    assert str(error.value).startswith(f"femnist_like: {message}")
    assert "\n" not in str(error.value)


def test_selectable_by_name_from_a_config():
    assert "femnist_like" in catalog.NATURAL
    exp = config.build(config.load(None, [
        'data.name = "femnist_like"', "data.num_clients = 12", 'model.name = "femnist_cnn"',
    ]))  # fmt: skip
    assert exp.data.name == "femnist_like" and exp.data.num_clients == 12
    assert exp.data.example_shape == (28, 28, 1) and exp.data.num_classes == 62
    with pytest.raises(ConfigError, match="num_clients"):
        config.build(config.load(None, ['data.name = "femnist_like"', "data.num_clients = -1"]))
