"""Smoke test of experiments/hdfl_setups.py's building blocks on a tiny population.

Two rounds on 6 synthetic clients, 2 a round. Checks that each method's result row has the
expected fields, that cost adds up (examples processed = the full epochs of the aggregated
slots, recomputed from the schedule's outcomes, + the examples wasted) and, without dropout,
that the clock follows the latency mapping: a round ends by the largest latency of its clients
and, without dropout, an LS-FL round lasts the m-th smallest latency of its over-committed
clients (float32 clock: rtol 1e-5).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from fedjax_het.system.schedule import LATE, OK

_PATH = Path(__file__).resolve().parent.parent / "experiments" / "hdfl_setups.py"
_SPEC = importlib.util.spec_from_file_location("hdfl_setups", _PATH)
hdfl_setups = importlib.util.module_from_spec(_SPEC)
sys.modules["hdfl_setups"] = hdfl_setups
_SPEC.loader.exec_module(hdfl_setups)

TINY = hdfl_setups.SetupSpec(
    "tiny", "tiny", 6, 2,
    ('data.name="synthetic"', "data.num_features=5", "data.num_classes=3",
     'model.name="logistic_regression"', "local.batch_size=5"),
)
ROUNDS = 2
EXP = hdfl_setups.experiment(TINY)
FIELDS = {
    "global_accuracy", "final_global_accuracy", "final_client_mean", "final_client_std",
    "final_client_p10", "client_mean", "client_std",
    "client_p10", "examples_processed", "examples_wasted", "examples_aggregated",
    "virtual_hours", "outcomes", "participation_gini", "clients_never_participated",
    "mean_cdr_selected", "curve", "wall_s",
}
METHODS = list(hdfl_setups.METHODS)


@pytest.mark.parametrize("method", METHODS)
def test_rows_have_the_fields_cost_adds_up_and_rounds_last_at_most_the_latency(method):
    env = hdfl_setups.environment(EXP, 0)
    history = hdfl_setups.train(EXP, TINY, method, 0, env, rounds=ROUNDS, eval_every=1)
    row = hdfl_setups.figures(history, EXP, env)
    assert set(row) == FIELDS
    assert [c["round"] for c in row["curve"]] == [0, 1, 2]
    np.testing.assert_allclose(
        row["examples_processed"], row["examples_aggregated"] + row["examples_wasted"]
    )
    slots = TINY.per_round + (method == "lsfl")  # ceil(4/3 * 2) = 3 slots under LS-FL
    assert sum(row["outcomes"].values()) == ROUNDS * slots
    assert row["outcomes"]["ok"] <= ROUNDS * TINY.per_round
    assert 0 <= row["client_p10"] <= row["client_mean"] <= 1 and row["client_std"] >= 0
    # The tail figures average the evaluation lines; the last line is the final model's.
    last = hdfl_setups.figures(history, EXP, env, tail=1)
    for key in ("global_accuracy", "client_mean", "client_std", "client_p10"):
        np.testing.assert_allclose(last[key], row[f"final_{key}"], rtol=1e-5)
    # A round ends by the largest latency of its clients (a drop comes before the finish).
    s = history.schedule
    latency = np.where(np.asarray(s.valid), env["latency"][np.asarray(s.selected)], 0.0)
    duration = np.asarray(s.duration)
    assert np.all(duration <= latency.max(axis=1) * (1 + 1e-5))
    np.testing.assert_allclose(row["virtual_hours"] * 3600, duration.sum(), rtol=1e-5)


def test_without_dropout_an_lsfl_round_lasts_the_latency_of_its_mth_finisher():
    env = hdfl_setups.environment(EXP, 1)
    env["cdr"] = np.zeros_like(env["cdr"])
    history = hdfl_setups.train(EXP, TINY, "lsfl", 1, env, rounds=ROUNDS, eval_every=ROUNDS)
    s = history.schedule
    latency = env["latency"][np.asarray(s.selected)]  # [R, 3 slots]
    outcome = np.asarray(s.outcome)
    m = TINY.per_round
    np.testing.assert_allclose(np.asarray(s.duration), np.sort(latency, axis=1)[:, m - 1],
                               rtol=1e-5)
    assert np.all(np.sum(outcome == OK, axis=1) == m)
    assert np.all(np.sum(outcome == LATE, axis=1) == outcome.shape[1] - m)
