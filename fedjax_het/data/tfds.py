"""Image-classification datasets from TensorFlow Datasets (TFDS), read without TensorFlow.

Examples are read through ``tfds.data_source`` (random access to TFDS's ``array_record`` files,
decoded with NumPy and Pillow), so reading needs ``tensorflow-datasets`` but not TensorFlow.
It is an optional extra: ``pip install "fedjax_het[tfds]"``.

Preparing a dataset for the first time (``download=True`` on a fresh ``data_dir``) runs the
dataset's TFDS builder. Most image builders (MNIST, CIFAR-10, ...) encode their images as PNG
with TensorFlow, so that one step needs TensorFlow installed: run it once, e.g.
``tfds build mnist --file_format=array_record``, or copy a data directory prepared elsewhere in
the ``array_record`` format, then load with ``download=False``.

Typical use, with a partitioner from :mod:`fedjax_het.data.partitioners`::

    train = load_split("cifar10", "train")
    test = load_split("cifar10", "test")
    parts = partitioners.dirichlet_label_skew(train.y, 100, 0.3, seed=0)
    test_parts = partitioners.split_like(parts, train.y, test.y, seed=0)
    data = federate(train, parts, test=test, test_partition=test_parts, name="cifar10")
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from fedjax_het.data.federated import ClientArrays, FederatedData


@dataclasses.dataclass(frozen=True)
class ImageSplit:
    """One centralised split of an image-classification dataset.

    Attributes:
      x: ``[n, ...]`` features; :func:`load_split` gives float32
        ``[n, height, width, channels]``, pixel values scaled to [0, 1].
      y: int32 ``[n]`` labels in ``[0, num_classes)``.
      num_classes: number of classes of the dataset's label feature.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int


def load_split(
    name: str,
    split: str = "train",
    *,
    num_examples: int | None = None,
    data_dir: str | Path | None = None,
    download: bool = True,
    image_key: str = "image",
    label_key: str = "label",
) -> ImageSplit:
    """Reads one split of a TFDS image-classification dataset into NumPy arrays.

    Unsigned-integer pixels are divided by their dtype's maximum (255 for uint8); 2-D images get
    a trailing channel axis of size 1. Examples keep TFDS's stored order.

    Args:
      name: TFDS dataset name, optionally with config and version (``"mnist"``,
        ``"cifar10:3.0.2"``).
      split: TFDS split, including TFDS slicing (``"train"``, ``"test"``, ``"train[:10%]"``).
      num_examples: read only the first ``num_examples`` examples (all if the split is smaller);
        None reads the whole split.
      data_dir: TFDS data directory; None uses TFDS's default (``$TFDS_DATA_DIR`` or
        ``~/tensorflow_datasets``).
      download: prepare the dataset if it is not in ``data_dir`` (see the module docstring).
      image_key: name of the image feature.
      label_key: name of the label feature, a ``tfds.features.ClassLabel``.

    Returns:
      The split's images, labels and number of classes.
    """
    if num_examples is not None and num_examples < 1:
        raise ValueError(f"num_examples must be >= 1 or None, got {num_examples}")
    tfds = _import_tfds()
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    features = source.dataset_info.features
    for key, role in ((image_key, "image_key"), (label_key, "label_key")):
        if key not in features:
            raise ValueError(f"{role}={key!r} is not a feature of {name}; it has {list(features)}")
    num_classes = getattr(features[label_key], "num_classes", None)
    if num_classes is None:
        raise ValueError(
            f"label_key={label_key!r} of {name} is not a ClassLabel feature; pick the feature "
            "holding class labels"
        )
    total = len(source) if num_examples is None else min(num_examples, len(source))
    if total == 0:
        raise ValueError(f"split {split!r} of {name} holds no examples")
    x, y = None, np.empty(total, dtype=np.int32)
    for row in range(total):
        record = source[row]
        image = _as_unit_float(np.asarray(record[image_key]), image_key)
        if x is None:
            x = np.empty((total, *image.shape), dtype=np.float32)
        if image.shape != x.shape[1:]:
            raise ValueError(
                f"images of {name} differ in shape ({x.shape[1:]} and {image.shape} at "
                f"example {row}); only fixed-size image datasets are supported"
            )
        x[row] = image
        y[row] = int(record[label_key])
    if y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"labels of {name} leave [0, {num_classes}): [{y.min()}, {y.max()}]")
    return ImageSplit(x=x, y=y, num_classes=int(num_classes))


