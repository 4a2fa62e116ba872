"""The bad-input corpus (issue 15): an impossible input is one line on stderr and exit code 2.

Every case goes through ``fedjax_het.front.cli.main`` in this process, as a user
meets it. A case passes when the command returns its code, prints exactly one
line on stderr that names the key or the path, no traceback and nothing on
stdout, and leaves no output directory behind: the error came before a run
could start. The cases of the issue are written out as examples; the
non-finite numbers are generated from ``config.schema``, so a number option
is covered the day it is added.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Callable
from pathlib import Path

import pytest

from fedjax_het import models, registry
from fedjax_het.data import catalog, feature_skew, partitioners
from fedjax_het.front import cli, config

# A check that regressed lets the run start: one round then fails fast instead of training 200.
SHORT = ("rounds=1", "eval_every=1")
POLICY = ('policy.kind="deadline"',)  # gives a [policy] table, so [system] and [policy] apply


@dataclasses.dataclass(frozen=True)
class Case:
    """A bad input: the command line and what its one error line must contain.

    ``{tmp}`` in ``argv`` and ``names`` stands for the test's own folder;
    ``prepare`` writes the files a case needs there first.
    """

    argv: tuple[str, ...]
    names: tuple[str, ...]
    code: int = 2
    prepare: Callable[[Path], None] | None = None


def _sets(overrides) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def run(*overrides: str, path: str | None = None) -> tuple[str, ...]:
    """``fedjax-het run [path] --set ... --out {tmp}/out``."""
    head = ["run"] if path is None else ["run", path]
    return (*head, *_sets((*SHORT, *overrides)), "--out", "{tmp}/out", "--no-progress")


def case(case_id: str, argv: tuple[str, ...], *names: str, code: int = 2, prepare=None, marks=()):
    return pytest.param(Case(argv, names, code, prepare), id=case_id, marks=marks)


def write(name: str, content: bytes) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_bytes(content)


def unreadable(tmp: Path) -> None:
    (tmp / "secret.toml").write_text("rounds = 3\n")
    (tmp / "secret.toml").chmod(0)


FEDPROX = 'algorithm.name="fedprox"'

EXAMPLES = [
    # The numbers of the issue: each crashed, overflowed or trained nonsense.
    case("client_lr=inf", run("algorithm.client_lr=inf"), "algorithm.client_lr"),
    case("server_lr=inf", run("algorithm.server_lr=inf"), "algorithm.server_lr"),
    case("hidden=[0]", run("model.hidden=[0]"), "[model]", "hidden"),
    case("hidden=[-5]", run("model.hidden=[-5]"), "[model]", "hidden"),
    case("epochs=inf", run("local.epochs=inf"), "local.epochs"),
    case("fedprox prox_mu=-1", run(FEDPROX, "algorithm.prox_mu=-1.0"), "algorithm.prox_mu"),
    case("fedprox prox_mu=nan", run(FEDPROX, "algorithm.prox_mu=nan"), "algorithm.prox_mu"),
    case(
        "fedprox mu=-1",
        run(FEDPROX, "algorithm.mu=-1.0"),
        "[algorithm] fedprox: prox_mu must lie in [0, inf)",
    ),
    case("step_time=inf", run(*POLICY, "system.step_time=inf"), "system.step_time"),
    case("overhead=inf", run(*POLICY, "policy.overhead=inf"), "policy.overhead"),
    case("dropout=1 (nobody trains)", run("system.dropout=1.0"), "system.dropout"),
    case("dropout=-0.1", run("system.dropout=-0.1"), "system.dropout"),
    case(
        "hetero describe step_time=inf",
        ("hetero", "describe", *_sets(["system.step_time=inf"]), "--out", "{tmp}/out"),
        "system.step_time",
    ),
    case(
        "sweep cell client_lr=inf",
        (
            "sweep",
            *_sets(SHORT),
            "--grid",
            "algorithm.client_lr=0.1,inf",
            "--out",
            "{tmp}/out",
            "--no-progress",
        ),
        "grid cell 1",
        "algorithm.client_lr must be a finite number",
    ),
    # More impossible numbers.
    case("epochs=0", run("local.epochs=0.0"), "epochs must be > 0"),
    case("epochs=1e400 (TOML reads inf)", run("local.epochs=1e400"), "local.epochs"),
    case("epochs=10**400", run(f"local.epochs={10**400}"), "local.epochs"),
    case("steps=0", run("local.steps=0"), "steps must be >= 1"),
    case("batch_size=0", run("local.batch_size=0"), "batch_size must be >= 1"),
    case("rounds=0", run("rounds=0"), "rounds must be >= 1"),
    case("rounds=2**40", run(f"rounds={2**40}"), "rounds must be an integer of 32 bits"),
    case("seed=-1", run("seed=-1"), "seed must be >= 0"),
    case("data.seed=-1", run("data.seed=-1"), "data.seed must be >= 0"),
    case("clients_per_round=0", run("sampler.clients_per_round=0"), "sampler.clients_per_round"),
    case("more devices than JAX sees", run("engine.devices=99"), "engine.devices must be between"),
    case(
        "fedadam server_b1=1",
        run('algorithm.name="fedadam"', "algorithm.server_b1=1.0"),
        "algorithm.server_b1 must lie in [0, 1)",
    ),
    case(
        "fedyogi server_eps=0",
        run('algorithm.name="fedyogi"', "algorithm.server_eps=0.0"),
        "algorithm.server_eps must lie in (0, inf)",
    ),
    case(
        "fedavgm server_momentum=1",
        run('algorithm.name="fedavgm"', "algorithm.server_momentum=1.0"),
        "algorithm.server_momentum",
    ),
    case(
        "fedrep head_share=1.5",
        run('algorithm.name="fedrep"', "algorithm.head_share=1.5"),
        "[algorithm] fedrep: head_share must lie in [0, 1]",
    ),
    case(
        "feddyn feddyn_alpha=0",
        run('algorithm.name="feddyn"', "algorithm.feddyn_alpha=0.0"),
        "algorithm.feddyn_alpha must lie in (0, inf)",
    ),
    case(
        "qffl qffl_q=-1", run('algorithm.name="qffl"', "algorithm.qffl_q=-1.0"), "algorithm.qffl_q"
    ),
    case(
        "ditto ditto_lambda=-1",
        run('algorithm.name="ditto"', "algorithm.ditto_lambda=-1.0"),
        "algorithm.ditto_lambda",
    ),
    case(
        "ifca init_noise=nan",
        run('algorithm.name="ifca"', "algorithm.init_noise=nan"),
        "algorithm.init_noise",
    ),
    case(
        "freezefl beta=-1",
        run(*POLICY, 'algorithm.name="freezefl"', "algorithm.beta=-1.0"),
        "[algorithm] freezefl: beta must lie in [0, inf)",
    ),
    case(
        "fedper personal_layers=0",
        run('algorithm.name="fedper"', "algorithm.personal_layers=0"),
        "personal_layers",
    ),
    case("bandwidth=0", run("system.bandwidth=0.0"), "system.bandwidth"),
    case("bandwidth=nan", run("system.bandwidth=nan"), "system.bandwidth"),
    case(
        "availability_p=0 (nobody is ever ready)",
        run('system.availability="bernoulli"', "system.availability_p=0.0"),
        "system.availability_p",
    ),
    case("step_time=-1", run("system.step_time=-1.0"), "system.step_time"),
    case("deadline=inf", run(*POLICY, "policy.deadline=inf"), "policy.deadline"),
    case("deadline=0", run(*POLICY, "policy.deadline=0.0"), "deadline must be > 0"),
    case("readiness=1", run('policy.kind="readiness"', "policy.readiness=1.0"), "policy.readiness"),
    case("over_commit=-1", run("policy.over_commit=-1.0"), "over_commit must be >= 0"),
    case("partition.beta=-inf", run("partition.beta=-inf"), "partition.beta"),
    case("partition.beta=0", run("partition.beta=0.0"), "[partition]", "beta"),
    case(
        "rotation angle=[inf]",
        run('feature_skew.kind="rotation"', "feature_skew.angle=[0.0, inf]"),
        "feature_skew.angle[1]",
    ),
    # Unknown keys and names.
    case("unknown top-level key", run("colour=1"), "unknown top-level key 'colour'"),
    case(
        "misspelt key",
        run("algorithm.clientlr=0.1"),
        "'algorithm.clientlr'",
        "did you mean 'algorithm.client_lr'",
    ),
    case("unknown system key", run("system.speed=3.0"), "'system.speed'"),
    case("unknown engine key", run("engine.chunks=2"), "'engine.chunks'"),
    case("unknown algorithm", run("algorithm.name=fedsgd"), "algorithm.name 'fedsgd'"),
    case("unknown model", run("model.name=resnet9000"), "model.name 'resnet9000'"),
    case("a table as a name", run("data.name.x=1"), "data.name"),
    # Values of the wrong type.
    case(
        "bool for a number", run("algorithm.client_lr=true"), "algorithm.client_lr must be a number"
    ),
    case(
        "float for an integer", run("local.batch_size=2.5"), "local.batch_size must be an integer"
    ),
    case("string for an integer", run('rounds="ten"'), "rounds must be an integer"),
    case("number for a list", run("model.hidden=3"), "model.hidden must be a list"),
    case(
        "float in an integer list", run("model.hidden=[1.5]"), "model.hidden[0] must be an integer"
    ),
    case("number for a table", run("data=3"), "data must be a table"),
    case("number for a flag", run("policy.availability_aware=1"), "policy.availability_aware"),
    case("--set without =", ("config", "--set", "rounds"), "--set expects key=value", "'rounds'"),
    # Config files.
    case("config file missing", run(path="{tmp}/nope.toml"), "'{tmp}/nope.toml' does not exist"),
    case("config file is a folder", run(path="{tmp}"), "'{tmp}' is a folder"),
    case(
        "config file is binary",
        run(path="{tmp}/binary.toml"),
        "'{tmp}/binary.toml'",
        "not a text file",
        prepare=write("binary.toml", bytes(range(256))),
    ),
    case(
        "config file holds a NUL",
        run(path="{tmp}/nul.toml"),
        "'{tmp}/nul.toml'",
        "line 1, column 11",
        prepare=write("nul.toml", b"rounds = 3\x00\n"),
    ),
    case(
        "config file is bad TOML",
        run(path="{tmp}/bad.toml"),
        "'{tmp}/bad.toml'",
        "not valid TOML",
        "line 2, column 10",
        prepare=write("bad.toml", b"seed = 1\nrounds = = 3\n"),
    ),
    case(
        "config file under a file",
        run(path="{tmp}/file.toml/x.toml"),
        "'{tmp}/file.toml/x.toml' cannot be read",
        prepare=write("file.toml", b"rounds = 3\n"),
    ),
    case(
        "config file unreadable",
        run(path="{tmp}/secret.toml"),
        "'{tmp}/secret.toml' cannot be read",
        prepare=unreadable,
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file"),
    ),
    case(
        "config file with an infinite number",
        run(path="{tmp}/inf.toml"),
        "local.epochs",
        prepare=write("inf.toml", b"[local]\nepochs = inf\n"),
    ),
    case(
        "config file with an unknown table",
        run(path="{tmp}/colour.toml"),
        "'colour'",
        prepare=write("colour.toml", b"[colour]\nred = 1\n"),
    ),
]

SMALL_RUN = b'rounds = 1\n[data]\nname = "synthetic"\nnum_clients = 4\n[sampler]\nclients_per_round = 2\n'


def run_to(out: str, *args: str) -> tuple[str, ...]:
    """``fedjax-het run --set ... --out OUT`` with more arguments."""
    return ("run", *_sets(SHORT), "--out", out, "--no-progress", *args)


def sweep_to(out: str) -> tuple[str, ...]:
    return ("sweep", *_sets(SHORT), "--grid", "seed=0,1", "--out", out, "--no-progress")


def folder(*files: tuple[str, bytes]) -> Callable[[Path], None]:
    """Makes ``{tmp}/out`` holding ``files``."""

    def prepare(tmp: Path) -> None:
        (tmp / "out").mkdir()
        for name, content in files:
            (tmp / "out" / name).write_bytes(content)

    return prepare


# Output paths: refused before anything is built, and what was there is left as it was.
OUTPUT_PATH_CASES = [
    case("--out ''", run_to(""), "empty path"),
    case("--out is a file", run_to("{tmp}/out"), "{tmp}/out is a file", prepare=write("out", b"x")),
    case("--out under a file", run_to("{tmp}/out/run"), "cannot write to the output directory "
         "{tmp}/out/run", prepare=write("out", b"x")),
    case("--out holds a run", run_to("{tmp}/out"), "{tmp}/out already holds files", "--overwrite",
         prepare=folder(("metrics.jsonl", b"{}\n"))),
    case("--out holds your files", run_to("{tmp}/out"), "already holds files",
         prepare=folder(("notes.txt", b"mine"))),
    case("--resume a missing folder", ("run", "--resume", "{tmp}/out"), "{tmp}/out has no config.toml"),
    case("--resume a folder that is not a run", ("run", "--resume", "{tmp}/out"),
         "{tmp}/out has no config.toml", prepare=folder(("notes.txt", b"mine"))),
    case("--resume a run without a checkpoint", ("run", "--resume", "{tmp}/out", "--no-progress"),
         "{tmp}/out has no checkpoint.npz", prepare=folder(("config.toml", SMALL_RUN))),
    case("--resume a damaged checkpoint", ("run", "--resume", "{tmp}/out", "--no-progress"),
         "checkpoint.npz is not a readable checkpoint",
         prepare=folder(("config.toml", SMALL_RUN), ("checkpoint.npz", b"PK\x03\x04 cut short"))),
    case("sweep --out holds files", sweep_to("{tmp}/out"), "{tmp}/out already holds files",
         prepare=folder(("notes.txt", b"mine"))),
    case("sweep --out is a file", sweep_to("{tmp}/out"), "{tmp}/out is a file",
         prepare=write("out", b"x")),
    case("sweep --resume a folder that is not a sweep", ("sweep", "--resume", "{tmp}/out"),
         "{tmp}/out has no sweep.json", prepare=folder(("notes.txt", b"mine"))),
    case("sweep without --grid", ("sweep", "--out", "{tmp}/out"), "--grid"),
    case("data describe --out is a file",
         ("data", "describe", *_sets(['data.name="synthetic"', "data.num_clients=4",
                                      "sampler.clients_per_round=2"]), "--out", "{tmp}/out"),
         "cannot write the report to {tmp}/out", prepare=write("out", b"x")),
]


# What a new user's first hour still found (issue "A researcher's first hour", item 7).
FIRST_HOUR_CASES = [
    case("--out name longer than the file system allows", run_to("{tmp}/" + "x" * 300),
         "cannot write to the output directory", "File name too long"),
    case("policy.readiness above 1 under a deadline policy",
         run(*POLICY, "policy.readiness=1.5"), "policy.readiness", "(0, 1)"),
    case("policy.readiness below 0 under a deadline policy",
         run(*POLICY, "policy.readiness=-1"), "policy.readiness", "(0, 1)"),
    case("a batch no device holds", run("local.batch_size=1000000000"),
         "does not fit the device"),
    case("scaffold's control variates compressed",
         run('algorithm.name="scaffold"', 'compression.upload="top_k"'),
         "[compression] does not apply to algorithm.name = 'scaffold'", "control variates"),
    case("scaffold's control variates made private",
         run('algorithm.name="scaffold"', "privacy.noise_multiplier=1.0"),
         "[privacy] does not apply to algorithm.name = 'scaffold'"),
    case("feddyn's server reads more than a mean, made private",
         run('algorithm.name="feddyn"', "privacy.noise_multiplier=1.0"),
         "[privacy] does not apply to algorithm.name = 'feddyn'", "mean of the client updates"),
    case("fetchsgd's sketch compressed again",
         run('algorithm.name="fetchsgd"', 'compression.upload="float16"'),
         "[compression] does not apply to algorithm.name = 'fetchsgd'", "its own uploads"),
    case("a key set twice in a config file", run(path="{tmp}/twice.toml"),
         "data.num_clients is set twice (line 4)",
         prepare=write("twice.toml", b"[data]\nnum_clients = 10\n\nnum_clients = 20\n")),
    case("a key set twice on the last line", run(path="{tmp}/last.toml"),
         "rounds is set twice (line 2)", prepare=write("last.toml", b"rounds = 1\nrounds = 2")),
    case("data.num_clients=-1", run("data.num_clients=-1"), "data.num_clients must be >= 1"),
    case("shakespeare num_clients=-1 (0 keeps them all)",
         run('data.name="shakespeare"', "data.num_clients=-1"), "data.num_clients must be >= 0"),
    case("random_k fraction=5", run('compression.upload="random_k"', "compression.fraction=5.0"),
         "random_k: fraction must be in (0, 1]"),
    case("fedprox's prox_mu with fedavg", run("algorithm.prox_mu=0.1"),
         "algorithm.prox_mu is an option of fedprox", "set algorithm.name = 'fedprox'"),
    case("client_lr overflows float32", run("algorithm.client_lr=1e308"),
         "algorithm.client_lr = 1e+308 is not finite in float32"),
    case("a list entry overflows float32",
         run('feature_skew.kind="rotation"', "feature_skew.angle=[0.0, -1e39]"),
         "feature_skew.angle[1] = -1e+39 is not finite in float32"),
    case("DP on the asynchronous server",
         run(*POLICY, 'server.mode="async"', "privacy.noise_multiplier=1.0"),
         "[privacy] and server.mode = 'async' do not combine"),
    case("a ring of models no device holds",
         run('system.devices="lognormal"', 'server.mode="async"', "server.max_staleness=1000000"),
         "server.max_staleness = 1000000", "does not fit the device"),
]


def _takes_float(hint) -> bool:
    """A float or an optional float; not a list of floats (``tuple[float, ...]``: a number
    there is refused as "must be a list", FIRST_HOUR_CASES and tests/test_width_config.py)."""
    sequence = typing.get_origin(hint) in (tuple, list)
    return hint is float or (not sequence and float in typing.get_args(hint))


def _variants() -> list[tuple[tuple[str, ...], str | None]]:
    """``(overrides, table)``: the default config with a [policy] (every float key), and one
    config per registered choice, whose own table's keys it contributes."""
    choices = {
        "data.name": catalog.DATASETS,
        "partition.kind": partitioners.PARTITIONERS,
        "feature_skew.kind": feature_skew.FEATURE_TRANSFORMS,
        "model.name": models.ZOO,
        "algorithm.name": registry.names("algorithm"),
        "selection.name": registry.names("selection"),
    }
    variants = [((), None)]
    for key, names in choices.items():
        table = key.split(".")[0]
        variants += [((f"{key}={name!r}",), table) for name in names]
    return variants


