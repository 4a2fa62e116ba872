"""Your own system data from the config: ``system.devices / network / availability`` as CSV paths.

Valid files must set the profiles to exactly what they say (checked value by value, and
through a CLI run whose round times follow from them); each file of a malformed corpus must
give a one-line ConfigError naming the file, the line and the column.
"""

import json
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.front import cli
from fedjax_het.front import config as config_lib
from fedjax_het.system import availability, sources

N = 6  # clients of the tiny config
TINY = [
    'data.name="synthetic"', f"data.num_clients={N}", "sampler.clients_per_round=3",
    "model.name=logistic_regression", "rounds=4", "eval_every=2",
]
DAY = 86_400.0

STEP_S = [0.1, 0.2, 0.7, 5.0, 5.0, 5.0]
DOWN = [1e6, 2e6, 5e5, 1e3, 1e3, 1e3]
UP = [1e5, 4e5, 2.5e5, 1e3, 1e3, 1e3]
DOWN_STD = [1e5, 0.0, 5e4, 0.0, 0.0, 0.0]
UP_STD = [0.0, 1e4, 0.0, 0.0, 0.0, 0.0]
# Client -> ready intervals; rows are written shuffled, [100, 200) and [200, 300) touch.
READY = {
    0: [(0, 3600), (7200, DAY)],
    1: [(0, DAY)],
    2: [(100, 200), (200, 300), (40_000, 50_000)],
    3: [], 4: [], 5: [],  # never ready: listed with one empty interval each
}


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _devices(folder: Path) -> Path:
    rows = [f"{k},{s}" for k, s in reversed(list(enumerate(STEP_S)))]
    return _write(folder, "devices.csv", "client,step_time_s\n" + "\n".join(rows) + "\n")


def _network(folder: Path, with_std: bool = True) -> Path:
    header = "client,down_bytes_per_s,up_bytes_per_s"
    columns = [DOWN, UP, DOWN_STD, UP_STD] if with_std else [DOWN, UP]
    header += ",down_std_bytes_per_s,up_std_bytes_per_s" if with_std else ""
    rows = [",".join(f"{v:g}" for v in (k, *(c[k] for c in columns))) for k in range(N)]
    return _write(folder, "network.csv", header + "\n" + "\n".join(rows) + "\n")


def _availability(folder: Path) -> Path:
    rows = [(k, s, e) for k, pairs in READY.items() for s, e in pairs or [(0, 0)]]
    text = "\n".join(f"{k},{s:g},{e:g}" for k, s, e in reversed(rows))
    return _write(folder, "availability.csv", "client,start_s,end_s\n" + text + "\n")


def _build(*overrides: str) -> config_lib.Experiment:
    return config_lib.build(config_lib.load(None, [*TINY, *overrides]))


def test_csv_files_set_every_profile_value(tmp_path):
    files = {"devices": _devices(tmp_path), "network": _network(tmp_path),
             "availability": _availability(tmp_path)}
    experiment = _build(*(f'system.{key}="{path}"' for key, path in files.items()))
    profiles = experiment.system.profiles
    for field, expected in [("step_time", STEP_S), ("down_mean", DOWN), ("up_mean", UP),
                            ("down_std", DOWN_STD), ("up_std", UP_STD)]:
        np.testing.assert_allclose(np.asarray(getattr(profiles, field)), expected, rtol=1e-6)
    assert np.asarray(profiles.trace).tolist() == list(range(N))
    # Readiness over two days (the trace repeats daily) against a plain interval lookup.
    times = np.arange(0.0, 2 * DAY, 50.0)
    ready_at = lambda t: availability.is_ready(profiles.availability, profiles.trace, t)
    got = jax.vmap(ready_at)(jnp.asarray(times, jnp.float32))
    expected = [[any(s <= t % DAY < e for s, e in READY[k]) for k in range(N)] for t in times]
    assert np.asarray(got).tolist() == expected
    ready = [sum(e - s for s, e in READY[k]) for k in range(N)]
    np.testing.assert_allclose(np.asarray(profiles.availability.ready_per_period), ready)
    for key, path in files.items():
        assert experiment.config["system"][key] == str(path)


def test_ai_scores_read_with_the_flash_rule(tmp_path):
    median = float(np.median(sources.load_devices()["ai_score"]))
    scores = [median, 2 * median, median / 4, 1000.0, 5063.0, 76206.0]
    text = "client,ai_score\n" + "".join(f"{k},{s!r}\n" for k, s in enumerate(scores))
    path = _write(tmp_path, "scores.csv", text)
    profiles = _build(f'system.devices="{path}"', "system.step_time=0.4").system.profiles
    expected = [0.4 * median / s for s in scores]  # the median device takes step_time
    np.testing.assert_allclose(np.asarray(profiles.step_time), expected, rtol=1e-6)
    assert float(profiles.step_time[1]) == pytest.approx(0.2)


