"""Label skew: clients whose label distributions P_k(y) differ (prior-probability shift).

Four published recipes (the taxonomy is Zhu et al., "Federated Learning on Non-IID Data: A
Survey", §3.2.1; use them through :mod:`fedjax_het.data.partitioners`):

- label-distribution imbalance, per class over clients: :func:`dirichlet_label_skew` (NIID-Bench);
- label-distribution imbalance, per client over classes: :func:`dirichlet_client_skew`
  (Hsu, Qi and Brown 2019);
- label-size imbalance, exactly c classes per client: :func:`classes_per_client` (NIID-Bench #C=k);
- label-size imbalance by shards of the label-sorted data: :func:`shards` (McMahan et al. 2017).

In both Dirichlet forms a smaller concentration ``beta`` gives more skew (the survey states it
backwards) and ``beta = inf`` gives every client the global label distribution.
"""

from __future__ import annotations

import numpy as np

from fedjax_het.data._partition_base import (
    Partition,
    check_concentration,
    check_int,
    check_labels,
    check_min_size,
    check_num_clients,
    check_sizes,
    min_size_error,
)


def dirichlet_label_skew(
    labels: np.ndarray,
    num_clients: int,
    beta: float = 0.5,
    *,
    seed: int,
    min_size: int = 10,
    max_tries: int = 100,
) -> Partition:
    """Label-skewed split by NIID-Bench's Dirichlet recipe (Li et al., ICDE 2022, §III-A).

    Li, Diao, Chen and He, "Federated Learning on Non-IID Data Silos: An Experimental Study".
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
      beta: Dirichlet concentration, > 0 (NIID-Bench uses 0.5 and 0.1). Small beta gives each
        client few classes; ``float('inf')`` uses p_c = 1/K for every class (IID by class).
      seed: seed of ``np.random.default_rng``.
      min_size: fewest examples any client may hold.
      max_tries: how many times the split is drawn before giving up.

    Returns:
      K int64 index arrays into ``labels``; every example is in exactly one of them.

    Raises:
      ValueError: on invalid arguments, or if no split in ``max_tries`` tries met ``min_size``.

    >>> parts = dirichlet_label_skew(np.arange(100) % 2, 4, 0.5, seed=0, min_size=5)
    >>> sum(part.size for part in parts)
    100
    """
    labels = check_labels(labels)
    check_num_clients(num_clients, labels.size)
    check_concentration(beta)
    check_min_size(min_size, max_tries, num_clients, labels.size)
    rng = np.random.default_rng(seed)
    class_members = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_tries):
        clients = _dirichlet_split_once(class_members, num_clients, beta, labels.size, rng)
        if min(client.size for client in clients) >= min_size:
            return [rng.permutation(client) for client in clients]
    raise min_size_error(f"dirichlet_label_skew (beta={beta})", num_clients, min_size, max_tries)


def dirichlet_client_skew(
    labels: np.ndarray,
    num_clients: int,
    beta: float = 0.5,
    *,
    seed: int,
    sizes: np.ndarray | None = None,
) -> Partition:
    """Label-skewed split, one Dirichlet draw per client over classes (Hsu, Qi, Brown 2019, §3).

    Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated
    Visual Classification" (arXiv:1909.06335): client k's labels follow q_k ~ Dir(beta * p), p the
    global class distribution (their alpha is ``beta`` here). Client k, visited in a random order,
    draws its n_k class counts ~ Multinomial(n_k, q_k) and takes that many unused examples of each
    class.

    Warning (finite pool, which the paper does not treat): when a class runs out, the client's
    remaining count is redrawn from q_k restricted to the classes left (or, if q_k has no mass
    there, in proportion to what is left). Clients late in the random order can therefore drift
    toward the leftover classes; with ``sizes`` summing to N the last client takes what remains.

    Args:
      labels: ``[N]`` non-negative integer class labels.
      num_clients: K, the number of clients.
      beta: concentration, > 0 (Hsu et al. sweep 0.05 to 100); ``float('inf')`` sets q_k = p.
      seed: seed of ``np.random.default_rng``.
      sizes: ``[K]`` client sizes n_k summing to at most N (e.g. from
        :func:`fedjax_het.data.quantity_skew.lognormal_sizes`); by default N split into K sizes
        that differ by at most one.

    Returns:
      K int64 index arrays into ``labels`` of sizes ``sizes``; every example is in exactly one of
      them when ``sizes`` sums to N (the default), otherwise the rest are left out.

    >>> parts = dirichlet_client_skew(np.arange(100) % 2, 4, 0.5, seed=0)
    >>> [part.size for part in parts]
    [25, 25, 25, 25]
    """
    labels = check_labels(labels)
    check_num_clients(num_clients, labels.size)
    check_concentration(beta)
    sizes = check_sizes(sizes, num_clients, labels.size)
    rng = np.random.default_rng(seed)
    classes, class_counts = np.unique(labels, return_counts=True)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    prior = class_counts / labels.size
    remaining = class_counts.copy()
    parts: Partition = [np.empty(0, dtype=np.int64)] * num_clients
    for k in rng.permutation(num_clients):
        q = prior if np.isinf(beta) else rng.dirichlet(beta * prior)
        taken = np.zeros_like(remaining)
        while (need := sizes[k] - taken.sum()) > 0:
            weights = np.where(remaining > taken, q, 0.0)
            if weights.sum() == 0:
                weights = (remaining - taken).astype(np.float64)
            draw = rng.multinomial(need, weights / weights.sum())
            taken += np.minimum(draw, remaining - taken)
        start = class_counts - remaining
        pieces = [pool[s : s + t] for pool, s, t in zip(pools, start, taken)]
        parts[k] = rng.permutation(np.concatenate(pieces)).astype(np.int64)
        remaining -= taken
    return parts


