"""experiments/flhetbench_table2.py's report: the table, the orderings against the paper's
(Spearman's rho) and InterMC-R's correlation with accuracy, on records built here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import flhetbench_table2 as t2


def record(accuracy, levels) -> dict:
    """One run per (level, method, seed 0) with ``accuracy(level, method)`` and the measured
    InterMC-R ``levels[level]``."""
    runs = [
        {"method": m, "level": level, "seed": 0, "rounds": 100, "final_acc": accuracy(level, m)}
        for level in t2.LEVELS
        for m in t2.METHODS
    ]
    return {"runs": runs, "levels": {f"{level}/0": r for level, r in levels.items()}}


def paper_accuracy(level: str, method: str) -> float:
    return t2.PAPER[level][t2.METHODS.index(method)] / 100


def test_the_paper_own_numbers_order_as_the_paper_with_rho_one():
    levels = {level: paper_r for level, (paper_r, *_) in t2.LEVELS.items()}
    lines = t2.orderings(t2.table(record(paper_accuracy, levels))[1])
    assert sum("Spearman rho +1.00 over 7 methods" in line for line in lines) == 3
    assert sum("BiasPrompt+ best: yes; FetchSGD second: yes." in line for line in lines) == 3


def test_reversed_numbers_give_rho_minus_one_and_no_claim():
    levels = {level: paper_r for level, (paper_r, *_) in t2.LEVELS.items()}
    lines = t2.orderings(t2.table(record(lambda lv, m: 1 - paper_accuracy(lv, m), levels))[1])
    assert sum("Spearman rho -1.00" in line for line in lines) == 3
    assert not any("best: yes" in line for line in lines)


def test_metric_correlation_is_pearson_r_over_the_cells():
    levels = {"severe": 0.5, "moderate": 0.7, "mild": 0.9}
    noise = {"severe": 0.05, "moderate": -0.02, "mild": 0.01}
    accuracy = lambda level, method: 2 * levels[level] + noise[level]
    line = t2.metric_correlation(record(accuracy, levels))[0]
    x = np.array(list(levels.values()))
    expected = np.corrcoef(x, 2 * x + np.array(list(noise.values())))[0, 1]
    assert f"fedavg {expected:+.2f}" in line and len(line.split(", ")) == len(t2.METHODS)


def test_report_writes_the_table_and_the_figure(tmp_path):
    levels = {level: paper_r for level, (paper_r, *_) in t2.LEVELS.items()}
    (tmp_path / "results.json").write_text(json.dumps(record(paper_accuracy, levels)))
    t2.report(tmp_path)
    text = (tmp_path / "table.md").read_text()
    assert text.count("| severe |") == 1 and "Pearson r of InterMC-R" in text
    assert (tmp_path / "table2.png").stat().st_size > 0


def test_a_level_without_runs_is_left_out():
    missing = "moderate"
    levels = {level: r for level, (r, *_) in t2.LEVELS.items() if level != missing}
    rec = record(paper_accuracy, levels)
    rec["runs"] = [r for r in rec["runs"] if r["level"] != missing]
    lines, _ = t2.table(rec)
    assert not any(f"| {missing} |" in line for line in lines)
    assert len(t2.orderings(t2.table(rec)[1])) == 2 * (len(t2.LEVELS) - 1)
