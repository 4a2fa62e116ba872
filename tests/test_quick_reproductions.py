"""Every seed paper's reproduction at ``--quick`` size, each a subprocess into a temporary
folder: every row (method, level, set-up, dropout rate, cell) of its table must be there.

So a change that breaks a reproduction shows in CI, not in the next hour-long run. Numbers are
not checked: at 2-4 rounds they mean nothing. FreezeFL's quick mode is
``tests/test_freezefl_table3.py``'s.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
sys.path.insert(0, str(EXPERIMENTS))


def quick(script: str, out: Path) -> None:
    """``script --quick`` in a process of its own on one CPU device, as a user runs it (not
    the conftest's four fake devices, over which every run would shard and compile anew)."""
    env = {**os.environ}
    env["XLA_FLAGS"] = re.sub(
        r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")
    ).strip()
    done = subprocess.run(
        [sys.executable, str(EXPERIMENTS / script), "--quick", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_flhetbench_table2_quick_runs_seven_methods_at_three_levels(tmp_path):
    import flhetbench_table2 as t2

    quick("flhetbench_table2.py", tmp_path)
    record = json.loads((tmp_path / "results.json").read_text())
    cells = {(r["method"], r["level"]) for r in record["runs"]}
    assert cells == set(itertools.product(t2.METHODS, t2.LEVELS))
    assert set(record["levels"]) == {f"{level}/0" for level in t2.LEVELS}
    assert record["environment"]["provenance"]["command"]


@pytest.mark.slow
def test_hdfl_quick_runs_every_setup_and_method(tmp_path):
    import hdfl_setups

    quick("hdfl_setups.py", tmp_path)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    cells = {(r["setup"], r["method"]) for r in runs}
    assert cells == set(itertools.product(hdfl_setups.SETUPS, hdfl_setups.METHODS))


@pytest.mark.slow
def test_gandalf_quick_runs_every_row_of_table_2(tmp_path):
    import gandalf_fault_tolerance as g

    quick("gandalf_fault_tolerance.py", tmp_path)
    lines = (tmp_path / "runs-quick.jsonl").read_text().splitlines()
    runs = [json.loads(line) for line in lines]
    rows = {(r["method"], r["fault_tolerance"], r["rate"]) for r in runs}
    assert rows == set(itertools.product(g.METHODS, (True, False), g.parse([]).rates))
    assert all(r["provenance"]["commit"] for r in runs)  # each raw row says where it came from


@pytest.mark.slow
def test_system_grid_quick_runs_all_16_cells_under_both_policies(tmp_path):
    quick("system_grid.py", tmp_path)
    record = json.loads((tmp_path / "results.json").read_text())
    for policy in ("deadline", "readiness"):
        assert len(record[policy]["cells"]) == 16
        assert all(0 < cell["inter_mc_r"] <= 1 for cell in record[policy]["cells"])


@pytest.mark.slow
def test_async_vs_sync_quick_runs_every_method(tmp_path):
    import async_vs_sync

    quick("async_vs_sync.py", tmp_path)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert {r["method"] for r in runs} == set(async_vs_sync.METHODS)
