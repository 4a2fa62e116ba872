"""An algorithm's traced hyperparameters: their names, defaults and allowed values.

Numbers a sweep may vary are not closed over by an algorithm's functions: they arrive as
the traced ``hyper`` dict, so one compiled program serves every value (Equinox's "static
structure, traced numbers"; optax's ``inject_hyperparams``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.typing import Hyper


@dataclasses.dataclass(frozen=True)
class Interval:
    """The values a hyperparameter may take, e.g. ``Interval(0, closed_low=False)`` for ``(0, inf)``."""

    low: float = -math.inf
    high: float = math.inf
    closed_low: bool = True
    closed_high: bool = True

    def contains(self, values: np.ndarray) -> bool:
        above = values >= self.low if self.closed_low else values > self.low
        below = values <= self.high if self.closed_high else values < self.high
        return bool(np.all(above & below))

    def __str__(self) -> str:
        left = "[" if self.closed_low and math.isfinite(self.low) else "("
        right = "]" if self.closed_high and math.isfinite(self.high) else ")"
        return f"{left}{self.low:g}, {self.high:g}{right}"


POSITIVE = Interval(0.0, closed_low=False)
NON_NEGATIVE = Interval(0.0)
UNIT = Interval(0.0, 1.0)
DECAY = Interval(0.0, 1.0, closed_high=False)  # a momentum or moving-average rate: [0, 1)


@dataclasses.dataclass(frozen=True)
class HyperSpec:
    """Every traced hyperparameter of an algorithm.

    Attributes:
      defaults: ``((name, default), ...)``.
      ranges: ``((name, Interval), ...)`` the values each may take, checked (defaults
        included, when the algorithm is built) before anything compiles. Every
        hyperparameter must be finite, whether or not it has a range.
    """

    defaults: tuple[tuple[str, float], ...] = ()
    ranges: tuple[tuple[str, Interval], ...] = ()

    def __add__(self, other: HyperSpec) -> HyperSpec:
        return HyperSpec(self.defaults + other.defaults, self.ranges + other.ranges)

    def values(
        self, overrides: Mapping[str, float] | None, *, owner: str,
        dtype: jax.typing.DTypeLike = jnp.float32,
    ) -> Hyper:
        """The traced dict: defaults, then ``overrides`` (unknown names are an error; ``owner``
        names the algorithm in messages), held as ``dtype``."""
        defaults = dict(self.defaults)
        unknown = sorted(set(overrides or {}) - set(defaults))
        if unknown:
            raise ValueError(
                f"{owner} has no hyperparameter {', '.join(map(repr, unknown))}; "
                f"it takes {', '.join(sorted(defaults)) or 'none'}"
            )
        merged = {**defaults, **(overrides or {})}
        for name, value in merged.items():
            self.check(name, value, label=f"{owner}: {name}")
        return {k: jnp.asarray(v, dtype) for k, v in merged.items()}

    def check(self, name: str, value, *, label: str | None = None) -> None:
        """Raises a one-line ValueError when ``value`` (a number or array) is impossible for
        ``name``: not finite, or outside its interval. ``label`` names it in the message."""
        label = label or name
        values = np.asarray(value, np.float64)
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{label} must be a finite number, got {value}")
        interval = dict(self.ranges).get(name)
        if interval is not None and not interval.contains(values):
            raise ValueError(f"{label} must lie in {interval}, got {value}")
