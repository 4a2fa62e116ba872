"""Grids of runs from one config, as few compiled programs as the grid allows (docs/design.md §3).

``fedjax-het sweep CONFIG --grid algorithm.client_lr=0.01,0.03,0.1 --grid seed=0..3``
runs the product of its axes. Each cell is the config with the user's
``--set`` overrides and then the cell's own (``config.load``), validated by
``config.build`` before anything compiles: a bad value names its cell and key.

Cells whose resolved configs differ only in numbers a program traces share
one program (``sweep.sweep``, compiled once): the ``seed``, the algorithm's
hyperparameters (``FederatedAlgorithm.hyperparameters``: ``[algorithm]`` keys
that are not options of its factory) and the numbers of ``[system]`` and
``[policy]`` whose systems stack (``sweep.stack_key``). Anything else (the
model, the batch size, the algorithm and its options, the data and its
partition, rounds) changes the program: such cells form separate programs,
each compiled once. Partitions do not stack: local batches are drawn over the
largest client's row count (``batching.batch_indices``), so a padded store
would change what each client draws. Configs a sweep cannot run (a learned
``[selection]``, an algorithm that freezes layers in the loop, host client
states, an asynchronous ``[server]``) run cell by cell with ``simulate.run``.

Results (``run``): one run directory per cell, ``cell-000/`` and on, with the
cell's resolved ``config.toml`` (``fedjax-het run cell-000/config.toml``
trains that cell again), and over them ``grid.csv`` / ``grid.json`` (one row
per cell) and ``grid.png`` (``plot_grid``).

>>> parse_axis("algorithm.client_lr=0.01,0.1").values
(0.01, 0.1)
>>> parse_axis("seed=0..2,7").values
(0, 1, 2, 7)
>>> parse_axis("model.hidden=[50, 50],[100]").texts
('[50, 50]', '[100]')

Over 400 lines on purpose: parsing the axes, grouping cells into programs and writing the table
are the one ``sweep`` command; each step is its own function.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import itertools
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_het import results
from fedjax_het.engine.hooks import Freezing
from fedjax_het.front import config as config_lib
from fedjax_het.front import logs
from fedjax_het.front.config import ConfigError, Experiment
from fedjax_het.front.sweep import Cell, stack_key, sweep
from fedjax_het.system.setup import System
from fedjax_het.training import checkpoint, distributed, simulate

_RANGE = re.compile(r"^(-?\d+)\s*\.\.\s*(-?\d+)$")
_CLOSING = {"[": "]", "{": "}"}


@dataclasses.dataclass(frozen=True)
class Axis:
    """One ``--grid KEY=VALUES`` axis: its values as written (TOML) and as read."""

    key: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class GridCell:
    """One cell: its axis values and what its validated config asks for.

    Attributes:
      values: ``{axis key: value}``.
      config: the resolved config (what ``cell-NNN/config.toml`` holds).
      seed, hyper, system: the parts that may vary inside one program.
    """

    values: Mapping[str, Any]
    config: Mapping[str, Any]
    seed: int
    hyper: Mapping[str, float]
    system: System | None

    @property
    def name(self) -> str:
        return ", ".join(f"{k}={_text(v)}" for k, v in self.values.items())


@dataclasses.dataclass(frozen=True)
class Program:
    """Cells that share one compiled program.

    Attributes:
      experiment: the first cell's experiment: data, model, algorithm, sampler, work, engine.
      cells: the cells' indices.
      swept: True: the cells run as one ``sweep.sweep``; False: one cell run by
        ``simulate.run`` (a config that a sweep cannot run).
    """

    experiment: Experiment
    cells: tuple[int, ...]
    swept: bool


@dataclasses.dataclass(frozen=True)
class Plan:
    """A validated grid: its axes, cells (in product order, the first axis slowest),
    programs, and the axis keys that change the compiled program."""

    axes: tuple[Axis, ...]
    cells: tuple[GridCell, ...]
    programs: tuple[Program, ...]
    splitting: tuple[str, ...]


def parse_axis(spec: str) -> Axis:
    """``"KEY=V1,V2,..."`` -> ``Axis``; a value ``A..B`` is the integers A to B inclusive.

    Values are TOML (``0.1``, ``true``, ``"text"``, ``[1, 2]``; a bare word is a
    string), separated by commas outside brackets and quotes.
    """
    key, sep, text = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--grid expects KEY=V1,V2,... or KEY=A..B (e.g. seed=0..3), got {spec!r}")
    texts: list[str] = []
    for part in _split(text):
        if not part:
            raise ConfigError(f"--grid {spec!r}: empty value (values are separated by commas)")
        bounds = _RANGE.match(part)
        if bounds is None:
            texts.append(part)
            continue
        low, high = map(int, bounds.groups())
        if low > high:
            raise ConfigError(f"--grid {spec!r}: the range {part} is empty (write A..B with A <= B)")
        texts += [str(v) for v in range(low, high + 1)]
    values = tuple(config_lib.parse_override(f"{key}={t}")[1] for t in texts)
    repeated = [t for i, t in enumerate(texts) if values[i] in values[:i]]
    if repeated:
        raise ConfigError(f"--grid {spec!r}: the value {repeated[0]} appears twice")
    return Axis(key, tuple(texts), values)


def _split(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes, each part stripped."""
    parts, current, stack, quote = [], [], [], None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in _CLOSING:
            stack.append(_CLOSING[char])
        elif stack and char == stack[-1]:
            stack.pop()
        elif char == "," and not stack:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return parts


