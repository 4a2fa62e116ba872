"""The config's optional [logging] table: live views of a run in TensorBoard and Weights & Biases.

Each logger receives what ``metrics.jsonl`` receives, as it is written (``on_eval``: one line
per evaluation, at the evaluated round), and at the end the ``History``'s per-round arrays
(training loss, participants; with a system each round's virtual clock, outcomes and bytes; with
an asynchronous server each event's applied, discarded and in-flight updates and staleness),
under ``round/`` (``event/`` for a server's events), and the summary's figures. The resolved
config is logged as the run's hyperparameters.

TensorBoard's files are written with tensorboardX (``pip install fedjax_het[tensorboard]``): a
writer of the event-file format with numpy and protobuf as its only dependencies, where
``torch.utils.tensorboard`` needs PyTorch and ``tf.summary`` (and Flax's ``clu`` writer
over it) TensorFlow. Weights & Biases logs through ``wandb`` (``pip install
fedjax_het[wandb]``), offline by default: its files go under the run's folder and nothing
leaves the machine until ``wandb sync``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedjax_het.schema import construct, dataclass_keys
from fedjax_het.training import distributed

MODES = ("offline", "online")


@dataclasses.dataclass(frozen=True)
class Logging:
    """Where a run shows its curves while it trains (the [logging] table).

    Attributes:
      name: the run's short name: its label in ``fedjax-het compare`` and its name in
        TensorBoard and Weights & Biases; "" : the results folder's name (a sweep's cell: its
        axis values).
      tensorboard: write TensorBoard event files to ``tensorboard/`` in the results folder
        (tensorboardX, the [tensorboard] extra); view them with ``tensorboard --logdir runs``.
      wandb: log to Weights & Biases (the [wandb] extra), its files under ``wandb/`` in the
        results folder.
      wandb_mode: offline: files only, nothing leaves the machine (``wandb sync`` uploads them
        later); online: streamed to the W&B server as the run trains.
      wandb_project: the W&B project the run belongs to.
      wandb_group: the W&B group; "" : none for a run, the sweep's folder name for its cells
        (one W&B run per cell, grouped).
    """

    name: str = ""
    tensorboard: bool = False
    wandb: bool = False
    wandb_mode: str = "offline"
    wandb_project: str = "fedjax_het"
    wandb_group: str = ""

    def __post_init__(self):
        if self.wandb_mode not in MODES:
            raise ValueError(
                f"wandb_mode must be one of {', '.join(MODES)}, got {self.wandb_mode!r}"
            )
        for flag, module in (("tensorboard", "tensorboardX"), ("wandb", "wandb")):
            if getattr(self, flag) and importlib.util.find_spec(module) is None:
                raise ValueError(f"{flag} = true needs {module}: pip install 'fedjax_het[{flag}]'")


TABLES: dict[str, str] = {
    "logging": "live views of a run: TensorBoard event files, Weights & Biases "
    "(fedjax_het.front.logs)"
}
"""What the table configures, for ``fedjax-het config --all``."""
DEFAULTS: dict[str, Any] = {"logging": {}}


def keys() -> dict[str, Any]:
    """The keys of [logging]."""
    return dataclass_keys("logging", Logging)


def options(config: dict[str, Any]) -> Logging:
    """The [logging] table checked and resolved in place (dropped when empty)."""
    table = config.get("logging") or {}
    if not table:
        config.pop("logging", None)
        return Logging()
    checked = construct("logging", Logging, table)
    config["logging"] = dataclasses.asdict(checked)
    return checked


def run_name(config: Mapping[str, Any], out_dir: str | Path) -> str:
    """The run's short name: ``logging.name``, else its folder's name."""
    return (config.get("logging") or {}).get("name") or Path(out_dir).name


class Logger(Protocol):
    """What receives a run's figures: ``log(values, step)``, ``finish()``."""

    def log(self, values: Mapping[str, float], step: int, axis: str) -> None: ...

    def finish(self, summary: Mapping[str, float]) -> None: ...