def classes_per_client(labels: np.ndarray, num_clients: int, c: int = 2, *, seed: int) -> Partition:
    """Exactly ``c`` classes per client, by NIID-Bench's #C=k recipe (Li et al., ICDE 2022, §III-A).

    Client k owns class ``classes[k mod C]`` (C distinct labels) and ``c - 1`` other classes drawn
    uniformly without replacement; then each class's shuffled examples are split into equal parts
    (``np.array_split``) among the clients that own it. ``c = 1`` gives one class per client, the
    case where FedAvg may fail to converge. This is the label-size imbalance of McMahan et al.
    (2017) in the exact-c form; :func:`shards` is the shard form.

    Args:
      labels: ``[N]`` non-negative integer class labels.
      num_clients: K, the number of clients.
      c: classes per client, between 1 and the number of distinct labels C.
      seed: seed of ``np.random.default_rng``.

    Returns:
      K int64 index arrays into ``labels``, each holding exactly ``c`` distinct labels. Examples of
      a class that no client owns are left out; that can happen only when K < C.

    Raises:
      ValueError: on invalid arguments, or when a class has fewer examples than owners (some
        owner would then miss it and hold fewer than ``c`` classes).

    >>> parts = classes_per_client(np.arange(100) % 4, 4, 1, seed=0)
    >>> [sorted(set((np.arange(100) % 4)[part].tolist())) for part in parts]
    [[0], [1], [2], [3]]
    """
    labels = check_labels(labels)
    check_num_clients(num_clients, labels.size)
    classes = np.unique(labels)
    check_int(c, f"c (classes per client; the labels hold {classes.size} classes)", 1, classes.size)
    rng = np.random.default_rng(seed)
    owners: list[list[int]] = [[] for _ in classes]
    for k in range(num_clients):
        first = k % classes.size
        others = rng.choice(np.delete(np.arange(classes.size), first), c - 1, replace=False)
        for j in (first, *others):
            owners[j].append(k)
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for j, class_owners in enumerate(owners):
        members = rng.permutation(np.flatnonzero(labels == classes[j]))
        if class_owners and members.size < len(class_owners):
            raise ValueError(
                f"class {classes[j]} has {members.size} examples but {len(class_owners)} clients "
                f"own it; with c={c} some client would miss a class: lower c or num_clients"
            )
        for k, piece in zip(class_owners, np.array_split(members, max(len(class_owners), 1))):
            pieces[k].append(piece)
    return [rng.permutation(np.concatenate(p)).astype(np.int64) for p in pieces]


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int = 2, *, seed: int
) -> Partition:
    """The FedAvg paper's pathological split (McMahan et al., AISTATS 2017, §3).

    McMahan, Moore, Ramage, Hampson and Agüera y Arcas, "Communication-Efficient Learning of Deep
    Networks from Decentralized Data": sort the examples by label (ties in random order), cut them
    into S = K * s shards, and give each client s shards drawn at random without replacement
    (MNIST: 200 shards of 300, s = 2, K = 100).

    Warning: when S does not divide N the shards differ in size by one (``np.array_split``), so
    that every example is still assigned; the paper's sizes divide exactly. A shard can straddle
    two classes, so a client holds at most 2s classes, and at most s when every class size is a
    multiple of the shard size.

    Args:
      labels: ``[N]`` non-negative integer class labels.
      num_clients: K, the number of clients.
      shards_per_client: s, >= 1.
      seed: seed of ``np.random.default_rng``.

    Returns:
      K int64 index arrays into ``labels``; every example is in exactly one of them.

    >>> parts = shards(np.repeat([0, 1, 2, 3], 30), 4, 1, seed=0)
    >>> [np.unique(np.repeat([0, 1, 2, 3], 30)[part]).size for part in parts]
    [1, 1, 1, 1]
    """
    labels = check_labels(labels)
    check_num_clients(num_clients)
    check_int(shards_per_client, "shards_per_client", 1)
    num_shards = num_clients * shards_per_client
    if num_shards > labels.size:
        raise ValueError(
            f"num_clients * shards_per_client = {num_shards} shards exceed the {labels.size} "
            "examples; lower num_clients or shards_per_client"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(labels.size)
    order = order[np.argsort(labels[order], kind="stable")].astype(np.int64)
    pieces = np.array_split(order, num_shards)
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [rng.permutation(np.concatenate([pieces[j] for j in row])) for row in dealt]


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