def federate(
    train: ImageSplit,
    partition: Sequence[np.ndarray],
    *,
    test: ImageSplit | None = None,
    test_partition: Sequence[np.ndarray] | None = None,
    name: str = "tfds",
) -> FederatedData:
    """Builds the flat federated store from centralised splits and a partition of each.

    ``catalog.federate`` ends here too, after its partitioner and feature skew.

    Args:
      train: the centralised training split.
      partition: one index array into ``train`` per client (a ``partitioners.Partition``).
      test: the centralised test split, or None for no per-client test split.
      test_partition: one index array into ``test`` per client; needed exactly when ``test`` is
        given, with as many clients as ``partition``.
      name: the dataset's name in logs.

    Returns:
      Client k's training rows are ``train.x[partition[k]]``; its test rows likewise.
    """
    if (test is None) != (test_partition is None):
        raise ValueError("pass test and test_partition together, or neither")
    if len(partition) == 0:
        raise ValueError("partition holds no clients; give at least one")
    _check_indices(partition, train.y.size, "partition")
    if test is not None:
        if len(test_partition) != len(partition):
            raise ValueError(
                f"test_partition has {len(test_partition)} clients but partition has "
                f"{len(partition)}; they must match"
            )
        if test.num_classes != train.num_classes:
            raise ValueError(
                f"test has {test.num_classes} classes but train has {train.num_classes}"
            )
        _check_indices(test_partition, test.y.size, "test_partition")
    return FederatedData(
        train=_gather(train, partition),
        test=None if test is None else _gather(test, test_partition),
        num_classes=train.num_classes,
        name=name,
    )


def _gather(split: ImageSplit, partition: Sequence[np.ndarray]) -> ClientArrays:
    """The flat store of ``split`` whose client k holds rows ``partition[k]``, in that order."""
    count = np.array([len(part) for part in partition], np.int32)
    offset = (np.cumsum(count) - count).astype(np.int32)
    order = np.concatenate(partition)
    return ClientArrays(
        x=split.x[order], y=split.y[order].astype(np.int32), offset=offset, count=count
    )


def _check_indices(partition: Sequence[np.ndarray], size: int, what: str) -> None:
    for k, part in enumerate(partition):
        part = np.asarray(part)
        in_range = part.size == 0 or (part.min() >= 0 and part.max() < size)
        if part.ndim != 1 or not np.issubdtype(part.dtype, np.integer) or not in_range:
            raise ValueError(f"{what}[{k}] must be a 1-D array of integer indices in [0, {size})")


def _as_unit_float(image: np.ndarray, image_key: str) -> np.ndarray:
    if not np.issubdtype(image.dtype, np.unsignedinteger):
        raise ValueError(
            f"feature {image_key!r} holds {image.dtype} values; only unsigned-integer images "
            "(uint8, uint16) can be scaled to [0, 1]"
        )
    if image.ndim == 2:
        image = image[..., np.newaxis]
    if image.ndim != 3:
        raise ValueError(f"feature {image_key!r} has shape {image.shape}; expected [h, w, c]")
    return image.astype(np.float32) / np.float32(np.iinfo(image.dtype).max)


def _import_tfds() -> ModuleType:
    try:
        return importlib.import_module("tensorflow_datasets")
    except ImportError as error:
        raise ImportError(
            "loading TFDS datasets needs tensorflow-datasets, an optional extra: "
            'pip install "fedjax_het[tfds]"'
        ) from error