def test_relative_paths_read_from_the_working_directory(tmp_path, monkeypatch):
    _devices(tmp_path)
    monkeypatch.chdir(tmp_path)
    experiment = _build('system.devices="devices.csv"', "system.network=uniform")
    np.testing.assert_allclose(np.asarray(experiment.system.profiles.step_time), STEP_S, rtol=1e-6)
    recorded = experiment.config["system"]  # what config.toml records: re-runnable from anywhere
    assert recorded["devices"] == str(tmp_path.resolve() / "devices.csv")
    assert recorded["network"] == "uniform"  # built-in names stay names


def test_availability_period_sets_the_cycle_of_a_csv_trace(tmp_path):
    path = _write(tmp_path, "two_days.csv", "".join(
        ["client,start_s,end_s\n"] + [f"{k},{DAY:g},{DAY + 60 * k:g}\n" for k in range(N)]
    ))
    profiles = _build(f'system.availability="{path}"',
                      f"system.availability_period={2 * DAY}").system.profiles
    np.testing.assert_allclose(np.asarray(profiles.availability.period), 2 * DAY)
    np.testing.assert_allclose(np.asarray(profiles.availability.ready_per_period),
                               [60.0 * k for k in range(N)])


def test_cli_run_times_rounds_by_the_files(tmp_path):
    """Clients 3-5 are never ready, so every round runs clients 0-2 and takes the slowest of
    ``down/bw_down + 2 * step_time + up/bw_up`` (wait_all, no spread in speeds)."""
    ready = "client,start_s,end_s\n0,0,86400\n1,0,86400\n2,0,86400\n3,0,0\n4,0,0\n5,0,0\n"
    files = {"devices": _devices(tmp_path), "network": _network(tmp_path, with_std=False),
             "availability": _write(tmp_path, "ready.csv", ready)}
    sets = [*TINY, "local.steps=2", *(f'system.{k}="{p}"' for k, p in files.items())]
    out = tmp_path / "run"
    argv = ["run", *(a for s in sets for a in ("--set", s)), "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    arrays = np.load(out / "arrays.npz")
    assert arrays["round_ok"].tolist() == [3] * 4 and arrays["round_unavailable"].sum() == 0
    per_client_down = arrays["round_bytes_down"] / 3
    per_client_up = arrays["round_bytes_up"] / 3
    expected = [max(d / DOWN[k] + 2 * STEP_S[k] + u / UP[k] for k in range(3))
                for d, u in zip(per_client_down, per_client_up)]
    np.testing.assert_allclose(arrays["round_duration_s"], expected, rtol=1e-5)
    recorded = tomllib.loads((out / "config.toml").read_text())["system"]
    assert {k: recorded[k] for k in files} == {k: str(p) for k, p in files.items()}
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["virtual_s"] == pytest.approx(sum(expected), rel=1e-5)


# --- the malformed corpus ---------------------------------------------------------------------

DEVICES = "client,step_time_s\n" + "".join(f"{k},0.1\n" for k in range(N))
NETWORK = "client,down_bytes_per_s,up_bytes_per_s\n" + "".join(f"{k},1e6,1e5\n" for k in range(N))
READY_ALL = "client,start_s,end_s\n" + "".join(f"{k},0,3600\n" for k in range(N))

# (option, file text, what the message must name: line, column, problem)
CORPUS = {
    "devices_not_a_number": (
        "devices", DEVICES.replace("3,0.1", "3,fast"), "line 5", "'step_time_s'", "'fast'"),
    "devices_negative_time": (
        "devices", DEVICES.replace("2,0.1", "2,-0.5"), "line 4", "'step_time_s'", "negative"),
    "devices_empty_value": (
        "devices", DEVICES.replace("0,0.1", "0,"), "line 2", "'step_time_s'", "empty"),
    "devices_no_value_column": (
        "devices", DEVICES.replace("step_time_s", "speed"), "line 1", "'step_time_s', 'ai_score'",
        "exactly one of"),
    "devices_client_repeats": (
        "devices", DEVICES.replace("4,0.1", "3,0.1"), "line 6", "'client'", "client 3 repeats"),
    "devices_fewer_rows_than_clients": (
        "devices", DEVICES.replace("5,0.1\n", ""), "line 6", "'client'", "no row for client(s) [5]"),
    "devices_unknown_client": (
        "devices", DEVICES + "9,0.1\n", "line 8", "'client'", "unknown client id 9"),
    "devices_zero_ai_score": (
        "devices", DEVICES.replace("step_time_s", "ai_score").replace("1,0.1", "1,0"), "line 3",
        "'ai_score'", "not > 0"),
    "network_missing_column": (
        "network", NETWORK.replace(",up_bytes_per_s", ""), "line 1", "'up_bytes_per_s'",
        "missing column"),
    "network_zero_bandwidth": (
        "network", NETWORK.replace("2,1e6,1e5", "2,1e6,0"), "line 4", "'up_bytes_per_s'",
        "not > 0"),
    "network_negative_std": (
        "network", NETWORK.replace("per_s\n", "per_s,down_std_bytes_per_s\n", 1).replace(
            "\n0,1e6,1e5", "\n0,1e6,1e5,-3").replace("1e5\n", "1e5,0\n"), "line 2",
        "'down_std_bytes_per_s'", "negative"),
    "network_too_few_fields": (
        "network", NETWORK.replace("4,1e6,1e5", "4,1e6"), "line 6", "'up_bytes_per_s'",
        "the row has 2 fields"),
    "network_too_many_fields": (
        "network", NETWORK.replace("1,1e6,1e5", "1,1e6,1e5,7"), "line 3", "column 4",
        "extra field '7'"),
    "network_infinite": (
        "network", NETWORK.replace("5,1e6", "5,inf"), "line 7", "'down_bytes_per_s'",
        "not a finite number"),
    "availability_negative_duration": (
        "availability", READY_ALL.replace("2,0,3600", "2,500,100"), "line 4", "'end_s'",
        "negative duration"),
    "availability_overlap": (
        "availability", READY_ALL + "1,3000,5000\n", "line 8", "'start_s'",
        "overlaps [0, 3600) on line 3"),
    "availability_past_the_period": (
        "availability", READY_ALL.replace("3,0,3600", "3,0,90000"), "line 5", "'end_s'",
        "past the period 86400"),
    "availability_negative_start": (
        "availability", READY_ALL.replace("0,0,3600", "0,-60,3600"), "line 2", "'start_s'",
        "negative"),
    "availability_fewer_clients": (
        "availability", READY_ALL.replace("4,0,3600\n", ""), "line 6", "'client'",
        "no row for client(s) [4]"),
    "availability_fractional_client": (
        "availability", READY_ALL.replace("1,0,3600", "1.5,0,3600"), "line 3", "'client'",
        "not a client id"),
    "availability_duplicate_column": (
        "availability", READY_ALL.replace("end_s\n", "end_s,client\n", 1).replace(
            "3600\n", "3600,0\n"), "line 1", "column 4", "duplicate column 'client'"),
    "availability_broken_quote": (
        "availability", READY_ALL.replace("3,0,3600", '3,"0"x,3600'), "line 5", "malformed CSV",
        "malformed CSV"),
    "availability_not_utf8": (
        "availability", None, "line 3", "column 3", "not UTF-8"),
    "availability_empty_file": ("availability", "", "line 1", "header", "empty file"),
}


def _corpus_file(folder: Path, name: str) -> Path:
    text = CORPUS[name][1]
    path = folder / f"{name}.csv"
    if text is None:  # a Latin-1 byte in line 3, column 3
        path.write_bytes(READY_ALL.replace("1,0,3600", "1,\xe90,3600").encode("latin-1"))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_malformed_file_gives_one_line_config_error(tmp_path, name):
    key, _, line, column, problem = CORPUS[name]
    path = _corpus_file(tmp_path, name)
    with pytest.raises(config_lib.ConfigError) as error:
        _build(f'system.{key}="{path}"')
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"[system] {path}: ")
    for part in (line, column, problem):
        assert part in message, (part, message)


def test_malformed_file_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    path = _corpus_file(tmp_path, "availability_overlap")
    argv = [a for s in [*TINY, f'system.availability="{path}"'] for a in ("--set", s)]
    assert cli.main(["run", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}: line 8, column 'start_s'" in err


@pytest.mark.parametrize(
    "value, message",
    [
        ('"/nowhere/traces.csv"', "/nowhere/traces.csv: cannot read the file"),
        ('"traces.txt"', "must be one of always, bernoulli, strict, loose or a path ending in .csv"),
    ],
)
def test_missing_file_and_unknown_name(value, message):
    with pytest.raises(config_lib.ConfigError, match="system.availability|nowhere") as error:
        _build(f"system.availability={value}")
    assert message in str(error.value)
