"""Bring your own system profiles: CSV schemas for availability, device speed and network.

Plain CSV files (UTF-8, comma-separated, a header row first); clients are integers
``0 .. N-1``. The ``[system]`` table reads them when ``devices``, ``network`` or
``availability`` is a path ending in ``.csv`` (``fedjax_het.system.setup``).

**Intervals** (``load_intervals_csv``), one ready interval per row::

    client,start_s,end_s
    0,3600,7200
    0,50000,52000
    2,0,86400

``start_s`` and ``end_s`` are seconds within one cycle of length ``period`` (given to the
loader, e.g. 86,400 for daily traces): ``0 <= start_s <= end_s <= period``; the interval is
``[start_s, end_s)`` and the trace is replayed cyclically (trace ``i`` belongs to client
``i``). Rows may come in any order. Intervals of one client must not overlap; touching ones
(one ends where the next starts) are joined. A row with ``start_s = end_s`` is empty: it
lists a client that is never ready, where ``every_client`` asks for a row per client.

**Device speeds** (``load_step_times_csv``), exactly one row per client and exactly one of
two value columns::

    client,step_time_s          client,ai_score
    0,0.12                      0,5063
    1,0.48                      1,212

``step_time_s`` is seconds per local training step (>= 0); ``ai_score`` is an AI-Benchmark
score (> 0), turned into seconds per step by the ``score_to_step_time`` you pass (e.g.
``functools.partial(sources.step_time_from_score, ...)``).

**Network** (``load_network_csv``), exactly one row per client, throughput in **bytes per
second** (MobiPerf and FLASH publish kbit/s: multiply by 125)::

    client,down_bytes_per_s,up_bytes_per_s,down_std_bytes_per_s,up_std_bytes_per_s
    0,1250000,250000,300000,50000
    1,500000,125000,0,0

The means must be > 0, the standard deviations (optional columns, default 0) >= 0; each
transfer draws its speed from the truncated normal of ``profiles.draw_speed``.

Every value is checked on load; errors are one-line ``ValueError`` naming the file, the line
(the header is line 1) and the column: an unreadable or non-UTF-8 file, broken quoting, a
duplicate or missing column, a row with too few or too many fields, a non-numeric or
non-finite value, a client id that is not an integer in range, a negative time or duration,
an end past the period, overlapping intervals, a duplicate client or fewer client rows than
clients. Extra columns are ignored.

>>> import pathlib, tempfile
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "ready.csv").write_text("client,start_s,end_s\\n0,0,3600\\n1,7200,9000\\n")
>>> _ = (folder / "speed.csv").write_text("client,step_time_s\\n0,0.2\\n1,0.05\\n")
>>> _ = (folder / "net.csv").write_text("client,down_bytes_per_s,up_bytes_per_s\\n0,2e6,5e5\\n")
>>> av = load_intervals_csv(folder / "ready.csv", period=86_400.0, num_clients=2)
>>> load_step_times_csv(folder / "speed.csv", num_clients=2).tolist(), av.num_traces
([0.2, 0.05], 2)
>>> load_network_csv(folder / "net.csv")["up_mean"].tolist()
[500000.0]
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from fedjax_het.system.availability import Availability

Row = tuple[int, dict[str, str]]  # (line number, {column: text}) of one data row

# Network columns (bytes/s) -> the ``ClientProfiles`` field each one fills.
NETWORK_MEANS = {"down_bytes_per_s": "down_mean", "up_bytes_per_s": "up_mean"}
NETWORK_STDS = {"down_std_bytes_per_s": "down_std", "up_std_bytes_per_s": "up_std"}


def _read(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[Row]]:
    """The header and the data rows of a CSV file whose header has the ``required`` columns;
    blank lines are skipped."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read the file ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (as Excel writes) is dropped
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - data.rfind(b"\n", 0, err.start)
        raise ValueError(f"{path}: line {line}, column {column}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        rows = [(reader.line_num, [x.strip() for x in fields]) for fields in reader if fields]
    except csv.Error as err:
        raise ValueError(f"{path}: line {reader.line_num}: malformed CSV ({err})") from None
    if not rows:
        raise ValueError(f"{path}: line 1: empty file, expected a header row")
    header_line, header = rows[0]
    for i, name in enumerate(header):
        if name and name in header[:i]:
            raise ValueError(
                f"{path}: line {header_line}, column {i + 1}: duplicate column {name!r}"
            )
    missing = [name for name in required if name not in header]
    if missing:
        raise ValueError(
            f"{path}: line {header_line}: missing column {missing[0]!r} (the header has "
            f"{', '.join(header)}; required: {', '.join(required)})"
        )
    out = []
    for line, fields in rows[1:]:
        if len(fields) < len(header):
            raise ValueError(
                f"{path}: line {line}, column {header[len(fields)]!r}: missing (the row has "
                f"{len(fields)} fields, the header {len(header)})"
            )
        if len(fields) > len(header):
            raise ValueError(
                f"{path}: line {line}, column {len(header) + 1}: extra field "
                f"{fields[len(header)]!r} (the header has {len(header)} columns)"
            )
        out.append((line, dict(zip(header, fields))))
    return header, out


def _number(path: Path, line: int, row: Mapping[str, str], column: str, rule: str = "") -> float:
    """The finite number in ``column``; ``rule`` ">= 0" or "> 0" bounds it."""
    where = f"{path}: line {line}, column {column!r}"
    text = row[column]
    if not text:
        raise ValueError(f"{where}: empty, expected a number")
    try:  # ASCII only: float() also reads other scripts' digits ("٣" is 3.0)
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{where}: {text!r} is not a finite number")
    if rule == ">= 0" and value < 0:
        raise ValueError(f"{where}: {value:g} is negative")
    if rule == "> 0" and not value > 0:
        raise ValueError(f"{where}: {value:g} is not > 0")
    return value


def _client(path: Path, line: int, row: Mapping[str, str], num_clients: int | None) -> int:
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


def _absent(path: Path, rows: list[Row], present, n: int) -> None:
    """Raises when a client of ``0 .. n-1`` has no row ("fewer rows than clients")."""
    absent = sorted(set(range(n)) - set(present))
    if absent:
        end = rows[-1][0] if rows else 1
        raise ValueError(
            f"{path}: column 'client': no row for client(s) {absent[:10]}"
            f"{' ...' if len(absent) > 10 else ''} (the file ends at line {end} with "
            f"rows for {n - len(absent)} of {n} clients; every client 0..{n - 1} needs one)"
        )


def _per_client(
    path: Path, rows: list[Row], num_clients: int | None, rules: Mapping[str, str]
) -> dict[str, np.ndarray]:
    """Exactly one row per client: ``{column: float64 [N]}`` for the columns of ``rules``."""
    values: dict[int, list[float]] = {}
    for line, row in rows:
        client = _client(path, line, row, num_clients)
        if client in values:
            raise ValueError(f"{path}: line {line}, column 'client': client {client} repeats")
        values[client] = [_number(path, line, row, column, rule) for column, rule in rules.items()]
    n = num_clients if num_clients is not None else max(values, default=-1) + 1
    if n == 0:
        raise ValueError(f"{path}: no client rows")
    _absent(path, rows, values, n)
    table = np.asarray([values[k] for k in range(n)], np.float64).reshape(n, len(rules))
    return {column: table[:, i] for i, column in enumerate(rules)}


def load_intervals_csv(
    path: str | Path,
    *,
    period: float,
    num_clients: int | None = None,
    min_interval: float = 0.0,
    every_client: bool = False,
) -> Availability:
    """Reads ``client,start_s,end_s`` ready intervals into an ``Availability``.

    Args:
      path: the CSV (schema in the module docstring).
      period: cycle length in seconds; every interval must lie in ``[0, period]``.
      num_clients: N; client ids must be below it. Default: the largest id + 1.
      min_interval: drop intervals shorter than this many seconds (after joining).
      every_client: every client ``0 .. N-1`` must have a row (a ``start_s = end_s`` row
        marks one that is never ready); otherwise a client with no row is never ready.

    Returns:
      ``N`` traces, trace ``i`` for client ``i``.
    """
    if not period > 0:
        raise ValueError(f"period must be > 0 seconds, got {period}")
    path = Path(path)
    _, rows = _read(path, ("client", "start_s", "end_s"))
    intervals = []  # (client, start, end, line)
    for line, row in rows:
        client = _client(path, line, row, num_clients)
        start, end = (_number(path, line, row, c, ">= 0") for c in ("start_s", "end_s"))
        if end < start:
            raise ValueError(
                f"{path}: line {line}, column 'end_s': end {end:g} is before start {start:g} "
                f"(a negative duration)"
            )
        if end > period:
            raise ValueError(
                f"{path}: line {line}, column 'end_s': {end:g} is past the period {period:g}"
            )
        intervals.append((client, start, end, line))
    _disjoint(path, intervals)
    n = num_clients if num_clients is not None else max((c for c, *_ in intervals), default=-1) + 1
    if every_client:
        _absent(path, rows, {c for c, *_ in intervals}, n)
    traces = [[] for _ in range(n)]
    for client, start, end, _ in intervals:
        traces[client].append((start, end))
    return Availability.from_intervals(traces, period, min_interval=min_interval)


def _disjoint(path: Path, intervals: list[tuple[int, float, float, int]]) -> None:
    """Raises on two overlapping intervals of one client, naming the later line."""
    ordered = sorted(intervals)
    for (c0, s0, e0, l0), (c1, s1, e1, l1) in itertools.pairwise(ordered):
        if c0 == c1 and s1 < e0:
            first, second = sorted(((l0, s0, e0), (l1, s1, e1)))
            raise ValueError(
                f"{path}: line {second[0]}, column 'start_s': interval [{second[1]:g}, "
                f"{second[2]:g}) of client {c0} overlaps [{first[1]:g}, {first[2]:g}) on "
                f"line {first[0]}"
            )


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
    header, rows = _read(path, ("client",))
    columns = [c for c in ("step_time_s", "ai_score") if c in header]
    if len(columns) != 1:
        raise ValueError(
            f"{path}: line 1: needs exactly one of the columns 'step_time_s', 'ai_score' "
            f"(the header has {', '.join(header)})"
        )
    column = columns[0]
    if column == "ai_score" and score_to_step_time is None:
        raise ValueError(f"{path}: gives 'ai_score', so score_to_step_time must be passed")
    rule = ">= 0" if column == "step_time_s" else "> 0"
    out = _per_client(path, rows, num_clients, {column: rule})[column]
    if column == "ai_score":
        out = np.asarray(score_to_step_time(out), np.float64)
    return out


def load_network_csv(path: str | Path, *, num_clients: int | None = None) -> dict[str, np.ndarray]:
    """Reads per-client download / upload throughput in bytes per second.

    Args:
      path: the CSV (schema in the module docstring): ``client``, ``down_bytes_per_s``,
        ``up_bytes_per_s`` and optionally ``down_std_bytes_per_s``, ``up_std_bytes_per_s``.
      num_clients: N; every client ``0 .. N-1`` must have exactly one row. Default: the
        largest id + 1.

    Returns:
      ``down_mean``, ``down_std``, ``up_mean``, ``up_std``: float64 ``[N]`` bytes/s, the
      ``ClientProfiles`` fields (as ``sources.load_network`` returns them per profile).
    """
    path = Path(path)
    header, rows = _read(path, ("client", *NETWORK_MEANS))
    rules = {c: "> 0" for c in NETWORK_MEANS} | {c: ">= 0" for c in NETWORK_STDS if c in header}
    table = _per_client(path, rows, num_clients, rules)
    n = len(table["down_bytes_per_s"])
    columns = NETWORK_MEANS | NETWORK_STDS
    return {field: table.get(column, np.zeros(n)) for column, field in columns.items()}
