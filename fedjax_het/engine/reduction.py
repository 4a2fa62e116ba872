"""The cohort's fixed pairwise reduction tree (docs/design.md §3; ``cohort.run_cohort``).

Contributions are added by one pairwise tree over the slots in run order,
padded with zeros to a power of two: inside a chunk one parallel add per level
(``tree_sum``), across chunks a binary counter of pending subtrees in the
scan's carry (``push``), and at the end the root from the subtrees left
(``root``). Chunks of a power-of-two size are whole subtrees, so every chunk
size gives the same bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het.typing import PyTree


def tree_sum(contributions: PyTree) -> PyTree:
    """Each leaf ``[c, ...]`` summed by a pairwise tree over its slots, padded with zeros to a
    power of two: ``((c_0 + c_1) + (c_2 + c_3)) + ...``, every level one parallel add."""

    def tree(x):
        size = 1 << (x.shape[0] - 1).bit_length()
        x = jnp.concatenate([x, jnp.zeros((size - x.shape[0], *x.shape[1:]), x.dtype)])
        while x.shape[0] > 1:
            x = x.reshape(x.shape[0] // 2, 2, *x.shape[1:])
            x = x[:, 0] + x[:, 1]
        return x[0]

    return jax.tree.map(tree, contributions)


def push(pending: PyTree, index: jax.Array, total: PyTree, levels: int) -> PyTree:
    """The pending subtrees after chunk ``index``'s ``total`` (a binary counter over chunks).

    ``pending[k]`` holds the sum of a complete subtree of ``2^k`` chunks while bit
    ``k`` of the chunks seen is set. Chunk ``index`` with ``t`` trailing one bits
    closes ``t`` subtrees, the earlier on the left: ``pending[t-1] + (... +
    (pending[0] + total))``, and is stored at level ``t``.
    """
    closes = jax.lax.population_count(index ^ (index + 1)) - 1

    def close(t):
        def branch(pending, total):
            for k in range(t):
                total = jax.tree.map(lambda p, s, k=k: p[k] + s, pending, total)
            return jax.tree.map(lambda p, s: p.at[t].set(s), pending, total)

        return branch

    return jax.lax.switch(closes, [close(t) for t in range(levels)], pending, total)


def root(pending: PyTree, num_chunks: int) -> PyTree:
    """The tree's root from the subtrees pending after ``num_chunks`` chunks, as the tree
    over ``num_chunks`` padded with zero chunks to a power of two adds them."""
    top = num_chunks.bit_length() - 1
    if num_chunks == 1 << top:
        return jax.tree.map(lambda p: p[top], pending)
    partial = None  # the subtree holding the first zero chunk; None: all zeros so far
    for k in range(top + 1):
        if num_chunks >> k & 1:  # a complete left sibling and the partial right one
            right = jax.tree.map(lambda p: 0, pending) if partial is None else partial
            partial = jax.tree.map(lambda p, r, k=k: p[k] + r, pending, right)
        elif partial is not None:  # the partial left sibling and a right one of zero chunks
            partial = jax.tree.map(lambda r: r + 0, partial)
    return partial
