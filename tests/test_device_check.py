"""experiments/device_check.sh --quick: the device check's CPU dry run.

The script that a lent GPU machine runs (install without network, environment, the
convolution formulations at W2, one throughput stage per target cell, precision gates,
cold and warm start-up, sweep against sequential runs, the headline run and the scale test,
invariance tests, summary) runs here at tiny sizes with this interpreter (``PYTHON``; the
install is skipped since this checkout's package is importable). It must exit 0 and leave
at most 8 plain files with plain names (what the device tool brings back): a JSONL of
bench_conv's rows and of gated and timed throughput rows with both matmul precisions, each
engine row's chunk plan from ``run``'s own planning, and a targets line; the headline's and
the scale test's rows; and a summary with a line for every target, in the order of the
stages.
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
STAGES = [
    "install",
    "environment",
    "conv-W2-100",
    "throughput-W2-1000",
    "throughput-W1-1000",
    "throughput-W1-10000",
    "throughput-W2-100",
    "precision",
    "startup",
    "sweep",
    "headline",
    "scale",
    "invariance",
]
FILES = {
    "device_check.log",
    "environment.txt",
    "throughput.jsonl",
    "summary.md",
    "precision.json",
    "startup.jsonl",
    "sweep.jsonl",
    "end_to_end.jsonl",
}


def dry_run(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    # conftest's fake CPU devices would make the default experiment shard over four devices
    env["XLA_FLAGS"] = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")
    ).strip()
    return subprocess.run(
        ["bash", str(REPO / "experiments" / "device_check.sh"), str(out), "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=2700,  # the dry run's budget, 2,400 s, and the summary's reserve
        check=False,
    )


def check_conv(conv: list[dict]) -> None:
    """bench_conv's rows: the loop, run's plan and the other formulation, gated."""
    assert [row["implementation"] for row in conv] == ["loop", "engine", "engine"]
    assert [row.get("engine_conv") for row in conv] == [None, "auto", "the other formulation"]
    assert {row["conv"] for row in conv[1:]} == {"xla", "patches"}
    assert all(row["gate"].get("passed", True) and "median_s" in row for row in conv)
    assert all("ratio_to_loop" in row and "plan_bytes" in row for row in conv[1:])
    assert all(row["cohort"] == 2 and row["compute_bound_s"] is None for row in conv)


def check_rows(rows: list[dict]) -> None:
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
    algorithms = {row["algorithm"] for row in rows}
    assert {"scaffold", "heterofl", "heterofl_masks"} <= algorithms
    engine = [row for row in rows if row["implementation"] == "engine"]
    assert all(row["chunk_plan"].startswith(f"chunk {row['chunk']} of ") for row in engine)
    assert all(row["plan_bytes"]["needed"] > 0 for row in engine)
    heterofl = [row for row in rows if row["algorithm"] == "heterofl"]
    assert heterofl and all(0 < row["width_flop_share"] < row["mean_width"] for row in heterofl)
    cells = [(row["workload"], row["cohort"]) for row in rows]
    assert sorted(set(cells), key=cells.index) == [("W2", 4), ("W1", 16), ("W1", 64), ("W2", 2)]
    assert {row["implementation"] for row in rows if row["cohort"] == 4} == {"engine"}
    looped = {(row["workload"], row["cohort"]) for row in rows if row["implementation"] == "loop"}
    assert looped == {("W1", 16)}  # the loop only in the cell of at most 1,000 clients


def check_targets(last: dict, rows: list[dict]) -> None:
    assert last["suite"] == "gpu" and last["evaluated_rows"] == len(rows)
    statuses = {t["status"] for t in last["targets"]}
    assert statuses <= {"quick (not the target size)", "not measured", "no value"}, statuses
    assert "quick (not the target size)" in statuses
    # "no value" only where the baseline was not timed: the loop, run in W1/16 alone
    looped = {(row["workload"], row["cohort"]) for row in rows if row["implementation"] == "loop"}
    assert all(
        "per-client loop" in t["claim"] and (t["workload"], t["cohort"]) not in looped
        for t in last["targets"]
        if t["status"] == "no value"
    )
    claims = {t["claim"].split(" (")[0]: t for t in last["targets"]}
    assert claims["FedAvg runs"]["note"].startswith("chunk ")
    assert claims["HeteroFL round"]["status"] == "quick (not the target size)"


def check_end_to_end(rows: list[dict]) -> None:
    headline = [row for row in rows if row.get("setting") == "fedjax_emnist"]
    assert len(headline) == 1 and headline[0]["rounds"] == 2
    scale = [row for row in rows if row.get("benchmark") == "scale"]
    assert {row["system"] for row in scale} == {"none", "flash-deadline"}
    assert all(row["implementation"] == "engine" and "median_s" in row for row in scale)


@pytest.mark.slow
def test_quick_device_check_runs_every_stage_and_writes_its_files(tmp_path):
    out = tmp_path / "out"
    done = dry_run(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    files = list(out.iterdir())
    assert all(f.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in files)
    assert {f.name for f in files} == FILES  # the 8 the device tool brings back

    lines = [json.loads(line) for line in (out / "throughput.jsonl").read_text().splitlines()]
    conv = [line for line in lines if line.get("benchmark") == "conv"]
    rows = [line for line in lines[:-1] if "benchmark" not in line]
    assert lines[: len(conv)] == conv  # the conv stage comes first
    check_conv(conv)
    check_rows(rows)
    check_targets(lines[-1], rows)
    end_to_end = (out / "end_to_end.jsonl").read_text().splitlines()
    check_end_to_end([json.loads(line) for line in end_to_end])

    summary = (out / "summary.md").read_text()
    stages = summary.split("|---|---|---|---|\n")[1].split("\n\n")[0].splitlines()
    table = [line.split(" | ")[:2] for line in stages]
    assert [name.removeprefix("| ") for name, _ in table] == STAGES
    assert all(status.startswith(("ok", "skipped (importable)")) for _, status in table), table
    assert "Convolutions at W2/2 on cpu" in summary
    assert "Target: W2/100 round as planned <= 0.5x the per-client loop:" in summary
    assert "Targets on cpu:cpu" in summary and "| FedAvg runs (population 2,000) |" in summary
    assert "| bfloat16 |" in summary and "Start-up warm:" in summary
    assert "Sweep vs sequential (16 cells, end to end):" in summary
    assert "Headline (FedJAX's EMNIST setting, 2 rounds" in summary
    assert "Scale (1,000 clients, 100 a round, flash-deadline)" in summary
    assert "Invariance tests: 1 passed" in summary
    assert summary.index("Convolutions") < summary.index("Targets on") < summary.index("Headline")
