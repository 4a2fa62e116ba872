"""The config's [algorithm] table: a registered algorithm (``fedjax_het.registry``) and its
options.

A key is a parameter of the algorithm's factory (it builds the algorithm), or else one of the
traced hyperparameters that the built :class:`FederatedAlgorithm` declares in ``hyper_defaults``
(the run passes it in ``hyper``), checked against its ``hyper_ranges``. A factory's docstring
describes its parameters (``Args:``) and hyperparameters (``Hyperparameters:``); a
hyperparameter that several algorithms share (``client_lr``) may be described once, by the
first registered algorithm that does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fedjax_het import registry
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.schema import (
    ConfigError,
    Key,
    arguments,
    check,
    configurable,
    documented,
    guarded,
    registered,
    signature_keys,
    unknown,
)

DEFAULTS: dict[str, Any] = {"algorithm": {"name": "fedavg", "client_lr": 0.05}}
TABLES: dict[str, str] = {
    "algorithm": "a registered algorithm; its other keys are its options and traced "
    "hyperparameters (fedjax_het.registry)"
}
"""What the table of this module configures, for ``fedjax-het config --all``."""
SKIP = ("name", "extra_hyper", "hyper_ranges")  # the base factory's plumbing, not options


def keys(config: Mapping[str, Any]) -> dict[str, Key]:
    """The keys of [algorithm] as ``config`` chooses it (``algorithm.name``)."""
    out = {"algorithm.name": name_key()} if config.get("algorithm") else {}
    factory = registered("algorithm", config["algorithm"].get("name"))
    return {**out, **signature_keys("algorithm", factory, SKIP), **hyper_keys(factory)}


def name_key() -> Key:
    """``algorithm.name``: the registered algorithms."""
    doc = "the algorithm; each takes its own options (fedjax-het explain algorithm.<option>)"
    default = DEFAULTS["algorithm"]["name"]
    return Key(str, default, doc, choices=tuple(registry.names("algorithm")))


def hyper_keys(factory: Callable[..., FederatedAlgorithm]) -> dict[str, Key]:
    """The traced hyperparameters of the algorithm ``factory`` builds with its defaults."""
    built = guarded("algorithm", factory)
    docs, paper = documented(factory)
    ranges = {k: str(interval) for k, interval in built.hyperparameters.ranges}
    out = {}
    for k, default in built.hyperparameters.defaults:
        doc = docs.get(k) or _described_elsewhere(k)
        out[f"algorithm.{k}"] = Key(float, default, doc, paper, allowed=ranges.get(k, ""))
    return out


def _described_elsewhere(hyper: str) -> str:
    """The description of ``hyper`` by the first registered algorithm that gives one."""
    for name in registry.names("algorithm"):
        doc = documented(registry.lookup("algorithm", name))[0].get(hyper)
        if doc:
            return doc
    return ""


def algorithm(config: dict[str, Any]) -> tuple[FederatedAlgorithm, dict[str, float]]:
    """The algorithm and the hyperparameters [algorithm] sets; [algorithm] resolved in place
    (every hyperparameter with the value the run uses)."""
    table = dict(config["algorithm"])
    name = table.pop("name", None)
    factory = registered("algorithm", name)
    params = configurable(factory, SKIP)
    structural = {k: v for k, v in table.items() if k in params}
    built = guarded("algorithm", lambda: factory(**arguments("algorithm", factory, structural)))
    allowed = dict(built.hyperparameters.defaults)
    hyper = {}
    for key, value in table.items():
        if key in structural:
            continue
        if key not in allowed:
            raise ConfigError(_unknown(name, key, ["name", *allowed, *params]))
        hyper[key] = check(f"algorithm.{key}", value, float)
        try:  # its range (the defaults were checked when the algorithm was built)
            built.check_hyper(key, hyper[key], label=f"algorithm.{key}")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    config["algorithm"] = {**config["algorithm"], **allowed, **hyper}
    return built, hyper


def _unknown(name: str, key: str, known: list[str]) -> str:
    """The error for a key algorithm ``name`` does not take: the algorithms that take it, if
    any, else the closest key it does take."""
    takers = [
        other for other in registry.names("algorithm") if other != name and key in _takes(other)
    ]
    if not takers:
        return unknown("key", f"algorithm.{key}", {f"algorithm.{k}": 0 for k in known})
    return (
        f"algorithm.{key} is an option of {', '.join(takers)}, not of algorithm.name = "
        f"{name!r}: set algorithm.name = {takers[0]!r}, or remove algorithm.{key}"
    )


def _takes(name: str) -> set[str]:
    """The keys the algorithm ``name`` takes: its factory's options and its hyperparameters."""
    factory = registry.lookup("algorithm", name)
    try:
        hyper = {k for k, _ in factory().hyperparameters.defaults}
    except (TypeError, ValueError):  # it needs options to be built: its factory's keys only
        hyper = set()
    return set(configurable(factory, SKIP)) | hyper
