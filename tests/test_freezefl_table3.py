"""Smoke test of experiments/freezefl_table3.py at ``--quick`` size.

Runs the script's quick mode (the FEMNIST CNN on a few Fashion-MNIST rows and the char LSTM
on a few speakers, uniform six-fold capabilities, all nine methods, one seed, two rounds) into
a temporary folder and checks what it writes: a run per data set and method with the fields
the tables read, the Markdown table with a row per method beside the paper's numbers and the
orderings, the summary CSV's columns and the participation figure. Numbers are not checked.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "experiments" / "freezefl_table3.py"
_SPEC = importlib.util.spec_from_file_location("freezefl_table3", _PATH)
table3 = importlib.util.module_from_spec(_SPEC)
sys.modules["freezefl_table3"] = table3
_SPEC.loader.exec_module(table3)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("freezefl_table3")
    table3.main(table3.parse(["--quick", "--out", str(out)]))
    return out


@pytest.mark.slow
def test_quick_run_writes_a_run_per_method(quick_run):
    runs = json.loads((quick_run / "results.json").read_text())["runs"]
    assert [(r["setup"], r["method"]) for r in runs] == [
        (setup, method) for setup in table3.SCALES["quick"] for method in table3.METHODS
    ]
    for r in runs:
        assert r["capability"] == "uniform6x"
        n = table3.SCALES["quick"][r["setup"]].num_clients
        assert len(r["participation"]) == len(r["exchange_s"]) == n
        assert [point["round"] for point in r["curve"]] == [0, 1, 2]
        assert 0 <= r["best_accuracy"] <= 1 and r["mean_round_s"] > 0


@pytest.mark.slow
def test_quick_run_writes_the_table_next_to_the_paper(quick_run):
    text = (quick_run / "table.md").read_text()
    assert "### femnist, capabilities uniform6x" in text
    for method in table3.METHODS:
        label = table3.METHODS[method]
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        assert row.count("|") == 12  # 11 columns
        if method in table3.PAPER["femnist"]:
            assert f"| {table3.PAPER['femnist'][method][0]:g} |" in row
    assert "| Freezing's round shorter than FedAvg's |" in text


@pytest.mark.slow
def test_quick_run_writes_the_summary_and_the_figure(quick_run):
    head, *lines = (quick_run / "summary.csv").read_text().splitlines()
    assert head.startswith("setup,capability,method,seeds,target,reached,best_accuracy_mean")
    assert len(lines) == len(table3.SCALES["quick"]) * len(table3.METHODS)
    assert (quick_run / "participation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
