"""The fedjax-het command: help, a tiny run end to end, config printing, and one-line errors."""

import json
import tomllib

import pytest

from fedjax_het.front import cli

TINY = [
    "--set", 'data.name="synthetic"', "--set", "data.num_clients=6",
    "--set", "sampler.clients_per_round=3", "--set", "model.name=logistic_regression",
    "--set", "rounds=4", "--set", "eval_every=2",
]


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["run", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for option in ("CONFIG", "--set", "--out", "--no-progress"):
        assert option.lower() in text.lower()
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "run" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert cli.main(["run", *TINY, "--out", str(out), "--no-progress"]) == 0
    return out


def test_run_writes_the_run_directory(tiny_run):
    out = tiny_run
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [0, 2, 4]
    for key in ("round", "wall_s", "train_loss", "test_loss", "test_accuracy", "participants",
                "client_accuracy_mean", "client_accuracy_std", "client_accuracy_p10",
                "client_accuracy_min"):
        assert key in lines[-1]
    assert lines[-1]["participants"] == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_test_accuracy"] == lines[-1]["test_accuracy"]
    config = tomllib.loads((out / "config.toml").read_text())
    assert config["rounds"] == 4 and config["data"]["num_clients"] == 6
    for name in ("curves.png", "arrays.npz", "data_summary.json", "label_heatmap.png"):
        assert (out / name).stat().st_size > 0


def test_rerunning_the_written_config_reproduces_the_metrics(tiny_run, tmp_path, capsys):
    first, second = tiny_run, tmp_path / "again"
    assert cli.main(["run", str(first / "config.toml"), "--out", str(second), "--no-progress"]) == 0
    assert "final test accuracy" in capsys.readouterr().out
    strip = lambda d: {k: v for k, v in d.items() if k != "wall_s"}
    read = lambda p: [strip(json.loads(x)) for x in (p / "metrics.jsonl").read_text().splitlines()]
    assert read(first) == read(second)


def test_config_prints_the_resolved_toml(capsys):
    assert cli.main(["config", *TINY]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["sampler"] == {"name": "uniform", "clients_per_round": 3}
    assert printed["algorithm"]["client_lr"] == 0.05


def test_config_error_is_one_line_and_exit_code_2(capsys):
    assert cli.main(["run", *TINY, "--set", "sampler.clients_per_round=60"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "sampler.clients_per_round must be between 1 and data.num_clients=6" in err
    assert "Traceback" not in err


def test_data_describe(tmp_path, capsys):
    assert cli.main(["data", "describe", "--set", "data.num_clients=20", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "data_summary.json").exists()
    assert (tmp_path / "label_heatmap.png").exists()
    assert "20" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["scaffold", "feddyn", "qffl", "ditto", "fedper", "fedrep", "ifca"]
)
def test_every_algorithm_with_memory_runs_from_the_command_on_the_default_data(name, tmp_path):
    """`fedjax-het run --set algorithm.name=X` on the default data and model, two rounds."""
    out = tmp_path / name
    args = ["run", "--set", f"algorithm.name={name!r}", "--set", "rounds=2",
            "--set", "eval_every=2", "--out", str(out), "--no-progress"]
    assert cli.main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2
    personal = name in ("ditto", "fedper", "fedrep", "ifca")
    assert ("personal_accuracy_mean" in summary) == personal
    assert summary["client_state_placement"] in ("device", "none")
