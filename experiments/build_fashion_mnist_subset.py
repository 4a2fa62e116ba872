"""Build the stratified Fashion-MNIST subset shipped in ``fedjax_het/data/assets``.

Fashion-MNIST: Han Xiao, Kashif Rasul, Roland Vollgraf, "Fashion-MNIST: a Novel Image Dataset
for Benchmarking Machine Learning Algorithms", arXiv:1708.07747 (2017). MIT licence,
Copyright (c) 2017 Zalando SE.

The source is the gzipped IDX files of Debian's ``dataset-fashion-mnist`` package::

    apt-get install -y dataset-fashion-mnist
    python experiments/build_fashion_mnist_subset.py

From the 60,000-image train set it draws ``N_TRAIN_PER_CLASS`` images of every class, and from
the 10,000-image test set ``N_TEST_PER_CLASS`` of every class, without replacement, with
``np.random.default_rng(SEED)``; each split is then shuffled. The output is a zip readable with
``np.load`` holding uint8 ``x_train [n, 28, 28]``, ``y_train [n]``, ``x_test [m, 28, 28]``,
``y_test [m]`` and int32 ``source_index_train`` / ``source_index_test``, the row of each
example in its original IDX file.

The zip is written by hand rather than with ``np.savez_compressed``, which stamps every member
with the current time: here every member has a fixed timestamp and mode, so two runs give
byte-identical files (same numpy and zlib). Only numpy and the standard library are used.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

DEFAULT_SOURCE = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_OUT = (
    Path(__file__).resolve().parent.parent
    / "fedjax_het"
    / "data"
    / "assets"
    / "fashion_mnist_subset.npz"
)

SEED = 0
NUM_CLASSES = 10
N_TRAIN_PER_CLASS = 1_320
N_TEST_PER_CLASS = 500
MAX_BYTES = 8_000_000

_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # earliest date a zip can hold


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Reads one gzipped IDX file of unsigned bytes into an array of its stated shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: magic number {found:#010x}, expected {magic:#010x}")
    ndim = magic & 0xFF
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} bytes of data for shape {shape}")
    return data.reshape(shape)


def load_split(source: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Returns the uint8 images ``[N, 28, 28]`` and labels ``[N]`` of one original split."""
    images_name, labels_name = _FILES[split]
    images = read_idx(source / images_name, _IMAGES_MAGIC)
    labels = read_idx(source / labels_name, _LABELS_MAGIC)
    if images.shape[1:] != (28, 28) or images.shape[0] != labels.shape[0]:
        raise ValueError(f"{split}: images {images.shape} do not match labels {labels.shape}")
    if labels.max() >= NUM_CLASSES:
        raise ValueError(f"{split}: label {labels.max()} out of range")
    return images, labels


def stratified_indices(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Draws ``per_class`` rows of every class without replacement, then shuffles them all."""
    chosen = []
    for c in range(NUM_CLASSES):
        rows = np.flatnonzero(labels == c)
        if rows.size < per_class:
            raise ValueError(f"class {c} has {rows.size} examples, {per_class} requested")
        chosen.append(np.sort(rng.choice(rows, size=per_class, replace=False)))
    return rng.permutation(np.concatenate(chosen)).astype(np.int32)


def build_arrays(
    source: Path, n_train_per_class: int, n_test_per_class: int, seed: int = SEED
) -> dict[str, np.ndarray]:
    """The arrays of the subset, in the order they are written."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    provenance: dict[str, np.ndarray] = {}
    for split, per_class in (("train", n_train_per_class), ("test", n_test_per_class)):
        images, labels = load_split(source, split)
        index = stratified_indices(labels, per_class, rng)
        arrays[f"x_{split}"] = np.ascontiguousarray(images[index], dtype=np.uint8)
        arrays[f"y_{split}"] = np.ascontiguousarray(labels[index], dtype=np.uint8)
        provenance[f"source_index_{split}"] = index
    return arrays | provenance


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes a deflated ``.npz`` with fixed member timestamps and modes (byte-deterministic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="dir of IDX .gz files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .npz path")
    parser.add_argument("--train-per-class", type=int, default=N_TRAIN_PER_CLASS)
    parser.add_argument("--test-per-class", type=int, default=N_TEST_PER_CLASS)
    args = parser.parse_args()

    arrays = build_arrays(args.source, args.train_per_class, args.test_per_class)
    write_npz(args.out, arrays)

    size = args.out.stat().st_size
    for name, array in arrays.items():
        print(f"{name:20s} {array.dtype!s:6s} {array.shape}")
    print(f"per class: {args.train_per_class} train, {args.test_per_class} test")
    print(f"wrote {args.out} ({size:,} bytes)")
    print(f"sha256 {sha256(args.out)}")
    if size > MAX_BYTES:
        raise SystemExit(f"{args.out} is {size:,} bytes, over the {MAX_BYTES:,}-byte budget")


if __name__ == "__main__":
    main()
