"""The two loggers of ``fedjax_het.front.logs``, each importing its optional library only when
a run asks for it: TensorBoard event files (tensorboardX) and a Weights & Biases run (wandb)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar


class TensorBoard:
    """A TensorBoard run in ``logdir``: each figure a scalar tagged by its name at its round
    (``round/…``, ``event/…``: the per-round arrays), the resolved config as the run's
    hyperparameters (HParams dashboard, with the summary's final accuracy and loss as its
    metrics) and as text."""

    def __init__(self, logdir: Path, hyper: Mapping[str, Any]):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(logdir), flush_secs=10)
        self.hyper = dict(hyper)
        text = "\n".join(f"    {k} = {v!r}" for k, v in self.hyper.items())
        self.writer.add_text("config", text, 0)

    def log(self, values: Mapping[str, float], step: int, axis: str) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a live view: the curves appear as the run writes them

    def finish(self, summary: Mapping[str, float]) -> None:
        from tensorboardX.summary import hparams

        metrics = {
            f"summary/{k}": summary[k]
            for k in ("final_test_accuracy", "best_test_accuracy", "final_test_loss")
            if k in summary
        }
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, 0)
        for event in hparams(self.hyper, metrics):  # the HParams plugin's session records
            self.writer.file_writer.add_summary(event)
        self.writer.close()


class WandB:
    """A Weights & Biases run with its files under ``out_dir/wandb`` (offline unless
    ``options.wandb_mode`` is online): every figure logged against the ``round`` (or
    ``event``) it belongs to, the resolved config as ``run.config``, the summary's figures as
    ``run.summary``. When the last open run finishes, W&B's service is torn down: its
    ``run.finish`` returns before the service has written the run's files (measured with wandb
    0.31: a run read back at once held none of its history in about one case of four)."""

    open_runs: ClassVar[set[int]] = set()  # the runs of this process not yet finished

    def __init__(self, out_dir: Path, options: Any, *, name: str, group: str, config: Mapping):
        import wandb

        where = out_dir / "wandb"
        where.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=options.wandb_project,
            name=name,
            group=group or None,
            dir=str(out_dir),
            config=dict(config),
            mode=options.wandb_mode,
            settings=wandb.Settings(
                reinit="create_new",  # a sweep's cells are open together, one run each
                console="off",
                silent=True,
                disable_git=True,
                save_code=False,
                x_disable_stats=True,
                x_save_requirements=False,
            ),
        )
        WandB.open_runs.add(id(self))
        for axis in ("round", "event"):
            self.run.define_metric(axis)
        self.run.define_metric("event/*", step_metric="event")
        self.run.define_metric("*", step_metric="round")

    def log(self, values: Mapping[str, float], step: int, axis: str) -> None:
        self.run.log({**values, axis: step})

    def finish(self, summary: Mapping[str, float]) -> None:
        import wandb

        self.run.summary.update(dict(summary))
        self.run.finish()
        WandB.open_runs.discard(id(self))
        if not WandB.open_runs:
            wandb.teardown()  # waits for the service to write every finished run
