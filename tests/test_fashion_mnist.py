"""The shipped Fashion-MNIST subset: shapes, dtypes, stratification and provenance."""

import gzip
import hashlib
import importlib.resources
from pathlib import Path

import numpy as np
import pytest

from fedjax_het.data import fashion_mnist

N_TRAIN_PER_CLASS = 1_320
N_TEST_PER_CLASS = 500
NUM_CLASSES = 10
SHA256 = "9ccf9d94ba2c848c1aadc0194837ffe606d128b3da19d28ff6da810be1593052"
SPLITS = [("train", N_TRAIN_PER_CLASS), ("test", N_TEST_PER_CLASS)]
DEBIAN_SOURCE = Path("/usr/share/datasets/fashion-mnist")


def _asset():
    return importlib.resources.files("fedjax_het.data") / "assets" / "fashion_mnist_subset.npz"


def _raw() -> dict[str, np.ndarray]:
    with _asset().open("rb") as f, np.load(f, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return fashion_mnist.load_fashion_mnist_subset()


def test_class_names():
    assert len(fashion_mnist.CLASS_NAMES) == NUM_CLASSES
    assert fashion_mnist.CLASS_NAMES[0] == "T-shirt/top"
    assert fashion_mnist.CLASS_NAMES[9] == "Ankle boot"


def test_asset_checksum_and_size():
    blob = _asset().read_bytes()
    assert len(blob) <= 8_000_000
    assert hashlib.sha256(blob).hexdigest() == SHA256


def test_raw_arrays():
    raw = _raw()
    assert sorted(raw) == sorted(
        ["x_train", "y_train", "x_test", "y_test", "source_index_train", "source_index_test"]
    )
    for split, per_class in SPLITS:
        n = per_class * NUM_CLASSES
        assert raw[f"x_{split}"].dtype == np.uint8 and raw[f"x_{split}"].shape == (n, 28, 28)
        assert raw[f"y_{split}"].dtype == np.uint8 and raw[f"y_{split}"].shape == (n,)
        index = raw[f"source_index_{split}"]
        assert index.dtype == np.int32 and index.shape == (n,)


@pytest.mark.parametrize("split,per_class", SPLITS)
def test_shapes_dtypes_range(data, split, per_class):
    n = per_class * NUM_CLASSES
    x, y = data[f"x_{split}"], data[f"y_{split}"]
    assert x.dtype == np.float32 and x.shape == (n, 28, 28, 1)
    assert y.dtype == np.int32 and y.shape == (n,)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert x.max() == 1.0  # images use the full range, not 0..255 left unscaled
    assert y.min() >= 0 and y.max() < NUM_CLASSES


@pytest.mark.parametrize("split,per_class", SPLITS)
def test_stratified(data, split, per_class):
    counts = np.bincount(data[f"y_{split}"], minlength=NUM_CLASSES)
    np.testing.assert_array_equal(counts, np.full(NUM_CLASSES, per_class))
    # Shuffled: the first 10% of a split already holds every class.
    assert np.unique(data[f"y_{split}"][:per_class]).size == NUM_CLASSES


def test_labels_match_raw_file(data):
    raw = _raw()
    for split in ("train", "test"):
        np.testing.assert_array_equal(data[f"y_{split}"], raw[f"y_{split}"].astype(np.int32))
        np.testing.assert_array_equal(
            data[f"x_{split}"][..., 0], raw[f"x_{split}"].astype(np.float32) / 255.0
        )


def test_source_indices_unique_and_in_range():
    raw = _raw()
    for split, total in (("train", 60_000), ("test", 10_000)):
        index = raw[f"source_index_{split}"]
        assert np.unique(index).size == index.size
        assert index.min() >= 0 and index.max() < total


def test_cached_read_only(data):
    again = fashion_mnist.load_fashion_mnist_subset()
    for key, array in data.items():
        assert again[key] is array
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array.reshape(-1)[0] = 0


def _read_idx(path: Path, header: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)


@pytest.mark.skipif(not DEBIAN_SOURCE.is_dir(), reason="dataset-fashion-mnist not installed")
def test_provenance_against_debian_idx():
    raw = _raw()
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = _read_idx(DEBIAN_SOURCE / f"{prefix}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
        labels = _read_idx(DEBIAN_SOURCE / f"{prefix}-labels-idx1-ubyte.gz", 8)
        index = raw[f"source_index_{split}"]
        np.testing.assert_array_equal(images[index], raw[f"x_{split}"])
        np.testing.assert_array_equal(labels[index], raw[f"y_{split}"])
