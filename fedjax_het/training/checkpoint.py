"""Checkpoints: everything the next round of a run needs, in one file written atomically.

A checkpoint is taken between blocks of rounds (``loop.train_loop``), where
the run state is whole: the server state (optimizer states included), every
client state (a ``HostStore``'s host rows too), the in-loop schedule's clock,
records and selection state, the last evaluation and the run's records so far
(evaluation lines, per-round metrics, schedule rows). The schedule's and the
clients' randomness need no position: every key is ``fold_in(seed, round,
client)``, so the round count is the position. A run resumed from a
checkpoint therefore computes bit for bit what the uninterrupted run computes;
a resume may raise ``rounds`` (``GROWING_KEYS``), and the run so extended
computes what a run started with that many rounds computes.

**Format: one ``.npz`` with a JSON manifest**, not ``orbax-checkpoint``:

* *no new dependency*: orbax brings tensorstore, protobuf and an async
  runtime for what is, here, a few arrays gathered on one host;
* *no pickles*: arrays are stored by name (the pytree path of the leaf) and
  the manifest is a JSON string, so ``np.load(allow_pickle=False)`` reads a
  checkpoint and a checkpoint cannot run code; dtypes numpy does not know
  (bfloat16, PRNG keys) are stored as their bits and named in the manifest;
* *atomic*: written to ``checkpoint.npz.tmp``, flushed to disk, then renamed
  over the old one, so a crash (or a full disk) while writing leaves the
  previous checkpoint whole;
* *multi-host*: every process gathers the sharded arrays (``_host_copy``) and
  process 0 writes, as for the other results; on resume each process reads the
  file and places its shards (``restore``, ``jax.make_array_from_callback``);
* *size and speed*: uncompressed, so writing is a copy at disk speed; model
  floats barely compress. The closing note of issue 15 gives figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_het import results
from fedjax_het.engine.client_store import _host_copy
from fedjax_het.training import distributed
from fedjax_het.typing import PyTree

FILE = "checkpoint.npz"
FORMAT = 1
_MANIFEST = "__manifest__"
# Config keys that do not change what a run computes: a resume may differ in them.
FREE_KEYS = ("distributed.", "engine.checkpoint_every")
# Config keys a resume may raise: a finished or interrupted run extended by more rounds
# computes what a run started with them computes (every key is ``fold_in(seed, round)``,
# and a schedule planned for more rounds begins with the one planned for fewer); a first
# run whose rounds were not a multiple of ``eval_every`` keeps its last evaluation as a
# line the longer run does not have.
GROWING_KEYS = ("rounds",)


# What reading a damaged or foreign file raises (a cut-short zip, a missing member, bad JSON).
UNREADABLE = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not belong to this run."""


