"""What the experiment scripts share: where results go and how they are written, the command
line of a reproduction, interleaved timing, summaries over seeds, and figures.

Every record and JSONL row carries the environment the program read
(``fedjax_het.results.environment``: versions, device, flags, git revision) and its
``provenance`` (``provenance.py``: commit, clean tree, ``--allow-dirty``, command), so a figure
never travels without what produced it; nothing is written under ``results/`` from a dirty tree
unless ``--allow-dirty`` says so. A reproduction (``personalisation.py``, ``hdfl_setups.py``...)
writes into one folder under ``results/`` and has ``--out`` and ``--report`` (redraw from the
results there, run nothing); a benchmark appends rows to a JSONL file under ``bench_results/``.

The scripts import this module as ``common``: running ``python experiments/x.py`` puts this
folder first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import provenance

from fedjax_het import results

RESULTS = Path(__file__).parent / "results"  # a folder per reproduction
BENCH_RESULTS = Path(__file__).parent / "bench_results"  # the benchmarks' JSONL files

Row = dict[str, Any]


def results_path(out: str | None, name: str, *, quick: bool) -> Path:
    """``out``, else ``bench_results/<name>[-quick]-<UTC time>.jsonl``; its folder made."""
    stamp = datetime.datetime.now(datetime.UTC)
    quick_tag = "-quick" if quick else ""
    path = Path(out or BENCH_RESULTS / f"{name}{quick_tag}-{stamp:%Y%m%dT%H%M%SZ}.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def out_dir(path: str | Path) -> Path:
    """``path`` as a folder, made if missing."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def environment(args: argparse.Namespace) -> Row:
    """The environment the program read, with the result's ``provenance`` (commit, clean tree,
    ``--allow-dirty``, command)."""
    allow_dirty = getattr(args, "allow_dirty", False)
    return {**results.environment(), "provenance": provenance.stamp(allow_dirty)}


def record(args: argparse.Namespace, **fields: Any) -> Row:
    """A results record: the command line's arguments, the environment and provenance, then
    ``fields``."""
    return {"args": vars(args), "environment": environment(args), **fields}


def write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON in ``path`` (replaced)."""
    path.write_text(json.dumps(value, indent=1) + "\n")


def earlier_runs(path: Path, resume: bool) -> list[Row]:
    """With ``resume``, the ``runs`` of the record in ``path`` (none if it does not exist)."""
    return json.loads(path.read_text())["runs"] if resume and path.exists() else []


def write_rows(
    path: Path,
    rows: Iterable[Row],
    environment: Row,
    *,
    key: str = "env",
    mode: str = "a",
) -> None:
    """Writes ``rows`` to the JSONL file ``path`` (``mode`` "a" appends, "w" replaces; the
    folder is made), one line each, ``environment`` added last under ``key``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as f:
        f.writelines(json.dumps({**row, key: environment}) + "\n" for row in rows)


def read_rows(path: Path) -> list[Row]:
    """The JSON lines of ``path`` (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def add_output_flags(parser: argparse.ArgumentParser, out: Path, *, resume: bool = False) -> None:
    """A reproduction's ``--out`` (its results folder, default ``out``), ``--resume`` (with
    ``resume``), ``--report`` and ``--allow-dirty`` (``provenance.guard``)."""
    parser.add_argument("--out", default=str(out), help=f"results folder (default {out})")
    provenance.add_flag(parser)
    if resume:
        parser.add_argument("--resume", action="store_true", help="skip the runs already there")
    parser.add_argument(
        "--report", action="store_true", help="run nothing: print the tables and plot from --out"
    )


def main_or_report(
    parse: Callable[[], argparse.Namespace],
    main: Callable[[argparse.Namespace], None],
    report: Callable[..., None],
    *options: str,
) -> None:
    """A reproduction's ``__main__``: with ``--report``, ``report(Path(args.out), *[args.<option>
    for each of options])`` from the results already there; else ``main(args)``, which runs and
    then reports, refused from a dirty tree into ``results/`` (``provenance.guard``)."""
    args = parse()
    if args.report:
        report(Path(args.out), *(getattr(args, name) for name in options))
    else:
        provenance.guard(Path(args.out), args.allow_dirty)
        main(args)


def interleaved(
    runs: Mapping[str, Callable[[], Any]], *, reps: int, warmup: int = 0
) -> dict[str, dict[str, list[float]]]:
    """Times ``reps`` calls of each run after ``warmup`` untimed ones, interleaved (one call of
    each in turn, so that other processes' load hits all alike), each blocked until its output
    is ready. Returns each run's ``seconds`` and the 1-minute load average before each timed
    call (``load``)."""
    timing = {name: {"seconds": [], "load": []} for name in runs}
    for rep in range(warmup + reps):
        for name, run in runs.items():
            load = os.getloadavg()[0]
            start = time.perf_counter()
            jax.block_until_ready(run())
            if rep >= warmup:
                timing[name]["seconds"].append(time.perf_counter() - start)
                timing[name]["load"].append(load)
    return timing


def seconds_summary(seconds: Sequence[float]) -> dict[str, float]:
    """``median_s``, ``min_s`` and ``max_s`` of timed ``seconds``."""
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds)}


def group_by(rows: Iterable[Row], key: Callable[[Row], Hashable]) -> dict[Hashable, list[Row]]:
    """``rows`` by ``key(row)``, in the order the keys first occur."""
    groups: dict[Hashable, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups


def mean_min_max(values: Iterable[float]) -> tuple[float, float, float]:
    """Mean, min and max of ``values`` (over seeds, say), in float64."""
    array = np.asarray(list(values), np.float64)
    return float(array.mean()), float(array.min()), float(array.max())


def spread(values: tuple[float, float, float], fmt: str = "{:.3f}") -> str:
    """``mean [min-max]`` of a ``mean_min_max`` triple, each number formatted by ``fmt``."""
    mean, low, high = (fmt.format(v) for v in values)
    return f"{mean} [{low}-{high}]"


def first_hit(run: Row, target: float) -> Row | None:
    """The first point of ``run["curve"]`` whose ``acc`` is at least ``target``, None if none."""
    return next((point for point in run["curve"] if point["acc"] >= target), None)


def pyplot() -> Any:
    """``matplotlib.pyplot``, drawing to files (the Agg backend); imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def spread_bars(
    ax: Any, entries: Sequence[Row], series: Sequence[tuple[str, str]], width: float = 0.27
) -> np.ndarray:
    """A group of bars per entry, one bar per ``(key, label)`` of ``series``: the mean of the
    entry's ``mean_min_max`` triple under ``key``, its min-max as the error bar. Returns the
    groups' x positions."""
    x = np.arange(len(entries))
    for i, (key, label) in enumerate(series):
        means = [entry[key][0] for entry in entries]
        errors = np.array([[e[key][0] - e[key][1], e[key][2] - e[key][0]] for e in entries]).T
        offset = (i - (len(series) - 1) / 2) * width
        ax.bar(x + offset, means, width, yerr=errors, label=label, capsize=2)
    return x


@contextlib.contextmanager
def figure(path: Path, *, dpi: int = 120, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """``(fig, axes)`` of ``plt.subplots(**subplots)``; after the block the figure is laid out
    (``tight_layout``) and saved to ``path`` at ``dpi``, and in any case closed."""
    plt = pyplot()
    fig, axes = plt.subplots(**subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
