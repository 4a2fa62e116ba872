"""experiments/bench_scale.py: its populations and its --quick run, rows and plan included.

The loop generator is leaf_synthetic's flat store; the flat generator gives the same layout
(FedProx §5.1's sizes, 80 % for training); the --quick run writes one row per variant with
the generator, the data seconds and, for the stateful FedPer row, the client-state plan
whose bytes are derived here from the model (its last layer, 200 x 10 + 10 floats).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import bench_harness as harness
import bench_scale

from fedjax_het.data.federated import ClientArrays
from fedjax_het.data.synthetic import leaf_synthetic


def test_the_loop_population_is_leaf_synthetic_flattened():
    options = {k: v for k, v in bench_scale.DATA.items() if k != "name"}
    clients = leaf_synthetic(30, seed=harness.SEED, **options)
    for split, xs, ys in (
        ("train", clients.train_x, clients.train_y),
        ("test", clients.test_x, clients.test_y),
    ):
        got = bench_scale.population(30, "loop", split)
        expected = ClientArrays.from_clients(xs, ys)
        for field in ("x", "y", "offset", "count"):
            np.testing.assert_array_equal(getattr(got, field), getattr(expected, field))


def test_the_flat_population_splits_each_client_80_20():
    train = bench_scale.population(200, "flat")
    test = bench_scale.population(200, "flat", "test")
    sizes = train.count + test.count
    assert sizes.min() >= bench_scale.DATA["min_size"]
    np.testing.assert_array_equal(test.count, [max(1, round(0.2 * s)) for s in sizes])
    assert train.x.shape == (train.count.sum(), bench_scale.DATA["num_features"])


@pytest.mark.slow  # generates, compiles and times two rounds (about 40 s on a loaded CPU)
def test_quick_run_writes_rows_with_the_generator_and_the_client_state_plan(tmp_path):
    out = tmp_path / "scale.jsonl"
    argv = ["--quick", "--baselines", "none", "--systems", "none", "--reps", "1"]
    bench_scale.main([*argv, "--stateful", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["algorithm"] for row in rows] == ["fedavg", "fedper"]
    for row in rows:
        assert row["generator"] == "flat" and row["data_s"] > 0 and row["quick"]
        assert row["population"] == 1000 and row["cohort"] == 100 and "error" not in row
    state = rows[1]["client_state"]
    head_bytes = (200 * 10 + 10) * 4
    assert state["row_bytes"] == head_bytes
    assert state["device_bytes"] == 1000 * head_bytes
    assert state["max_rows"] == min(1000, (1 + 1) * 100)  # rounds = reps + 1, 100 slots
    assert state["placement"] in ("device", "host")
