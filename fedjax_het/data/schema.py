"""The config's [data], [partition], [feature_skew] and [local] tables.

``[data]`` names a dataset of ``catalog.DATASETS`` and takes its builder's options;
``[partition]`` (centralised datasets only) a partitioner of ``partitioners.PARTITIONERS``
and its options; ``[feature_skew]`` (optional, centralised datasets) a per-client transform
of ``feature_skew.FEATURE_TRANSFORMS`` and its options; ``[local]`` is a :class:`LocalWork`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from fedjax_het.data import catalog, feature_skew, partitioners
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.schema import (
    ConfigError,
    Key,
    arguments,
    choose,
    configurable,
    construct,
    dataclass_keys,
    guarded,
    resolved,
    signature_keys,
)

DEFAULTS: dict[str, Any] = {
    "data": {"name": "fashion_mnist", "num_clients": 100},
    "partition": {"kind": "dirichlet", "beta": 0.5, "min_size": 10},
    "feature_skew": {},
    "local": {"batch_size": 20, "epochs": 1.0},
}
UNBOUNDED: dict[str, str] = {"partition.beta": "no skew: the Dirichlet limit of equal proportions"}
"""The options of these tables for which ``inf`` means something, and what."""
PARTITION_SKIP = ("labels", "num_clients", "seed")  # given by [data], not by the table
SKEW_SKIP = ("x", "y", "parts", "seed")


TABLES: dict[str, str] = {
    "data": "the dataset and its options (fedjax_het.data.catalog)",
    "partition": "centralised datasets: how the examples are split among the clients "
    "(fedjax_het.data.partitioners)",
    "feature_skew": "centralised datasets: a transform of each client's features or labels "
    "(fedjax_het.data.feature_skew)",
    "local": "how much each selected client trains in a round (fedjax_het.data.LocalWork)",
}
"""What each table of this module configures, for ``fedjax-het config --all``."""
CHOOSERS: dict[str, tuple[str, Mapping[str, Callable]]] = {
    "data": ("name", catalog.DATASETS),
    "partition": ("kind", partitioners.PARTITIONERS),
    "feature_skew": ("kind", feature_skew.FEATURE_TRANSFORMS),
}
"""The key that chooses each table's function, and the functions it chooses among."""
_CHOOSER_DOCS = {
    "data": "the dataset; each takes its own options (fedjax-het explain data.<option>)",
    "partition": "the partitioner; each takes its own options",
    "feature_skew": "the per-client transform; each takes its own options",
}


def keys(config: Mapping[str, Any]) -> dict[str, Key]:
    """The keys of these tables as ``config`` chooses them (``data.name``, ``partition.kind``,
    ``feature_skew.kind``)."""
    out: dict[str, Key] = {}
    for table, (name, choices) in CHOOSERS.items():
        if config.get(table) or (table == "feature_skew" and config.get("partition")):
            default = DEFAULTS[table].get(name, ...)
            out[f"{table}.{name}"] = Key(str, default, _CHOOSER_DOCS[table], choices=tuple(choices))
    data = signature_keys("data", _dataset(config))
    out.update({key: spec for key, spec in data.items() if key not in out})
    if config.get("partition"):
        kind = config["partition"].get("kind")
        factory = choose("partition.kind", kind, partitioners.PARTITIONERS)
        out.update(signature_keys("partition", factory, PARTITION_SKIP))
    if config.get("feature_skew"):
        kind = config["feature_skew"].get("kind")
        transform = choose("feature_skew.kind", kind, feature_skew.FEATURE_TRANSFORMS)
        out.update(signature_keys("feature_skew", transform, SKEW_SKIP))
    out.update(dataclass_keys("local", LocalWork))
    return out


def _dataset(config: Mapping[str, Any]) -> Callable:
    return choose("data.name", config["data"].get("name"), catalog.DATASETS)


