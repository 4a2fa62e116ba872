"""Runs side by side: one figure of their curves and a Markdown table of what each reached.

Rounds, virtual time and bytes to a target accuracy rank settings differently under
deadlines and stragglers (FLHetBench, Zhang et al. 2024, §4.1), so the table gives all
three. Run directories whose configs differ only in ``seed`` (a sweep's seed cells, or
runs started by hand) are one group: the figure draws their mean with the min-max band,
the table gives the mean and the spread.

>>> import tempfile
>>> from fedjax_het import results
>>> runs = []
>>> for seed, accuracy in ((0, 0.6), (1, 0.8)):
...     out = results.RunWriter(f"{tempfile.mkdtemp()}/run", {"seed": seed, "rounds": 2})
...     for r, a in ((0, 0.1), (2, accuracy)):
...         out.append({"round": r, "test_accuracy": a, "wall_s": r})
...     runs.append(out.out_dir)
>>> comparison = compare(runs, target=0.7)
>>> [(group.label, len(group.runs)) for group in comparison.groups]
[('run', 2)]
>>> print(comparison.table.splitlines()[2])
| run | 2 | unfinished | 0.7 (0.6-0.8) | 0.7 (0.6-0.8) | 2 (1 of 2 runs) | - | - | - | - | - |
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_het.results import RunRecord, load

# x axis name: (how to read it from an evaluation, its label)
X_AXES = {
    "round": "round",
    "virtual_hours": "virtual hours",
    "bytes": "MB moved (down + up)",
    "wall_s": "wall seconds",
}


@dataclasses.dataclass(frozen=True)
class Group:
    """Runs whose configs differ only in ``seed``, and what sets them apart from the others."""

    label: str
    runs: tuple[RunRecord, ...]


@dataclasses.dataclass(frozen=True)
class Comparison:
    groups: tuple[Group, ...]
    table: str
    figure: Path | None


def compare(
    run_dirs: Sequence[str | Path],
    *,
    x: str = "round",
    metric: str = "test_accuracy",
    target: float | None = None,
    figure: str | Path | None = None,
    labels: Sequence[str] = (),
) -> Comparison:
    """Reads the runs (a sweep's directory stands for its ``cell-NNN`` runs), groups seeds,
    writes the figure of ``metric`` against ``x`` to ``figure`` (when given) and returns the
    Markdown table (with rounds, virtual hours and MB to ``target`` when given). ``labels``:
    short names of the ``run_dirs``, in their order (``group_runs``).

    Raises:
      ValueError: (one line) an unknown ``x``, no runs, a run without ``metric``, or more
        labels than run directories.
      FileNotFoundError: (one line) a path that is not a run or sweep directory.
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    records = [load(path) for path in expand(run_dirs)]
    missing = [str(r.path) for r in records if not any(metric in m for m in r.metrics)]
    if missing:
        raise ValueError(f"no {metric!r} in the metrics of {', '.join(missing)}")
    if len(labels) > len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} run directories")
    groups = group_runs(records, {Path(d).resolve(): name for d, name in zip(run_dirs, labels)})
    if figure is not None:
        figure = Path(figure)
        plot(groups, x, metric, figure)
    return Comparison(tuple(groups), table(groups, metric, target), figure)


def expand(run_dirs: Sequence[str | Path]) -> list[Path]:
    """Each path as runs: itself if it holds ``metrics.jsonl``, else its ``cell-NNN`` runs."""
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    paths: list[Path] = []
    for run_dir in map(Path, run_dirs):
        cells = sorted(p.parent for p in run_dir.glob("cell-*/metrics.jsonl"))
        if (run_dir / "metrics.jsonl").is_file():
            paths.append(run_dir)
        elif cells:
            paths.extend(cells)
        else:
            raise FileNotFoundError(f"{run_dir} is not a run directory (no metrics.jsonl) or a sweep's")
    return paths


