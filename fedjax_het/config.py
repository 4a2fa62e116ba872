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

    [distributed]       # optional: several processes/hosts (fedjax_het.training.distributed.Cluster)
    enabled = true

Every key is checked against the signature of the function it feeds, before
anything is built or compiled: an unknown key, a value of the wrong type or an
impossible value raises :class:`ConfigError` naming the key and what is
allowed. No number may be NaN or infinite, except where :data:`UNBOUNDED`
says what ``inf`` means; integers fit in 32 bits; seeds are >= 0. Only the
checks that need the data come after it is built (the model's options, checked
by its factory, which takes the data's shapes; a cohort larger than the
clients; a partition that cannot be drawn), still before anything compiles.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import math
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from fedjax_het import models, registry
from fedjax_het.data import catalog, feature_skew, partitioners
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.engine.client_store import PLACEMENTS
from fedjax_het.engine.local import PRECISIONS
from fedjax_het.gandalf import pipeline as gandalf
from fedjax_het.system import events, setup
from fedjax_het.system.policy import RoundPolicy, num_selected
from fedjax_het.system.sampler import Sampler
from fedjax_het.training import compilation, distributed
from fedjax_het.training.divergence import NONFINITE
from fedjax_het.transforms import compression, privacy


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is allowed."""


DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "rounds": 200,
    "eval_every": 10,
    "data": {"name": "fashion_mnist", "num_clients": 100},
    "partition": {"kind": "dirichlet", "beta": 0.5, "min_size": 10},
    "feature_skew": {},
    "model": {"name": "mlp", "hidden": [200, 200]},
    "algorithm": {"name": "fedavg", "client_lr": 0.05},
    "sampler": {"name": "uniform", "clients_per_round": 10},
    "local": {"batch_size": 20, "epochs": 1.0},
    "engine": {
        "chunk": 0, "unroll": 1, "weighting": "examples", "eval_batch_size": 1024,
        "client_state": "auto", "devices": 0, "precision": "float32", "nonfinite": "stop",
        "checkpoint_every": 50, "matmul_precision": compilation.DEFAULT_MATMUL_PRECISION,
        "compile_cache": True,
    },
    "system": {},
    "policy": {},
    "selection": {},
    "server": {},
    "compression": {},
    "privacy": {},
    "distributed": {},
}
SCALARS = {"seed": int, "rounds": int, "eval_every": int}
ENGINE = {
    "chunk": int, "unroll": int, "weighting": str, "eval_batch_size": int, "client_state": str,
    "devices": int, "precision": str, "nonfinite": str, "checkpoint_every": int,
    "matmul_precision": str, "compile_cache": bool,
}
UNBOUNDED: dict[str, str] = {
    "partition.beta": "no skew: the Dirichlet limit of equal proportions",
    "system.bandwidth": "transfers take no time",
}
"""The number options for which ``inf`` means something, and what; every other number
option must be finite, and none may be NaN (``_check``)."""
INT_BITS = 32  # integer options must fit JAX's default int32


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
    mediated: gandalf.GandalfOptions | None = None  # algorithm.name "gandalf" or "mediator"

    def run_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`fedjax_het.training.simulate.run` this config asks for."""
        engine = self.config["engine"]
        return {
            "rounds": self.config["rounds"],
            "eval_every": self.config["eval_every"],
            "seed": self.config["seed"],
            "work": self.work,
            "hyper": self.hyper,
            "chunk": engine["chunk"] or None,
            "unroll": engine["unroll"],
            "weighting": engine["weighting"],
            "eval_batch_size": engine["eval_batch_size"],
            "client_state": engine["client_state"],
            "devices": engine["devices"] or None,
            "precision": engine["precision"],
            "nonfinite": engine["nonfinite"],
            "checkpoint_every": engine["checkpoint_every"],
            "matmul_precision": engine["matmul_precision"],
            "compile_cache": engine["compile_cache"],
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
    return merge_defaults(raw)


def read(path: str | Path) -> dict[str, Any]:
    """The TOML tables of the config file ``path``.

    Raises:
      ConfigError: one line naming the path: it does not exist, is a folder or
        not a regular file, cannot be read, is not UTF-8 text, or is not valid
        TOML (with tomllib's line and column).
    """
    name = f"config file {str(path)!r}"
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"{name} is a folder, not a TOML file")
    if file.exists() and not file.is_file():
        raise ConfigError(f"{name} is not a regular file")
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{name} does not exist") from None
    except OSError as err:
        raise ConfigError(f"{name} cannot be read: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{name} is not a text file (not UTF-8 at byte {err.start}); a config is TOML text"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{name} is not valid TOML: {err}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """``"algorithm.client_lr=0.1"`` -> ``("algorithm.client_lr", 0.1)``; values are TOML."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. algorithm.client_lr=0.1), got {item!r}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word is a string
    return key.strip(), value


_NAME_KEYS = {"data": "name", "partition": "kind", "model": "name", "algorithm": "name"}


def merge_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ConfigError(_unknown("top-level key", unknown[0], DEFAULTS))
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


def cluster(config: Mapping[str, Any]) -> distributed.Cluster:
    """The ``[distributed]`` table of a merged config, checked (read before ``build``:
    ``jax.distributed.initialize`` must come before JAX computes anything)."""
    return _construct("distributed", distributed.Cluster, config["distributed"])


def compile_cache(config: Mapping[str, Any]) -> bool:
    """``engine.compile_cache`` of a merged config, checked (read before ``build``, which may
    compile: ``compilation.configure`` comes first so that those programs are cached too)."""
    default = DEFAULTS["engine"]["compile_cache"]
    return _check("engine.compile_cache", config["engine"].get("compile_cache", default), bool)


def schema(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every key a merged ``config`` may set, with its type (``{"rounds": int, ...}``).

    The keys of a table follow what the config chooses (``data.name``,
    ``partition.kind``, ``feature_skew.kind``, ``model.name``,
    ``algorithm.name`` with its traced hyperparameters, ``selection.name``);
    ``[system]`` and ``[policy]`` are listed whether or not the config has
    them. It is how tests reach every option, so that a new one is covered
    as soon as it exists.
    """
    keys: dict[str, Any] = {**SCALARS, **{f"engine.{k}": v for k, v in ENGINE.items()}}
    chosen = {**_NAME_KEYS, "sampler": "name", "feature_skew": "kind", "selection": "name"}
    keys.update({f"{table}.{name}": str for table, name in chosen.items() if config.get(table)})

    def add(table: str, fn: Callable, skip: Sequence[str] = ()) -> None:
        hints = typing.get_type_hints(fn)
        keys.update({f"{table}.{k}": hints.get(k, Any) for k in configurable(fn, skip)})

    add("data", _choose("data.name", config["data"].get("name"), catalog.DATASETS))
    if config.get("partition"):
        kind = config["partition"].get("kind")
        add("partition", _choose("partition.kind", kind, partitioners.PARTITIONERS),
            _PARTITION_SKIP)
    if config.get("feature_skew"):
        kind = config["feature_skew"].get("kind")
        add("feature_skew", _choose("feature_skew.kind", kind, feature_skew.FEATURE_TRANSFORMS),
            ("x", "y", "parts", "seed"))
    add("model", _choose("model.name", config["model"].get("name"), models.ZOO),
        ("example_shape", "num_classes"))
    name = config["algorithm"].get("name")
    if name in gandalf.MEDIATED:
        hints = typing.get_type_hints(gandalf.GandalfOptions)
        keys.update({f"algorithm.{k}": hints[k] for k in _MEDIATOR_OPTIONS})
        factory = _registered("algorithm", "fedavg")
    else:
        factory = _registered("algorithm", name)
        add("algorithm", factory)
    keys.update({f"algorithm.{k}": float for k, _ in _guarded("algorithm", factory).hyper_defaults})
    keys["sampler.clients_per_round"] = int
    for table, cls in (("local", LocalWork), ("distributed", distributed.Cluster)):
        keys.update({f"{table}.{k}": v for k, v in typing.get_type_hints(cls).items()})
    add("system", setup.profiles_from_options, ("num_clients",))
    add("policy", setup.policy_from_options)
    add("server", events.server_from_options, ("start", "on_unavailable"))
    add("compression", compression.from_options)
    add("privacy", privacy.options)
    if config.get("selection"):
        add("selection", _registered("selection", config["selection"].get("name")),
            ("num_clients", "num_slots"))
    return keys


def build(config: Mapping[str, Any]) -> Experiment:
    """Validates every key of a merged config and builds the experiment's parts.

    The returned experiment's ``config`` is the resolved config: every option
    with the value the run uses, so writing it out gives a config that
    reproduces the run. A config with ``engine.precision = "float64"`` turns on
    ``jax_enable_x64`` for the process (the float64 run needs it).
    """
    config = copy.deepcopy(dict(config))
    _check_run(config)
    if config["engine"]["precision"] == "float64":
        jax.config.update("jax_enable_x64", True)
    config["distributed"] = {
        k: v for k, v in dataclasses.asdict(cluster(config)).items() if v is not None
    }
    data_table = dict(config["data"])
    dataset = _choose("data.name", data_table.pop("name", None), catalog.DATASETS)
    data_args = _arguments("data", dataset, data_table)
    config["data"] = {"name": config["data"]["name"], **_resolved(data_args, dataset)}
    sampler_factory, cohort = _sampler(config["sampler"], config["data"].get("num_clients") or None)
    work = _construct("local", LocalWork, config["local"])
    config["local"] = {
        f.name: getattr(work, f.name) for f in dataclasses.fields(work)
        if getattr(work, f.name) is not None
    }
    model_table = dict(config["model"])
    model_factory = _choose("model.name", model_table.pop("name", None), models.ZOO)
    skip = ("example_shape", "num_classes")
    model_args = _arguments("model", model_factory, model_table, skip)
    config["model"] = {"name": config["model"]["name"], **_resolved(model_args, model_factory, skip)}
    mediated = _mediated(config)
    algorithm, hyper = _algorithm(config["algorithm"])
    config["algorithm"] = {**config["algorithm"], **dict(algorithm.hyper_defaults), **hyper}
    if mediated is not None:
        config["algorithm"] = {**mediated[1], **config["algorithm"], "name": mediated[2]}
        mediated = mediated[0]
    private = _privacy_options(config)
    if private is not None:
        chosen = {k: v for k, v in private.items() if k != "target_epsilon"}
        algorithm = _guarded(
            "privacy", lambda: privacy.private(algorithm, cohort_size=cohort, **chosen)
        )
    algorithm = _compressed(config, algorithm)
    if private is not None and config.get("compression", {}).get("majority_vote"):
        raise ConfigError("compression.majority_vote and [privacy] do not combine: DP-FedAvg "
                          "noises a sum of clipped updates, not a vote")  # fmt: skip
    partition = _check_partition(config)
    skew = _check_skew(config, partition)
    if partition is not None:
        kind = partition["kind"]
        params = _resolved(partition, partitioners.PARTITIONERS[kind], _PARTITION_SKIP)
        config["partition"] = {"kind": kind, **{k: v for k, v in params.items() if k != "kind"}}
    system_options = _system_options(config)
    if algorithm.freezing is not None and system_options is None:
        raise ConfigError(
            f"algorithm {algorithm.name!r} freezes layers by device timing: it needs a [system] "
            "(and [policy]) table"
        )
    selection = _selection_options(config, has_system=system_options is not None)
    server = _server_options(config, system_options, algorithm, selection is not None)

    # Every key is checked: from here on, only what needs the data itself.
    data = _build_data(dataset, data_args, partition, skew, config["data"].get("num_clients"))
    if cohort > data.num_clients:
        raise ConfigError(
            f"sampler.clients_per_round must be between 1 and the {data.num_clients} clients of "
            f"the data, got {cohort}"
        )
    if server is not None and server.concurrency > data.num_clients:
        raise ConfigError(
            f"server.concurrency must be at most the {data.num_clients} clients of the data, got "
            f"{server.concurrency}"
        )
    if private is not None and private["target_epsilon"] > 0:
        config["rounds"] = _rounds_within_budget(private, config["rounds"], cohort, data.num_clients)
    model = _guarded("model", lambda: model_factory(data.example_shape, data.num_classes, **model_args))
    sampler = _guarded("sampler", lambda: sampler_factory(data.num_clients, cohort))
    system = select = None
    if system_options is not None:
        profile_args, policy = system_options
        profiles = _guarded(
            "system", lambda: setup.profiles_from_options(data.num_clients, **profile_args)
        )
        system = setup.System(profiles, policy)
    if selection is not None:
        factory, args = selection
        slots = min(int(num_selected(cohort, system.policy.over_commit)), data.num_clients)
        select = _guarded("selection", lambda: factory(data.num_clients, slots, **args))
    return Experiment(
        data, model, algorithm, sampler, work, hyper, config, system, select, server, mediated
    )


def _rounds_within_budget(private: dict[str, float], rounds: int, cohort: int, clients: int) -> int:
    """``rounds``, cut to the last round within ``privacy.target_epsilon`` (the run stops there)."""
    allowed = privacy.rounds_within(
        private["target_epsilon"], private["noise_multiplier"], cohort, clients, private["delta"],
        most=rounds,
    )
    if allowed == 0:
        raise ConfigError(
            f"privacy.target_epsilon = {private['target_epsilon']} at delta {private['delta']}: "
            f"not one round fits at noise_multiplier {private['noise_multiplier']} with "
            f"{cohort} of {clients} clients a round"
        )
    return allowed


def _privacy_options(config: dict[str, Any]) -> dict[str, float] | None:
    """The optional [privacy] table, checked (``privacy.options``)."""
    args = _optional_table(config, "privacy", privacy.options)
    return None if args is None else _guarded("privacy", lambda: privacy.options(**args))


def _optional_table(config: dict[str, Any], name: str, fn: Callable) -> dict[str, Any] | None:
    """An optional table checked against ``fn``'s signature: its values, with ``fn``'s defaults
    filled in the run's record; None (and the table dropped) when it is empty."""
    table = dict(config.get(name) or {})
    if not table:
        config.pop(name, None)
        return None
    args = _arguments(name, fn, table)
    config[name] = _resolved(args, fn)
    return args


def _compressed(config: dict[str, Any], algorithm: FederatedAlgorithm) -> FederatedAlgorithm:
    """``algorithm`` with the optional [compression] table's encodings (``compression.compressed``)."""
    args = _optional_table(config, "compression", compression.from_options)
    if args is None:
        return algorithm
    upload, download, vote = _guarded("compression", lambda: compression.from_options(**args))
    return _guarded(
        "compression",
        lambda: compression.compressed(
            algorithm, upload=upload, download=download, majority_vote=vote
        ),
    )


def _selection_options(config: dict[str, Any], *, has_system: bool) -> tuple[Callable, dict] | None:
    """The optional [selection] table, checked: a learned selection's factory and options."""
    table = dict(config.get("selection") or {})
    if not table:
        config.pop("selection", None)
        return None
    if not has_system:
        raise ConfigError("selection needs a [system] (and [policy]): it selects among devices")
    name = table.pop("name", None)
    factory = _registered("selection", name)
    skip = ("num_clients", "num_slots")
    args = _arguments("selection", factory, table, skip)
    config["selection"] = {"name": name, **_resolved(args, factory, skip)}
    return factory, args


_MEDIATOR_OPTIONS = tuple(
    f.name for f in dataclasses.fields(gandalf.GandalfOptions) if f.name != "gan"
)


def _mediated(config: dict[str, Any]) -> tuple[gandalf.GandalfOptions, dict, str] | None:
    """For ``algorithm.name = "gandalf" | "mediator"`` (``gandalf.run_gandalf``): the checked
    options, their resolved values and the name; the [algorithm] table is left holding FedAvg's
    name and hyperparameters. None for every other algorithm."""
    name = config["algorithm"].get("name")
    if name not in gandalf.MEDIATED:
        return None
    for table in ("server", "selection", "compression", "privacy"):
        if config.get(table):
            raise ConfigError(f"algorithm.name = {name!r} runs mediator groups: it takes no "
                              f"[{table}] table")
    table = dict(config["algorithm"])
    options = {k: table.pop(k) for k in list(table) if k in _MEDIATOR_OPTIONS}
    chosen = _guarded("algorithm", lambda: gandalf.gandalf_options(
        gan=gandalf.MEDIATED[name], **options))
    resolved = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in dataclasses.asdict(chosen).items() if k != "gan" and v is not None
    }
    config["algorithm"] = {**table, "name": "fedavg"}
    return chosen, resolved, name


