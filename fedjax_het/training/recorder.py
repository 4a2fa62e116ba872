"""What a run records: its evaluation lines, results directory and final ``History``.

``Recorder`` logs each evaluation (``metrics.jsonl`` through ``results.RunWriter``),
checks each block for divergence (``divergence.first_divergence``), keeps what a
checkpoint needs of it (``records``, ``restore``) and assembles the ``History`` and
``summary.json`` at the end.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_het import results
from fedjax_het.data import diagnostics
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.hooks import RunReport
from fedjax_het.engine.round import RunState
from fedjax_het.system.participation import warnings as system_warnings
from fedjax_het.system.schedule import Schedule
from fedjax_het.training import checkpoint, compilation, distributed
from fedjax_het.training.divergence import Divergence, dropped_warnings, first_divergence
from fedjax_het.training.metrics import (
    EventAccounting,
    ScheduleAccounting,
    client_accuracy_summary,
    time_to_accuracy,
)
from fedjax_het.training.programs import Setup
from fedjax_het.typing import Hyper, Params


@dataclasses.dataclass
class History:
    """What a run produced.

    Attributes:
      metrics: one dict per evaluation (round 0 and every ``eval_every`` rounds).
      round_metrics: per-round arrays ``[rounds]``: train_loss, participants, examples.
      client_accuracy: ``[num_clients]`` last per-client test accuracy of the global model
        (NaN: no test rows).
      params: the final global model.
      state: the final ``RunState``.
      summary: final figures, compile and run time, rounds / virtual time / wall time to
        each target accuracy, where the client states lived (``client_state_placement``:
        device, host or none) and the bytes they held at the end (``client_state_bytes``:
        every client's on the device, the written rows on the host), and (with a system)
        totals of time, bytes and work.
      schedule: the run's schedule when it had a system, else None.
      out_dir: where results were written, or None.
      personal_accuracy: ``[num_clients]`` last test accuracy of each client's own model
        (algorithms with a ``Personalized`` hook), else None.
    """

    metrics: list[dict[str, Any]]
    round_metrics: dict[str, np.ndarray]
    client_accuracy: np.ndarray
    params: Params
    state: RunState
    summary: dict[str, Any]
    schedule: Schedule | None = None
    out_dir: Path | None = None
    personal_accuracy: np.ndarray | None = None


class Recorder:
    """One run's evaluation lines, results directory and final ``History``."""

    def __init__(
        self,
        start: float,
        accounting: ScheduleAccounting | None,
        *,
        out_dir: str | Path | None = None,
        config: Mapping[str, Any] | None = None,
        data: FederatedData | None = None,
        on_eval: Callable[[dict[str, Any]], None] | None = None,
        drop_nonfinite: bool = False,
        overwrite: bool = False,
        resume: bool = False,
    ):
        self.start, self.accounting, self.on_eval = start, accounting, on_eval
        self.drop_nonfinite = drop_nonfinite
        self.divergence: Divergence | None = None
        self.interrupted: int | None = None
        self.checkpoint: checkpoint.Saved | None = None  # the last one written
        self.wall_before = 0.0  # wall seconds of the run before it was resumed
        self.evaluations: list[dict[str, Any]] = []
        self.per_round: list[dict[str, np.ndarray]] = []
        writes = out_dir is not None and distributed.writes_results()
        self.writer = (
            results.RunWriter(out_dir, config, overwrite=overwrite, resume=resume)
            if writes
            else None
        )
        self.report_of = data if self.writer else None  # written after the first block

    def write_report(self) -> None:
        """The partition's diagnostics (``data_summary.json``, ``label_heatmap.png``), once:
        after the first block (so that they do not delay the first round) or at the end."""
        data, self.report_of = self.report_of, None
        if data is not None:
            report = diagnostics.describe(data)
            text = results.strict_json(report) + "\n"
            self.writer.write("data_summary.json", lambda path: path.write_text(text))
            self.writer.write(
                "label_heatmap.png",
                lambda path: diagnostics.plot_label_heatmap(report["label_histogram"], path),
            )

    def records(self, prefix: str) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        """What a checkpoint keeps of this recorder: per-round arrays (named under
        ``prefix``) and the evaluation lines."""
        arrays = {f"{prefix}/{k}": v for k, v in self.round_arrays().items()}
        return arrays, self.evaluations

    def round_arrays(self) -> dict[str, np.ndarray]:
        """The per-round metrics so far, one array each (none before the first block)."""
        return {
            k: np.concatenate([b[k] for b in self.per_round])
            for k in (self.per_round[0] if self.per_round else {})
        }

    def restore(
        self,
        arrays: Mapping[str, np.ndarray],
        evaluations: list[dict[str, Any]],
        wall_before: float,
    ) -> None:
        """Continues from a checkpoint's ``records``: the metrics file is rewritten to them
        (dropping any line the interrupted run wrote after its checkpoint)."""
        self.per_round = [dict(arrays)] if arrays else []
        self.evaluations = list(evaluations)
        self.wall_before = wall_before
        if self.writer:
            self.writer.rewrite_metrics(self.evaluations)

    def record(self, done: int, block_metrics: dict[str, np.ndarray] | None, ev) -> bool:
        """Logs the evaluation ``ev`` after ``done`` rounds (``block_metrics``: the last block).

        Returns whether the run diverged in this block (``divergence.first_divergence``;
        the first divergence is kept in ``self.divergence``).
        """
        if block_metrics is not None:
            self.per_round.append(block_metrics)
            if self.divergence is None:
                self.divergence = first_divergence(
                    done, block_metrics, ev, drop_nonfinite=self.drop_nonfinite
                )
        line = {
            "round": done,
            "wall_s": round(self.wall_before + time.perf_counter() - self.start, 4),
            "train_loss": _train_loss(block_metrics) if block_metrics else None,
            "participants": int(block_metrics["participants"][-1]) if block_metrics else 0,
            "nonfinite_updates": int(np.sum(block_metrics["nonfinite_updates"]))
            if block_metrics
            else 0,
            "test_loss": float(ev["loss"]),
            "test_accuracy": float(ev["accuracy"]),
            **client_accuracy_summary(ev["client_correct"], ev["client_count"]),
            **(
                client_accuracy_summary(
                    ev["personal_correct"], ev["client_count"], "personal_accuracy"
                )
                if "personal_correct" in ev
                else {}
            ),
            **(self.accounting.upto(done) if self.accounting else {}),
        }
        self.evaluations.append(line)
        if self.writer:
            self.writer.append(line)
        if self.on_eval:
            self.on_eval(line)
        if block_metrics is not None:
            self.write_report()
        return self.divergence is not None

    @property
    def status(self) -> str:
        """ "diverged", "interrupted" or "completed"."""
        if self.divergence is not None:
            return "diverged"
        return "completed" if self.interrupted is None else "interrupted"

    def history(
        self,
        state: RunState,
        ev,
        setup: Setup,
        *,
        plans: Schedule | None,
        targets: Sequence[float],
        timing: Mapping[str, float],
        hyper: Hyper | None = None,
    ) -> History:
        """The run's ``History`` from the final ``state`` and evaluation ``ev`` (``hyper``: the
        run's hyperparameters, when they are not ``setup``'s: a sweep's cell)."""
        self.write_report()
        round_metrics = self.round_arrays()
        if self.accounting:
            round_metrics.update(self.accounting.per_round)
        with np.errstate(invalid="ignore", divide="ignore"):
            client_accuracy = ev["client_correct"] / ev["client_count"]
            personal = ev.get("personal_correct")
            personal_accuracy = None if personal is None else personal / ev["client_count"]
        summary = self._summary(setup, targets=targets, timing=timing, hyper=hyper)
        algorithm = setup.round.algorithm
        history = History(
            self.evaluations,
            round_metrics,
            client_accuracy,
            algorithm.global_params(state.server_state),
            state,
            summary,
            schedule=plans,
            personal_accuracy=personal_accuracy,
        )
        if self.writer:
            history.out_dir = self.writer.out_dir
            if isinstance(self.accounting, EventAccounting):
                self.writer.write("async.png", self.accounting.plot)
            self.writer.finish(history)
        return history

    def _summary(
        self,
        setup: Setup,
        *,
        targets: Sequence[float],
        timing: Mapping[str, float],
        hyper: Hyper | None = None,
    ) -> dict[str, Any]:
        """``summary.json``: the final and best figures, ``timing``, the round's plan, the
        targets' first rounds, the status, the accounting's totals and the algorithm's
        report (``hyper`` as in ``history``)."""
        evaluations, final = self.evaluations, self.evaluations[-1]
        summary = {
            "rounds": final["round"],
            "final_test_accuracy": final["test_accuracy"],
            "final_test_loss": final["test_loss"],
            "best_test_accuracy": max(e["test_accuracy"] for e in evaluations),
            **{
                k: final[k] for k in final if k.startswith(("client_accuracy", "personal_accuracy"))
            },
            **timing,
            "chunk": setup.round.chunk,
            "chunk_plan": setup.chunk_plan.describe(),
            **({"conv": setup.chunk_plan.conv} if setup.chunk_plan.conv else {}),
            "devices": 1 if setup.round.mesh is None else setup.round.mesh.size,
            "backend": jax.default_backend(),
            "matmul_precision": compilation.matmul_precision_in_effect(),
            "compile_cache": compilation.record(),
            "client_state_placement": setup.state_plan.placement,
            "client_state_bytes": setup.state_plan.held_bytes(setup.round.store),
            "to_accuracy": time_to_accuracy(evaluations, targets),
            "status": self.status,
            **({"diverged": dataclasses.asdict(self.divergence)} if self.divergence else {}),
            **(
                {
                    "interrupted": {
                        "signal": signal.Signals(self.interrupted).name,
                        "round": final["round"],
                    }
                }
                if self.interrupted
                else {}
            ),
            **(
                {
                    "checkpoint": {
                        "round": self.checkpoint.done,
                        "bytes": self.checkpoint.bytes,
                        "seconds": round(self.checkpoint.seconds, 4),
                    }
                }
                if self.checkpoint
                else {}
            ),
            **(self.accounting.totals() if self.accounting else {}),
        }
        warnings = dropped_warnings(self.round_arrays())
        if self.accounting:
            steps = len(self.accounting.per_round["clock_s"])
            warnings = system_warnings(summary, setup.data.num_clients, steps) + warnings
        if self.accounting or warnings:
            summary["warnings"] = warnings
        algorithm = setup.round.algorithm
        if (reported := algorithm.hook(RunReport)) is not None:
            values = {k: float(v) for k, v in (setup.hyper if hyper is None else hyper).items()}
            summary.update(reported.report(values, setup.data.num_clients, final["round"]))
        return summary


def _train_loss(block_metrics: dict[str, np.ndarray]) -> float | None:
    """The mean training loss of the block's rounds in which someone trained; None when
    nobody did (every client late, unavailable, or its update dropped as non-finite)."""
    trained = np.asarray(block_metrics["examples"]) > 0
    loss = np.asarray(block_metrics["train_loss"])
    return float(np.mean(loss[trained])) if np.any(trained) else None
