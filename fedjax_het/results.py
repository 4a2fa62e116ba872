"""The run directory: resolved config, metrics, summary, per-client arrays and a plot.

Layout of ``out_dir``::

    config.toml      the resolved config (re-runnable with ``fedjax-het run``)
    metrics.jsonl    one JSON object per evaluated round (strict JSON: a non-finite value is null)
    summary.json     final figures and timings
    arrays.npz       per-round and per-client arrays
    curves.png       test accuracy and losses against rounds

``load(out_dir)`` reads one back as a :class:`RunRecord` (``fedjax_het.front.compare`` compares
several).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def to_toml(config: Mapping[str, Any]) -> str:
    """Writes a config of tables of scalars and lists as TOML (``tomllib`` reads it back)."""
    lines = []
    scalars = {k: v for k, v in config.items() if not isinstance(v, Mapping)}
    for key, value in scalars.items():
        lines.append(f"{key} = {_toml_value(value)}")
    for table, entries in config.items():
        if isinstance(entries, Mapping):
            lines.append(f"\n[{table}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in entries.items() if v is not None]
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return "inf" if math.isinf(value) else repr(float(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def strict_json(value: Any, **kwargs: Any) -> str:
    """``value`` as strict JSON: NaN and infinities (which ``json`` writes as bare ``NaN``
    tokens that strict readers reject) become ``null``."""

    def clean(x):
        if isinstance(x, Mapping):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (float, np.floating)) and not math.isfinite(x):
            return None
        return x

    return json.dumps(clean(value), allow_nan=False, **kwargs)


class OutDirError(ValueError):
    """An output directory that cannot be used: a file, unwritable, or holding another run."""


class NotWritten(OSError):
    """Results that could not be written (a full disk, say); the others were.

    ``history`` holds the run's results in memory; ``missing`` names each file
    not written with the reason.
    """

    def __init__(self, out_dir: Path, missing: Sequence[str], history=None):
        self.out_dir, self.missing, self.history = out_dir, list(missing), history
        super().__init__(f"could not write {'; '.join(self.missing)} in {out_dir}")


def prepare_out_dir(out_dir: str | Path, *, overwrite: bool = False, resume: bool = False) -> Path:
    """Checks (and creates) a run's output directory before anything runs.

    Refused with :class:`OutDirError`: an empty path, a path that is a file,
    a directory that cannot be written, and a directory that already holds
    files (another run's results: nothing a user wrote is replaced) unless
    ``overwrite`` (our result files in it are replaced, a stale checkpoint
    removed) or ``resume`` (it must hold a run to continue).
    """
    if str(out_dir).strip() == "":
        raise OutDirError("the output directory is an empty path; name a directory")
    path = Path(out_dir)
    try:
        _check_out_dir(path, overwrite=overwrite, resume=resume)
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".fedjax_het_write_test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OutDirError(f"cannot write to the output directory {path}: {err.strerror}") from None
    return path


def _check_out_dir(path: Path, *, overwrite: bool, resume: bool) -> None:
    if path.exists() and not path.is_dir():
        raise OutDirError(f"the output directory {path} is a file")
    if resume:
        if not path.is_dir():
            raise OutDirError(f"there is no run to resume at {path}")
    elif path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise OutDirError(
                f"{path} already holds files (another run?); choose a new --out, pass "
                "--overwrite to replace its results, or --resume to continue it"
            )
        (path / "checkpoint.npz").unlink(missing_ok=True)


class RunWriter:
    """Writes a run's results as they come, so an interrupted run keeps what it did.

    A file that cannot be written (a full disk) does not stop the run: the
    failure is kept in ``missing`` (``NotWritten`` reports it at the end, and
    ``summary.json``'s ``not_written``), the part written is removed (a metrics
    line cut short: the line), and the other files are still written.
    """

    def __init__(
        self, out_dir: str | Path, config: Mapping[str, Any] | None, *, overwrite: bool = False,
        resume: bool = False,
    ):
        self.out_dir = prepare_out_dir(out_dir, overwrite=overwrite, resume=resume)
        self.missing: dict[str, str] = {}
        self.write("config.toml", lambda path: path.write_text(to_toml(config or {})))
        self._metrics = self.out_dir / "metrics.jsonl"
        self.write("metrics.jsonl", lambda path: path.write_text(""))

    def write(self, name: str, write: Callable[[Path], Any], *, keep: int | None = None) -> None:
        """``write(out_dir / name)``; an ``OSError`` is recorded in ``missing``, not raised,
        and what was written removed (``keep``: the file's first ``keep`` bytes stay)."""
        path = self.out_dir / name
        try:
            write(path)
        except OSError as err:
            self.missing.setdefault(name, err.strerror or str(err))
            try:
                if keep is None:
                    path.unlink(missing_ok=True)
                else:
                    os.truncate(path, keep)
            except OSError:
                pass  # a file that can be neither written nor removed stays as it is

    def rewrite_metrics(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """``metrics.jsonl`` holding exactly ``lines`` (a resumed run's, up to its checkpoint)."""
        text = "".join(strict_json(line) + "\n" for line in lines)
        self.write("metrics.jsonl", lambda path: path.write_text(text))

    def append(self, line: Mapping[str, Any]) -> None:
        def append(path: Path) -> None:
            with path.open("a") as f:
                f.write(strict_json(line) + "\n")

        size = self._metrics.stat().st_size if self._metrics.is_file() else 0
        self.write("metrics.jsonl", append, keep=size)

    def finish(self, history) -> None:
        """Writes arrays.npz, curves.png and summary.json (last: with ``not_written``, the
        files missing and why, when some are); raises ``NotWritten`` if any file of the run
        could not be written (after writing every one it could)."""
        arrays = {
            "client_accuracy": history.client_accuracy,
            **({} if history.personal_accuracy is None
               else {"personal_accuracy": history.personal_accuracy}),
            **{f"round_{k}": v for k, v in history.round_metrics.items()},
        }
        self.write("arrays.npz", lambda path: np.savez_compressed(path, **arrays))
        self.write("curves.png", lambda path: plot_curves(history.metrics, path))
        mark_not_written(history.summary, self.missing)
        summary = strict_json(history.summary, indent=2) + "\n"
        self.write("summary.json", lambda path: path.write_text(summary))
        if self.missing:
            missing = [f"{name} ({why})" for name, why in self.missing.items()]
            raise NotWritten(self.out_dir, missing, history)


NOT_WRITTEN = "completed_not_written"  # the status of a run that finished but lost files


def mark_not_written(summary: dict[str, Any], missing: Mapping[str, str]) -> None:
    """Adds ``not_written`` (file -> why) to ``summary`` when files are ``missing``, and turns
    its status "completed" into ``NOT_WRITTEN``: a tool reading only the status must not
    take a run with missing files for a complete one."""
    if missing:
        summary["not_written"] = dict(missing)
        if summary.get("status") == "completed":
            summary["status"] = NOT_WRITTEN


def plot_curves(metrics: list[Mapping[str, Any]], path: Path) -> None:
    """Test accuracy (with the per-client 10th percentile) and losses against rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [m["round"] for m in metrics]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_acc.plot(rounds, [m["test_accuracy"] for m in metrics], label="global test")
    ax_acc.plot(rounds, [m["client_accuracy_mean"] for m in metrics], label="client mean")
    ax_acc.plot(rounds, [m["client_accuracy_p10"] for m in metrics], label="client 10th pct", ls="--")
    if "personal_accuracy_mean" in metrics[0]:
        ax_acc.plot(rounds, [m["personal_accuracy_mean"] for m in metrics], label="personal mean")
    ax_acc.set(xlabel="round", ylabel="accuracy", title="accuracy")
    ax_acc.legend()
    ax_loss.plot(rounds, [m["test_loss"] for m in metrics], label="test")
    trained = [m for m in metrics if m["train_loss"] is not None]
    ax_loss.plot([m["round"] for m in trained], [m["train_loss"] for m in trained], label="train (local)")
    ax_loss.set(xlabel="round", ylabel="loss", title="loss")
    ax_loss.legend()
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict[str, Any]:
    """Versions, device, flags and git revision, read by the program (docs/design.md §9).

    Benchmarks and experiments record this beside their figures, so a number
    never travels without the environment that produced it.
    """
    import datetime
    import os
    import platform
    import subprocess
    import sys
    from importlib import metadata

    import jax

    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=repo, capture_output=True, text=True, check=True
            )
        except (OSError, subprocess.CalledProcessError):
            return "unknown"
        return done.stdout.strip()

    device = jax.local_devices()[0]
    return {
        "versions": {
            name: metadata.version(name)
            for name in ("fedjax_het", "jax", "jaxlib", "flax", "optax", "numpy")
        },
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device": f"{device.platform}:{device.device_kind}",
        "device_count": jax.device_count(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_env": {k: v for k, v in os.environ.items() if k.startswith("JAX_")},
        "git_revision": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One run directory, read back.

    Attributes:
      path: the directory.
      config: its resolved ``config.toml`` (empty when it has none).
      metrics: ``metrics.jsonl``, one dict per evaluation (non-finite values are None).
      summary: ``summary.json``; None while the run has not finished (or was killed).
    """

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def status(self) -> str:
        """``summary.json``'s status ("completed", "interrupted", "diverged",
        ``NOT_WRITTEN``), or "unfinished"."""
        return "unfinished" if self.summary is None else str(self.summary.get("status", "?"))

    def series(self, key: str) -> np.ndarray:
        """``key`` of every evaluation that has it, as float64 (None: NaN)."""
        values = [m[key] for m in self.metrics if key in m]
        return np.asarray([np.nan if v is None else v for v in values], np.float64)


def load(out_dir: str | Path) -> RunRecord:
    """Reads a run directory (``fedjax-het run --out``, or one ``cell-NNN`` of a sweep).

    Raises:
      FileNotFoundError: (one line) the directory has no ``metrics.jsonl``.
      ValueError: (one line) a file that is not what the run writes.
    """
    path = Path(out_dir)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} is not a run directory: it has no metrics.jsonl")
    metrics = [_json(path / "metrics.jsonl", line) for line in _lines(path / "metrics.jsonl")]
    summary_path, config_path = path / "summary.json", path / "config.toml"
    summary = _json(summary_path, summary_path.read_text()) if summary_path.is_file() else None
    try:
        config = tomllib.loads(config_path.read_text()) if config_path.is_file() else {}
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{config_path}: not a config the run wrote ({err})") from None
    return RunRecord(path, config, metrics, summary)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def _json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON the run wrote ({err})") from None
