"""``data describe`` and ``hetero describe`` write where ``run`` would: a new directory per call,
an ``--out`` holding a report kept unless ``--overwrite``."""

from pathlib import Path

from fedjax_het.front import cli

SMALL = ["--set", 'data.name="synthetic"', "--set", "data.num_clients=6",
         "--set", "sampler.clients_per_round=2", "--set", "rounds=4"]  # fmt: skip
HETERO = [*SMALL, "--set", "system.devices=lognormal", "--mc-rounds", "20", "--mc-trips", "20"]


def test_each_call_without_out_writes_a_new_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli.time, "strftime", lambda fmt: "20261126-120000")  # the same second
    for _ in range(2):
        assert cli.main(["data", "describe", *SMALL]) == 0
    made = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert made == ["data-synthetic-20261126-120000", "data-synthetic-20261126-120000-2"]
    assert all((tmp_path / "runs" / name / "data_summary.json").is_file() for name in made)


def test_hetero_describe_keeps_a_report_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "hetero"
    assert cli.main(["hetero", "describe", *HETERO, "--out", str(out)]) == 0
    first = (out / "system_summary.json").read_text()
    assert cli.main(["hetero", "describe", *HETERO, "--out", str(out)]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (out / "system_summary.json").read_text() == first
    assert cli.main(["hetero", "describe", *HETERO, "--out", str(out), "--overwrite"]) == 0


def test_a_config_without_system_leaves_no_directory(tmp_path, capsys):
    out = tmp_path / "nothing"
    assert cli.main(["hetero", "describe", *SMALL, "--out", str(out)]) == 2
    assert "needs a [system] or [policy] table" in capsys.readouterr().err
    assert not Path(out).exists()
