"""The pure parts of experiments/flhetbench_metrics.py and system_grid.py's Pearson r, against
closed forms: the STD/KS/JS baselines and the correlation table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
import flhetbench_metrics as metrics
import system_grid


def test_baselines_of_the_database_itself_are_zero_distance():
    database = np.geomspace(1.0, 100.0, 200)
    got = metrics.baselines(database, database)
    assert got["ks"] == 0.0 and got["js"] == pytest.approx(0.0, abs=1e-12)
    assert got["std"] == pytest.approx(database.std() / database.mean())


def test_disjoint_values_are_at_distance_one():
    """All clients far above every database value: KS statistic 1, JS distance 1 bit."""
    database = np.linspace(1.0, 2.0, 50)
    got = metrics.baselines(np.full(10, 100.0), database)
    assert got["ks"] == 1.0 and got["js"] == pytest.approx(1.0)
    assert got["std"] == pytest.approx(0.0, abs=1e-12)


def test_js_of_two_known_distributions():
    """JS([1, 0], [1/2, 1/2]) = 1/2 KL(p||m) + 1/2 KL(q||m), m = [3/4, 1/4], in bits."""
    p, q, m = np.array([1.0, 0.0]), np.array([0.5, 0.5]), np.array([0.75, 0.25])
    kl_p = np.log2(1 / 0.75)
    kl_q = 0.5 * np.log2(0.5 / 0.75) + 0.5 * np.log2(0.5 / 0.25)
    assert metrics._js(p, q) == pytest.approx((kl_p + kl_q) / 2)
    assert metrics._kl(p, m) == pytest.approx(kl_p)


def test_correlations_per_study_skip_unknown_outcomes():
    acc = [0.5, 0.6, 0.7, 0.8]
    rows = [
        {"study": "inter", "mc_r": 2 * a, "std": -a, "ks": a * a, "js": 1.0,
         "deadline_accuracy": a, "mc_t": a, "readiness_hours_to_target": h}
        for a, h in zip(acc, [1.0, None, 3.0, 2.0])
    ]  # fmt: skip
    table = {(c["x"], c["y"]): c for c in metrics.correlations(rows)}
    assert table[("mc_r", "deadline_accuracy")]["r"] == pytest.approx(1.0)
    assert table[("std", "deadline_accuracy")]["r"] == pytest.approx(-1.0)
    assert np.isnan(table[("js", "deadline_accuracy")]["r"])  # a constant has no r
    timed = table[("mc_t", "readiness_hours_to_target")]
    assert timed["n"] == 3
    assert timed["r"] == pytest.approx(np.corrcoef([0.5, 0.7, 0.8], [1.0, 3.0, 2.0])[0, 1])
    assert {c["study"] for c in table.values()} == {"inter"}


def test_system_grid_pearson_drops_pairs_with_a_missing_side():
    r, n = system_grid.pearson([1.0, 2.0, None, 3.0, 4.0], [2.0, 4.0, 5.0, None, 8.0])
    assert n == 3 and r == pytest.approx(1.0)
    assert np.isnan(system_grid.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])[0])