def plan(
    path: str | Path | None, sets: Sequence[str], axes: Sequence[Axis], *, one_program: bool = False
) -> Plan:
    """Builds and validates every cell of the grid and groups them into programs.

    Args:
      path: the config file (None: the defaults).
      sets: the user's ``--set`` overrides; a cell's own come after them.
      axes: the grid's axes (``parse_axis``); their keys must differ.
      one_program: refuse (ConfigError) a grid that needs more than one program.

    Raises:
      ConfigError: no axis, a repeated axis key, a cell whose config is invalid
        (the message names the cell), or more than one program with ``one_program``.
    """
    if not axes:
        raise ConfigError("sweep needs at least one --grid KEY=VALUES axis")
    keys = [axis.key for axis in axes]
    repeated = [k for i, k in enumerate(keys) if k in keys[:i]]
    if repeated:
        raise ConfigError(f"--grid {repeated[0]!r} is given twice; list all its values in one --grid")
    cells: list[GridCell] = []
    groups: dict[Any, list[int]] = {}
    experiments: dict[Any, Experiment] = {}
    for i, texts in enumerate(itertools.product(*(axis.texts for axis in axes))):
        values = {a.key: a.values[a.texts.index(t)] for a, t in zip(axes, texts)}
        overrides = [*sets, *(f"{a.key}={t}" for a, t in zip(axes, texts))]
        cell_name = ", ".join(f"{a.key}={t}" for a, t in zip(axes, texts))
        try:
            experiment = config_lib.build(config_lib.load(path, overrides))
        except ConfigError as err:
            raise ConfigError(f"grid cell {i} ({cell_name}): {err}") from None
        cells.append(GridCell(
            values, experiment.config, experiment.config["seed"], dict(experiment.hyper),
            experiment.system,
        ))
        group = _program_key(experiment) if _sweepable(experiment) else ("alone", i)
        groups.setdefault(group, []).append(i)
        experiments.setdefault(group, experiment)
    programs = tuple(
        Program(experiments[g], tuple(ids), g[0] != "alone") for g, ids in groups.items()
    )
    result = Plan(tuple(axes), tuple(cells), programs, _splitting(axes, programs))
    if one_program and len(programs) > 1:
        raise ConfigError(_one_program_error(result))
    return result


def _sweepable(experiment: Experiment) -> bool:
    """Whether ``sweep`` can run the config (else ``simulate.run`` runs it alone)."""
    return (
        experiment.select is None and experiment.algorithm.hook(Freezing) is None
        and experiment.config["engine"]["client_state"] != "host" and experiment.server is None
    )


def _program_key(experiment: Experiment) -> tuple:
    """Equal for configs that differ only in what one program traces."""
    config = copy.deepcopy(dict(experiment.config))
    del config["seed"]
    for name, _ in experiment.algorithm.hyperparameters.defaults:
        config["algorithm"].pop(name, None)
    for table in ("system", "policy"):
        for key, value in list(config.get(table, {}).items()):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                del config[table][key]
    stack = None
    if experiment.system is not None:
        stack = stack_key(experiment.system, experiment.sampler, experiment.data.num_clients)
    return ("sweep", json.dumps(config, sort_keys=True, default=str), stack)


def _splitting(axes: Sequence[Axis], programs: Sequence[Program]) -> tuple[str, ...]:
    """The axis keys for which two cells differing in that key alone are in different programs."""
    program_of = {i: p for p, program in enumerate(programs) for i in program.cells}
    shape = [len(axis.values) for axis in axes]
    positions = list(itertools.product(*(range(n) for n in shape)))
    index = {pos: i for i, pos in enumerate(positions)}
    splitting = []
    for a, axis in enumerate(axes):
        if any(
            program_of[index[pos]] != program_of[index[(*pos[:a], 0, *pos[a + 1:])]]
            for pos in positions
        ):
            splitting.append(axis.key)
    return tuple(splitting)