def _server_options(
    config: dict[str, Any], system: tuple[dict[str, Any], RoundPolicy] | None,
    algorithm: FederatedAlgorithm, learned_selection: bool,
) -> events.AsyncServer | None:
    """The optional [server] table, checked: an asynchronous server (with its trace start and
    unavailability rule from the [policy]), or None for the synchronous one."""
    skip = ("start", "on_unavailable")
    table = dict(config.get("server") or {})
    if not table:
        config.pop("server", None)
        return None
    args = _arguments("server", events.server_from_options, table, skip)
    config["server"] = _resolved(args, events.server_from_options, skip)
    if config["server"]["mode"] == "sync":
        return _guarded("server", lambda: events.server_from_options(**args))
    if system is None:
        raise ConfigError("server.mode = 'async' runs on device timings: it needs a [system] "
                          "(and [policy]) table")
    if learned_selection or algorithm.freezing is not None:
        raise ConfigError(
            "server.mode = 'async' takes neither a [selection] nor an algorithm that freezes by "
            f"device timing ({algorithm.name}); run them with server.mode = 'sync'"
        )
    policy = system[1]
    if policy.max_staleness:
        raise ConfigError("policy.max_staleness (stale tasks of the synchronous server) and "
                          "server.mode = 'async' do not combine; use server.max_staleness")
    return _guarded("server", lambda: events.server_from_options(
        **args, start=float(policy.start), on_unavailable=policy.on_unavailable))


