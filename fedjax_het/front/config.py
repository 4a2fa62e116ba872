"""Typed, validated run configs from TOML (docs/design.md §2).

A config is a TOML file of a few top-level numbers and one table per part
of the experiment; anything left out takes the default of :data:`DEFAULTS`::

    seed = 0            # the run's root seed (selection, local batches, init)
    rounds = 200
    eval_every = 10

    [data]              # a dataset of fedjax_het.data.catalog.DATASETS and its options
    name = "fashion_mnist"
    num_clients = 100

    [partition]         # centralised datasets only: a partitioner and its options
    kind = "dirichlet"
    beta = 0.5

    [feature_skew]      # optional, centralised datasets: a per-client transform and its options
    kind = "rotation"   # gaussian_noise, salt_pepper, rotation, label_flip, label_permutation
    angle = 90.0

    [model]             # a model of fedjax_het.models.ZOO and its options
    name = "mlp"

    [algorithm]         # a registered algorithm; other keys are its options or hyperparameters
    name = "fedavg"
    client_lr = 0.05

    [sampler]           # a registered client-selection rule
    name = "uniform"
    clients_per_round = 10

    [local]             # fedjax_het.data.LocalWork: batch_size, epochs or steps, max_steps, shuffle
    batch_size = 20
    epochs = 1.0

    [engine]            # chunk (0 = automatic), unroll, weighting, eval_batch_size,
                        # client_state: "auto", "device" or "host" (fedjax_het.engine.client_store),
                        # devices (0 = every local device), precision: "float32", "bfloat16"
                        # (local training) or "float64" (the whole run, for reference work),
                        # nonfinite: "stop" or "drop" (fedjax_het.training.divergence),
                        # checkpoint_every (rounds; 0 = only at the end and on Ctrl-C),
                        # matmul_precision: "highest" (float32 products on every backend),
                        # "high" (bf16x3 on GPU) or "default" (TF32 on GPU: about 1e-2
                        # from float32; on CPU all three are the same arithmetic),
                        # compile_cache: true keeps compiled programs on disk for the next
                        # run (fedjax_het.training.compilation: $FEDJAX_HET_CACHE_DIR, else
                        # ~/.cache/fedjax_het/xla); false compiles everything afresh

    [system]            # optional: device and state heterogeneity (fedjax_het.system.setup)
    devices = "flash"   # uniform, lognormal, flash; availability = always, bernoulli, strict...
                        # (devices, network, availability: or your own "traces/x.csv")

    [policy]            # optional: how rounds run: wait_all, deadline, readiness
    kind = "deadline"
    deadline = 120.0

    [selection]         # optional, with a system: a registered selection that learns
    name = "power_of_choice"
    candidates = 20

    [compression]       # optional: compressed updates (fedjax_het.transforms.compression.from_options)
    upload = "top_k"    # none, float16, bfloat16, qsgd, terngrad, sign, scaled_sign, random_k
    fraction = 0.01     # (levels for qsgd), error_feedback = true, download = "float16"

    [logging]           # optional: live curves (fedjax_het.front.logs): TensorBoard, W&B
    tensorboard = true  # event files in <out>/tensorboard; wandb = true: a W&B run (offline)

    [distributed]       # optional: several processes/hosts (fedjax_het.training.distributed.Cluster)
    enabled = true

Every key is checked against the signature of the function it feeds, before
anything is built or compiled: an unknown key, a value of the wrong type or an
impossible value raises :class:`ConfigError` naming the key and what is
allowed. No number may be NaN or infinite, except where :data:`UNBOUNDED`
says what ``inf`` means; integers fit in 32 bits; seeds are >= 0; a key of an optional table
that does nothing in the config chosen (``policy.on_late`` under ``policy.kind = "wait_all"``,
:data:`APPLIES`) is refused, saying where it applies. Only the
checks that need the data come after it is built (the model's options, checked
by its factory, which takes the data's shapes; a cohort larger than the
clients; a partition that cannot be drawn; every size the config sets, priced by
``fedjax_het.training.sizes``), still before anything compiles or any directory is made.

Each table's schema (its defaults, its checks and what it builds) lives beside the code it
configures: the top-level numbers, [engine] and [distributed] in ``fedjax_het.training.schema``;
[data], [partition], [feature_skew] and [local] in ``fedjax_het.data.schema``; [model] in
``fedjax_het.front.model_schema``; [algorithm] in ``fedjax_het.engine.schema`` (a mediator run's in
``fedjax_het.gandalf.schema``); [sampler], [system], [policy], [server] and [selection] in
``fedjax_het.system.schema``; [compression] and [privacy] in ``fedjax_het.transforms.schema``;
[logging] in ``fedjax_het.front.logs``.
They share the machinery of ``fedjax_het.schema``. This module assembles them: the
defaults, ``load``, ``options`` (every key with its type, default and description: what
``fedjax-het config --all`` and ``fedjax-het explain`` print, ``fedjax_het.front.explain``),
``schema`` and ``build``, with the checks between tables.

Over 400 lines on purpose: it assembles every table's schema into one config and holds the
defaults; each table's keys live in its layer's ``schema.py``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from inspect import signature
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_het import models, registry
from fedjax_het.algorithms.submodels import levels_by_speed
from fedjax_het.data import catalog
from fedjax_het.data import schema as data_schema
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine import schema as algorithm_schema
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.hooks import Freezing
from fedjax_het.front import logs, model_schema
from fedjax_het.front.toml_input import parse_override, read, shallow
from fedjax_het.gandalf import schema as gandalf_schema
from fedjax_het.gandalf.pipeline import GandalfOptions
from fedjax_het.schema import INT_BITS, ConfigError, Key, applies, representable, unknown
from fedjax_het.system import events, setup
from fedjax_het.system import schema as system_schema
from fedjax_het.system.sampler import Sampler
from fedjax_het.training import schema as training_schema
from fedjax_het.training import sizes
from fedjax_het.training.costs import client_costs
from fedjax_het.training.options import RunOptions, run_options
from fedjax_het.training.schema import cluster, compile_cache
from fedjax_het.transforms import schema as transforms_schema

__all__ = [
    "DEFAULTS",
    "INT_BITS",
    "TABLES",
    "UNBOUNDED",
    "ConfigError",
    "Experiment",
    "build",
    "cluster",
    "compile_cache",
    "load",
    "merge_defaults",
    "options",
    "parse_override",
    "read",
    "schema",
]

_ORDER = (
    "seed", "rounds", "eval_every", "data", "partition", "feature_skew", "model", "algorithm",
    "sampler", "local", "engine", "system", "policy", "selection", "server", "compression",
    "privacy", "logging", "distributed",
)  # fmt: skip
_TABLES = (training_schema, data_schema, model_schema, algorithm_schema, system_schema,
           transforms_schema, logs)  # fmt: skip
DEFAULTS: dict[str, Any] = dict(
    sorted(
        ((k, v) for table in _TABLES for k, v in table.DEFAULTS.items()),
        key=lambda item: _ORDER.index(item[0]),
    )
)
"""Every top-level key and table with its defaults, in the order a written config lists them."""
TABLES: dict[str, str] = {
    table: doc
    for table in DEFAULTS
    for module in (*_TABLES, gandalf_schema)
    for name, doc in getattr(module, "TABLES", {}).items()
    if name == table
}
"""What each table configures, in the order a written config lists them."""
UNBOUNDED: dict[str, str] = {**data_schema.UNBOUNDED, **system_schema.UNBOUNDED}
"""The number options for which ``inf`` means something, and what; every other number
option must be finite, and none may be NaN (``fedjax_het.schema.check``)."""
APPLIES = {**system_schema.APPLIES, **transforms_schema.APPLIES}
"""Where each key of an optional table does something; set elsewhere, it is refused."""
_NAME_KEYS = {"data": "name", "partition": "kind", "model": "name", "algorithm": "name"}
"""The keys that choose a table's function: naming another drops the default options."""