def _one_program_error(grid: Plan) -> str:
    alone = [p for p in grid.programs if not p.swept]
    if alone:
        return (
            f"--one-program: grid cell {alone[0].cells[0]} cannot share a program (a learned "
            "[selection], an algorithm that freezes layers in the loop, or host client states "
            "run one cell at a time)"
        )
    algorithm = grid.programs[0].experiment.algorithm
    traced = ", ".join(f"algorithm.{name}" for name, _ in algorithm.hyperparameters.defaults)
    keys = ", ".join(grid.splitting)
    return (
        f"--one-program: the grid needs {len(grid.programs)} programs: {keys} "
        f"change{'s' if len(grid.splitting) == 1 else ''} the compiled program; one program "
        f"varies only seed, {traced or 'no algorithm hyperparameters'}, and [system]/[policy] "
        "numbers whose systems stack"
    )


COMMAND = "sweep.json"  # the sweep's config path, --set and --grid, for --resume


def run(
    grid: Plan, out: str | Path, *, progress: bool = True, cells_at_once: int | None = None,
    command: Mapping[str, Any] | None = None, resume: bool = False, overwrite: bool = False,
) -> list[simulate.History]:
    """Runs every program of ``grid``; writes the cell directories, grid.csv, grid.json, grid.png.

    Returns one ``History`` per cell, in grid order (``out_dir``: its cell directory).
    In a multi-process run only process 0 writes. ``command`` (the CLI's config
    path, ``--set`` and ``--grid``) is saved as ``sweep.json`` for ``--resume``.
    Checkpoints go to ``checkpoints/program-K`` (a swept program's chunks) and the
    cell directories (a program of one run); with ``resume`` every program
    continues from its checkpoint, one without a checkpoint starts afresh.
    ``overwrite``: the directories may already hold files.
    """
    out = Path(out)
    writes = distributed.writes_results()
    if writes:
        results.prepare_out_dir(out, overwrite=overwrite, resume=resume)
        if command is not None and not resume:
            (out / COMMAND).write_text(json.dumps(command, indent=2) + "\n")
    by_cell: dict[int, simulate.History] = {}
    start = time.perf_counter()
    for k, program in enumerate(grid.programs):
        dirs = [out / f"cell-{i:03d}" for i in program.cells]
        cells = [grid.cells[i] for i in program.cells]
        loggers = [  # one logged run per cell, grouped under the sweep's folder name
            logs.open_loggers(c.config, d, name=f"{d.name} {c.name}", group=out.name)
            for c, d in zip(cells, dirs)
        ]
        done: list[simulate.History] = []
        try:
            done = _run_program(grid, program, k, out, dirs, loggers, progress=progress,
                                cells_at_once=cells_at_once, resume=resume, overwrite=overwrite)
        finally:
            for logged, history in itertools.zip_longest(loggers, done):
                logged.finish(history)
        by_cell.update(zip(program.cells, done))
    histories = [by_cell[i] for i in range(len(grid.cells))]
    if writes:
        write(grid, histories, out, wall_s=time.perf_counter() - start)
    return histories


def _run_program(
    grid: Plan, program: Program, k: int, out: Path, dirs: Sequence[Path],
    loggers: Sequence[logs.Loggers], *, progress: bool, cells_at_once: int | None, resume: bool,
    overwrite: bool,
) -> list[simulate.History]:
    """The histories of one program's cells: one ``sweep``, or one ``simulate.run``."""
    exp = program.experiment
    if program.swept:
        kwargs = exp.run_kwargs()
        for key in ("seed", "hyper", "system", "select", "server"):
            kwargs.pop(key)
        cells = [grid.cells[i] for i in program.cells]
        return sweep(
            exp.data, exp.model, exp.algorithm, exp.sampler, **kwargs, progress=progress,
            cells_at_once=cells_at_once, checkpoints=out / "checkpoints" / f"program-{k}",
            resume=resume, overwrite=overwrite,
            cells=[Cell(c.seed, c.hyper, c.system, d, c.config, logged.on_eval)
                   for c, d, logged in zip(cells, dirs, loggers)],
        )  # fmt: skip
    return [simulate.run(
        exp.data,
        *exp.options(
            progress=progress,
            out_dir=dirs[0],
            config=exp.config,
            resume=resume and (dirs[0] / checkpoint.FILE).is_file(),
            overwrite=overwrite or resume,
            on_eval=loggers[0].on_eval,
        ),
    )]


