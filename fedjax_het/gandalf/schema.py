"""The config's [algorithm] table when it names a mediator run (``algorithm.name = "gandalf"``
or ``"mediator"``, run by ``pipeline.run_gandalf``): the options of :class:`GandalfOptions`,
beside the hyperparameters of the FedAvg that trains each group.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, NamedTuple

from fedjax_het.engine import schema as algorithm_schema
from fedjax_het.gandalf.pipeline import MEDIATED, GandalfOptions, gandalf_options
from fedjax_het.schema import ConfigError, Key, check, dataclass_keys, guarded, registered

OPTIONS = tuple(f.name for f in dataclasses.fields(GandalfOptions) if f.name != "gan")
"""The keys of [algorithm] that are mediator options (``gan`` follows from the name)."""
REFUSED = ("server", "selection", "compression", "privacy", "logging")
"""The tables a mediator run takes none of."""


class Mediated(NamedTuple):
    """A mediator run's checked [algorithm] table."""

    options: GandalfOptions
    record: dict[str, Any]  # the options with the values the run uses
    name: str  # "gandalf" or "mediator"


def is_mediated(config: Mapping[str, Any]) -> bool:
    """Whether ``config``'s [algorithm] names a mediator run."""
    name = config["algorithm"].get("name")
    return isinstance(name, str) and name in MEDIATED


def keys(config: Mapping[str, Any]) -> dict[str, Key]:
    """The keys of a mediator run's [algorithm]: the mediator options and the hyperparameters
    of the FedAvg that trains each group."""
    out = {"algorithm.name": name_key()} if config.get("algorithm") else {}
    options = dataclass_keys("algorithm", GandalfOptions)
    out.update({f"algorithm.{k}": options[f"algorithm.{k}"] for k in OPTIONS})
    return {**out, **algorithm_schema.hyper_keys(registered("algorithm", "fedavg"))}


def name_key() -> Key:
    """``algorithm.name`` with the mediator runs among its choices."""
    key = algorithm_schema.name_key()
    doc = f"{key.doc}; {' and '.join(MEDIATED)} run mediator groups (fedjax_het.gandalf)"
    return key._replace(doc=doc, choices=(*key.choices, *MEDIATED))


def mediated(config: dict[str, Any]) -> Mediated | None:
    """The checked mediator options of [algorithm]; the table is left holding FedAvg's name and
    hyperparameters (``record`` puts the options back). None for every other algorithm."""
    if not is_mediated(config):
        return None
    name = config["algorithm"]["name"]
    for table in REFUSED:
        if config.get(table):
            raise ConfigError(
                f"algorithm.name = {name!r} runs mediator groups: it takes no [{table}] table"
            )
    table = dict(config["algorithm"])
    hints = typing.get_type_hints(GandalfOptions)
    options = {k: check(f"algorithm.{k}", table.pop(k), hints[k]) for k in list(table)
               if k in OPTIONS}
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