CHOOSERS = ("algorithm.name", "data.name", "model.name", "partition.kind", "feature_skew.kind")
CHOOSERS += ("sampler.name", "selection.name", "policy.kind", "server.mode", "system.devices")
"""Keys that choose a function: a label names the choice, not the options that follow from it."""
QUIET = ("seed", "logging.", "distributed.", "engine.compile_cache", "engine.checkpoint_every")
"""Keys that do not change what a run computes: never in a label."""
MOST_KEYS = 3
"""Keys an automatic label names at most (then "+N more")."""


def group_runs(
    records: Sequence[RunRecord], labels: Mapping[Path, str] | None = None
) -> list[Group]:
    """Groups runs by their config without ``seed``. A group's label is, in order: the
    ``labels`` entry of its run directory (or of the sweep holding it), its runs'
    ``logging.name``, or the keys that differ between the groups (``short_labels``)."""
    keyed: dict[str, list[RunRecord]] = {}
    for record in records:
        config = {k: v for k, v in _flat(record.config).items() if k != "seed"}
        keyed.setdefault(json.dumps(config, sort_keys=True, default=str), []).append(record)
    runs_of = list(keyed.values())
    automatic = short_labels([_flat(runs[0].config) for runs in runs_of])
    groups = []
    for runs, label in zip(runs_of, automatic, strict=True):
        given = {_given(r, labels or {}) for r in runs} - {""}
        name = given.pop() if len(given) == 1 else label or runs[0].path.name
        groups.append(Group(name, tuple(runs)))
    if len({g.label for g in groups}) < len(groups):  # same configs in different directories
        groups = [dataclasses.replace(g, label=f"{g.label} ({g.runs[0].path.name})") for g in groups]
    return groups


def _given(record: RunRecord, labels: Mapping[Path, str]) -> str:
    """The label given to a run: by ``--label`` (its directory's or its sweep's), else its
    config's ``logging.name``; "" : none."""
    path = Path(record.path).resolve()
    for where in (path, path.parent):
        if where in labels:
            return labels[where]
    return str(record.config.get("logging", {}).get("name", ""))


def short_labels(flats: Sequence[Mapping[str, Any]]) -> list[str]:
    """One label per flattened config: the keys whose values differ between them, without the
    options a differing choice brings along (FedProx's ``prox_mu`` beside ``algorithm.name``),
    keys that change nothing computed (``QUIET``), and at most ``MOST_KEYS`` of them; a choice
    is written as its value (``fedprox``), an option by its last name (``client_lr=0.1``)."""
    keys = sorted({k for flat in flats for k in flat})
    values = {k: {json.dumps(f.get(k), default=str) for f in flats} for k in keys}
    differing = [k for k in keys if len(values[k]) > 1 and not k.startswith(QUIET)]
    chosen = [k for k in CHOOSERS if k in differing]
    tables = tuple(c.rpartition(".")[0] + "." for c in chosen)
    follows = {k for k in differing if k.startswith(tables) and any(k not in f for f in flats)}
    named = chosen + [k for k in differing if k not in chosen and k not in follows]
    leaves = [k.rpartition(".")[2] for k in named]
    short = {k: leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(named, leaves)}
    labels = []
    for flat in flats:
        parts = [
            str(flat.get(k, "-")) if k in chosen else f"{short[k]}={flat.get(k, '-')}"
            for k in named[:MOST_KEYS]
        ]
        more = len(named) - MOST_KEYS
        labels.append(", ".join(parts) + (f" +{more} more" if more > 0 else ""))
    return labels


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def x_values(record: RunRecord, x: str) -> np.ndarray:
    """The x coordinate of each evaluation (NaN where the run did not record it)."""

    def one(m: Mapping[str, Any]) -> float:
        if x == "virtual_hours":
            return m["virtual_s"] / 3600 if "virtual_s" in m else np.nan
        if x == "bytes":
            moved = [m.get("bytes_down"), m.get("bytes_up")]
            return np.nan if None in moved else sum(moved) / 1e6
        return float(m.get(x, np.nan))

    return np.asarray([one(m) for m in record.metrics], np.float64)


