"""Failures that must not lose the end of a run (issue 21, item 8).

A second Ctrl-C while a run stops, a Ctrl-C before the first round, a noise multiplier the
privacy accountant cannot take, a missing ``dp-accounting``, a full disk, rounds in which
every update was dropped as non-finite, and extending a finished run by more rounds. Each
ends in one line (or a warning) and keeps what was computed; an extended run equals, bit
for bit, a run started with that many rounds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from fedjax_het import models, results, rng
from fedjax_het.algorithms import fedavg
from fedjax_het.data import FederatedData, LocalWork
from fedjax_het.front import cli, config
from fedjax_het.sampling import uniform
from fedjax_het.training import checkpoint, simulate
from fedjax_het.training.interrupt import Interrupted
from fedjax_het.training.options import run_options
from fedjax_het.transforms import privacy

TINY = [
    'data.name="synthetic"',
    "data.num_clients=8",
    "sampler.clients_per_round=3",
    "model.name=mlp",
    "model.hidden=[8]",
    "rounds=8",
    "eval_every=2",
    "engine.devices=1",
]
DEADLINE = [
    'system.devices="lognormal"',
    "system.dropout=0.2",
    'policy.kind="deadline"',
    "policy.deadline=5.0",
]
ASYNC = (
    'algorithm.name="fedbuff"',
    'system.devices="lognormal"',
    "system.dropout=0.2",
    'server.mode="async"',
    "server.concurrency=5",
    "server.buffer_size=3",
    "server.max_staleness=2",
)
# What depends on the process, not on the run (as in test_checkpoint.py).
WALL = (
    "wall_s",
    "first_block_s_with_compile",
    "to_accuracy",
    "checkpoint",
    "chunk_plan",
    "compile_cache",
)
# ``fedjax-het`` in a child process with SIGINT handled as in a terminal (test_checkpoint.py).
FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'fedjax-het'; runpy.run_module('fedjax_het.front.cli', run_name='__main__')"
)


@pytest.fixture(autouse=True)
def interactive():
    """SIGINT handled as in a terminal, even where the tests run as a background job."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def sets(*overrides: str) -> list[str]:
    return [a for s in [*TINY, *overrides] for a in ("--set", s)]


def experiment(*extra: str) -> config.Experiment:
    return config.build(config.load(None, [*TINY, *extra]))


def run(exp: config.Experiment, out, **kwargs) -> simulate.History:
    return simulate.run(
        exp.data,
        *exp.options(**kwargs, out_dir=out, config=exp.config, progress=False),
    )


def without_wall(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in WALL}


def one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


# 1. A second Ctrl-C while the run stops.


