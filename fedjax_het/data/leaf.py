"""LEAF's FEMNIST, Shakespeare and Sent140, read from LEAF's JSON files.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", arXiv:1812.01097, 2018) writes
each dataset as ``train/*.json`` and ``test/*.json`` under one directory (LEAF's
``data/<dataset>/data``); every file holds ``users`` (ids), ``num_samples`` (one count per user)
and ``user_data`` (``{user: {"x": [...], "y": [...]}}``). Each LEAF user becomes one client, in
the order of the training files (sorted by name) and their ``users`` lists. A user with no test
file entry gets an empty test split; a user present only in the test files (LEAF's
``--t user`` split, where test users are other people) raises, since here a client's test split
belongs to the same client. With no ``test/`` directory the data has no test split.

Per dataset:

- FEMNIST: x holds 784 floats per example (row-major 28 x 28), reshaped to float32
  ``[28, 28, 1]`` images as stored: LEAF divides the 8-bit grey levels by 255 and does not
  invert them, so strokes are dark on a background near 1. y holds 62 classes in LEAF's
  numbering: 0-9 digits, 10-35 upper-case and 36-61 lower-case letters.
- Shakespeare: x holds 80-character strings, y the next character; both map to int32 ids with
  LEAF's 80-symbol vocabulary as :mod:`fedjax_het.data.shakespeare` does (any other character
  gets the one out-of-vocabulary id 80, so there are 81 classes).
- Sent140: x holds rows whose 5th field ``x[4]`` is the tweet text, y the sentiment 0 or 1.
  Text is lower-cased and split on whitespace; words map to ids with :func:`word_vocabulary`
  built from the loaded clients' training tweets (id 0 pads, id 1 is any word outside the
  vocabulary); each tweet is cut or right-padded to ``seq_len`` ids (LEAF's Sent140 models read
  25 words).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fedjax_het.data import shakespeare
from fedjax_het.data.federated import FederatedData

FEMNIST_NUM_CLASSES = 62
SENT140_PAD_ID = 0
SENT140_OOV_ID = 1

_T = TypeVar("_T")
_Encoder = Callable[[list, list], _T]  # one user's LEAF x and y lists -> a compact form
_Arrays = tuple[np.ndarray, np.ndarray]


def tokenize(text: str) -> list[str]:
    """Sent140 tokens: the lower-cased text split on whitespace.

    >>> tokenize("Good  MORNING\\tworld")
    ['good', 'morning', 'world']
    """
    return text.lower().split()


def word_vocabulary(texts: Iterable[str], max_size: int | None = None) -> list[str]:
    """Distinct tokens of ``texts``, most frequent first (ties alphabetical), at most ``max_size``.

    Word ``i`` of the list gets id ``i + 2`` in :func:`encode_words` (0 pads, 1 is out of
    vocabulary).

    >>> word_vocabulary(["b a", "a c b a"])
    ['a', 'b', 'c']
    """
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be >= 1 or None, got {max_size}")
    counts = collections.Counter(token for text in texts for token in tokenize(text))
    ranked = sorted(counts, key=lambda word: (-counts[word], word))
    return ranked if max_size is None else ranked[:max_size]


def encode_words(texts: Sequence[str], vocabulary: Sequence[str], seq_len: int) -> np.ndarray:
    """int32 ``[len(texts), seq_len]`` token ids: the first ``seq_len`` tokens, right-padded.

    >>> encode_words(["a x b", "b b b b"], ["a", "b"], 3).tolist()
    [[2, 1, 3], [3, 3, 3]]
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    word_ids = {word: index + 2 for index, word in enumerate(vocabulary)}
    encoded = np.full((len(texts), seq_len), SENT140_PAD_ID, dtype=np.int32)
    for row, text in enumerate(texts):
        tokens = tokenize(text)[:seq_len]
        encoded[row, : len(tokens)] = [word_ids.get(token, SENT140_OOV_ID) for token in tokens]
    return encoded