def _float_cases() -> list:
    cases = []
    for overrides, table in _variants():
        keys = config.schema(config.load(None, [*POLICY, *overrides]))
        for key, hint in keys.items():
            if not _takes_float(hint) or (table is not None and not key.startswith(f"{table}.")):
                continue
            for bad in ("inf", "-inf", "nan"):
                if bad == "inf" and key in config.UNBOUNDED:
                    continue  # inf means something there
                argv = ("config", *_sets([*POLICY, *overrides, f"{key}={bad}"]))
                name = " ".join([*(o.split("=")[1].strip("'") for o in overrides), f"{key}={bad}"])
                cases.append(case(name, argv, f"{key} must be a finite number"))
    return cases


FLOAT_CASES = _float_cases()


def _outside(interval) -> list[float]:
    """The values just outside ``interval``: an open end itself, or one past a closed end."""
    values = []
    if math.isfinite(interval.low):
        values.append(interval.low - (1.0 if interval.closed_low else 0.0))
    if math.isfinite(interval.high):
        values.append(interval.high + (1.0 if interval.closed_high else 0.0))
    return values


def _range_cases() -> list:
    """Every algorithm's hyperparameters just outside their declared ranges."""
    cases = []
    for name in registry.names("algorithm"):
        for key, interval in registry.lookup("algorithm", name)().hyperparameters.ranges:
            for bad in _outside(interval):
                argv = (
                    "config",
                    *_sets([*POLICY, f"algorithm.name={name!r}", f"algorithm.{key}={bad}"]),
                )
                cases.append(
                    case(f"{name} {key}={bad}", argv, f"{key} must lie in {interval}, got")
                )
    return cases


