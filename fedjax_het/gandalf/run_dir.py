"""A GANDALF or mediator run in a run directory, kept as ``simulate.run`` keeps its runs.

The directory gets ``config.toml`` at once, a ``metrics.jsonl`` line at each
evaluation, a ``checkpoint.npz`` every ``checkpoint_every`` rounds, at the end
and on SIGINT or SIGTERM (the run stops after the block of rounds it is
computing), then ``summary.json`` (``status`` "completed" or "interrupted") and
``curves.png``. A resumed run (``resume=True``, the same config or one with more
``rounds``) computes phases 1-2 again, which give the same rows (every key comes
from the seed), restores the mediators' state, the rounds' plans and metrics and
the evaluations, and goes on bit for bit as the uninterrupted run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedjax_het import results
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.gandalf.mediator import Continuation
from fedjax_het.gandalf.pipeline import (
    GandalfOptions,
    GandalfResult,
    evaluation_line,
    plot,
    run_gandalf,
)
from fedjax_het.models import Model
from fedjax_het.training import checkpoint
from fedjax_het.training.interrupt import Interrupted


def run_in_dir(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    options: GandalfOptions,
    *,
    out_dir: str | Path,
    config: Mapping[str, Any] | None,
    resume: bool = False,
    checkpoint_every: int = 0,
    **run_args: Any,
) -> GandalfResult:
    """``pipeline.run_gandalf(data, model, algorithm, options, **run_args)`` writing its run
    directory ``out_dir`` as it goes (module docstring); the directory must have been
    prepared (``results.prepare_out_dir``; with ``resume``, the config checked against the
    checkpoint's, ``checkpoint.check_config``).

    Raises:
      Interrupted: after writing the checkpoint, the metrics so far and the summary.
      results.NotWritten: a file could not be written (after writing every one it could).
    """
    loaded = checkpoint.load(out_dir) if resume else None
    writer = results.RunWriter(out_dir, config, overwrite=True, resume=resume)
    start, began = float(run_args.get("start", 0.0)), time.perf_counter()
    wall_before = 0.0 if loaded is None else float(loaded.manifest["wall_s"])
    if loaded is not None:
        writer.rewrite_metrics([evaluation_line(e, start) for e in loaded.manifest["evaluations"]])

    def save(done: int, arrays: dict, evaluations: list) -> None:
        manifest = {
            "config": results.to_toml(config or {}),
            "evaluations": evaluations,
            "wall_s": wall_before + time.perf_counter() - began,
        }
        try:
            checkpoint.save(out_dir, done=done, arrays=arrays, manifest=manifest)
        except OSError as err:
            writer.missing[checkpoint.FILE] = f"round {done}: {err.strerror}"

    go = Continuation(
        loaded,
        on_eval=lambda evaluation: writer.append(evaluation_line(evaluation, start)),
        save=save,
        checkpoint_every=checkpoint_every,
    )
    try:
        result = run_gandalf(data, model, algorithm, options, continuation=go, **run_args)
    except Interrupted as stopped:
        _write_summary(writer, {"status": "interrupted", "rounds_done": stopped.done})
        raise
    summary = {
        "status": "completed",
        **result.summary,
        "to_accuracy": {f"{t:g}": hit for t, hit in result.targets.items()},
        "groups": result.groups.members.tolist(),
    }
    writer.write("curves.png", lambda path: plot(result.evaluations, path))
    _write_summary(writer, summary)
    return result


def _write_summary(writer: results.RunWriter, summary: dict[str, Any]) -> None:
    """``summary.json`` (with ``not_written`` when files are missing); raises ``NotWritten``
    if any file of the run could not be written."""
    summary = dict(summary)
    results.mark_not_written(summary, writer.missing)
    text = results.strict_json(summary, indent=2) + "\n"
    writer.write("summary.json", lambda path: path.write_text(text))
    if writer.missing:
        raise results.NotWritten(writer.out_dir, [f"{k} ({v})" for k, v in writer.missing.items()])
