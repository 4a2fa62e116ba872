"""[logging]: a run's curves in TensorBoard and Weights & Biases, read back and compared with the
run's own ``metrics.jsonl`` and ``arrays.npz``; a sweep's cells as runs of one group.

The event files are read with TensorBoard's own reader (``EventAccumulator``, the dev extra),
the offline W&B run with a reader of its record log written here (the LevelDB log format W&B
uses: 32 KiB blocks of CRC, length and type headers around ``wandb_internal_pb2.Record``s).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from fedjax_het.front import cli
from fedjax_het.front import config as config_lib

SYSTEM = """
rounds = 4
eval_every = 2
[data]
name = "synthetic"
num_clients = 8
[model]
name = "logistic_regression"
[sampler]
clients_per_round = 3
[system]
devices = "lognormal"
network = "uniform"
availability = "bernoulli"
availability_p = 0.7
[logging]
name = "tiny"
tensorboard = true
"""
ASYNC = """
[algorithm]
name = "fedbuff"
[server]
mode = "async"
concurrency = 4
buffer_size = 2
max_staleness = 2
"""


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the TensorBoard run in ``logdir``, by TensorBoard's reader."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def _flat(line: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics line, nested ones named ``a/b`` (as a logger names them)."""
    out = {}
    for key, value in line.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


def _run(tmp_path: Path, text: str, *args: str) -> Path:
    path, out = tmp_path / "run.toml", tmp_path / "run"
    path.write_text(text)
    assert cli.main(["run", str(path), "--out", str(out), "--no-progress", *args]) == 0
    return out


def _assert_logged(scalars: dict, out: Path, axis: str) -> None:
    """Every number of every metrics.jsonl line at its round, every per-round array (arrays.npz)
    at its round under ``axis/``: the same float32 values."""
    lines = _lines(out)
    for line in lines:
        for key, value in _flat(line).items():
            if key != "round":
                assert scalars[key][line["round"]] == np.float32(value), key
    arrays = np.load(out / "arrays.npz")
    per_round = [k for k in arrays.files if k.startswith("round_")]
    assert per_round
    for name in per_round:
        logged = scalars[f"{axis}/{name.removeprefix('round_')}"]
        expected = np.asarray(arrays[name], np.float32)
        kept = np.isfinite(expected)
        steps = np.arange(1, len(expected) + 1)[kept]
        np.testing.assert_array_equal([logged[int(s)] for s in steps], expected[kept])


def test_tensorboard_holds_every_metric_of_a_system_run(tmp_path):
    out = _run(tmp_path, SYSTEM)
    scalars = _scalars(out / "tensorboard")
    _assert_logged(scalars, out, "round")
    for key in ("virtual_s", "bytes_up", "bytes_down", "outcomes/ok", "round/clock_s"):
        assert key in scalars, key  # a system run's virtual time and bytes
    summary = json.loads((out / "summary.json").read_text())
    assert scalars["summary/final_test_accuracy"][0] == np.float32(summary["final_test_accuracy"])


def test_tensorboard_holds_the_async_servers_events(tmp_path):
    text = SYSTEM.replace("rounds = 4", "rounds = 6").split("[logging]")[0] + ASYNC
    out = _run(tmp_path, text + "[logging]\ntensorboard = true\n")
    scalars = _scalars(out / "tensorboard")
    _assert_logged(scalars, out, "event")
    for key in ("event/applied", "event/discarded", "event/in_flight", "applied", "dispatched"):
        assert key in scalars, key


def _wandb_records(run_dir: Path) -> list:
    """The records of an offline W&B run's ``run-*.wandb`` log."""
    internal = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    (path,) = run_dir.glob("run-*.wandb")
    data, records, pending, pos, block = path.read_bytes(), [], b"", 7, 32768
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            records.append(internal.Record.FromString(pending))
            pending = b""
    return records


def _wandb_history(records) -> list[dict[str, float]]:
    rows = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    key = lambda item: item.key or "/".join(item.nested_key)
    return [{key(i): json.loads(i.value_json) for i in row.item} for row in rows]


def test_wandb_offline_run_holds_the_metrics_and_config(tmp_path):
    pytest.importorskip("wandb")
    out = _run(tmp_path, SYSTEM.replace("tensorboard = true", "wandb = true"))
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    records = _wandb_records(run_dir)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "tiny"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    resolved = config_lib.load(out / "config.toml")
    assert config["algorithm.client_lr"] == resolved["algorithm"]["client_lr"]
    assert config["system.availability_p"] == 0.7
    history = _wandb_history(records)
    evaluations = [row for row in history if "test_accuracy" in row]
    assert len(evaluations) == len(_lines(out))
    for row, line in zip(evaluations, _lines(out)):
        for key, value in _flat(line).items():
            assert row[key] == pytest.approx(value, rel=1e-12), key
    rounds = [row for row in history if "round/train_loss" in row]
    assert [row["round"] for row in rounds] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_sweeps_cells_are_runs_of_one_group(tmp_path):
    pytest.importorskip("wandb")
    path, out = tmp_path / "sweep.toml", tmp_path / "sweep"
    text = SYSTEM.split("[system]")[0] + "[logging]\nwandb = true\ntensorboard = true\n"
    path.write_text(text)
    args = ["sweep", str(path), "--grid", "seed=0,1", "--out", str(out), "--no-progress"]
    assert cli.main(args) == 0
    names = set()
    for cell in ("cell-000", "cell-001"):
        scalars = _scalars(out / cell / "tensorboard")
        _assert_logged(scalars, out / cell, "round")
        (run_dir,) = (out / cell / "wandb").glob("offline-run-*")
        (run,) = [r.run for r in _wandb_records(run_dir) if r.WhichOneof("record_type") == "run"]
        assert run.run_group == "sweep"
        names.add(run.display_name)
    assert names == {"cell-000 seed=0", "cell-001 seed=1"}


def test_logging_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["config", "--set", "logging.wandb_mode='cloud'"]) == 2
    err = capsys.readouterr().err
    assert "[logging] wandb_mode must be one of offline, online" in err
    assert cli.main(["config", "--set", "logging.tensorbord=true"]) == 2
    assert "logging.tensorbord" in capsys.readouterr().err


def test_a_mediator_run_refuses_logging_in_one_line(capsys):
    args = ["config", "--set", "algorithm.name=gandalf", "--set", "logging.tensorboard=true"]
    assert cli.main(args) == 2
    assert "takes no [logging] table" in capsys.readouterr().err
