"""A diverging run stops in the round it diverged, keeps its results, and says so in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.front import cli, config
from fedjax_het.sampling import uniform
from fedjax_het.training import simulate
from fedjax_het.training.divergence import Diverged, first_divergence
from fedjax_het.training.options import run_options

TINY = [
    'data.name="synthetic"', "data.num_clients=6", "sampler.clients_per_round=3",
    "model.name=logistic_regression", "rounds=6", "eval_every=2", "engine.devices=1",
]


def strict(path) -> list[dict]:
    """Every line of a JSONL file, refusing the bare NaN / Infinity tokens of lax JSON."""

    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_first_divergence_names_the_round_and_the_clients():
    block = {"train_loss": np.array([0.5, 0.4, np.nan]), "nonfinite_updates": np.array([0, 2, 3])}
    ev = {"loss": 1.0}
    found = first_divergence(6, block, ev, drop_nonfinite=False)
    assert (found.round, found.clients) == (5, 2)
    assert found.describe() == "diverged in round 5: 2 client(s) sent non-finite updates"
    dropped = first_divergence(6, block, ev, drop_nonfinite=True)
    assert dropped.round == 6 and dropped.reason == "the training loss is not finite"
    finite = {"train_loss": np.array([0.5]), "nonfinite_updates": np.array([0])}
    assert first_divergence(1, finite, ev, drop_nonfinite=False) is None
    assert first_divergence(1, finite, {"loss": np.inf}, drop_nonfinite=False).reason == (
        "the global model's test loss is not finite"
    )


def test_a_huge_learning_rate_stops_with_one_line_and_keeps_the_results(tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["run", *[a for s in TINY for a in ("--set", s)],
                     "--set", "model.name=mlp", "--set", "model.hidden=[16]",
                     "--set", "algorithm.client_lr=1e30", "--out", str(out), "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "diverged in round" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text(), parse_constant=float)
    assert summary["status"] == "diverged"
    assert f"diverged in round {summary['diverged']['round']}" in err
    lines = strict(out / "metrics.jsonl")
    assert lines[-1]["round"] == summary["rounds"] < 6  # stopped after the block it diverged in
    assert (out / "arrays.npz").exists() and (out / "curves.png").exists()


def poisoned(nan_client: int) -> FederatedData:
    """Six clients; every training feature of ``nan_client`` is NaN (its test split is not)."""
    gen = np.random.default_rng(0)
    xs = [gen.normal(size=(8, 4)).astype(np.float32) for _ in range(6)]
    xs[nan_client][:] = np.nan
    ys = [gen.integers(0, 3, 8).astype(np.int32) for _ in range(6)]
    return FederatedData.from_client_arrays(
        xs, ys, test_xs=[gen.normal(size=(2, 4)).astype(np.float32) for _ in xs],
        test_ys=[y[:2] for y in ys], num_classes=3,
    )


def run_poisoned(nonfinite: str) -> simulate.History:
    """FedAvg over all six clients a round, client 2 poisoned."""
    return simulate.run(
        poisoned(nan_client=2),
        *run_options(
            model=models.logistic_regression((4,), 3),
            algorithm=fedavg(),
            sampler=uniform(num_clients=6, cohort_size=6),
            rounds=6,
            work=LocalWork(batch_size=4),
            hyper={"client_lr": 0.1},
            eval_every=2,
            progress=False,
            devices=1,
            nonfinite=nonfinite,
        ),
    )


def test_a_client_with_nan_data_stops_the_run_naming_it():
    with pytest.raises(Diverged, match="diverged in round 1: 1 client\\(s\\) sent non-finite"):
        run_poisoned("stop")


def test_dropping_nonfinite_updates_keeps_the_model_finite_and_counts_them():
    history = run_poisoned("drop")
    assert history.summary["status"] == "completed"
    np.testing.assert_array_equal(history.round_metrics["nonfinite_updates"], [1] * 6)
    np.testing.assert_array_equal(history.round_metrics["participants"], [5] * 6)
    assert np.isfinite(history.round_metrics["train_loss"]).all()
    for leaf in np.asarray(history.params["Dense_0"]["kernel"]), history.params["Dense_0"]["bias"]:
        assert np.isfinite(leaf).all()


def test_nonfinite_option_is_checked():
    with pytest.raises(config.ConfigError, match="engine.nonfinite must be 'stop' or 'drop'"):
        config.build(config.load(None, [*TINY, 'engine.nonfinite="ignore"']))
