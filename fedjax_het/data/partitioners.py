"""Partitioners: split a centralised dataset's examples over simulated clients.

Every partitioner returns a :data:`Partition`: one int64 array per client of indices into the
dataset it was given, in random order within each client. Unless its docstring says otherwise,
every example goes to exactly one client. All randomness comes from ``np.random.default_rng(seed)``,
so the same arguments give the same split. The kinds follow the taxonomy of Zhu et al., "Federated
Learning on Non-IID Data: A Survey" (§3), and the recipes of the papers each docstring cites.

By name (:data:`PARTITIONERS`, :func:`partition`), each called as
``fn(labels, num_clients, seed=seed, **params)``:

- ``"iid"``: :func:`iid`, a uniform random split (equal sizes, or given ``sizes``).
- ``"dirichlet"``: :func:`dirichlet_label_skew`, p_c ~ Dir_K(beta) per class over clients
  (NIID-Bench).
- ``"dirichlet_client"``: :func:`dirichlet_client_skew`, q_k ~ Dir(beta * p) per client over
  classes (Hsu et al. 2019).
- ``"classes_per_client"``: :func:`classes_per_client`, exactly c classes per client (NIID-Bench).
- ``"shards"``: :func:`shards`, s label-sorted shards per client (McMahan et al. 2017).
- ``"quantity_lognormal"``, ``"quantity_dirichlet"``: IID content, skewed sizes
  (:func:`quantity_lognormal`, Acar et al. 2021; :func:`quantity_dirichlet`, NIID-Bench).
- ``"natural"``: :func:`natural`, one client per user/writer id.

Per-client test splits: :func:`split_like` (a separate test set, split to follow each client's
labels) and :func:`holdout` (a fraction of each client's own examples). :func:`label_histogram`
counts the labels each client holds. Feature and label-noise transforms of a partitioned dataset
are in :mod:`fedjax_het.data.feature_skew`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedjax_het.data._partition_base import (
    Partition,
    call_registered,
    check_int,
    check_labels,
    check_num_clients,
    check_partition,
    check_probability,
    count_examples,
    group_by_owner,
)
from fedjax_het.data.label_skew import (
    classes_per_client,
    dirichlet_client_skew,
    dirichlet_label_skew,
    shards,
)
from fedjax_het.data.quantity_skew import (
    dirichlet_sizes,
    iid,
    lognormal_sizes,
    quantity_dirichlet,
    quantity_lognormal,
)

__all__ = [
    "PARTITIONERS",
    "Partition",
    "classes_per_client",
    "dirichlet_client_skew",
    "dirichlet_label_skew",
    "dirichlet_sizes",
    "holdout",
    "iid",
    "label_histogram",
    "lognormal_sizes",
    "natural",
    "partition",
    "quantity_dirichlet",
    "quantity_lognormal",
    "shards",
    "split_like",
]


def natural(
    labels: np.ndarray | int,
    num_clients: int,
    *,
    seed: int,
    client_ids: np.ndarray,
    min_size: int = 1,
) -> Partition:
    """One client per natural id (user, writer, speaker), as LEAF splits FEMNIST by writer.

    Caldas et al., "LEAF: A Benchmark for Federated Settings" (2018), and the survey of Zhu et al.
    (§3.1.3: EMNIST split by writer). Ids holding fewer than ``min_size`` examples are dropped;
    of the rest, ``num_clients`` ids are chosen uniformly at random without replacement (all of
    them when ``num_clients`` equals their number). Client k is the k-th smallest chosen id, so
    ``client_ids[parts[k][0]]`` names it.

    Args:
      labels: ``[N]`` labels (only their number is used), or N itself.
      num_clients: K, at most the number of ids with ``min_size`` or more examples.
      seed: seed of ``np.random.default_rng``.
      client_ids: ``[N]`` id of each example's owner (integers or strings).
      min_size: fewest examples an id needs to be a client.

    Returns:
      K int64 index arrays; examples of ids that were dropped or not chosen are left out.

    >>> parts = natural(4, 2, seed=0, client_ids=np.array(["b", "a", "b", "a"]))
    >>> [sorted(part.tolist()) for part in parts]
    [[1, 3], [0, 2]]
    """
    client_ids = np.asarray(client_ids)
    num_examples = count_examples(labels)
    if client_ids.shape != (num_examples,):
        raise ValueError(
            f"client_ids must have shape ({num_examples},), one id per example; "
            f"got {client_ids.shape}"
        )
    check_int(min_size, "min_size", 1)
    ids, owner, counts = np.unique(client_ids, return_inverse=True, return_counts=True)
    eligible = np.flatnonzero(counts >= min_size)
    check_num_clients(num_clients)
    if num_clients > eligible.size:
        raise ValueError(
            f"num_clients={num_clients} exceeds the {eligible.size} ids holding at least "
            f"min_size={min_size} examples (of {ids.size} ids); lower num_clients or min_size"
        )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(eligible, num_clients, replace=False))
    client_of_id = np.full(ids.size, -1, dtype=np.int64)
    client_of_id[chosen] = np.arange(num_clients)
    return group_by_owner(client_of_id[owner], num_clients, rng)


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
    This is the per-client local test set the survey of Zhu et al. (§7, P0 item 10) asks for,
    for label skew; for feature skew use :func:`holdout`, which keeps each client's own x.

    Args:
      client_train_indices: the training split, one index array into ``train_labels`` per client.
      train_labels: ``[N_train]`` non-negative integer labels.
      test_labels: ``[N_test]`` non-negative integer labels.
      seed: seed of ``np.random.default_rng``.

    Returns:
      One int64 index array into ``test_labels`` per client; every test example is in exactly one.
    """
    train_labels = check_labels(train_labels, "train_labels")
    test_labels = check_labels(test_labels, "test_labels")
    parts = check_partition(client_train_indices, train_labels.size, "client_train_indices")
    num_clients = len(parts)
    num_classes = int(max(train_labels.max(initial=-1), test_labels.max(initial=-1))) + 1
    train_counts = label_histogram(parts, train_labels, num_classes)
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
    return group_by_owner(owner, num_clients, rng)