def reached(record: RunRecord, metric: str, target: float, x: str) -> float | None:
    """``x`` at the first evaluation whose ``metric`` reached ``target``; None if none did."""
    xs = x_values(record, x)
    for m, at in zip(record.metrics, xs, strict=True):
        if m.get(metric) is not None and m[metric] >= target:
            return None if np.isnan(at) else float(at)
    return None


def table(groups: Sequence[Group], metric: str, target: float | None) -> str:
    """One Markdown row per group: final and best ``metric``, what it took to reach ``target``,
    and the run's totals (virtual hours, MB moved, participation Gini) where it had a system."""
    head = ["run", "seeds", "status", f"final {metric}", f"best {metric}"]
    if target is not None:
        head += [f"rounds to {target:g}", f"virtual h to {target:g}", f"MB to {target:g}"]
    head += ["virtual h", "MB moved", "participation Gini"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in groups:
        runs = group.runs
        finals = [r.series(metric)[-1] for r in runs]
        bests = [np.nanmax(r.series(metric)) for r in runs]
        cells = [group.label, str(len(runs)), "/".join(sorted({r.status for r in runs}))]
        cells += [_spread(finals), _spread(bests)]
        if target is not None:
            for x in ("round", "virtual_hours", "bytes"):
                timed = [r for r in runs if not np.isnan(x_values(r, x)).all()]
                cells.append(_to_target([reached(r, metric, target, x) for r in timed]))
        last = [r.metrics[-1] for r in runs]
        cells.append(_spread([m["virtual_s"] / 3600 for m in last if "virtual_s" in m]))
        cells.append(_spread([(m["bytes_down"] + m["bytes_up"]) / 1e6 for m in last
                              if "bytes_up" in m]))  # fmt: skip
        cells.append(_spread([_gini(r) for r in runs if _gini(r) is not None]))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _gini(record: RunRecord) -> float | None:
    summary = record.summary or {}
    value = summary.get("participation_gini", summary.get("system", {}).get("participation_gini"))
    return None if value is None else float(value)


def _spread(values: Sequence[float]) -> str:
    values = [v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return "-"
    mean = f"{np.mean(values):.4g}"
    return mean if len(values) == 1 else f"{mean} ({min(values):.4g}-{max(values):.4g})"


def _to_target(hits: Sequence[float | None]) -> str:
    got = [h for h in hits if h is not None]
    if not got:
        return "-" if len(hits) < 2 else f"- (0 of {len(hits)} runs)"
    text = _spread(got)
    return text if len(got) == len(hits) else f"{text} ({len(got)} of {len(hits)} runs)"


def plot(groups: Sequence[Group], x: str, metric: str, path: Path) -> None:
    """Saves ``figure``'s plot to ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(groups, x, metric)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(groups: Sequence[Group], x: str, metric: str):
    """``metric`` against ``x``, one line per group (the mean over its seeds, evaluation by
    evaluation) with the min-max band of its seeds; the legend outside the axes, on their
    right, its labels wrapped at 28 characters, the figure widened to hold it (constrained
    layout: nothing clipped, no curve covered)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    for group in groups:
        length = min(len(r.metrics) for r in group.runs)
        xs = np.stack([x_values(r, x)[:length] for r in group.runs])
        ys = np.stack([_aligned(r, metric)[:length] for r in group.runs])
        at = np.nanmean(xs, axis=0)
        label = textwrap.fill(f"{group.label} (n={len(group.runs)})", 28)
        (line,) = ax.plot(at, np.nanmean(ys, axis=0), label=label)
        if len(group.runs) > 1:
            ax.fill_between(at, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0),
                            color=line.get_color(), alpha=0.2)  # fmt: skip
    ax.set(xlabel=X_AXES[x], ylabel=metric)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    return fig


def _aligned(record: RunRecord, metric: str) -> np.ndarray:
    return np.asarray([np.nan if m.get(metric) is None else m[metric] for m in record.metrics])