@dataclasses.dataclass
class Experiment:
    """Everything a run needs, built from a validated config."""

    data: FederatedData
    model: models.Model
    algorithm: FederatedAlgorithm
    sampler: Sampler
    work: LocalWork
    hyper: dict[str, float]
    config: dict[str, Any]
    system: setup.System | None = None
    select: Callable | None = None
    server: events.AsyncServer | None = None
    mediated: GandalfOptions | None = None  # algorithm.name "gandalf" or "mediator"
    notes: tuple[str, ...] = ()  # what the config changed that it does not say (printed)

    def options(self, **overrides: Any) -> RunOptions:
        """The option groups of :func:`fedjax_het.training.simulate.run` this config asks for,
        with ``overrides`` (an output directory, the progress bar) on top:
        ``simulate.run(experiment.data, *experiment.options(out_dir=...))``."""
        return run_options(
            model=self.model, algorithm=self.algorithm, sampler=self.sampler,
            **{**self.run_kwargs(), **overrides},
        )

    def run_kwargs(self) -> dict[str, Any]:
        """The flat keywords of ``run_options`` this config sets, besides the model, algorithm
        and sampler."""
        return {
            **training_schema.run_options(self.config),
            "work": self.work,
            "hyper": self.hyper,
            "system": self.system,
            "select": self.select,
            "server": self.server,
        }