def holdout(
    client_indices: Sequence[np.ndarray], test_fraction: float = 0.2, *, seed: int
) -> tuple[Partition, Partition]:
    """Holds out a random ``test_fraction`` of each client's own examples as its local test set.

    Client k with n_k examples keeps ``round(test_fraction * n_k)`` of them, chosen uniformly
    without replacement, for testing: a test set drawn from the client's own joint distribution
    P_k(x, y), label, feature and concept skew alike (the per-client local test accuracy of the
    survey of Zhu et al., §7, P0 item 10, and of LG-FedAvg, Liang et al. 2020).

    Args:
      client_indices: a partition, one index array per client.
      test_fraction: the held-out fraction, in [0, 1].
      seed: seed of ``np.random.default_rng``.

    Returns:
      ``(train, test)``: two partitions over the same clients whose union, client by client, is
      ``client_indices``.

    >>> train, test = holdout([np.arange(10), np.arange(10, 15)], 0.2, seed=0)
    >>> [part.size for part in train], [part.size for part in test]
    ([8, 4], [2, 1])
    """
    check_probability(test_fraction, "test_fraction")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for part in client_indices:
        shuffled = rng.permutation(np.asarray(part, dtype=np.int64))
        num_test = int(np.round(test_fraction * shuffled.size))
        test.append(shuffled[:num_test])
        train.append(shuffled[num_test:])
    return train, test


def label_histogram(
    client_indices: Sequence[np.ndarray], labels: np.ndarray, num_classes: int
) -> np.ndarray:
    """``[K, num_classes]`` int64 counts: entry (k, c) is how many of client k's examples are c."""
    labels = check_labels(labels)
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"labels hold class {labels.max()} but num_classes is {num_classes}")
    counts = np.zeros((len(client_indices), num_classes), dtype=np.int64)
    for k, indices in enumerate(client_indices):
        counts[k] = np.bincount(labels[indices], minlength=num_classes)
    return counts


PARTITIONERS: dict[str, Callable[..., Partition]] = {
    "iid": iid,
    "dirichlet": dirichlet_label_skew,
    "dirichlet_client": dirichlet_client_skew,
    "classes_per_client": classes_per_client,
    "shards": shards,
    "quantity_lognormal": quantity_lognormal,
    "quantity_dirichlet": quantity_dirichlet,
    "natural": natural,
}
"""Config name -> partitioner, each called as ``fn(labels, num_clients, seed=seed, **params)``."""


def partition(kind: str, labels: np.ndarray, num_clients: int, *, seed: int, **params) -> Partition:
    """Runs the partitioner registered as ``kind``, after checking the parameter names.

    A config table such as ``[partition] kind = "dirichlet"  beta = 0.5  min_size = 10`` becomes
    ``partition(**table, labels=labels, num_clients=K, seed=seed)``. The values are checked by the
    partitioner itself (beta <= 0, c above the number of classes, more clients than examples...).

    Raises:
      ValueError: for an unknown ``kind`` (listing the choices), an unknown parameter (naming it
        and listing the allowed ones), a missing required one, or a bad value.

    >>> parts = partition("shards", np.repeat([0, 1], 10), 2, seed=0, shards_per_client=1)
    >>> [part.size for part in parts]
    [10, 10]
    """
    return call_registered(
        PARTITIONERS, "partition kind", kind, (labels, num_clients), seed, params
    )