def load_femnist(root: str | Path, *, max_clients: int | None = None) -> FederatedData:
    """LEAF FEMNIST from ``root/train`` and ``root/test`` (module docstring gives the encoding).

    Args:
      root: the directory holding LEAF's ``train/`` and ``test/`` folders.
      max_clients: keep only the first ``max_clients`` users; None keeps all.
    """

    def encode(xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(xs, dtype=np.float32)
        if xs and x.shape != (len(xs), 28 * 28):
            raise ValueError(f"FEMNIST examples must hold 784 pixel values each, got {x.shape}")
        return x.reshape(-1, 28, 28, 1), _labels(ys, FEMNIST_NUM_CLASSES, "FEMNIST")

    train, test = _read(root, max_clients, encode)
    return _federate(train, test, FEMNIST_NUM_CLASSES, "femnist")


def load_shakespeare(root: str | Path, *, max_clients: int | None = None) -> FederatedData:
    """LEAF Shakespeare: int32 character ids ``x [n, 80]`` and next-character ids ``y [n]``.

    Characters map to ids with :func:`fedjax_het.data.shakespeare.encode` (LEAF's 80-symbol
    vocabulary, any other character to one out-of-vocabulary id; 81 classes).

    Args:
      root: the directory holding LEAF's ``train/`` and ``test/`` folders.
      max_clients: keep only the first ``max_clients`` users; None keeps all.
    """

    def encode(xs: list, ys: list) -> tuple[np.ndarray, np.ndarray]:
        if any(len(text) != shakespeare.SEQUENCE_LENGTH for text in xs):
            raise ValueError(
                f"Shakespeare x strings must hold {shakespeare.SEQUENCE_LENGTH} characters"
            )
        if any(len(char) != 1 for char in ys):
            raise ValueError("Shakespeare labels must be single characters")
        x = shakespeare.encode("".join(xs)).reshape(len(xs), shakespeare.SEQUENCE_LENGTH)
        return x, shakespeare.encode("".join(ys))

    train, test = _read(root, max_clients, encode)
    return _federate(train, test, shakespeare.NUM_CLASSES, "shakespeare")


def load_sent140(
    root: str | Path,
    *,
    max_clients: int | None = None,
    seq_len: int = 25,
    max_vocab: int | None = 10_000,
) -> FederatedData:
    """LEAF Sent140: int32 word ids ``x [n, seq_len]`` (see the module docstring), ``y`` 0 or 1.

    Args:
      root: the directory holding LEAF's ``train/`` and ``test/`` folders.
      max_clients: keep only the first ``max_clients`` users; None keeps all.
      seq_len: tokens kept per tweet; shorter tweets are right-padded with id 0.
      max_vocab: the vocabulary keeps the ``max_vocab`` most frequent training tokens (ids 2 to
        ``max_vocab + 1``); None keeps every training token.
    """

    def read_texts(xs: list, ys: list) -> tuple[list[str], np.ndarray]:
        return [_tweet_text(row) for row in xs], _labels(ys, 2, "Sent140")

    train, test = _read(root, max_clients, read_texts)
    vocabulary = word_vocabulary((text for texts, _ in train.values() for text in texts), max_vocab)

    def to_ids(users: dict[str, tuple[list[str], np.ndarray]]) -> dict[str, _Arrays]:
        return {
            user: (encode_words(texts, vocabulary, seq_len), y)
            for user, (texts, y) in users.items()
        }

    return _federate(to_ids(train), None if test is None else to_ids(test), 2, "sent140")


LOADERS: dict[str, Callable[..., FederatedData]] = {
    "femnist": load_femnist,
    "shakespeare": load_shakespeare,
    "sent140": load_sent140,
}
"""The LEAF loaders by dataset name."""


def _read(
    root: str | Path, max_clients: int | None, encode: _Encoder
) -> tuple[dict[str, _T], dict[str, _T] | None]:
    """``encode``d data of the first ``max_clients`` training users, and of their test data.

    The test dict has the same users in the same order (``encode([], [])`` for a user without
    test data), or is None when ``root`` has no ``test/`` folder.
    """
    if max_clients is not None and max_clients < 1:
        raise ValueError(f"max_clients must be >= 1 or None, got {max_clients}")
    root = Path(root)
    if not (root / "train").is_dir():
        raise ValueError(f"root must hold LEAF's train/ folder; {root / 'train'} is not a folder")
    wanted = max_clients or float("inf")
    train_users, train = _read_split(root / "train", encode, lambda user, kept: kept < wanted)
    if not (root / "test").is_dir():
        return train, None
    test_users, test = _read_split(root / "test", encode, lambda user, kept: user in train)
    only_test = sorted(set(test_users) - set(train_users))
    if only_test:
        raise ValueError(
            f"{len(only_test)} user(s) are in {root / 'test'} but not in train (first: "
            f"{only_test[:3]}); split LEAF data by sample (--t sample), not by user"
        )
    return train, {user: test[user] if user in test else encode([], []) for user in train}


def _read_split(
    directory: Path, encode: _Encoder, keep: Callable[[str, int], bool]
) -> tuple[list[str], dict[str, _T]]:
    """Every user id of a LEAF split in file order, and ``encode(x, y)`` of the kept users.

    Files are read one at a time (sorted by name) and only their encoded users are kept, so
    memory holds one file's JSON at a time. ``keep(user, number_kept_so_far)`` picks users.
    """
    files = sorted(directory.glob("*.json"))
    if not files:
        raise ValueError(f"no LEAF *.json files in {directory}")
    users: dict[str, None] = {}  # ordered set
    encoded: dict[str, _T] = {}
    for path in files:
        content = json.loads(path.read_text())
        missing = {"users", "num_samples", "user_data"} - set(content)
        if missing:
            raise ValueError(f"{path} lacks the LEAF keys {sorted(missing)}")
        if len(content["users"]) != len(content["num_samples"]):
            raise ValueError(f"{path}: users and num_samples differ in length")
        for user, num_samples in zip(content["users"], content["num_samples"]):
            if user in users:
                raise ValueError(f"user {user!r} appears twice in {directory} (again in {path})")
            users[user] = None
            examples = content["user_data"][user]
            if not len(examples["x"]) == len(examples["y"]) == num_samples:
                raise ValueError(
                    f"{path}: user {user!r} has {len(examples['x'])} x, {len(examples['y'])} y "
                    f"and num_samples {num_samples}; they must agree"
                )
            if keep(user, len(encoded)):
                encoded[user] = encode(examples["x"], examples["y"])
    return list(users), encoded


def _federate(
    train: dict[str, _Arrays], test: dict[str, _Arrays] | None, num_classes: int, name: str
) -> FederatedData:
    empty = [user for user, (_, y) in train.items() if y.size == 0]
    if empty:
        raise ValueError(f"user(s) {empty[:3]} have no training examples; every client needs one")
    train_xs, train_ys = zip(*train.values())
    test_xs = test_ys = None
    if test is not None:
        test_xs, test_ys = zip(*test.values())
    return FederatedData.from_client_arrays(
        train_xs, train_ys, test_xs=test_xs, test_ys=test_ys, num_classes=num_classes, name=name
    )


def _labels(ys: list, num_classes: int, dataset: str) -> np.ndarray:
    y = np.asarray(ys)
    valid = y.ndim == 1 and np.issubdtype(y.dtype, np.integer)
    if y.size and not (valid and 0 <= y.min() and y.max() < num_classes):
        raise ValueError(f"{dataset} labels must be integers in [0, {num_classes}), got {ys[:5]}")
    return y.astype(np.int32)


def _tweet_text(row: Any) -> str:
    if not isinstance(row, list) or len(row) < 5 or not isinstance(row[4], str):
        raise ValueError(f"Sent140 x rows must be lists whose 5th field is the text, got {row!r}")
    return row[4]