def test_a_second_and_third_signal_while_stopping_still_write_everything(tmp_path, monkeypatch):
    """SIGINT twice at the end of round 4's block and once more while the results are written:
    the run still ends after that block, with its checkpoint and every result file."""
    plot = results.plot_curves

    def plot_then_interrupt(metrics, path):
        os.kill(os.getpid(), signal.SIGINT)
        plot(metrics, path)

    monkeypatch.setattr(results, "plot_curves", plot_then_interrupt)
    exp = experiment()

    def on_eval(line):
        if line["round"] == 4:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as stopped:
        simulate.run(
            exp.data,
            *exp.options(out_dir=tmp_path, config=exp.config, progress=False, on_eval=on_eval),
        )
    assert (stopped.value.done, stopped.value.exit_code) == (4, 130)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 4
    assert checkpoint.load(tmp_path).done == 4
    for name in ("arrays.npz", "curves.png", "label_heatmap.png", "metrics.jsonl"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.slow
def test_ctrl_c_twice_on_the_command_line_exits_130_with_the_results(tmp_path):
    """The probe: ``fedjax-het run`` gets SIGINT, then SIGINT again 0.3 s later."""
    out = tmp_path / "run"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            FROM_A_TERMINAL,
            "run",
            *sets("rounds=600", "eval_every=10"),
            "--out",
            str(out),
            "--no-progress",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    while child.poll() is None and (
        not metrics.exists() or len(metrics.read_text().splitlines()) < 3
    ):
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    err = child.communicate(timeout=120)[1]
    assert child.returncode == 130, err
    assert one_line(err).endswith(f"continue with: fedjax-het run --resume {out}")
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert (out / "checkpoint.npz").is_file() and (out / "curves.png").stat().st_size > 0


# 2. Ctrl-C before the first round.


def test_ctrl_c_while_the_data_are_prepared_is_one_line(tmp_path, monkeypatch, capsys):
    build = config.build

    def interrupted_build(raw):
        os.kill(os.getpid(), signal.SIGINT)
        return build(raw)

    monkeypatch.setattr(config, "build", interrupted_build)
    assert cli.main(["run", *sets(), "--out", str(tmp_path / "out"), "--no-progress"]) == 130
    err = one_line(capsys.readouterr().err)
    assert err == "fedjax-het: interrupted by SIGINT before the first round: nothing was trained"
    assert not (tmp_path / "out").exists()


def test_ctrl_c_while_the_round_is_built_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C while the round is built (or planned): the run stops at once, before its results
    directory is opened; running again into the same --out needs no --overwrite."""
    setup = simulate.round_setup

    def interrupted_setup(*args):
        os.kill(os.getpid(), signal.SIGINT)
        return setup(*args)

    monkeypatch.setattr(simulate, "round_setup", interrupted_setup)
    argv = ["run", *sets(*DEADLINE, "rounds=2"), "--out", str(tmp_path / "out"), "--no-progress"]
    assert cli.main(argv) == 130
    err = one_line(capsys.readouterr().err)
    assert err == "fedjax-het: interrupted by SIGINT before the first round: nothing was trained"
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.undo()
    assert cli.main(argv) == 0


def test_ctrl_c_during_the_first_compilation_stops_before_the_first_round(
    tmp_path, monkeypatch, capsys
):
    """The signal arrives while round 0 is evaluated (its program compiling): the loop stops
    before its first block; the results hold round 0's evaluation and no checkpoint."""
    record = simulate.Recorder.record

    def record_then_interrupt(self, done, block, ev):
        if done == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return record(self, done, block, ev)

    monkeypatch.setattr(simulate.Recorder, "record", record_then_interrupt)
    out = tmp_path / "out"
    assert cli.main(["run", *sets(*DEADLINE), "--out", str(out), "--no-progress"]) == 130
    assert one_line(capsys.readouterr().err) == (
        "fedjax-het: interrupted by SIGINT before the first round: nothing was trained; "
        f"round 0's evaluation is in {out}"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["rounds"]) == ("interrupted", 0)
    assert not (out / checkpoint.FILE).exists()


# 3 and 4. The privacy accountant: a noise multiplier it cannot take, and no dp-accounting.


@pytest.mark.parametrize("noise", ["1e300", "1e4", "inf"])
def test_a_noise_multiplier_beyond_the_accountant_is_refused_before_training(
    noise, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = ["run", *sets(f"privacy.noise_multiplier={noise}"), "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 2
    assert "noise_multiplier" in one_line(capsys.readouterr().err)
    assert not out.exists()


def test_the_largest_noise_multiplier_is_one_the_accountant_computes():
    """``MAX_NOISE_MULTIPLIER`` gives a finite ε >= 0 for cohorts sampled at q from 1e-7 to 1,
    one round or a million, without dp-accounting's warnings of numerical trouble."""
    import logging

    troubles = []

    class Count(logging.Handler):
        def emit(self, record):
            troubles.append(record.getMessage())

    absl = logging.getLogger("absl")
    handler = Count(logging.WARNING)
    absl.addHandler(handler)
    try:
        for cohort, clients in [(1, 10**7), (10, 1000), (1, 2), (999, 1000), (2, 2)]:
            for rounds in (1, 10**6):
                eps = privacy.epsilon(privacy.MAX_NOISE_MULTIPLIER, rounds, cohort, clients, 1e-5)
                assert np.isfinite(eps) and eps >= 0, (cohort, clients, rounds, eps)
    finally:
        absl.removeHandler(handler)
    assert troubles == []


def test_a_run_at_the_largest_noise_multiplier_reports_its_privacy(tmp_path):
    exp = experiment(f"privacy.noise_multiplier={privacy.MAX_NOISE_MULTIPLIER}", "rounds=2")
    history = run(exp, tmp_path)
    assert history.summary["privacy"]["noise_multiplier"] == privacy.MAX_NOISE_MULTIPLIER
    assert np.isfinite(history.summary["privacy"]["epsilon"])


def test_a_private_run_without_dp_accounting_is_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # as on an install without it
    out = tmp_path / "out"
    argv = ["run", *sets("privacy.noise_multiplier=1.0"), "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "[privacy]" in err and err.endswith("pip install 'fedjax_het[privacy]'")
    assert not out.exists()
    with pytest.raises(ValueError, match="fedjax_het\\[privacy\\]"):  # the Python API too
        privacy.private(fedavg(), cohort_size=3)


# 5. A full disk.

# A child whose files may not grow past LIMIT bytes (RLIMIT_FSIZE; EFBIG, "File too large",
# as a full disk's ENOSPC): config.toml, metrics.jsonl, arrays.npz, data_summary.json and
# summary.json fit; the checkpoint and the two plots do not.
LIMIT = 4096
FILE_SIZE_LIMITED = (
    "import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    f"resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT})); "
    "sys.argv[0] = 'fedjax-het'; runpy.run_module('fedjax_het.front.cli', run_name='__main__')"
)


@pytest.mark.slow
def test_files_a_full_disk_cut_short_are_removed_named_and_in_the_summary(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FILE_SIZE_LIMITED,
            "run",
            *sets("rounds=4", "engine.compile_cache=false"),
            "--out",
            str(out),
            "--no-progress",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    err = one_line(done.stderr)
    unwritten = ("checkpoint.npz", "curves.png", "label_heatmap.png")
    for name in unwritten:
        assert name in err
        assert not (out / name).exists(), f"{name} left behind"
    assert not (out / "checkpoint.npz.tmp").exists()
    for name in ("config.toml", "metrics.jsonl", "arrays.npz", "data_summary.json"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["not_written"]) == sorted(unwritten)
    assert summary["not_written"]["checkpoint.npz"].startswith("round 4: ")
    assert results.load(out).metrics[-1]["round"] == 4


def test_a_metrics_line_cut_short_is_taken_back(tmp_path):
    """An append that fails part-way leaves metrics.jsonl as it was: every line stays JSON."""
    writer = results.RunWriter(tmp_path, {})
    writer.append({"round": 0})
    real_open = type(tmp_path).open

    class Half:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

    try:
        type(tmp_path).open = lambda self, mode="r", *a, **k: Half(real_open(self, mode, *a, **k))
        writer.append({"round": 1, "test_accuracy": 0.5})
    finally:
        type(tmp_path).open = real_open
    assert writer.missing == {"metrics.jsonl": "No space left on device"}
    assert [m["round"] for m in results.load(tmp_path).metrics] == [0]


# 6. Every update dropped as non-finite.


def all_poisoned() -> FederatedData:
    """Four clients whose every training feature is NaN (their test splits are not)."""
    gen = np.random.default_rng(0)
    xs = [np.full((8, 4), np.nan, np.float32) for _ in range(4)]
    ys = [gen.integers(0, 3, 8).astype(np.int32) for _ in range(4)]
    return FederatedData.from_client_arrays(
        xs,
        ys,
        test_xs=[gen.normal(size=(2, 4)).astype(np.float32) for _ in xs],
        test_ys=[y[:2] for y in ys],
        num_classes=3,
    )


def _dropping_run(data, rounds: int) -> simulate.History:
    """FedAvg on 4 clients, 2 a round, non-finite updates dropped."""
    return simulate.run(
        data,
        *run_options(
            model=models.logistic_regression((4,), 3),
            algorithm=fedavg(),
            sampler=uniform(num_clients=4, cohort_size=2),
            rounds=rounds,
            work=LocalWork(batch_size=4),
            hyper={"client_lr": 0.1},
            eval_every=2,
            progress=False,
            devices=1,
            nonfinite="drop",
        ),
    )


def test_rounds_whose_every_update_was_dropped_have_no_train_loss_and_a_warning():
    history = _dropping_run(all_poisoned(), rounds=4)
    assert history.summary["status"] == "completed"
    assert [(m["train_loss"], m["participants"]) for m in history.metrics] == [(None, 0)] * 3
    (warning,) = history.summary["warnings"]
    assert warning.startswith("4 of 4 rounds trained nobody: every update was non-finite")


def test_a_run_that_trained_has_no_warnings_key():
    """Runs without a system that trained: their summary is as before (no ``warnings``)."""
    history = _dropping_run(_clean(), rounds=2)
    assert "warnings" not in history.summary
    assert history.metrics[-1]["train_loss"] > 0


def _clean() -> FederatedData:
    gen = np.random.default_rng(0)
    xs = [gen.normal(size=(8, 4)).astype(np.float32) for _ in range(4)]
    ys = [gen.integers(0, 3, 8).astype(np.int32) for _ in range(4)]
    return FederatedData.from_client_arrays(xs, ys, test_xs=xs, test_ys=ys, num_classes=3)


# 7. A finished run extended by more rounds.


def test_a_schedule_for_more_rounds_begins_with_the_one_for_fewer():
    """What makes extending exact with a system: the schedule planned for 10 rounds (or 10
    server events) begins with the one planned for 6, key for key."""
    for extra in (DEADLINE, ASYNC):

        def plans(rounds, extra=extra):
            exp = experiment(*extra, f"rounds={rounds}")
            spec = simulate.local_spec(exp.model, exp.algorithm, exp.data, exp.work)
            key = rng.seed_key(0)
            if exp.server is not None:
                return simulate.plan_events(
                    exp.system, exp.data, spec, exp.server, events=rounds, key=key
                )
            return simulate.plan_run(
                exp.system, exp.data, spec, exp.sampler, rounds=rounds, key=key
            )

        short, long = plans(6), plans(10)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(b)[:6], a), short, long)


