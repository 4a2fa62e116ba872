"""A stratified Fashion-MNIST subset shipped with the package.

Fashion-MNIST: Han Xiao, Kashif Rasul, Roland Vollgraf, "Fashion-MNIST: a Novel Image Dataset
for Benchmarking Machine Learning Algorithms", arXiv:1708.07747 (2017); MIT licence, Copyright (c)
2017 Zalando SE. The subset in ``assets/fashion_mnist_subset.npz`` holds 1,320 training images per
class drawn from the 60,000-image train set and 500 test images per class from the 10,000-image
test set, built by ``experiments/build_fashion_mnist_subset.py`` from Debian's
``dataset-fashion-mnist`` package; ``assets/README.md`` gives its provenance, checksum and licence.
"""

from __future__ import annotations

import functools
import importlib.resources

import numpy as np

CLASS_NAMES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_ASSET = "fashion_mnist_subset.npz"


@functools.cache
def _load() -> tuple[tuple[str, np.ndarray], ...]:
    path = importlib.resources.files("fedjax_het.data") / "assets" / _ASSET
    with path.open("rb") as f, np.load(f, allow_pickle=False) as npz:
        raw = {key: npz[key] for key in ("x_train", "y_train", "x_test", "y_test")}
    out = {}
    for split in ("train", "test"):
        x = raw[f"x_{split}"].astype(np.float32)[..., np.newaxis] / np.float32(255.0)
        out[f"x_{split}"] = x
        out[f"y_{split}"] = raw[f"y_{split}"].astype(np.int32)
    for array in out.values():
        array.flags.writeable = False
    return tuple(out.items())


def load_fashion_mnist_subset() -> dict[str, np.ndarray]:
    """Loads the shipped Fashion-MNIST subset (read once, then cached).

    Returns:
      A new dict on every call, over the same cached read-only arrays:
      ``x_train`` float32 ``[13200, 28, 28, 1]`` and ``x_test`` float32 ``[5000, 28, 28, 1]``,
      pixel values in [0, 1]; ``y_train`` int32 ``[13200]`` and ``y_test`` int32 ``[5000]``,
      labels 0..9 indexing ``CLASS_NAMES``. Each split is shuffled and has equally many examples
      of every class.
    """
    return dict(_load())
