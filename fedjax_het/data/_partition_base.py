"""What every partitioner shares: the :data:`Partition` type, argument checks, cutting helpers.

Private: the public names live in :mod:`fedjax_het.data.partitioners`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Partition = list[np.ndarray]
"""One int64 array of example indices per client."""


def check_labels(labels: np.ndarray, name: str = "labels") -> np.ndarray:
    """``labels`` as a 1-D array of non-negative integers, or a ValueError naming ``name``."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{name} must be >= 0, got a label {labels.min()}")
    return labels


def check_int(value: int, name: str, minimum: int, maximum: int | None = None) -> None:
    """An integer (not a bool) in ``[minimum, maximum]``."""
    is_int = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not (is_int and minimum <= value and (maximum is None or value <= maximum)):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be an integer >= {minimum}{upper}, got {value!r}")


def count_examples(labels: np.ndarray | int) -> int:
    """N, from ``[N]`` labels (any dtype: only their number is used) or from N itself."""
    if isinstance(labels, int | np.integer) and not isinstance(labels, bool):
        if labels < 0:
            raise ValueError(f"the number of examples must be >= 0, got {labels}")
        return int(labels)
    labels = np.asarray(labels)
    if labels.ndim < 1:
        raise ValueError(f"labels must be an array of N labels or the int N, got {labels!r}")
    return labels.shape[0]


def check_num_clients(num_clients: int, num_examples: int | None = None) -> None:
    """At least one client, and (when ``num_examples`` is given) no more clients than examples."""
    check_int(num_clients, "num_clients", 1)
    if num_examples is not None and num_clients > num_examples:
        raise ValueError(
            f"num_clients={num_clients} exceeds the {num_examples} examples: some clients would "
            "hold nothing; lower num_clients"
        )


def check_concentration(beta: float, name: str = "beta") -> None:
    """A Dirichlet concentration: > 0, ``float('inf')`` allowed (the limit of equal proportions)."""
    if not beta > 0:
        raise ValueError(f"{name} must be > 0 (float('inf') for no skew), got {beta}")


def check_probability(value: float, name: str) -> None:
    """A probability or fraction in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def check_min_size(min_size: int, max_tries: int, num_clients: int, num_examples: int) -> None:
    """The guard arguments of the resampling partitioners, and that they can be met at all."""
    check_int(min_size, "min_size", 0)
    check_int(max_tries, "max_tries", 1)
    if num_clients * min_size > num_examples:
        raise ValueError(
            f"num_clients * min_size = {num_clients} * {min_size} = {num_clients * min_size} "
            f"exceeds the {num_examples} examples; lower min_size or num_clients"
        )


def min_size_error(partitioner: str, num_clients: int, min_size: int, max_tries: int) -> ValueError:
    """The error of a resampling partitioner whose ``min_size`` guard failed every try."""
    return ValueError(
        f"{partitioner} could not give every one of {num_clients} clients at least "
        f"min_size={min_size} examples in {max_tries} tries; lower min_size or the skew"
    )


def check_sizes(sizes: np.ndarray | None, num_clients: int, num_examples: int) -> np.ndarray:
    """Client sizes: given ones checked, or N split into K sizes that differ by at most one."""
    if sizes is None:
        return np.diff(np.arange(num_clients + 1, dtype=np.int64) * num_examples // num_clients)
    sizes = np.asarray(sizes)
    if sizes.shape != (num_clients,) or not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError(f"sizes must be {num_clients} integers, one per client; got {sizes!r}")
    if sizes.min() < 0 or sizes.sum() > num_examples:
        raise ValueError(
            f"sizes must be >= 0 and sum to at most the {num_examples} examples; "
            f"got sum {sizes.sum()}, min {sizes.min()}"
        )
    return sizes.astype(np.int64)


def check_partition(parts: Sequence[np.ndarray], num_examples: int, name: str) -> Partition:
    """``parts`` as int64 arrays of distinct indices in ``[0, num_examples)``."""
    if len(parts) < 1:
        raise ValueError(f"{name} must hold at least one client, got none")
    arrays = [np.asarray(part) for part in parts]
    for k, part in enumerate(arrays):
        if part.ndim != 1 or (part.size and not np.issubdtype(part.dtype, np.integer)):
            raise ValueError(f"{name}[{k}] must be a 1-D integer index array, got {part.dtype}")
        if part.size and (part.min() < 0 or part.max() >= num_examples):
            raise ValueError(f"{name}[{k}] holds indices outside [0, {num_examples})")
    flat = np.concatenate(arrays)
    if np.unique(flat).size != flat.size:
        raise ValueError(f"{name} assigns some example to more than one client (or twice)")
    return [part.astype(np.int64) for part in arrays]


def sizes_from_proportions(proportions: np.ndarray, total: int) -> np.ndarray:
    """Integer sizes summing to ``total``: the pieces between ``floor(cumsum(p) * total)``."""
    cuts = np.floor(np.cumsum(proportions) / np.sum(proportions) * total).astype(np.int64)
    cuts[-1] = total
    return np.diff(cuts, prepend=0)


def cut(order: np.ndarray, sizes: np.ndarray) -> Partition:
    """Consecutive pieces of ``order`` of the given sizes (their sum may be below its length)."""
    pieces = np.split(np.asarray(order, dtype=np.int64), np.cumsum(sizes))
    return pieces[: len(sizes)]


def group_by_owner(owner: np.ndarray, num_clients: int, rng: np.random.Generator) -> Partition:
    """Indices ``i`` grouped by ``owner[i]`` in ``[0, num_clients)``, shuffled within each client.

    Examples whose owner is negative are left out.
    """
    shuffled = rng.permutation(owner.size)
    shuffled = shuffled[owner[shuffled] >= 0]
    grouped = shuffled[np.argsort(owner[shuffled], kind="stable")]
    return cut(grouped, np.bincount(owner[shuffled], minlength=num_clients))


def call_registered(
    registry: dict[str, Callable], what: str, kind: str, args: tuple, seed: int, params: dict
) -> Any:
    """``registry[kind](*args, seed=seed, **params)`` with the kind and parameter names checked.

    The parameters a function accepts are those after its first ``len(args)`` ones, less
    ``seed``. Shared by ``partitioners.partition`` and ``feature_skew.transform``.
    """
    if kind not in registry:
        hint = difflib.get_close_matches(str(kind), registry, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(f"unknown {what} {kind!r}{suggestion}; choices: {', '.join(registry)}")
    fn = registry[kind]
    accepted = list(inspect.signature(fn).parameters.values())[len(args) :]
    accepted = [p for p in accepted if p.name != "seed"]
    allowed = [p.name for p in accepted]
    for name in params:
        if name not in allowed:
            raise ValueError(
                f"unknown parameter {name!r} for {what} {kind!r}; allowed: {', '.join(allowed)}"
            )
    required = [p.name for p in accepted if p.default is inspect.Parameter.empty]
    missing = [name for name in required if name not in params]
    if missing:
        raise ValueError(f"{what} {kind!r} needs parameter(s) {', '.join(missing)}")
    return fn(*args, seed=seed, **params)