RANGE_CASES = _range_cases()


def _listing(path: Path) -> list[tuple[str, int]] | None:
    """What a path holds (names and sizes), or None when it does not exist."""
    if not path.exists():
        return None
    if not path.is_dir():
        return [("", path.lstat().st_size)]
    return sorted((str(p.relative_to(path)), p.lstat().st_size) for p in path.rglob("*"))


def _check_refused(c: Case, tmp_path: Path, capsys) -> None:
    if c.prepare is not None:
        c.prepare(tmp_path)
    out_before = _listing(tmp_path / "out")
    capsys.readouterr()
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in c.argv]
    assert cli.main(argv) == c.code
    captured = capsys.readouterr()
    assert captured.out == ""  # no training, no progress, no config printed
    lines = captured.err.splitlines()
    assert len(lines) == 1 and captured.err.endswith("\n"), captured.err
    assert "Traceback" not in captured.err
    for fragment in c.names:
        assert fragment.replace("{tmp}", str(tmp_path)) in lines[0]
    assert _listing(tmp_path / "out") == out_before  # no run directory created or written


@pytest.mark.parametrize("c", EXAMPLES)
def test_bad_input_is_one_line_before_anything_runs(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


@pytest.mark.parametrize("c", FLOAT_CASES)
def test_every_number_option_refuses_inf_and_nan(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


@pytest.mark.parametrize("c", RANGE_CASES)
def test_every_hyperparameter_refuses_values_outside_its_range(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


def test_every_hyperparameter_declares_its_range():
    """So that RANGE_CASES reach it: a hyperparameter without a range accepts any finite number."""
    for name in registry.names("algorithm"):
        algorithm = registry.lookup("algorithm", name)()
        ranged = {key for key, _ in algorithm.hyperparameters.ranges}
        assert [key for key, _ in algorithm.hyperparameters.defaults if key not in ranged] == [], name


@pytest.mark.parametrize("c", OUTPUT_PATH_CASES)
def test_output_path_is_refused(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


@pytest.mark.parametrize("c", FIRST_HOUR_CASES)
def test_what_the_first_hour_found_is_refused(c, tmp_path, capsys):
    _check_refused(c, tmp_path, capsys)


def test_the_corpus_reaches_every_float_option_and_algorithm():
    """The generated cases are not vacuous: they hold the keys of the issue and every algorithm."""
    ids = " ".join(p.id for p in FLOAT_CASES)
    for key in (
        "algorithm.client_lr=nan",
        "local.epochs=inf",
        "system.step_time=inf",
        "policy.overhead=inf",
        "partition.beta=-inf",
        "system.bandwidth=nan",
        "fedprox algorithm.prox_mu=inf",
        "fedadam algorithm.server_b2=nan",
    ):
        assert key in ids
    assert "partition.beta=inf" not in ids.split() and "system.bandwidth=inf" not in ids.split()
    for name in registry.names("algorithm"):
        assert f"{name} algorithm.client_lr=inf" in ids
    assert len(EXAMPLES) + len(FLOAT_CASES) + len(RANGE_CASES) >= 60


def test_infinite_bandwidth_and_concentration_still_mean_something(capsys):
    """The two options where inf is documented: no transfer time, no label skew."""
    assert (
        cli.main(["config", *_sets([*POLICY, "system.bandwidth=inf", "partition.beta=inf"])]) == 0
    )
    printed = capsys.readouterr().out
    assert "bandwidth = inf" in printed and "beta = inf" in printed


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_keeps_what_was_written_and_says_what_was_not(tmp_path, capsys):
    """``summary.json`` goes to ``/dev/full`` (every write: no space left); the run still
    writes its other files and ends with one line naming the one it could not write."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").symlink_to("/dev/full")
    sets = _sets([*SHORT, 'data.name="synthetic"', "data.num_clients=4", "sampler.clients_per_round=2"])
    assert cli.main(["run", *sets, "--out", str(tmp_path / "out"), "--overwrite", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == (f"fedjax-het: could not write summary.json (No space left on device) in "
                   f"{tmp_path / 'out'}\n")
    for name in ("metrics.jsonl", "arrays.npz", "curves.png", "config.toml", "checkpoint.npz"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name


def test_a_zero_step_time_is_free_compute_for_every_device_source():
    """``system.step_time = 0`` is accepted for identical and log-normal devices alike (as a
    devices CSV's ``step_time_s = 0`` is): every step takes no time, only the network does."""
    from fedjax_het.system import setup

    for devices in ("uniform", "lognormal"):
        profiles = setup.profiles_from_options(6, devices=devices, step_time=0.0)
        assert float(abs(profiles.step_time).max()) == 0.0