def table(grid: Plan, histories: Sequence[simulate.History]) -> list[dict[str, Any]]:
    """One row per cell: its grid values, program, accuracies, final train loss, times, directory.

    ``wall_s`` and ``first_block_s_with_compile`` are those of the cell's program
    (or chunk of cells), shared by its cells.
    """
    program_of = {i: p for p, program in enumerate(grid.programs) for i in program.cells}
    rows = []
    for i, history in enumerate(histories):
        s, p = history.summary, program_of[i]
        rows.append({
            "cell": i,
            **grid.cells[i].values,
            "program": p,
            "final_test_accuracy": s["final_test_accuracy"],
            "best_test_accuracy": s["best_test_accuracy"],
            "client_accuracy_mean": s["client_accuracy_mean"],
            "client_accuracy_p10": s["client_accuracy_p10"],
            "final_train_loss": history.metrics[-1]["train_loss"],
            "rounds": s["rounds"],
            "cells_in_program": len(grid.programs[p].cells),
            "wall_s": s["wall_s"],
            "first_block_s_with_compile": s["first_block_s_with_compile"],
            "dir": None if history.out_dir is None else history.out_dir.name,
        })
    return rows


def write(
    grid: Plan, histories: Sequence[simulate.History], out: Path, *, wall_s: float
) -> None:
    """grid.csv and grid.json (axes, programs, ``table`` rows) and grid.png in ``out``."""
    rows = table(grid, histories)
    with (out / "grid.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: _text(v) for k, v in row.items()} for row in rows)
    record = {
        "axes": {axis.key: list(axis.values) for axis in grid.axes},
        "cells": len(grid.cells),
        "programs": len(grid.programs),
        "program_changing_keys": list(grid.splitting),
        "wall_s": round(wall_s, 3),
        "rows": rows,
    }
    (out / "grid.json").write_text(results.strict_json(record, indent=2) + "\n")
    plot_grid(grid, rows, [h.metrics for h in histories], out / "grid.png")


def plot_grid(
    grid: Plan, rows: Sequence[Mapping[str, Any]], curves: Sequence[Sequence[Mapping[str, Any]]],
    path: Path,
) -> None:
    """Final test accuracy against the grid, and every cell's accuracy curve.

    Left: final accuracy against the first axis other than ``seed`` (x), one line
    per value of the next such axis; the cells a point gathers (seeds, further
    axes) give its mean and min-max bar. Right: test accuracy against rounds,
    one line per cell, coloured by its x value, dashed by its line value.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    varied = [a for a in grid.axes if a.key != "seed" and len(a.values) > 1] or list(grid.axes)
    x_axis, line_axis = varied[0], (varied[1] if len(varied) > 1 else None)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x_axis.values)
    xs = list(x_axis.values) if numeric else list(range(len(x_axis.values)))
    log = numeric and min(xs) > 0 and max(xs) / min(xs) >= 10
    lines = line_axis.values if line_axis else (None,)
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(x_axis.values)))
    styles = ("-", "--", ":", "-.")

    fig, (ax_grid, ax_curves) = plt.subplots(1, 2, figsize=(11, 4))
    for n, line in enumerate(lines):
        mine = [r for r in rows if line_axis is None or r[line_axis.key] == line]
        acc = [[r["final_test_accuracy"] for r in mine if r[x_axis.key] == v] for v in x_axis.values]
        mean = np.array([np.mean(a) for a in acc])
        spread = np.array([[mean[j] - min(a), max(a) - mean[j]] for j, a in enumerate(acc)]).T
        label = None if line_axis is None else f"{line_axis.key}={_text(line)}"
        ax_grid.errorbar(xs, mean, yerr=spread, marker="o", capsize=3, ls=styles[n % 4], label=label)
    if log:
        ax_grid.set_xscale("log")
    if not numeric:
        ax_grid.set_xticks(xs, [_text(v) for v in x_axis.values])
    gathered = len(rows) // (len(x_axis.values) * len(lines))
    ax_grid.set(
        xlabel=x_axis.key, ylabel="final test accuracy",
        title="final accuracy" + (f" (mean, min-max of {gathered} cells)" if gathered > 1 else ""),
    )
    if line_axis is not None:
        ax_grid.legend(fontsize=8)
    for row, metrics in zip(rows, curves):
        colour = colours[x_axis.values.index(row[x_axis.key])]
        style = styles[lines.index(row[line_axis.key]) % 4] if line_axis else "-"
        ax_curves.plot([m["round"] for m in metrics], [m["test_accuracy"] for m in metrics],
                       color=colour, ls=style, lw=1, alpha=0.8)
    for v, colour in zip(x_axis.values, colours):
        ax_curves.plot([], [], color=colour, label=f"{x_axis.key}={_text(v)}")
    ax_curves.set(xlabel="round", ylabel="test accuracy", title=f"every cell ({len(rows)})")
    ax_curves.legend(fontsize=8)
    for ax in (ax_grid, ax_curves):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _text(value: Any) -> str:
    """A grid value as a table cell: numbers and strings plainly, lists as TOML-like text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)
