"""Mediator groups: clients grouped towards a uniform class mix (GANDALF, Algorithm 4).

Chou, Chang, Chou, "A GAN-based Data Augmentation Framework for Federated
Learning on Non-IID Data" (GANDALF), §3.2 and Algorithm 4; Astraea's
rebalancing mediators use the same grouping idea. Groups of at most
``ceil(K / M_c)`` clients are filled one after another, each time adding the
client ``c`` that minimises ``D_KL(P_m + P_c || P_u)``, the divergence of the
group's pooled class mix from uniform.

>>> import numpy as np
>>> kl_groups(np.array([[9, 1], [1, 9], [8, 2], [2, 8]]), group_size=2).members.tolist()
[[2, 3], [0, 1]]
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Groups:
    """Clients grouped under mediators, padded to a rectangle.

    Attributes:
      members: int32 ``[M, G]`` client ids, in each group's order (padding: 0).
      mask: bool ``[M, G]`` which entries are members.
    """

    members: np.ndarray
    mask: np.ndarray

    def __post_init__(self):
        members, mask = np.asarray(self.members), np.asarray(self.mask)
        if members.ndim != 2 or members.shape != mask.shape:
            raise ValueError(
                f"members and mask must be [M, G] of one shape, got {members.shape} and {mask.shape}"
            )
        if not np.all(mask.any(axis=1)):
            raise ValueError(f"group {int(np.argmin(mask.any(axis=1)))} is empty")
        ids = members[mask.astype(bool)]
        if np.any(ids < 0) or len(np.unique(ids)) != len(ids):
            raise ValueError("group members must be distinct client ids >= 0")
        object.__setattr__(self, "members", np.where(mask, members, 0).astype(np.int32))
        object.__setattr__(self, "mask", mask.astype(bool))

    @property
    def num_groups(self) -> int:
        return int(self.members.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.members.shape[1])


def kl_divergence_to_uniform(counts: np.ndarray) -> np.ndarray:
    """``D_KL(p || uniform)`` of the class mix ``p = counts / Σ counts`` over the last axis (0 log 0 = 0)."""
    counts = np.asarray(counts, np.float64)
    p = counts / np.maximum(counts.sum(axis=-1, keepdims=True), 1e-300)
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0) * counts.shape[-1]), 0.0)
    return terms.sum(axis=-1)


def kl_groups(
    class_counts: np.ndarray, *, group_size: int | None = None, num_groups: int | None = None
) -> Groups:
    """Greedy grouping towards a uniform class mix (GANDALF, Algorithm 4).

    Groups are filled one at a time up to ``group_size`` clients (or
    ``ceil(K / num_groups)``, Algorithm 4's cap); each step adds the remaining
    client whose counts bring the group's pooled class mix closest to uniform in
    ``D_KL(P_m + P_c || P_u)`` (ties: the lowest id). The last group may be
    smaller; with ``num_groups`` that does not divide ``K`` there may be fewer
    groups than asked (Algorithm 4 fixes the cap, not the count).

    .. note:: ``P`` are class counts, so the group's mix is that of its pooled
       data; the paper's equal-sized clients make counts and distributions agree.

    Args:
      class_counts: ``[K, C]`` examples of each class held by each client.
      group_size, num_groups: give exactly one.

    Returns:
      ``Groups`` with ``members`` in the order they were added.
    """
    counts = np.asarray(class_counts, np.float64)
    if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
        raise ValueError(f"class_counts must be [K, C] with K, C >= 1, got shape {counts.shape}")
    if np.any(counts < 0) or np.any(counts.sum(axis=1) <= 0):
        raise ValueError("class_counts must be >= 0 with at least one example per client")
    num_clients = counts.shape[0]
    if (group_size is None) == (num_groups is None):
        raise ValueError("give group_size or num_groups, not both or neither")
    if num_groups is not None:
        if not 1 <= num_groups <= num_clients:
            raise ValueError(f"num_groups must be in [1, {num_clients}], got {num_groups}")
        group_size = math.ceil(num_clients / num_groups)
    if not 1 <= group_size <= num_clients:
        raise ValueError(f"group_size must be in [1, {num_clients}], got {group_size}")
    left = list(range(num_clients))
    groups = []
    while left:
        pooled, group = np.zeros(counts.shape[1]), []
        while left and len(group) < group_size:
            divergence = kl_divergence_to_uniform(pooled + counts[left])
            chosen = left.pop(int(np.argmin(divergence)))
            group.append(chosen)
            pooled = pooled + counts[chosen]
        groups.append(group)
    members = np.zeros((len(groups), group_size), np.int32)
    mask = np.zeros(members.shape, bool)
    for m, group in enumerate(groups):
        members[m, : len(group)], mask[m, : len(group)] = group, True
    return Groups(members, mask)
