"""Optimizers whose numbers are traced hyperparameters.

A :class:`HyperOptimizer` names the ``hyper`` entries it reads (with
defaults) and builds the optax transformation from them inside the traced
round, so one compiled program can be swept over learning rates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import optax

from fedjax_het.engine.hyper import DECAY, POSITIVE, HyperSpec, Interval
from fedjax_het.typing import Hyper

RANGES: dict[str, Interval] = {
    "lr": POSITIVE, "momentum": DECAY, "b1": DECAY, "b2": DECAY, "eps": POSITIVE,
}
"""The values each optimizer number may take: learning rates and eps > 0, decay rates in [0, 1)."""


@dataclasses.dataclass(frozen=True)
class HyperOptimizer:
    """An optax optimizer built from ``hyper`` entries named ``{role}_{field}``.

    Attributes:
      build: ``hyper -> optax.GradientTransformation``.
      hyper: the entries ``build`` reads, their defaults and allowed values (``RANGES``).
    """

    build: Callable[[Hyper], optax.GradientTransformation]
    hyper: HyperSpec


def _make(role: str, factory: Callable[..., optax.GradientTransformation], **defaults) -> HyperOptimizer:
    names = {field: f"{role}_{field}" for field in defaults}

    def build(hyper: Hyper) -> optax.GradientTransformation:
        return factory(**{field: hyper[name] for field, name in names.items()})

    return HyperOptimizer(
        build,
        HyperSpec(
            tuple((names[f], float(v)) for f, v in defaults.items()),
            tuple((names[f], RANGES[f]) for f in defaults),
        ),
    )


def sgd(role: str, *, lr: float, momentum: float | None = None) -> HyperOptimizer:
    """Plain SGD, or heavy-ball momentum when ``momentum`` is given (``{role}_momentum``)."""
    if momentum is None:
        return _make(role, lambda lr: optax.sgd(lr), lr=lr)
    return _make(role, lambda lr, momentum: optax.sgd(lr, momentum=momentum), lr=lr, momentum=momentum)


def adam(role: str, *, lr: float, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> HyperOptimizer:
    """Adam; defaults follow Reddi et al. 2021 (Adaptive Federated Optimization, §5: tau = 1e-3)."""
    return _make(role, lambda lr, b1, b2, eps: optax.adam(lr, b1=b1, b2=b2, eps=eps),
                 lr=lr, b1=b1, b2=b2, eps=eps)


def yogi(role: str, *, lr: float, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> HyperOptimizer:
    """Yogi (Zaheer et al. 2018), the server optimizer of FedYogi."""
    return _make(role, lambda lr, b1, b2, eps: optax.yogi(lr, b1=b1, b2=b2, eps=eps),
                 lr=lr, b1=b1, b2=b2, eps=eps)


def adagrad(role: str, *, lr: float, eps: float = 1e-3) -> HyperOptimizer:
    """Adagrad with zero initial accumulator, the server optimizer of FedAdagrad."""
    return _make(role, lambda lr, eps: optax.adagrad(lr, initial_accumulator_value=0.0, eps=eps),
                 lr=lr, eps=eps)