def dataset(config: dict[str, Any]) -> tuple[Callable, dict[str, Any]]:
    """The dataset's builder and its checked options; [data] resolved in place."""
    table = {k: v for k, v in config["data"].items() if k != "name"}
    builder = _dataset(config)
    args = arguments("data", builder, table)
    _check_num_clients(builder, args)
    config["data"] = {"name": config["data"]["name"], **resolved(args, builder)}
    return builder, args


def _check_num_clients(builder: Callable, args: Mapping[str, Any]) -> None:
    """``data.num_clients`` >= 1, or >= 0 for a dataset whose default 0 keeps every client."""
    count = args.get("num_clients")
    if count is None:
        return
    keeps_all = configurable(builder).get("num_clients") == 0
    if count < (0 if keeps_all else 1):
        allowed = ">= 0 (0: every client of the data)" if keeps_all else ">= 1"
        raise ConfigError(f"data.num_clients must be {allowed}, got {count}")


def local_work(config: dict[str, Any]) -> LocalWork:
    """The [local] table as the :class:`LocalWork` it builds; resolved in place."""
    work = construct("local", LocalWork, config["local"])
    if work.steps is not None and work.max_steps is not None:
        effect = ("caps every client at" if work.max_steps < work.steps else "does nothing beside")
        raise ConfigError(
            f"local.max_steps = {work.max_steps} {effect} local.steps = {work.steps}: it caps the "
            "steps of local.epochs; with local.steps give that number alone"
        )
    config["local"] = {
        f.name: getattr(work, f.name)
        for f in dataclasses.fields(work)
        if getattr(work, f.name) is not None
    }
    return work


def partition_and_skew(config: dict[str, Any]) -> tuple[dict | None, dict | None]:
    """The checked [partition] and [feature_skew] tables (None: the data comes split, no
    skew); both resolved in place."""
    partition = _partition(config)
    skew = _skew(config, partition)
    if partition is not None:
        kind = partition["kind"]
        params = resolved(partition, partitioners.PARTITIONERS[kind], PARTITION_SKIP)
        config["partition"] = {"kind": kind, **{k: v for k, v in params.items() if k != "kind"}}
    return partition, skew


def _partition(config: Mapping[str, Any]) -> dict[str, Any] | None:
    name = config["data"].get("name")
    if name in catalog.NATURAL:
        if "partition" in config:
            raise ConfigError(
                f"[partition] does not apply to data.name={name!r}, whose clients come with the "
                "data; remove the table"
            )
        return None
    partition = dict(config.get("partition") or {})
    kind = partition.pop("kind", None)
    factory = choose("partition.kind", kind, partitioners.PARTITIONERS)
    checked = arguments("partition", factory, partition, PARTITION_SKIP, UNBOUNDED)
    return {"kind": kind, **checked}


def _skew(config: dict[str, Any], partition: dict[str, Any] | None) -> dict[str, Any] | None:
    """The optional [feature_skew] table, checked against its transform's options."""
    table = dict(config.get("feature_skew") or {})
    if not table:
        config.pop("feature_skew", None)
        return None
    if partition is None:
        raise ConfigError(
            f"[feature_skew] applies to centralised datasets; data.name="
            f"{config['data']['name']!r} comes already split"
        )
    kind = table.pop("kind", None)
    transform = choose("feature_skew.kind", kind, feature_skew.FEATURE_TRANSFORMS)
    checked = arguments("feature_skew", transform, table, SKEW_SKIP)
    config["feature_skew"] = {"kind": kind, **resolved(checked, transform, SKEW_SKIP)}
    return {"kind": kind, **checked}


def build_data(
    builder: Callable,
    args: Mapping[str, Any],
    partition: Mapping[str, Any] | None,
    skew: Mapping[str, Any] | None,
    num_clients: int | None,
) -> FederatedData:
    """The federated data: built, then (a centralised dataset) partitioned and skewed."""
    built = guarded("data", lambda: builder(**args))
    if partition is None:
        return built
    seed = args.get("seed", 0)
    return guarded(
        "partition" if skew is None else "partition / feature_skew",
        lambda: catalog.federate(built, num_clients, partition, seed=seed, skew=skew),
    )