EXTEND = {
    "fedavg": (),
    "deadline": DEADLINE,
    "power_of_choice_online": (
        *DEADLINE,
        'selection.name="power_of_choice"',
        "selection.candidates=6",
    ),
    "fedbuff_async": ASYNC,
}


@pytest.mark.parametrize("extra", EXTEND.values(), ids=EXTEND.keys())
def test_a_finished_run_extended_equals_the_longer_run(tmp_path, extra):
    short = run(experiment(*extra, "rounds=6"), tmp_path / "cut")
    assert short.summary["status"] == "completed"
    longer = experiment(*extra, "rounds=10")
    extended = run(longer, tmp_path / "cut", resume=True)
    whole = run(longer, tmp_path / "whole")
    lines = lambda d: [
        without_wall(json.loads(x)) for x in (d / "metrics.jsonl").read_text().splitlines()
    ]
    assert lines(tmp_path / "cut") == lines(tmp_path / "whole")
    assert [m["round"] for m in extended.metrics][-1] == 10
    assert without_wall(extended.summary) == without_wall(whole.summary)
    for name, value in whole.round_metrics.items():
        np.testing.assert_array_equal(extended.round_metrics[name], value, err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, extended.params, whole.params)
    jax.tree.map(np.testing.assert_array_equal, extended.state, whole.state)


