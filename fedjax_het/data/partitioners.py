"""Partitioners: split a centralised dataset's examples over simulated clients.

Every partitioner returns a :data:`Partition`: one int64 array per client of indices into the
dataset it was given, in random order within each client. Unless its docstring says otherwise,
every example goes to exactly one client. All randomness comes from ``np.random.default_rng(seed)``,
so the same arguments give the same split.

- :func:`iid`: a uniform random split into equal sizes.
- :func:`dirichlet_label_skew`: label-distribution skew by the NIID-Bench recipe of Li, Diao,
  Chen and He, "Federated Learning on Non-IID Data Silos: An Experimental Study" (ICDE 2022),
  §III-A: for every class c draw p_c ~ Dir_K(beta) over the K clients and split class c's
  examples by p_c. Smaller beta gives more skew.
- :func:`split_like`: a test set split over the same clients so that each client's test labels
  follow its own training labels, for per-client test accuracy.

:func:`label_histogram` counts the labels each client holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Partition = list[np.ndarray]
"""One int64 array of example indices per client."""


def iid(num_examples: int, num_clients: int, *, seed: int) -> Partition:
    """Splits ``num_examples`` examples uniformly at random into ``num_clients`` clients.

    Client sizes differ by at most one; with more clients than examples some clients are empty.
    """
    _check_num_clients(num_clients)
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    order = np.random.default_rng(seed).permutation(num_examples).astype(np.int64)
    return np.array_split(order, num_clients)


def dirichlet_label_skew(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    *,
    seed: int,
    min_size: int = 10,
    max_tries: int = 100,
) -> Partition:
    """Label-skewed split by NIID-Bench's Dirichlet recipe (Li et al., ICDE 2022, §III-A).

    For every class c (in increasing label order) the class's examples are shuffled, a proportion
    vector p_c ~ Dir_K(beta) is drawn over the K clients, and the examples are cut at
    ``cumsum(p_c) * n_c`` (``np.split``), client k taking the k-th piece.

    Balancing step (as in NIID-Bench's code): before class c is cut, every client already holding
    at least N / K examples (N = ``len(labels)``) gets p_{k,c} = 0 and p_c is renormalised, so no
    client grows far past an equal share. In the rare case that p_c puts all its mass on such full
    clients, class c is split equally among the others.

    The whole split is redrawn, up to ``max_tries`` times, until every client holds at least
    ``min_size`` examples (NIID-Bench uses ``min_size=10`` and retries without limit).

    Args:
      labels: ``[N]`` non-negative integer class labels.
      num_clients: K, the number of clients.
      beta: Dirichlet concentration, > 0. Small beta (0.1) gives each client few classes; large
        beta approaches every client holding the global label distribution. ``float('inf')``
        uses equal proportions 1/K for every class (IID by class).
      seed: seed of ``np.random.default_rng``.
      min_size: fewest examples any client may hold.
      max_tries: how many times the split is drawn before giving up.

    Returns:
      K int64 index arrays into ``labels``; every example is in exactly one of them.

    Raises:
      ValueError: on invalid arguments, or if no split in ``max_tries`` tries met ``min_size``.
    """
    labels = _check_labels(labels, "labels")
    _check_num_clients(num_clients)
    if not beta > 0:
        raise ValueError(f"beta must be > 0 (float('inf') for equal proportions), got {beta}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    if num_clients * min_size > labels.size:
        raise ValueError(
            f"num_clients * min_size = {num_clients} * {min_size} = {num_clients * min_size} "
            f"exceeds the {labels.size} examples in labels; lower min_size or num_clients"
        )
    rng = np.random.default_rng(seed)
    class_members = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_tries):
        clients = _dirichlet_split_once(class_members, num_clients, beta, labels.size, rng)
        if min(client.size for client in clients) >= min_size:
            return [rng.permutation(client) for client in clients]
    raise ValueError(
        f"dirichlet_label_skew could not give every one of {num_clients} clients at least "
        f"min_size={min_size} examples in {max_tries} tries (beta={beta}, {labels.size} "
        "examples); lower min_size or raise beta"
    )


def split_like(
    client_train_indices: Sequence[np.ndarray],
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    *,
    seed: int,
) -> Partition:
    """Splits a test set over the clients of a training split, following each client's labels.

    Each test example of class c goes, independently, to client k with probability
    n_{k,c} / n_c, where n_{k,c} counts client k's training examples of class c and n_c is their
    sum over clients. A client's expected test label distribution is then proportional to its
    training label counts, and a client never gets test examples of a class it has not trained
    on. Test examples of a class that no client trains on are spread uniformly over the clients.

    Args:
      client_train_indices: the training split, one index array into ``train_labels`` per client.
      train_labels: ``[N_train]`` non-negative integer labels.
      test_labels: ``[N_test]`` non-negative integer labels.
      seed: seed of ``np.random.default_rng``.

    Returns:
      One int64 index array into ``test_labels`` per client; every test example is in exactly one.
    """
    train_labels = _check_labels(train_labels, "train_labels")
    test_labels = _check_labels(test_labels, "test_labels")
    num_clients = len(client_train_indices)
    _check_num_clients(num_clients)
    num_classes = int(max(train_labels.max(initial=-1), test_labels.max(initial=-1))) + 1
    train_counts = label_histogram(client_train_indices, train_labels, num_classes)
    rng = np.random.default_rng(seed)
    owner = np.empty(test_labels.size, dtype=np.int64)
    for c in np.unique(test_labels):
        members = np.flatnonzero(test_labels == c)
        class_counts = train_counts[:, c]
        if class_counts.sum() > 0:
            owner[members] = rng.choice(
                num_clients, size=members.size, p=class_counts / class_counts.sum()
            )
        else:
            owner[members] = rng.integers(num_clients, size=members.size)
    shuffled = rng.permutation(test_labels.size)
    grouped = shuffled[np.argsort(owner[shuffled], kind="stable")]
    cut_points = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return np.split(grouped.astype(np.int64), cut_points)


def label_histogram(
    client_indices: Sequence[np.ndarray], labels: np.ndarray, num_classes: int
) -> np.ndarray:
    """``[K, num_classes]`` int64 counts: entry (k, c) is how many of client k's examples are c."""
    labels = _check_labels(labels, "labels")
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels hold class {labels.max()} but num_classes is {num_classes}")
    counts = np.zeros((len(client_indices), num_classes), dtype=np.int64)
    for k, indices in enumerate(client_indices):
        counts[k] = np.bincount(labels[indices], minlength=num_classes)
    return counts


def _dirichlet_split_once(
    class_members: list[np.ndarray],
    num_clients: int,
    beta: float,
    num_examples: int,
    rng: np.random.Generator,
) -> Partition:
    """One draw of the NIID-Bench split, without the ``min_size`` check."""
    equal_share = num_examples / num_clients
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    for members in class_members:
        members = rng.permutation(members)
        if np.isinf(beta):
            proportions = np.full(num_clients, 1.0 / num_clients)
        else:
            proportions = rng.dirichlet(np.full(num_clients, beta))
        not_full = sizes < equal_share
        proportions = np.where(not_full, proportions, 0.0)
        if proportions.sum() > 0:
            proportions = proportions / proportions.sum()
        else:
            proportions = not_full / np.count_nonzero(not_full)
        cut_points = (np.cumsum(proportions) * members.size).astype(np.int64)[:-1]
        for k, piece in enumerate(np.split(members, cut_points)):
            pieces[k].append(piece)
            sizes[k] += piece.size
    return [np.concatenate(client_pieces).astype(np.int64) for client_pieces in pieces]


def _check_labels(labels: np.ndarray, name: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{name} must be >= 0, got a label {labels.min()}")
    return labels


def _check_num_clients(num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