def _system_options(config: dict[str, Any]) -> tuple[dict[str, Any], RoundPolicy] | None:
    """The [system] and [policy] tables, checked without the data: the profile options and
    the policy. Neither table given means no system heterogeneity (None)."""
    tables = {name: dict(config.get(name) or {}) for name in ("system", "policy")}
    if not any(tables.values()):
        for name in tables:
            config.pop(name, None)
        return None
    profile_args = setup.absolute_paths(_arguments(
        "system", setup.profiles_from_options, tables["system"], skip=("num_clients",)
    ))
    _guarded("system", lambda: setup.check_profile_options(**profile_args))
    policy_args = _arguments("policy", setup.policy_from_options, tables["policy"])
    config["system"] = _resolved(profile_args, setup.profiles_from_options, ("num_clients",))
    config["policy"] = _resolved(policy_args, setup.policy_from_options)
    return profile_args, _guarded("policy", lambda: setup.policy_from_options(**policy_args))


def _check_run(config: dict[str, Any]) -> None:
    """The top-level numbers and the [engine] table, in place."""
    for key, kind in SCALARS.items():
        config[key] = _check(key, config[key], kind)
    for key in ("rounds", "eval_every"):
        if config[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {config[key]}")
    engine = config["engine"]
    for key in engine:
        if key not in ENGINE:
            raise ConfigError(_unknown("key", f"engine.{key}", {f"engine.{k}": 0 for k in ENGINE}))
    for key, kind in ENGINE.items():
        engine[key] = _check(f"engine.{key}", engine.get(key, DEFAULTS["engine"][key]), kind)
    for key in ("chunk", "devices", "checkpoint_every"):
        if engine[key] < 0:
            raise ConfigError(f"engine.{key} must be >= 0, got {engine[key]}")
    if engine["devices"] > jax.device_count():  # the devices of every process (cohort.client_mesh)
        raise ConfigError(
            f"engine.devices must be between 0 (every device) and the {jax.device_count()} "
            f"devices JAX sees, got {engine['devices']}"
        )
    if engine["nonfinite"] not in NONFINITE:
        raise ConfigError(
            f"engine.nonfinite must be 'stop' or 'drop', got {engine['nonfinite']!r}"
        )
    if engine["precision"] not in PRECISIONS:
        raise ConfigError(
            f"engine.precision must be one of {', '.join(map(repr, PRECISIONS))}, got "
            f"{engine['precision']!r}"
        )
    try:
        compilation.check_matmul_precision(engine["matmul_precision"], "engine.matmul_precision")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key in ("unroll", "eval_batch_size"):
        if engine[key] < 1:
            raise ConfigError(f"engine.{key} must be >= 1, got {engine[key]}")
    if engine["weighting"] not in ("examples", "uniform"):
        raise ConfigError(
            f"engine.weighting must be 'examples' or 'uniform', got {engine['weighting']!r}"
        )
    if engine["client_state"] not in PLACEMENTS:
        raise ConfigError(
            f"engine.client_state must be one of {', '.join(map(repr, PLACEMENTS))}, got "
            f"{engine['client_state']!r}"
        )


def _sampler(table: Mapping[str, Any], num_clients: int | None) -> tuple[Callable, int]:
    """The sampler factory and cohort size; checked against ``num_clients`` when it is known."""
    table = dict(table)
    factory = _registered("sampler", table.pop("name", None))
    cohort = _check("sampler.clients_per_round", table.pop("clients_per_round", 10), int)
    for key in table:
        allowed = {"sampler.name": 0, "sampler.clients_per_round": 0}
        raise ConfigError(_unknown("key", f"sampler.{key}", allowed))
    if cohort < 1 or (num_clients is not None and cohort > num_clients):
        raise ConfigError(
            f"sampler.clients_per_round must be between 1 and data.num_clients={num_clients}, "
            f"got {cohort}"
        )
    return factory, cohort


_PARTITION_SKIP = ("labels", "num_clients", "seed")


def _check_partition(config: Mapping[str, Any]) -> dict[str, Any] | None:
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
    factory = _choose("partition.kind", kind, partitioners.PARTITIONERS)
    checked = _arguments("partition", factory, partition, _PARTITION_SKIP)
    return {"kind": kind, **checked}


def _check_skew(config: dict[str, Any], partition: dict[str, Any] | None) -> dict[str, Any] | None:
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
    transform = _choose("feature_skew.kind", kind, feature_skew.FEATURE_TRANSFORMS)
    skip = ("x", "y", "parts", "seed")
    checked = _arguments("feature_skew", transform, table, skip)
    config["feature_skew"] = {"kind": kind, **_resolved(checked, transform, skip)}
    return {"kind": kind, **checked}


def _build_data(dataset, data_args, partition, skew, num_clients) -> FederatedData:
    built = _guarded("data", lambda: dataset(**data_args))
    if partition is None:
        return built
    seed = data_args.get("seed", 0)
    return _guarded(
        "partition" if skew is None else "partition / feature_skew",
        lambda: catalog.federate(built, num_clients, partition, seed=seed, skew=skew),
    )


def _algorithm(table: Mapping[str, Any]) -> tuple[FederatedAlgorithm, dict[str, float]]:
    table = dict(table)
    factory = _registered("algorithm", table.pop("name", None))
    params = configurable(factory)
    structural = {k: v for k, v in table.items() if k in params}
    algorithm = _guarded("algorithm", lambda: factory(**_arguments("algorithm", factory, structural)))
    allowed = dict(algorithm.hyper_defaults)
    hyper = {}
    for key, value in table.items():
        if key in structural:
            continue
        if key not in allowed:
            raise ConfigError(_unknown("key", f"algorithm.{key}",
                                       {f"algorithm.{k}": 0 for k in [*allowed, *params]}))
        hyper[key] = _check(f"algorithm.{key}", value, float)
        try:  # its range (the defaults were checked when the algorithm was built)
            algorithm.check_hyper(key, hyper[key], label=f"algorithm.{key}")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return algorithm, hyper


def _registered(kind: str, name: Any) -> Callable:
    """The factory registered under ``name`` (``fedjax_het.registry``)."""
    known = registry.names(kind)
    if not isinstance(name, str) or name not in known:
        raise ConfigError(_unknown(f"{kind}.name", name, dict.fromkeys(known)))
    return registry.lookup(kind, name)


def _choose(key: str, name: Any, choices: Mapping[str, Any]) -> Any:
    if not isinstance(name, str) or name not in choices:
        raise ConfigError(_unknown(key, name, choices))
    return choices[name]


def _arguments(table: str, fn: Callable, values: Mapping[str, Any], skip: Sequence[str] = ()) -> dict:
    """Checks ``values`` against ``fn``'s configurable keyword parameters and their type hints.

    Configurable parameters are those whose default is a TOML value (number,
    string, bool, list) or that have no default. Returns the checked values.
    """
    params = configurable(fn, skip)
    hints = typing.get_type_hints(fn)
    out = {}
    for key, value in values.items():
        if key not in params:
            raise ConfigError(_unknown("key", f"{table}.{key}", {f"{table}.{k}": 0 for k in params}))
        out[key] = _check(f"{table}.{key}", value, hints.get(key, Any))
    missing = [k for k, default in params.items() if default is ... and k not in out]
    if missing:
        raise ConfigError(f"{table}.{missing[0]} is required here and has no default")
    return out


def configurable(fn: Callable, skip: Sequence[str] = ()) -> dict[str, Any]:
    """``{name: default}`` of ``fn``'s parameters a config table may set (no default: ``...``)."""
    out = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in skip or p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        if p.default is p.empty:
            out[name] = ...
        elif isinstance(p.default, (bool, int, float, str, list, tuple)):
            out[name] = list(p.default) if isinstance(p.default, tuple) else p.default
    return out


def _resolved(table: Mapping[str, Any], fn: Callable, skip: Sequence[str] = ()) -> dict[str, Any]:
    """``table`` with every configurable default of ``fn`` filled in, for the run's record."""
    defaults = {k: v for k, v in configurable(fn, skip).items() if v is not ...}
    return {**defaults, **table}


def _construct(table: str, cls: type, values: Mapping[str, Any]):
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in values:
        if key not in fields:
            raise ConfigError(_unknown("key", f"{table}.{key}", {f"{table}.{k}": 0 for k in fields}))
    checked = {k: _check(f"{table}.{k}", v, hints[k]) for k, v in values.items()}
    if "steps" in checked and "epochs" not in checked:
        checked["epochs"] = None
    return _guarded(table, lambda: cls(**checked))


def _guarded(table: str, make: Callable[[], Any]) -> Any:
    """Runs a constructor, turning its ValueError into a ConfigError that names the table."""
    try:
        return make()
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"[{table}] {err}") from None


