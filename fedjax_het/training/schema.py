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

from fedjax_het.convolution import CONV_IMPLS
from fedjax_het.engine.client_store import PLACEMENTS
from fedjax_het.engine.local import PRECISIONS
from fedjax_het.schema import (
    ConfigError,
    Key,
    check,
    construct,
    dataclass_keys,
    unknown,
    within,
)
from fedjax_het.training import compilation, distributed
from fedjax_het.training.divergence import NONFINITE

# fmt: off
TOP = {
    "seed": Key(int, 0, "the run's root seed: client selection, local batches, the model's "
                "initialisation and every other draw derive from it (fedjax_het.rng)", minimum=0),
    "rounds": Key(int, 200, "rounds of training (with an asynchronous [server]: server events)",
                  minimum=1),
    "eval_every": Key(int, 10, "rounds between evaluations of the global model on the test "
                      "split; the rounds in between run as one compiled block", minimum=1),
}
TABLES: dict[str, str] = {
    "engine": "how the rounds run on the devices (fedjax_het.engine)",
    "distributed": "several processes or hosts in one run (fedjax_het.training.distributed)",
}
"""What each table of this module configures, for ``fedjax-het config --all``."""
ENGINE = {
    "chunk": Key(int, 0, "clients per vmap chunk; 0: automatic (the backend's preference, "
                 "lowered to what fits the device's free memory)", minimum=0),
    "unroll": Key(int, 1, "unrolling of the local-step scan", minimum=1),
    "conv": Key(str, "auto", "how a CNN's convolutions run in local training: xla (XLA's "
                "convolution), patches (im2col and a matmul; a vmapped chunk's is a batched "
                "matmul), auto: the plan's choice for the backend and chunk",
                choices=("auto", *CONV_IMPLS)),
    "weighting": Key(str, "examples", "how client updates are weighted: by their examples "
                     "(FedAvg's n_k) or all alike", choices=("examples", "uniform")),
    "eval_batch_size": Key(int, 1024, "rows per evaluation batch", minimum=1),
    "client_state": Key(str, "auto", "where algorithms' per-client states live: on the device, "
                        "in host memory (the rows of clients ever selected; bit-identical "
                        "results), or auto: the device when they fit", choices=PLACEMENTS),
    "devices": Key(int, 0, "shard each cohort over this many devices; 0: every device JAX sees",
                   minimum=0),
    "precision": Key(str, "float32", "float32; bfloat16: local training in bfloat16 with float32 "
                     "master params; float64: the whole run in float64, for reference work",
                     choices=PRECISIONS),
    "nonfinite": Key(str, "stop", "a non-finite loss or client update: stop ends the run (its "
                     "results so far written); drop gives such updates weight 0 and counts them",
                     choices=NONFINITE),
    "checkpoint_every": Key(int, 50, "rounds between checkpoints (fedjax-het run --resume); "
                            "0: only at the end and on Ctrl-C", minimum=0),
    "matmul_precision": Key(str, compilation.DEFAULT_MATMUL_PRECISION, "float32 products on "
                            "every backend (highest), bf16x3 on GPU (high) or TF32 on GPU "
                            "(default, about 1e-2 from float32); on CPU all three are the same",
                            choices=compilation.MATMUL_PRECISIONS),
    "compile_cache": Key(bool, True, "keep compiled programs on disk for the next run "
                         "($FEDJAX_HET_CACHE_DIR, else ~/.cache/fedjax_het/xla); false compiles "
                         "everything afresh"),
}
# fmt: on
DEFAULTS: dict[str, Any] = {
    **{k: key.default for k, key in TOP.items()},
    "engine": {k: key.default for k, key in ENGINE.items()},
    "distributed": {},
}


def keys() -> dict[str, Key]:
    """The top-level keys and those of [engine] and [distributed]."""
    return {
        **TOP,
        **{f"engine.{k}": key for k, key in ENGINE.items()},
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
        within(key, config[key], spec)
    engine = config["engine"]
    for key in engine:
        if key not in ENGINE:
            raise ConfigError(unknown("key", f"engine.{key}", {f"engine.{k}": 0 for k in ENGINE}))
    for key, spec in ENGINE.items():
        engine[key] = check(f"engine.{key}", engine.get(key, spec.default), spec.hint)
        within(f"engine.{key}", engine[key], spec)
    if engine["devices"] > jax.device_count():  # the devices of every process (cohort.client_mesh)
        raise ConfigError(
            f"engine.devices must be between 0 (every device) and the {jax.device_count()} "
            f"devices JAX sees, got {engine['devices']}"
        )


def run_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``simulate.run`` that the top-level numbers and [engine] give."""
    engine = config["engine"]
    return {
        "rounds": config["rounds"],
        "eval_every": config["eval_every"],
        "seed": config["seed"],
        "chunk": engine["chunk"] or None,
        "conv": engine["conv"],
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
