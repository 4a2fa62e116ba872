"""Asynchronous runs end to end: ``[server] mode = "async"`` from the command line, its
run directory and summary, and one-line errors for bad options (resuming one bit for bit:
``test_checkpoint``'s ``fedbuff_async`` case)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_het.front import cli

CONFIG = """
rounds = 6
eval_every = 3
[data]
name = "synthetic"
num_clients = 20
[model]
name = "logistic_regression"
[algorithm]
name = "fedbuff"
[sampler]
clients_per_round = 4
[local]
batch_size = 10
epochs = 1.0
[system]
devices = "lognormal"
network = "uniform"
bandwidth = 1e5
availability = "bernoulli"
availability_p = 0.8
dropout = 0.2
[server]
mode = "async"
concurrency = 8
buffer_size = 3
max_staleness = 2
"""


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "async.toml"
    path.write_text(CONFIG)
    return path


def run(path, out, *args):
    return cli.main(["run", str(path), "--out", str(out), "--no-progress", *args])


def test_async_run_writes_its_events_and_summary(config_path, tmp_path, capsys):
    assert run(config_path, tmp_path / "out") == 0
    printed = capsys.readouterr().out
    assert "asynchronous server:" in printed and "staleness histogram" in printed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    histogram = summary["staleness_histogram"]
    assert len(histogram) == 3 and sum(histogram) == summary["applied"] == 6 * 3
    assert summary["dispatched"] >= summary["applied"] + summary["discarded"] + summary["dropped"]
    assert summary["virtual_s"] > 0 and 0 <= summary["participation_gini"] <= 1
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [0, 3, 6]
    assert lines[-1]["applied"] == 18 and lines[1]["virtual_s"] <= lines[2]["virtual_s"]
    assert (tmp_path / "out" / "async.png").stat().st_size > 10_000
    arrays = np.load(tmp_path / "out" / "arrays.npz")
    assert arrays["round_staleness_max"].max() <= 2 and arrays["round_applied"].tolist() == [3] * 6


@pytest.mark.parametrize("setting,message", [
    ("server.buffer_size=9", "[server] buffer_size (9) must not exceed concurrency (8)"),
    ("server.max_staleness=0", "[server] max_staleness must be an integer >= 1"),
    ("server.mode='later'", "[server] mode must be one of"),
    ("server.concurrency=21", "server.concurrency must be at most the 20 clients"),
    ("server.pace=1", "server.pace"),
    ("algorithm.name='timelyfl'", "takes neither a [selection] nor an algorithm that freezes"),
])
def test_bad_server_options_are_one_line_errors(config_path, tmp_path, capsys, setting, message):
    capsys.readouterr()
    assert cli.main(["config", str(config_path), "--set", setting]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err


def test_async_needs_a_system(config_path, tmp_path, capsys):
    text = config_path.read_text().split("[system]")[0] + "[server]\nmode = \"async\"\n"
    (tmp_path / "nosystem.toml").write_text(text)
    assert cli.main(["config", str(tmp_path / "nosystem.toml")]) == 2
    assert "needs a [system]" in capsys.readouterr().err
