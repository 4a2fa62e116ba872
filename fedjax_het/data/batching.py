"""Local batches as indices drawn inside jit (docs/design.md §3).

A client's round of local work is ``num_steps`` minibatches of ``batch_size``
rows of its own data. Only indices are drawn here, shape
``[max_steps, batch_size]``; the caller gathers the rows once. Positions past
the client's work are masked, never dropped: a ragged last batch keeps its
real examples and masks the rest.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from fedjax_het.typing import PRNGKey


@dataclasses.dataclass(frozen=True)
class LocalWork:
    """How much each selected client trains in a round.

    Give ``epochs`` (passes over the client's own data; a client of ``n``
    examples works ``ceil(epochs * n / batch_size)`` steps) or ``steps`` (the
    same number of full batches for everyone); neither means one epoch. ``max_steps`` caps the work and
    fixes the static scan length; by default it is the largest client's need.

    Attributes:
      batch_size: examples per local step.
      epochs: local epochs (None: 1 unless ``steps`` is given).
      steps: local steps, or None when ``epochs`` is given.
      max_steps: static cap on steps (None: derived from the largest client).
      shuffle: True draws epochs as fresh permutations of the client's rows
        (every example once per epoch); False draws rows uniformly with
        replacement, which is cheaper for very large clients.
    """

    batch_size: int
    epochs: float | None = None
    steps: int | None = None
    max_steps: int | None = None
    shuffle: bool = True

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.epochs is not None and self.steps is not None:
            raise ValueError("give epochs or steps, not both")
        if self.epochs is None and self.steps is None:
            object.__setattr__(self, "epochs", 1.0)
        if self.epochs is not None and not 0 < self.epochs < math.inf:
            raise ValueError(f"epochs must be > 0 and finite, got {self.epochs}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")

    def static_steps(self, max_count: int) -> int:
        """The scan length: ``max_steps`` or the need of the largest client."""
        if self.max_steps is not None:
            return self.max_steps
        if self.steps is not None:
            return self.steps
        return max(1, math.ceil(self.epochs * max_count / self.batch_size))

    def examples_to_process(self, count: jax.Array) -> jax.Array:
        """Examples a client of ``count`` rows processes before the step cap."""
        if self.steps is not None:
            return jnp.full_like(count, self.steps * self.batch_size)
        return jnp.ceil(self.epochs * count.astype(jnp.float32)).astype(jnp.int32)


def steps_for(num_examples: jax.Array, *, batch_size: int, max_steps: int) -> jax.Array:
    """The steps that hold at least one of ``num_examples`` examples, at most ``max_steps``."""
    return jnp.minimum((num_examples + batch_size - 1) // batch_size, max_steps)


def batch_indices(
    key: PRNGKey,
    offset: jax.Array,
    count: jax.Array,
    num_examples: jax.Array,
    *,
    max_steps: int,
    batch_size: int,
    max_count: int,
    shuffle: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Row indices, example mask and step count of one client's local work.

    With ``shuffle``, epoch ``e`` visits the client's rows in its own random
    order: every (epoch, row) pair gets a random key and pairs are sorted by
    (epoch, key), so each complete epoch is a permutation and a partial last
    epoch is a uniform random subset.

    Args:
      key: this client's key for this round.
      offset, count: the client's first row and number of rows (traced scalars).
      num_examples: examples to process this round (traced scalar).
      max_steps, batch_size: static shape of the work.
      max_count: static bound on ``count`` over all clients.
      shuffle: permutation epochs (True) or sampling with replacement (False).

    Returns:
      ``indices`` int32 ``[max_steps, batch_size]`` rows into the flat store,
      ``example_mask`` bool of the same shape, and ``num_steps`` int32: the
      steps that hold at least one real example.
    """
    positions = max_steps * batch_size
    if shuffle:
        pairs = jnp.arange(positions + max_count, dtype=jnp.int32)
        epoch, row = pairs // count, pairs % count
        noise = jax.random.bits(key, pairs.shape, jnp.uint32)
        _, _, rows = jax.lax.sort((epoch, noise, row), num_keys=2)
        rows = rows[:positions]
    else:
        rows = jax.random.randint(key, (positions,), 0, count, dtype=jnp.int32)
    position = jnp.arange(positions, dtype=jnp.int32)
    example_mask = position < num_examples
    num_steps = steps_for(num_examples, batch_size=batch_size, max_steps=max_steps)
    shape = (max_steps, batch_size)
    return (offset + rows).reshape(shape), example_mask.reshape(shape), num_steps.astype(jnp.int32)
