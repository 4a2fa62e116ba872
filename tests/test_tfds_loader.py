"""Tests of fedjax_het.data.tfds: reading TFDS splits without TensorFlow, offline, and federating.

Two offline sources: ``tfds.testing.mock_data`` (random examples shaped like the registered
dataset's features, read through the real ``tfds.data_source`` call) and a tiny dataset prepared
in ``tmp_path`` by a builder defined here, whose images are PNG bytes written with Pillow, so
preparing it needs no TensorFlow either; its pixel values identify each example.
"""

import io
import sys

import numpy as np
import pytest

from fedjax_het.data import tfds as tfds_loader

NUM_TINY_CLASSES = 3
TINY_TRAIN_VALUES = [0, 17, 34, 51, 68, 85, 102, 119, 136, 153, 170, 187, 204, 221, 238, 255]
TINY_TEST_VALUES = [5, 40, 200]


def tiny_label(value: int) -> int:
    return (value // 17) % NUM_TINY_CLASSES


@pytest.fixture(scope="module")
def tfds():
    return pytest.importorskip("tensorflow_datasets")


@pytest.fixture(scope="module")
def tiny_data_dir(tfds, tmp_path_factory):
    """Prepares a 4x4 grey-scale dataset; image pixel value v (all 16 pixels) has label tiny_label(v)."""
    from PIL import Image

    def png(value: int) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(np.full((4, 4), value, np.uint8)).save(buffer, format="PNG")
        return buffer.getvalue()

    with tfds.core.registered.skip_registration():

        class FedjaxHetTinyImages(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                features = tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(shape=(4, 4, 1)),
                        "label": tfds.features.ClassLabel(num_classes=NUM_TINY_CLASSES),
                        "note": tfds.features.Text(),
                    }
                )
                return tfds.core.DatasetInfo(builder=self, features=features)

            def _split_generators(self, dl_manager):
                return {
                    "train": self._generate_examples(TINY_TRAIN_VALUES),
                    "test": self._generate_examples(TINY_TEST_VALUES),
                }

            def _generate_examples(self, values):
                for value in values:
                    yield value, {"image": png(value), "label": tiny_label(value), "note": "x"}

    data_dir = tmp_path_factory.mktemp("tfds")
    builder = FedjaxHetTinyImages(data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
    return data_dir


def load_tiny(data_dir, split, **kwargs):
    return tfds_loader.load_split(
        "fedjax_het_tiny_images", split, data_dir=data_dir, download=False, **kwargs
    )


def test_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"fedjax_het\[tfds\]"):
        tfds_loader.load_split("mnist")


def test_tiny_dataset_pixels_are_scaled_and_paired_with_their_labels(tiny_data_dir):
    train = load_tiny(tiny_data_dir, "train")
    assert train.x.dtype == np.float32 and train.x.shape == (len(TINY_TRAIN_VALUES), 4, 4, 1)
    assert train.y.dtype == np.int32 and train.num_classes == NUM_TINY_CLASSES
    values = np.rint(train.x[:, 0, 0, 0] * 255).astype(int)
    assert sorted(values.tolist()) == TINY_TRAIN_VALUES
    for k, value in enumerate(values):
        np.testing.assert_array_equal(train.x[k], np.full((4, 4, 1), value / 255, np.float32))
        assert train.y[k] == tiny_label(value)
    assert train.x.min() == 0.0 and train.x.max() == 1.0


def test_reading_needs_no_tensorflow(tiny_data_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # any `import tensorflow` now fails
    assert load_tiny(tiny_data_dir, "train").y.size == len(TINY_TRAIN_VALUES)


def test_num_examples_takes_the_first_examples(tiny_data_dir):
    everything = load_tiny(tiny_data_dir, "train")
    first = load_tiny(tiny_data_dir, "train", num_examples=5)
    np.testing.assert_array_equal(first.x, everything.x[:5])
    np.testing.assert_array_equal(first.y, everything.y[:5])
    assert load_tiny(tiny_data_dir, "test", num_examples=100).y.size == len(TINY_TEST_VALUES)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_examples": 0}, "num_examples"),
        ({"image_key": "picture"}, "image_key='picture'"),
        ({"label_key": "note"}, "ClassLabel"),
    ],
)
def test_bad_arguments_raise(tiny_data_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_tiny(tiny_data_dir, "train", **kwargs)


def test_federate_gives_each_client_its_partition(tiny_data_dir):
    train, test = load_tiny(tiny_data_dir, "train"), load_tiny(tiny_data_dir, "test")
    partition = [np.array([3, 0, 7]), np.arange(8, 16), np.array([1, 2, 4, 5, 6])]
    test_partition = [np.array([2]), np.array([], np.int64), np.array([0, 1])]
    data = tfds_loader.federate(
        train, partition, test=test, test_partition=test_partition, name="tiny"
    )
    assert data.num_clients == 3 and data.num_classes == NUM_TINY_CLASSES and data.name == "tiny"
    for k in range(3):
        x, y = data.train.client(k)
        np.testing.assert_array_equal(x, train.x[partition[k]])
        np.testing.assert_array_equal(y, train.y[partition[k]])
        x, y = data.test.client(k)
        np.testing.assert_array_equal(x, test.x[test_partition[k]])
        np.testing.assert_array_equal(y, test.y[test_partition[k]])


def test_federate_rejects_mismatched_partitions(tiny_data_dir):
    train, test = load_tiny(tiny_data_dir, "train"), load_tiny(tiny_data_dir, "test")
    with pytest.raises(ValueError, match="together"):
        tfds_loader.federate(train, [np.arange(16)], test=test)
    with pytest.raises(ValueError, match="test_partition has 1 clients"):
        tfds_loader.federate(
            train, [np.arange(8), np.arange(8, 16)], test=test, test_partition=[np.arange(3)]
        )
    with pytest.raises(ValueError, match=r"partition\[1\]"):
        tfds_loader.federate(train, [np.arange(8), np.array([16])])


@pytest.mark.parametrize(
    "name,shape,num_classes", [("mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10)]
)
def test_mock_registered_datasets_match_the_raw_data_source(tfds, name, shape, num_classes):
    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        split = tfds_loader.load_split(name, "train", num_examples=4)
        raw = tfds.data_source(name, split="train")
        expected_x = np.stack([raw[k]["image"] for k in range(4)]).astype(np.float64) / 255
        expected_y = [int(raw[k]["label"]) for k in range(4)]
    assert split.x.shape == (4, *shape) and split.x.dtype == np.float32
    np.testing.assert_allclose(split.x, expected_x, rtol=1e-6)
    assert split.y.tolist() == expected_y and split.num_classes == num_classes
