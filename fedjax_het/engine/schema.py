"""The config's [algorithm] table: a registered algorithm (``fedjax_het.registry``) and its
options.

A key is a parameter of the algorithm's factory (it builds the algorithm), or else one of the
traced hyperparameters that the built :class:`FederatedAlgorithm` declares in ``hyper_defaults``
(the run passes it in ``hyper``), checked against its ``hyper_ranges``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedjax_het.configuring import (
    ConfigError,
    arguments,
    check,
    configurable,
    guarded,
    registered,
    signature_keys,
    unknown,
)
from fedjax_het.engine.algorithm import FederatedAlgorithm

DEFAULTS: dict[str, Any] = {"algorithm": {"name": "fedavg", "client_lr": 0.05}}


def keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of [algorithm] as ``config`` chooses it (``algorithm.name``), with their types."""
    out: dict[str, Any] = {"algorithm.name": str} if config.get("algorithm") else {}
    factory = registered("algorithm", config["algorithm"].get("name"))
    return {**out, **signature_keys("algorithm", factory), **hyper_keys(factory)}


def hyper_keys(factory: Callable[..., FederatedAlgorithm]) -> dict[str, Any]:
    """The traced hyperparameters of the algorithm ``factory`` builds with its defaults."""
    return {f"algorithm.{k}": float for k, _ in guarded("algorithm", factory).hyper_defaults}


def algorithm(config: dict[str, Any]) -> tuple[FederatedAlgorithm, dict[str, float]]:
    """The algorithm and the hyperparameters [algorithm] sets; [algorithm] resolved in place
    (every hyperparameter with the value the run uses)."""
    table = dict(config["algorithm"])
    factory = registered("algorithm", table.pop("name", None))
    params = configurable(factory)
    structural = {k: v for k, v in table.items() if k in params}
    built = guarded("algorithm", lambda: factory(**arguments("algorithm", factory, structural)))
    allowed = dict(built.hyper_defaults)
    hyper = {}
    for key, value in table.items():
        if key in structural:
            continue
        if key not in allowed:
            choices = {f"algorithm.{k}": 0 for k in [*allowed, *params]}
            raise ConfigError(unknown("key", f"algorithm.{key}", choices))
        hyper[key] = check(f"algorithm.{key}", value, float)
        try:  # its range (the defaults were checked when the algorithm was built)
            built.check_hyper(key, hyper[key], label=f"algorithm.{key}")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    config["algorithm"] = {**config["algorithm"], **allowed, **hyper}
    return built, hyper
