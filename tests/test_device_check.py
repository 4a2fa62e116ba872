"""experiments/device_check.sh --quick: the device check's CPU dry run.

The script that a lent GPU machine runs (install without network, environment,
one throughput stage per target cell, precision gates, cold and warm start-up,
sweep against sequential runs, invariance tests, summary) runs here at tiny
sizes with this interpreter (``PYTHON``; the install is skipped since this
checkout's package is importable). It must exit 0 and leave at most 8 plain
files with plain names (what the device tool brings back), a JSONL of gated and
timed rows with both matmul precisions, each engine row's chunk plan from
``run``'s own planning, and a targets line, and a summary.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_device_check_runs_every_stage_and_writes_its_files(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    # conftest's fake CPU devices would make the default experiment shard over four devices
    env["XLA_FLAGS"] = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")
    ).strip()
    done = subprocess.run(
        ["bash", str(REPO / "experiments" / "device_check.sh"), str(out), "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    files = list(out.iterdir())
    assert 1 <= len(files) <= 8 and all(f.is_file() for f in files)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in files)
    names = {f.name for f in files}
    assert {
        "device_check.log", "environment.txt", "throughput.jsonl", "summary.md",
        "precision.json", "startup.jsonl", "sweep.jsonl",
    } <= names  # fmt: skip

    lines = [json.loads(line) for line in (out / "throughput.jsonl").read_text().splitlines()]
    rows, last = lines[:-1], lines[-1]
    gated = [row for row in rows if "passed" in row.get("gate", {})]
    assert gated and all(row["gate"]["passed"] for row in gated)
    assert {row["workload"] for row in rows} == {"W1", "W2"}
    assert all("median_s" in row for row in rows)  # every implementation was timed
    assert all(
        (row["gate_matmul_precision"], row["matmul_precision"]) == ("highest", "highest")
        for row in rows
    )
    assert {"engine", "loop", "bare_vmap"} <= {row["implementation"] for row in rows}
    assert {"flash-deadline", "none"} <= {row["system"] for row in rows}
    assert "scaffold" in {row["algorithm"] for row in rows}
    engine = [row for row in rows if row["implementation"] == "engine"]
    assert all(row["chunk_plan"].startswith(f"chunk {row['chunk']} of ") for row in engine)
    cells = [(row["workload"], row["cohort"]) for row in rows]
    assert sorted(set(cells), key=cells.index) == [("W1", 16), ("W1", 64), ("W2", 4)]  # target order
    assert not any(row["implementation"] == "loop" for row in rows if row["cohort"] == 64)

    assert last["suite"] == "gpu" and last["evaluated_rows"] == len(rows)
    statuses = {t["status"] for t in last["targets"]}
    assert statuses <= {"quick (not the target size)", "not measured", "no value"}, statuses
    assert "quick (not the target size)" in statuses
    # "no value" only where the baseline was not timed: the loop, left out at W1/64 above
    looped = {(row["workload"], row["cohort"]) for row in rows if row["implementation"] == "loop"}
    assert all(
        "per-client loop" in t["claim"] and (t["workload"], t["cohort"]) not in looped
        for t in last["targets"] if t["status"] == "no value"
    )  # fmt: skip

    summary = (out / "summary.md").read_text()
    assert "Targets on cpu:cpu" in summary and "| throughput-W2-100 | ok |" in summary
    assert "Invariance tests: 1 passed" in summary
    assert "| bfloat16 |" in summary and "Start-up warm:" in summary
    assert "Sweep vs sequential (16 cells, end to end):" in summary
