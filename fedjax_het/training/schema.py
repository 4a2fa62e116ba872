"""The config's top-level numbers and its [engine] and [distributed] tables: how the training
loop runs (``simulate.run``'s options) and how this process joins a multi-process run.

Both are read before anything else of the config: ``[distributed]`` because
``jax.distributed.initialize`` must come before JAX computes anything, ``engine.compile_cache``
because ``compilation.configure`` must come before the first compilation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from fedjax_het.configuring import ConfigError, Key, check, construct, dataclass_keys, unknown
from fedjax_het.engine.client_store import PLACEMENTS
from fedjax_het.engine.local import PRECISIONS
from fedjax_het.training import compilation, distributed
from fedjax_het.training.divergence import NONFINITE

TOP = {"seed": Key(int, 0), "rounds": Key(int, 200), "eval_every": Key(int, 10)}
ENGINE = {
    "chunk": Key(int, 0),  # 0: automatic
    "unroll": Key(int, 1),
    "weighting": Key(str, "examples"),
    "eval_batch_size": Key(int, 1024),
    "client_state": Key(str, "auto"),
    "devices": Key(int, 0),  # 0: every local device
    "precision": Key(str, "float32"),
    "nonfinite": Key(str, "stop"),
    "checkpoint_every": Key(int, 50),
    "matmul_precision": Key(str, compilation.DEFAULT_MATMUL_PRECISION),
    "compile_cache": Key(bool, True),
}
DEFAULTS: dict[str, Any] = {
    **{k: key.default for k, key in TOP.items()},
    "engine": {k: key.default for k, key in ENGINE.items()},
    "distributed": {},
}


def keys() -> dict[str, Any]:
    """The top-level keys and those of [engine] and [distributed], with their types."""
    return {
        **{k: key.hint for k, key in TOP.items()},
        **{f"engine.{k}": key.hint for k, key in ENGINE.items()},
        **dataclass_keys("distributed", distributed.Cluster),
    }


def cluster(config: Mapping[str, Any]) -> distributed.Cluster:
    """The ``[distributed]`` table of a merged config, checked (read before ``build``:
    ``jax.distributed.initialize`` must come before JAX computes anything)."""
    return construct("distributed", distributed.Cluster, config["distributed"])


def resolve_cluster(config: dict[str, Any]) -> None:
    """Checks ``[distributed]`` and records its set options, in place."""
    config["distributed"] = {
        k: v for k, v in dataclasses.asdict(cluster(config)).items() if v is not None
    }


def compile_cache(config: Mapping[str, Any]) -> bool:
    """``engine.compile_cache`` of a merged config, checked (read before ``build``, which may
    compile: ``compilation.configure`` comes first so that those programs are cached too)."""
    default = ENGINE["compile_cache"].default
    return check("engine.compile_cache", config["engine"].get("compile_cache", default), bool)


def check_run(config: dict[str, Any]) -> None:
    """The top-level numbers and the [engine] table, in place."""
    for key, spec in TOP.items():
        config[key] = check(key, config[key], spec.hint)
    for key in ("rounds", "eval_every"):
        if config[key] < 1:
            raise ConfigError(f"{key} must be >= 1, got {config[key]}")
    engine = config["engine"]
    for key in engine:
        if key not in ENGINE:
            raise ConfigError(unknown("key", f"engine.{key}", {f"engine.{k}": 0 for k in ENGINE}))
    for key, spec in ENGINE.items():
        engine[key] = check(f"engine.{key}", engine.get(key, spec.default), spec.hint)
    _check_engine(engine)


def _check_engine(engine: Mapping[str, Any]) -> None:
    """The values of a typed [engine] table, each within what it may be."""
    for key in ("chunk", "devices", "checkpoint_every"):
        if engine[key] < 0:
            raise ConfigError(f"engine.{key} must be >= 0, got {engine[key]}")
    if engine["devices"] > jax.device_count():  # the devices of every process (cohort.client_mesh)
        raise ConfigError(
            f"engine.devices must be between 0 (every device) and the {jax.device_count()} "
            f"devices JAX sees, got {engine['devices']}"
        )
    if engine["nonfinite"] not in NONFINITE:
        raise ConfigError(f"engine.nonfinite must be 'stop' or 'drop', got {engine['nonfinite']!r}")
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


def run_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``simulate.run`` that the top-level numbers and [engine] give."""
    engine = config["engine"]
    return {
        "rounds": config["rounds"],
        "eval_every": config["eval_every"],
        "seed": config["seed"],
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
    }