@dataclasses.dataclass(frozen=True)
class Saved:
    """Where a checkpoint went, after how many rounds, how big it is and how long it took."""

    path: Path
    done: int
    bytes: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A checkpoint read back: ``done`` rounds, its arrays by name, its manifest and file."""

    done: int
    arrays: dict[str, np.ndarray]
    manifest: dict[str, Any]
    path: Path | None = None

    def tree(self, prefix: str, like: PyTree) -> PyTree:
        """The pytree stored under ``prefix``, shaped and placed like ``like``."""
        return restore(like, self.group(prefix), prefix)

    def group(self, prefix: str) -> dict[str, np.ndarray]:
        """The plain arrays stored under ``prefix``, by their name inside it."""
        return {
            k[len(prefix) + 1 :]: v for k, v in self.arrays.items() if k.startswith(prefix + "/")
        }


def leaves(prefix: str, tree: PyTree) -> dict[str, np.ndarray]:
    """Host copies of the leaves of ``tree``, named ``prefix/<pytree path>``.

    Collective in a multi-process run: every process must call it (the arrays
    sharded across hosts are gathered).
    """
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out[f"{prefix}/{jax.tree_util.keystr(path)}"] = _host_copy(leaf)
    return out


def restore(like: PyTree, arrays: Mapping[str, np.ndarray], what: str = "state") -> PyTree:
    """``like`` with every leaf replaced by ``arrays[<its pytree path>]``, on ``like``'s devices.

    Raises CheckpointError naming the first leaf that is missing or has another
    shape or dtype (a checkpoint of another model, algorithm or population).
    """

    def one(path, leaf):
        name = jax.tree_util.keystr(path)
        if name not in arrays:
            raise CheckpointError(f"the checkpoint has no {what}{name}: it is not this run's")
        stored, is_key = arrays[name], jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        target = jax.random.key_data(leaf) if is_key else leaf
        if stored.shape != target.shape or stored.dtype != np.dtype(target.dtype):
            raise CheckpointError(
                f"the checkpoint's {what}{name} is {stored.dtype}{list(stored.shape)}, this run's "
                f"is {np.dtype(target.dtype)}{list(target.shape)}: it is not this run's"
            )
        if not isinstance(leaf, jax.Array):
            return stored
        sharding = target.sharding
        value = jax.make_array_from_callback(stored.shape, sharding, lambda index: stored[index])
        return jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf)) if is_key else value

    return jax.tree_util.tree_map_with_path(one, like)


def save(
    out_dir: str | Path,
    *,
    done: int,
    arrays: Mapping[str, np.ndarray],
    manifest: Mapping[str, Any],
) -> Saved | None:
    """Writes ``arrays`` and ``manifest`` (JSON) as ``out_dir/checkpoint.npz``, atomically.

    Only process 0 writes (None elsewhere). On an ``OSError`` (a full disk) the
    partial file is removed, the previous checkpoint stays, and the error is raised.
    """
    if not distributed.writes_results():
        return None
    start = time.perf_counter()
    path = Path(out_dir) / FILE
    tmp = path.with_name(FILE + ".tmp")
    stored, dtypes = {}, {}
    for name, value in arrays.items():
        value = np.asarray(value, order="C")
        if value.dtype.kind == "V":  # bfloat16 and the like: stored as their bits
            dtypes[name] = str(value.dtype)
            value = value.view(f"u{value.dtype.itemsize}")
        stored[name] = value
    header = {"format": FORMAT, "done": done, "dtypes": dtypes, **manifest}
    stored[_MANIFEST] = np.asarray(results.strict_json(header))
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **stored)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return Saved(path, done, path.stat().st_size, time.perf_counter() - start)


def load(out_dir: str | Path) -> Loaded:
    """Reads ``out_dir/checkpoint.npz``; CheckpointError (one line, in our words) if there is
    none, it is unreadable, or its manifest does not describe its arrays."""
    path = Path(out_dir) / FILE
    with _opened(out_dir) as npz:
        try:
            arrays = {name: npz[name] for name in npz.files}
        except UNREADABLE as err:
            raise CheckpointError(_unreadable(path, err)) from None
    manifest = _manifest(path, arrays.pop(_MANIFEST, None))
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):  # a member that is not an .npy array
            raise CheckpointError(f"{path} is not a checkpoint: its member {name!r} is no array")
    for name, dtype in manifest["dtypes"].items():
        arrays[name] = _view(path, arrays, name, dtype)
    return Loaded(manifest["done"], arrays, manifest, path)


def check_config(out_dir: str | Path, config: Mapping[str, Any]) -> None:
    """Refuses (CheckpointError naming the keys) a ``config`` other than the one the
    checkpoint in ``out_dir`` was written with; reads only the manifest."""
    path = Path(out_dir) / FILE
    with _opened(out_dir) as npz:
        try:
            stored = npz[_MANIFEST] if _MANIFEST in npz.files else None
        except UNREADABLE as err:
            raise CheckpointError(_unreadable(path, err)) from None
        stored = _manifest(path, stored)["config"]
    differ = config_differences(tomllib.loads(results.to_toml(config)), tomllib.loads(stored))
    if differ:
        raise CheckpointError(f"the config differs from the checkpoint's in {'; '.join(differ)}")


@contextlib.contextmanager
def _opened(out_dir: str | Path) -> Iterator[Any]:
    """``np.load`` of the checkpoint, never of pickles: a file that is not a zip archive is
    refused before numpy reads it (numpy would take it for a pickle)."""
    path = Path(out_dir) / FILE
    if not path.is_file():
        raise CheckpointError(f"{out_dir} has no {FILE} to resume from")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is not a readable checkpoint: not an .npz archive")
    with open(path, "rb") as f:
        try:
            npz = np.load(f, allow_pickle=False)
        except UNREADABLE as err:
            raise CheckpointError(_unreadable(path, err)) from None
        with npz:
            yield npz


def _unreadable(path: Path, err: Exception) -> str:
    if "pickle" in str(err):  # numpy's advice to allow pickles is never ours to give
        return f"{path} is not a readable checkpoint: it holds Python objects (pickles)"
    return f"{path} is not a readable checkpoint: {err}"


def _manifest(path: Path, stored: np.ndarray | None) -> dict[str, Any]:
    """The manifest, its structure checked: a JSON object with ``format``, ``done`` (rounds,
    an integer >= 0), ``dtypes`` (array name -> dtype name), ``config`` (TOML),
    ``evaluations`` (a list) and ``wall_s`` (seconds >= 0)."""
    bad = lambda what: CheckpointError(f"{path} is not a usable checkpoint: {what}")
    if stored is None or not isinstance(stored, np.ndarray) or stored.dtype.kind != "U":
        raise bad("it has no manifest")
    try:
        manifest = json.loads(str(stored))
    except ValueError:
        raise bad("its manifest is not JSON") from None
    if not isinstance(manifest, dict):
        raise bad(f"its manifest is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is checkpoint format {manifest.get('format')}; this version reads {FORMAT}"
        )
    kinds = {"done": int, "dtypes": dict, "config": str, "evaluations": list, "wall_s": float}
    for key, kind in kinds.items():
        value = manifest.get(key)
        number = kind is float and isinstance(value, int)
        if key not in manifest:
            raise bad(f"its manifest's {key!r} is missing")
        if isinstance(value, bool) or not (isinstance(value, kind) or number):
            raise bad(f"its manifest's {key!r} is {value!r}")
    if manifest["done"] < 0 or not np.isfinite(manifest["wall_s"]) or manifest["wall_s"] < 0:
        raise bad(f"its manifest says {manifest['done']} rounds in {manifest['wall_s']} s")
    try:
        tomllib.loads(manifest["config"])
    except tomllib.TOMLDecodeError as err:
        raise bad(f"its manifest's config is not TOML ({err})") from None
    return manifest


def _view(path: Path, arrays: dict[str, np.ndarray], name: str, dtype: Any) -> np.ndarray:
    """``arrays[name]``'s bits as the manifest's ``dtype`` (bfloat16, a PRNG key's data)."""
    try:
        target = jax.numpy.dtype(dtype)
    except TypeError:
        target = None
    if target is None or target.kind != "V":  # save names only dtypes numpy lacks
        raise CheckpointError(
            f"{path} is not a usable checkpoint: its manifest names {dtype!r} for {name!r}, "
            "not a dtype it stores as bits"
        )
    stored = arrays.get(name)
    if stored is None or stored.dtype != np.dtype(f"u{target.itemsize}"):
        found = "it has no such array" if stored is None else f"the array is {stored.dtype}"
        raise CheckpointError(
            f"{path} is not a usable checkpoint: its manifest stores {name!r} as {dtype}, "
            f"but {found}"
        )
    return stored.view(target)


def config_differences(resumed: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two resolved configs, as
    ``key: stored -> resumed`` (keys in ``FREE_KEYS`` do not count, nor keys in
    ``GROWING_KEYS`` that grew)."""
    flat_a, flat_b = _flat(resumed), _flat(stored)
    return [
        f"{key}: {flat_b.get(key, '(unset)')!r} -> {flat_a.get(key, '(unset)')!r}"
        for key in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(key) != flat_b.get(key)
        and not key.startswith(FREE_KEYS)
        and not (key in GROWING_KEYS and _grew(flat_a.get(key), flat_b.get(key)))
    ]


def _grew(resumed: Any, stored: Any) -> bool:
    return isinstance(resumed, int) and isinstance(stored, int) and resumed > stored


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out
