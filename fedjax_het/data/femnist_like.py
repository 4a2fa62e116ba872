"""FEMNIST-shaped data generated at run time: 28x28x1 images of 62 classes held by 3,400
writers with LEAF-like ragged sizes, from the seed alone (no download).

The shape of TensorFlow Federated's EMNIST-62 (the data of FedJAX's EMNIST benchmark:
3,400 writers, 671,585 training and 77,483 test images, about 198 and 23 a writer), built
so that a CNN learns it and a writer's images differ from another's as handwriting does:

    prototype_c = a smooth random image (white noise blurred by a Gaussian of ``blur``
                  pixels), scaled to zero mean and unit variance, for class c < 62
    writer k:     a shift s_k (whole pixels, each axis uniform in [-shift, shift]), a contrast
                  a_k ~ U(1 - contrast, 1 + contrast), a brightness b_k ~ N(0, brightness^2),
                  class proportions q_k ~ Dirichlet(concentration * p), p the class shares
                  (digits ``digit_weight`` times as common as each letter, as in EMNIST)
    example:      y ~ q_k,  x = a_k roll(prototype_y, s_k) + b_k + N(0, noise^2) per pixel

Writer sizes: ``round(LogNormal)`` with the given mean and coefficient of variation, at
least ``min_size``; a tenth of each writer's images (at least one) is its test split.
The real FEMNIST, where a user has it, loads with ``data.name = "leaf"``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import numpy as np

from fedjax_het.data.federated import ClientArrays, FederatedData

SHAPE = (28, 28, 1)
NUM_CLASSES = 62  # 10 digits, 26 upper-case and 26 lower-case letters
DIGITS = 10


def prototypes(rng: np.random.Generator, blur: float) -> np.ndarray:
    """``[62, 28, 28]`` smooth zero-mean unit-variance images: white noise blurred by a
    Gaussian of ``blur`` pixels (a product of 1-D blurs, done in the Fourier domain)."""
    noise = rng.standard_normal((NUM_CLASSES, *SHAPE[:2]))
    freq = np.fft.fftfreq(SHAPE[0])
    gain = np.exp(-2.0 * (np.pi * blur * freq) ** 2)
    smooth = np.fft.ifft2(np.fft.fft2(noise) * np.outer(gain, gain)).real
    smooth -= smooth.mean(axis=(1, 2), keepdims=True)
    return smooth / smooth.std(axis=(1, 2), keepdims=True)


def writer_sizes(
    rng: np.random.Generator, num_clients: int, mean_size: float, size_cv: float, min_size: int
) -> np.ndarray:
    """``[num_clients]`` examples per writer: LogNormal with mean ``mean_size`` and
    coefficient of variation ``size_cv``, rounded, at least ``min_size``."""
    sigma = np.sqrt(np.log1p(size_cv**2))
    sizes = rng.lognormal(np.log(mean_size) - sigma**2 / 2, sigma, num_clients)
    return np.maximum(np.rint(sizes), min_size).astype(np.int64)


def femnist_like(
    num_clients: int = 3400,
    *,
    seed: int = 0,
    mean_size: float = 220.0,
    size_cv: float = 0.4,
    min_size: int = 10,
    test_fraction: float = 0.1,
    noise: float = 1.0,
    shift: int = 2,
    contrast: float = 0.4,
    brightness: float = 0.3,
    concentration: float = 20.0,
    digit_weight: float = 3.0,
    blur: float = 1.5,
) -> FederatedData:
    """Generates the dataset of the module docstring.

    Args:
      num_clients: writers, >= 1 (3,400 as in TFF's EMNIST-62).
      seed: seed of ``np.random.default_rng``: the same seed, the same bytes.
      mean_size, size_cv, min_size: the writers' sizes (train and test together); the
        defaults give about 198 training images a writer, as TFF's EMNIST.
      test_fraction: each writer's share of test images, in (0, 1); at least one each.
      noise: per-pixel noise standard deviation, >= 0.
      shift: most pixels a writer's images are shifted along each axis, in [0, 13].
      contrast, brightness: spread of the writers' contrast (in [0, 1)) and brightness (>= 0).
      concentration: how close a writer's class shares stay to the global ones (> 0).
      digit_weight: how much more common each digit is than each letter (> 0).
      blur: the prototypes' smoothness in pixels (> 0).

    Raises:
      ValueError: (one line) a size or option out of range.
    """
    _check(locals())
    rng = np.random.default_rng(seed)
    protos = prototypes(rng, blur).astype(np.float32)
    sizes = writer_sizes(rng, num_clients, mean_size, size_cv, min_size)
    tests = np.minimum(sizes - 1, np.maximum(1, np.rint(test_fraction * sizes))).astype(np.int32)
    train, test = _empty(sizes - tests), _empty(tests)
    style = _Style(protos, seed, noise, shift, contrast, brightness, concentration, digit_weight)
    blocks = np.array_split(np.arange(num_clients), min(num_clients, 8 * (os.cpu_count() or 1)))
    with concurrent.futures.ThreadPoolExecutor() as pool:  # numpy fills without the GIL
        list(pool.map(lambda block: style.write(block, train, test), blocks))
    return FederatedData(train, test, NUM_CLASSES, name="femnist_like")


def _empty(count: np.ndarray) -> ClientArrays:
    """A split of ``count[k]`` rows a writer, to be written in place."""
    offset = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int32)
    total = int(count.sum())
    return ClientArrays(
        np.empty((total, *SHAPE), np.float32), np.empty(total, np.int32), offset,
        count.astype(np.int32),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Style:
    """How writers draw their images (the module docstring's writer and example lines)."""

    protos: np.ndarray
    seed: int
    noise: float
    shift: int
    contrast: float
    brightness: float
    concentration: float
    digit_weight: float

    def write(self, writers: np.ndarray, train: ClientArrays, test: ClientArrays) -> None:
        """Draws each of ``writers`` from its own generator (seeded by the seed and its id, so
        the bytes do not depend on the threads) into its rows of ``train`` and ``test``."""
        shares = np.where(np.arange(NUM_CLASSES) < DIGITS, self.digit_weight, 1.0)
        shares /= shares.sum()
        for k in writers.tolist():
            rng = np.random.default_rng((self.seed, k))
            dy, dx = rng.integers(-self.shift, self.shift + 1, 2)
            scale = rng.uniform(1 - self.contrast, 1 + self.contrast)
            offset = np.float32(self.brightness * rng.standard_normal())
            rolled = np.roll(scale * self.protos + offset, (int(dy), int(dx)), axis=(1, 2))
            classes = rng.dirichlet(self.concentration * shares)
            for split in (train, test):
                begin, size = int(split.offset[k]), int(split.count[k])
                rows = split.x[begin : begin + size, ..., 0]
                labels = rng.choice(NUM_CLASSES, size, p=classes)
                rng.standard_normal(rows.shape, dtype=np.float32, out=rows)
                rows *= np.float32(self.noise)
                rows += rolled[labels]
                split.y[begin : begin + size] = labels


def _check(arguments: dict) -> None:
    """A one-line ValueError for the first of ``femnist_like``'s ``arguments`` out of range."""
    a, min_size = arguments, arguments["min_size"]
    ranges = [
        ("num_clients", a["num_clients"] >= 1, ">= 1"),
        ("min_size", min_size >= 2, ">= 2 (one training and one test image)"),
        ("mean_size", a["mean_size"] >= min_size, f">= min_size ({min_size})"),
        ("size_cv", a["size_cv"] >= 0, ">= 0"),
        ("test_fraction", 0 < a["test_fraction"] < 1, "in (0, 1)"),
        ("noise", a["noise"] >= 0, ">= 0"),
        ("shift", 0 <= a["shift"] <= 13, "in [0, 13]"),
        ("contrast", 0 <= a["contrast"] < 1, "in [0, 1)"),
        ("brightness", a["brightness"] >= 0, ">= 0"),
        ("concentration", a["concentration"] > 0, "> 0"),
        ("digit_weight", a["digit_weight"] > 0, "> 0"),
        ("blur", a["blur"] > 0, "> 0"),
    ]
    for name, ok, allowed in ranges:
        if not (np.isfinite(a[name]) and ok):
            raise ValueError(f"femnist_like: {name} must be {allowed}, got {a[name]}")
