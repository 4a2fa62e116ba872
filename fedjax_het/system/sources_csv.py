"""Bring your own system profiles: CSV schemas for availability and device speed.

Two plain CSV files, comma-separated, with a header row; clients are integers ``0 .. N-1``
(trace ``i`` of the availability belongs to client ``i``).

**Intervals** (``load_intervals_csv``), one ready interval per row::

    client,start_s,end_s
    0,3600,7200
    0,50000,52000
    2,0,86400

``start_s`` and ``end_s`` are seconds within one cycle of length ``period`` (given to the
loader, e.g. 86,400 for daily traces): ``0 <= start_s <= end_s <= period``; the interval is
``[start_s, end_s)`` and the trace is replayed cyclically. Rows may come in any order;
overlapping or touching intervals of a client are merged. A client with no row is never
available.

**Device speeds** (``load_step_times_csv``), exactly one row per client and exactly one of
two value columns::

    client,step_time_s          client,ai_score
    0,0.12                      0,5063
    1,0.48                      1,212

``step_time_s`` is seconds per local training step (>= 0); ``ai_score`` is an AI-Benchmark
score (> 0), turned into seconds per step by the ``score_to_step_time`` you pass (e.g.
``functools.partial(sources.step_time_from_score, ...)``).

Every value is checked on load; errors are ``ValueError`` naming the file, the line (the
header is line 1) and the column: a missing column, a non-numeric or non-finite value, a
client id that is not an integer in range, a negative time, an end before its start or past
the period, a duplicate or missing client. Extra columns are ignored.

>>> import pathlib, tempfile
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "ready.csv").write_text("client,start_s,end_s\\n0,0,3600\\n1,7200,9000\\n")
>>> _ = (folder / "speed.csv").write_text("client,step_time_s\\n0,0.2\\n1,0.05\\n")
>>> av = load_intervals_csv(folder / "ready.csv", period=86_400.0, num_clients=2)
>>> load_step_times_csv(folder / "speed.csv", num_clients=2).tolist(), av.num_traces
([0.2, 0.05], 2)
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedjax_het.system.availability import Availability


def _read(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    """The header and the ``(line number, row)`` pairs of a CSV file."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = [name.strip() for name in reader.fieldnames or []]
        if not header:
            raise ValueError(f"{path}: empty file, expected a header row")
        reader.fieldnames = header
        rows = [(reader.line_num, row) for row in reader]
    return header, rows


def _require(path: Path, header: list[str], required: tuple[str, ...]) -> None:
    missing = [name for name in required if name not in header]
    if missing:
        raise ValueError(
            f"{path}: missing column {missing[0]!r} (the header has {', '.join(header)}; "
            f"required: {', '.join(required)})"
        )


def _number(path: Path, line: int, row: dict, column: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{path}: line {line}, column {column!r}: {text!r} is not a finite number")
    return value


def _client(path: Path, line: int, row: dict, num_clients: int | None) -> int:
    value = _number(path, line, row, "client")
    if value != int(value) or value < 0:
        raise ValueError(
            f"{path}: line {line}, column 'client': {value:g} is not a client id (an integer >= 0)"
        )
    if num_clients is not None and value >= num_clients:
        raise ValueError(
            f"{path}: line {line}, column 'client': unknown client id {int(value)} "
            f"(num_clients={num_clients}, ids are 0..{num_clients - 1})"
        )
    return int(value)


def load_intervals_csv(
    path: str | Path,
    *,
    period: float,
    num_clients: int | None = None,
    min_interval: float = 0.0,
) -> Availability:
    """Reads ``client,start_s,end_s`` ready intervals into an ``Availability``.

    Args:
      path: the CSV (schema in the module docstring).
      period: cycle length in seconds; every interval must lie in ``[0, period]``.
      num_clients: N; client ids must be below it. Default: the largest id + 1.
      min_interval: drop intervals shorter than this many seconds (after merging).

    Returns:
      ``N`` traces, trace ``i`` for client ``i`` (empty for a client with no row).
    """
    if not period > 0:
        raise ValueError(f"period must be > 0 seconds, got {period}")
    path = Path(path)
    header, rows = _read(path)
    _require(path, header, ("client", "start_s", "end_s"))
    clients, pairs = [], []
    for line, row in rows:
        client = _client(path, line, row, num_clients)
        start, end = (_number(path, line, row, c) for c in ("start_s", "end_s"))
        for column, value in (("start_s", start), ("end_s", end)):
            if value < 0:
                raise ValueError(f"{path}: line {line}, column {column!r}: {value:g} is negative")
        if end < start:
            raise ValueError(
                f"{path}: line {line}, column 'end_s': end {end:g} is before start {start:g}"
            )
        if end > period:
            raise ValueError(
                f"{path}: line {line}, column 'end_s': {end:g} is past the period {period:g}"
            )
        clients.append(client)
        pairs.append((start, end))
    n = num_clients if num_clients is not None else max(clients, default=-1) + 1
    clients = np.asarray(clients, np.int64)
    pairs = np.asarray(pairs, np.float64).reshape(-1, 2)
    traces = [pairs[clients == k] for k in range(n)]
    return Availability.from_intervals(traces, period, min_interval=min_interval)


def load_step_times_csv(
    path: str | Path,
    *,
    num_clients: int | None = None,
    score_to_step_time: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Reads ``client,step_time_s`` (or ``client,ai_score``) into ``[N]`` seconds per step.

    Args:
      path: the CSV (schema in the module docstring).
      num_clients: N; every client ``0 .. N-1`` must have exactly one row. Default: the
        largest id + 1.
      score_to_step_time: required when the file gives ``ai_score``.

    Returns:
      float64 ``[N]`` seconds per local step, by client id.
    """
    path = Path(path)
    header, rows = _read(path)
    _require(path, header, ("client",))
    columns = [c for c in ("step_time_s", "ai_score") if c in header]
    if len(columns) != 1:
        raise ValueError(
            f"{path}: needs exactly one of the columns 'step_time_s', 'ai_score' "
            f"(the header has {', '.join(header)})"
        )
    column = columns[0]
    if column == "ai_score" and score_to_step_time is None:
        raise ValueError(f"{path}: gives 'ai_score', so score_to_step_time must be passed")
    values: dict[int, float] = {}
    for line, row in rows:
        client = _client(path, line, row, num_clients)
        value = _number(path, line, row, column)
        if column == "step_time_s" and value < 0:
            raise ValueError(f"{path}: line {line}, column {column!r}: {value:g} is negative")
        if column == "ai_score" and value <= 0:
            raise ValueError(f"{path}: line {line}, column {column!r}: {value:g} is not > 0")
        if client in values:
            raise ValueError(f"{path}: line {line}, column 'client': client {client} repeats")
        values[client] = value
    n = num_clients if num_clients is not None else max(values, default=-1) + 1
    absent = sorted(set(range(n)) - set(values))
    if n == 0:
        raise ValueError(f"{path}: no client rows")
    if absent:
        raise ValueError(
            f"{path}: column 'client': no row for client(s) {absent[:10]} "
            f"(every client 0..{n - 1} needs one)"
        )
    out = np.asarray([values[k] for k in range(n)], np.float64)
    if column == "ai_score":
        out = np.asarray(score_to_step_time(out), np.float64)
    return out