class Loggers:
    """Every logger of one run, fed as ``metrics.jsonl`` is (``on_eval``) and at the end
    (``finish``). ``open_`` makes them at the first line, once the run has opened its results
    folder (which must be empty until then); no logger: nothing is done."""

    def __init__(self, open_: Callable[[], Sequence[Logger]] = list):
        self.open_, self.loggers = open_, None

    def on_eval(self, line: Mapping[str, Any]) -> None:
        """One ``metrics.jsonl`` line, at its round (its numbers only, nested ones as
        ``outcomes/ok``)."""
        if self.loggers is None:
            self.loggers = list(self.open_())
        values = flat_numbers(line)
        step = int(values.pop("round"))
        for logger in self.loggers:
            logger.log(values, step, "round")

    def finish(self, history: Any | None) -> None:
        """The run's per-round arrays and summary figures (``history`` None: the run ended
        without one; the loggers are closed either way)."""
        loggers, self.loggers = self.loggers or [], []
        summary = {}
        if history is not None:
            axis = "event" if "staleness_histogram" in history.summary else "round"
            rows = _per_round(history.round_metrics)
            for logger in loggers:
                for step, values in enumerate(rows, 1):
                    logger.log({f"{axis}/{k}": v for k, v in values.items()}, step, axis)
            summary = flat_numbers(history.summary)
        for logger in loggers:
            logger.finish(summary)


def logged(
    run: Callable[[Callable[[Mapping[str, Any]], None]], Any],
    config: Mapping[str, Any],
    out_dir: str | Path,
    *,
    name: str = "",
    group: str = "",
) -> Any:
    """``run(on_eval)``'s History, its figures logged as ``config["logging"]`` asks (only by the
    process that writes results); the loggers are finished with the History of a run that
    stopped early (``Diverged``, ``Interrupted``) and closed whatever happens."""
    loggers = open_loggers(config, out_dir, name=name, group=group)
    history = None
    try:
        history = run(loggers.on_eval)
    except BaseException as err:
        kept = getattr(err, "history", None)
        history = kept if hasattr(kept, "round_metrics") else None
        raise
    finally:
        loggers.finish(history)
    return history


def open_loggers(
    config: Mapping[str, Any], out_dir: str | Path, *, name: str = "", group: str = ""
) -> Loggers:
    """The loggers ``config["logging"]`` asks for, writing under ``out_dir`` (``name``,
    ``group``: the defaults of ``logging.name`` and ``logging.wandb_group``)."""
    table = config.get("logging") or {}
    if not table or not distributed.writes_results():
        return Loggers()
    options_ = Logging(**table)
    hyper = flat_config(config)

    def open_() -> list[Logger]:
        from fedjax_het.front.logs_backends import TensorBoard, WandB

        out: list[Logger] = []
        if options_.tensorboard:
            out.append(TensorBoard(Path(out_dir) / "tensorboard", hyper))
        if options_.wandb:
            run = options_.name or name or Path(out_dir).name
            group_ = options_.wandb_group or group
            out.append(WandB(Path(out_dir), options_, name=run, group=group_, config=hyper))
        return out

    return Loggers(open_)


def flat_numbers(tree: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a nested mapping, keyed ``a/b`` (bools and lists left out)."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_numbers(value, f"{name}/"))
        elif _is_number(value) and math.isfinite(float(value)):
            out[name] = float(value)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A resolved config as hyperparameters: ``{"algorithm.client_lr": 0.05, ...}``, lists as
    their TOML-like text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def _per_round(arrays: Mapping[str, np.ndarray]) -> list[dict[str, float]]:
    """``[{metric: value}]`` per round from ``History.round_metrics``' ``[R]`` arrays."""
    columns = {k: np.asarray(v, np.float64) for k, v in arrays.items() if np.ndim(v) == 1}
    rounds = max((len(v) for v in columns.values()), default=0)
    return [
        {k: float(v[r]) for k, v in columns.items() if len(v) > r and np.isfinite(v[r])}
        for r in range(rounds)
    ]