def load(path: str | Path | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Reads ``path`` (or nothing), applies ``--set`` style ``overrides``, merges the defaults.

    Tables replace their defaults key by key; naming another ``data.name``,
    ``partition.kind``, ``model.name`` or ``algorithm.name`` drops the default
    options of the one it replaces.
    """
    raw = {} if path is None else read(path)
    for item in overrides:
        key, value = parse_override(item)
        *tables, leaf = key.split(".")
        node = raw
        for table in tables:
            node = node.setdefault(table, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {table!r} is not a table")
        node[leaf] = value
    shallow(raw)
    return merge_defaults(raw)


def merge_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (a config's tables) over :data:`DEFAULTS`, as ``load`` describes."""
    extra = sorted(set(raw) - set(DEFAULTS))
    if extra:
        raise ConfigError(unknown("top-level key", extra[0], DEFAULTS))
    merged = copy.deepcopy(DEFAULTS)
    for key, value in raw.items():
        if isinstance(DEFAULTS[key], dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key} must be a table ([{key}]), got {value!r}")
            name_key = _NAME_KEYS.get(key)
            if name_key in value and value[name_key] != DEFAULTS[key][name_key]:
                merged[key] = {}
            merged[key].update(value)
        else:
            merged[key] = value
    local = raw.get("local", {})
    if "steps" in local and "epochs" not in local:
        merged["local"].pop("epochs", None)  # local work is given in steps instead
    name = merged["data"].get("name")
    if isinstance(name, str) and name in catalog.NATURAL and "partition" not in raw:
        del merged["partition"]  # the clients come with the data
    return merged


def options(config: Mapping[str, Any]) -> dict[str, Key]:
    """Every key a merged ``config`` may set, as the :class:`~fedjax_het.schema.Key` that
    checks it: its type, its default in this config, the values it may take, what it does.

    The keys of a table follow what the config chooses (``data.name``,
    ``partition.kind``, ``feature_skew.kind``, ``model.name``,
    ``algorithm.name`` with its traced hyperparameters, ``selection.name``);
    ``[system]``, ``[policy]``, ``[server]``, ``[compression]``, ``[privacy]`` and
    ``[distributed]`` are listed whether or not the config has them. It is how tests and
    ``fedjax-het explain`` reach every option, so that a new one is covered as soon as it exists.
    """
    mediated = gandalf_schema.is_mediated(config)
    out = {
        **training_schema.keys(),
        **data_schema.keys(config),
        **model_schema.keys(config),
        **(gandalf_schema.keys(config) if mediated else algorithm_schema.keys(config)),
        **system_schema.keys(config),
        **transforms_schema.keys(),
        **logs.keys(),
    }
    if "algorithm.name" in out:
        out["algorithm.name"] = gandalf_schema.name_key()
    return {key: spec._replace(default=_default(config, key, spec)) for key, spec in out.items()}


def _default(config: Mapping[str, Any], key: str, spec: Key) -> Any:
    """``key``'s default in ``config``: :data:`DEFAULTS`' where its table is the default one
    (``local.batch_size = 20``), else its function's (``spec.default``)."""
    table, _, leaf = key.rpartition(".")
    defaults = DEFAULTS.get(table, {}) if table else DEFAULTS
    chooser = _NAME_KEYS.get(table)
    if chooser and config.get(table, {}).get(chooser) != defaults.get(chooser):
        return spec.default
    return defaults.get(leaf, spec.default)


def schema(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every key a merged ``config`` may set, with its type (``{"rounds": int, ...}``): the
    types of :func:`options`."""
    return {key: spec.hint for key, spec in options(config).items()}


@dataclasses.dataclass
class _Checked:
    """The parts of a config that ``build`` checks before the data exists."""

    dataset: Callable[..., Any]
    data_args: dict[str, Any]
    partition: dict[str, Any] | None
    skew: dict[str, Any] | None
    work: LocalWork
    model: Callable[..., models.Model]
    model_args: dict[str, Any]
    algorithm: FederatedAlgorithm
    untransformed: FederatedAlgorithm  # before [privacy] and [compression]
    hyper: dict[str, float]
    mediated: gandalf_schema.Mediated | None
    private: dict[str, float] | None
    sampler: Callable[..., Sampler]
    cohort: int
    system: system_schema.SystemOptions | None
    selection: system_schema.Selection | None
    server: events.AsyncServer | None


def build(config: Mapping[str, Any]) -> Experiment:
    """Validates every key of a merged config and builds the experiment's parts.

    The returned experiment's ``config`` is the resolved config: every option
    with the value the run uses, so writing it out gives a config that
    reproduces the run. A config with ``engine.precision = "float64"`` turns on
    ``jax_enable_x64`` for the process (the float64 run needs it).
    """
    config = copy.deepcopy(dict(config))
    checked = _check_tables(config)
    sizes.check_data(config)  # a generated dataset, before it is generated
    # Every key is checked: from here on, only what needs the data itself.
    data = data_schema.build_data(
        checked.dataset, checked.data_args, checked.partition, checked.skew,
        config["data"].get("num_clients"),
    )  # fmt: skip
    num_clients = data.num_clients
    system_schema.check_with_data(checked.cohort, checked.server, num_clients)
    clusters = config["algorithm"].get("num_clusters")
    if clusters is not None and clusters > num_clients:
        raise ConfigError(f"algorithm.num_clusters must be at most the {num_clients} clients of "
                          f"the data (each client joins one cluster), got {clusters}")
    notes = ()
    if checked.private is not None:
        asked = config["rounds"]
        config["rounds"] = transforms_schema.rounds_within_budget(
            checked.private, asked, checked.cohort, num_clients
        )
        notes = transforms_schema.budget_notes(checked.private, asked, config["rounds"])
    model = model_schema.build_model(
        checked.model, checked.model_args, data.example_shape, data.num_classes, data.train.x,
        data.train.y,
    )
    planned = checked.selection is None and checked.algorithm.hook(Freezing) is None
    sizes.check(config, data, model, checked.work, checked.cohort, planned=planned)
    transforms_schema.check_updates(
        config, checked.untransformed, model, data.train.x, data.train.y
    )
    sampler = system_schema.build_sampler(checked.sampler, num_clients, checked.cohort)
    system = select = None
    if checked.system is not None:
        system = system_schema.build_system(checked.system, num_clients)
    algorithm = _with_widths(config, checked, system, model, data)
    if checked.selection is not None:
        select = system_schema.build_selection(
            checked.selection, checked.cohort, system, num_clients
        )
    mediated = None if checked.mediated is None else checked.mediated.options
    return Experiment(
        data, model, algorithm, sampler, checked.work, checked.hyper, config, system, select,
        checked.server, mediated, notes,
    )  # fmt: skip


def _with_widths(
    config: dict[str, Any], checked: _Checked, system: setup.System | None, model: models.Model,
    data: FederatedData,
) -> FederatedAlgorithm:
    """The algorithm, with ``algorithm.width_from = "speed"``'s client levels from the
    system's step times (``submodels.levels_by_speed``; not written to the resolved config,
    which derives them again), and its sub-model costs checked on the model."""
    algorithm, table = checked.algorithm, config["algorithm"]
    if table.get("width_from") == "speed":
        widths = table.get("widths", signature(registry.lookup("algorithm", table["name"]))
                           .parameters["widths"].default)
        levels = levels_by_speed(np.asarray(system.profiles.step_time), len(widths))
        rebuilt = {**config, "algorithm": {**table, "width_from": "uniform",
                                          "client_levels": list(levels)}}
        algorithm, _ = algorithm_schema.algorithm(rebuilt)
        algorithm, _ = transforms_schema.transformed(rebuilt, algorithm, checked.cohort)
    try:
        client_costs(algorithm, model, data.num_clients, data.train.x)
    except ValueError as err:
        raise ConfigError(f"algorithm.name = {algorithm.name!r} with model.name = "
                          f"{config['model']['name']!r}: {err}") from None
    return algorithm


def _applies(config: dict[str, Any], given: Mapping[str, Sequence[str]]) -> None:
    """Refuses a key of an optional table that does nothing in the resolved ``config``
    (:data:`APPLIES`), such as ``policy.deadline`` when ``policy.kind`` is not "deadline"."""
    if not any(f"{table}.{key}" in APPLIES for table, keys in given.items() for key in keys):
        return
    defaults = {key: spec.default for key, spec in options(config).items()}
    applies(config, given, APPLIES, defaults)


def _check_tables(config: dict[str, Any]) -> _Checked:
    """Checks every table without the data, in place (each resolved to the values the run
    uses), and the rules between tables."""
    given = {name: list(table) for name, table in config.items() if isinstance(table, Mapping)}
    training_schema.check_run(config)
    representable(config, config["engine"]["precision"])  # before numpy casts the values
    if config["engine"]["precision"] == "float64":
        jax.config.update("jax_enable_x64", True)
    training_schema.resolve_cluster(config)
    dataset, data_args = data_schema.dataset(config)
    sampler, cohort = system_schema.sampler(config, config["data"].get("num_clients") or None)
    work = data_schema.local_work(config)
    model, model_args = model_schema.model_options(config)
    mediated = gandalf_schema.mediated(config)
    algorithm, hyper = algorithm_schema.algorithm(config)
    if mediated is not None:
        gandalf_schema.record(config, mediated)
    untransformed = algorithm
    algorithm, private = transforms_schema.transformed(config, algorithm, cohort)
    partition, skew = data_schema.partition_and_skew(config)
    system = system_schema.system_options(config)
    freezes = algorithm.hook(Freezing) is not None
    if freezes and system is None:
        raise ConfigError(
            f"algorithm {algorithm.name!r} freezes layers by device timing: it needs a [system] "
            "(and [policy]) table"
        )
    if config["algorithm"].get("width_from") == "speed" and system is None:
        raise ConfigError("algorithm.width_from = 'speed' ranks the clients by their devices' "
                          "step times: it needs a [system] table (or width_from = 'uniform')")
    if config["algorithm"].get("width_from") == "speed" and config["algorithm"].get(
            "client_levels"):
        raise ConfigError("algorithm.width_from = 'speed' derives algorithm.client_levels from "
                          "the devices' step times: give one of the two")
    selection = system_schema.selection_options(config, has_system=system is not None)
    server = system_schema.server_options(
        config, system, algorithm=algorithm.name, freezes=freezes,
        learned_selection=selection is not None, private=private is not None,
    )  # fmt: skip
    representable(config, config["engine"]["precision"])
    _applies(config, given)
    logs.options(config)
    return _Checked(
        dataset, data_args, partition, skew, work, model, model_args, algorithm, untransformed,
        hyper, mediated, private, sampler, cohort, system, selection, server,
    )  # fmt: skip