def _check(key: str, value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` (int, float, bool, str, sequences, optionals) or a ConfigError."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        # The option of the value's own kind first, so that its error is the one reported.
        options.sort(key=lambda option: _is_sequence(option) != isinstance(value, (list, tuple)))
        errors = []
        for option in options:
            try:
                return _check(key, value, option)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key} has an unsupported type")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the largest float
            number = math.inf if value > 0 else -math.inf
        if math.isfinite(number) or (number == math.inf and key in UNBOUNDED):
            return number
        allowed = f" or inf ({UNBOUNDED[key]})" if key in UNBOUNDED else ""
        raise ConfigError(f"{key} must be a finite number{allowed}, got {number}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        if not -(2 ** (INT_BITS - 1)) <= value < 2 ** (INT_BITS - 1):
            raise ConfigError(
                f"{key} must be an integer of {INT_BITS} bits (|value| < 2**{INT_BITS - 1}), "
                f"got {value}"
            )
        if key.rpartition(".")[2] == "seed" and value < 0:  # numpy refuses them, JAX wraps them
            raise ConfigError(f"{key} must be >= 0, got {value}")
        return value
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if _is_sequence(hint):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return [_check(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)] if args else value
    return value


def _is_sequence(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    return origin in (list, tuple, Sequence, typing.Sequence) or hint in (list, tuple)


def _unknown(what: str, name: Any, choices: Mapping[str, Any]) -> str:
    known = sorted(choices)
    hint = difflib.get_close_matches(str(name), known, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown {what} {name!r}{suggestion}; allowed: {', '.join(known)}"
