"""A run's checkpoint glue: what ``train_loop``'s ``save`` writes between blocks (the run
state, the host-held client rows, the recorders' records), and how a resumed run gets
them back (``load_checkpoint``, ``restore_state``). The file format is
``fedjax_het.training.checkpoint``'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_het import results
from fedjax_het.engine import client_store
from fedjax_het.training import checkpoint
from fedjax_het.training.recorder import Recorder


def checkpointer(
    out_dir: str | Path | None,
    config: Mapping[str, Any] | None,
    recorders: Sequence[Recorder],
    store: client_store.ClientStore,
    extra: Callable[[], dict[str, np.ndarray]],
) -> Callable[[int, Any], None] | None:
    """``train_loop``'s ``save``: the run state, the host-held client rows, the
    recorders' records and ``extra()`` as ``out_dir/checkpoint.npz`` (None: no ``out_dir``).

    A checkpoint that cannot be written (a full disk) is reported by the run's
    ``NotWritten`` at the end; the previous one stays.
    """
    if out_dir is None:
        return None

    def save(done: int, state: Any) -> None:
        arrays = {**checkpoint.leaves("state", state), **store.host_rows(), **extra()}
        evaluations = []
        for j, recorder in enumerate(recorders):
            records, lines = recorder.records(f"records{j}")
            arrays.update(records)
            evaluations.append(lines)
        first = recorders[0]
        manifest = {
            "config": results.to_toml(config or {}),
            "evaluations": evaluations,
            "wall_s": first.wall_before + time.perf_counter() - first.start,
        }
        try:
            saved = checkpoint.save(out_dir, done=done, arrays=arrays, manifest=manifest)
        except OSError as err:
            for recorder in recorders:
                if recorder.writer:
                    recorder.writer.missing[checkpoint.FILE] = f"round {done}: {err.strerror}"
            return
        for recorder in recorders:
            recorder.checkpoint = saved

    return save


def load_checkpoint(out_dir: str | Path, recorders: Sequence[Recorder]) -> checkpoint.Loaded:
    """The checkpoint in ``out_dir``, its records restored into ``recorders`` (check the
    config first, ``checkpoint.check_config``, before a recorder rewrites it)."""
    loaded = checkpoint.load(out_dir)
    _check_rounds(loaded, len(recorders))
    for j, recorder in enumerate(recorders):
        recorder.restore(
            loaded.group(f"records{j}"),
            loaded.manifest["evaluations"][j],
            loaded.manifest["wall_s"],
        )
    return loaded


def _check_rounds(loaded: checkpoint.Loaded, runs: int) -> None:
    """Refuses a checkpoint whose round counter disagrees with its records: each run's
    per-round arrays hold ``done`` rounds and its last evaluation is of round ``done``
    (a counter ahead of the records would skip the rounds between)."""
    done, evaluations, path = loaded.done, loaded.manifest["evaluations"], loaded.path
    if len(evaluations) != runs or not all(isinstance(e, list) for e in evaluations):
        raise checkpoint.CheckpointError(
            f"{path} is not a usable checkpoint: it has evaluations of {len(evaluations)} "
            f"run(s), this is {runs}"
        )
    for j, lines in enumerate(evaluations):
        records = loaded.group(f"records{j}").values()
        lengths = sorted({a.shape[0] if a.ndim else -1 for a in records})
        last = lines[-1].get("round") if lines and isinstance(lines[-1], dict) else None
        if lengths != [done] or last != done:
            raise checkpoint.CheckpointError(
                f"{path} is not a usable checkpoint: its manifest says {done} rounds were done, "
                f"its records hold {lengths or 'no'} rounds and its last evaluation is of "
                f"round {last}"
            )


def restore_state(loaded: checkpoint.Loaded, like: Any, store: client_store.ClientStore) -> Any:
    """The checkpoint's run state, placed like ``like`` (a fresh ``init``), and the
    store's host rows."""
    jax.block_until_ready(like)  # a HostStore's init empties its table; restore after it
    store.restore_host_rows(loaded.group("host"))
    return loaded.tree("state", like)