def test_a_run_extended_from_between_evaluations_computes_the_same_model(tmp_path):
    """6 rounds at eval_every = 4, then 10: the model and every per-round figure are the
    longer run's; metrics.jsonl keeps the first run's evaluation at round 6 besides."""
    run(experiment("rounds=6", "eval_every=4"), tmp_path / "cut")
    longer = experiment("rounds=10", "eval_every=4")
    extended = run(longer, tmp_path / "cut", resume=True)
    whole = run(longer, tmp_path / "whole")
    assert [m["round"] for m in extended.metrics] == [0, 4, 6, 8, 10]
    for name, value in whole.round_metrics.items():
        np.testing.assert_array_equal(extended.round_metrics[name], value, err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, extended.params, whole.params)


def test_resume_takes_more_rounds_and_nothing_else(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", *sets("rounds=4"), "--out", str(out), "--no-progress"]) == 0
    resume = ["run", "--resume", str(out), "--no-progress"]
    assert cli.main([*resume, "--set", "rounds=2"]) == 2
    assert one_line(capsys.readouterr().err).endswith(
        "differs from the checkpoint's in rounds: 4 -> 2"
    )
    assert cli.main([*resume, "--set", "rounds=6", "--set", "seed=1"]) == 2
    assert one_line(capsys.readouterr().err).endswith(
        "differs from the checkpoint's in seed: 0 -> 1"
    )
    assert cli.main([*resume, "--set", "rounds=6"]) == 0
    assert [m["round"] for m in results.load(out).metrics] == [0, 2, 4, 6]
    assert "rounds = 6" in (out / "config.toml").read_text()
