"""The config's [algorithm] table when it names a mediator run (``algorithm.name = "gandalf"``
or ``"mediator"``, run by ``pipeline.run_gandalf``): the options of :class:`GandalfOptions`,
beside the hyperparameters of the FedAvg that trains each group.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, NamedTuple

from fedjax_het.configuring import ConfigError, guarded, registered
from fedjax_het.engine import schema as algorithm_schema
from fedjax_het.gandalf.pipeline import MEDIATED, GandalfOptions, gandalf_options

OPTIONS = tuple(f.name for f in dataclasses.fields(GandalfOptions) if f.name != "gan")
"""The keys of [algorithm] that are mediator options (``gan`` follows from the name)."""


class Mediated(NamedTuple):
    """A mediator run's checked [algorithm] table."""

    options: GandalfOptions
    record: dict[str, Any]  # the options with the values the run uses
    name: str  # "gandalf" or "mediator"


def is_mediated(config: Mapping[str, Any]) -> bool:
    """Whether ``config``'s [algorithm] names a mediator run."""
    return config["algorithm"].get("name") in MEDIATED


def keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a mediator run's [algorithm], with their types."""
    out: dict[str, Any] = {"algorithm.name": str} if config.get("algorithm") else {}
    hints = typing.get_type_hints(GandalfOptions)
    out.update({f"algorithm.{k}": hints[k] for k in OPTIONS})
    return {**out, **algorithm_schema.hyper_keys(registered("algorithm", "fedavg"))}


def mediated(config: dict[str, Any]) -> Mediated | None:
    """The checked mediator options of [algorithm]; the table is left holding FedAvg's name and
    hyperparameters (``record`` puts the options back). None for every other algorithm."""
    name = config["algorithm"].get("name")
    if name not in MEDIATED:
        return None
    for table in ("server", "selection", "compression", "privacy"):
        if config.get(table):
            raise ConfigError(
                f"algorithm.name = {name!r} runs mediator groups: it takes no [{table}] table"
            )
    table = dict(config["algorithm"])
    options = {k: table.pop(k) for k in list(table) if k in OPTIONS}
    chosen = guarded("algorithm", lambda: gandalf_options(gan=MEDIATED[name], **options))
    resolved = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(chosen).items()
        if k != "gan" and v is not None
    }
    config["algorithm"] = {**table, "name": "fedavg"}
    return Mediated(chosen, resolved, name)


def record(config: dict[str, Any], run: Mediated) -> None:
    """Puts the mediator options and name back into the resolved [algorithm] table."""
    config["algorithm"] = {**run.record, **config["algorithm"], "name": run.name}
