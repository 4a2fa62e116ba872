"""Checkpoints and resume: an interrupted run, resumed, equals the uninterrupted run bit for bit.

An interrupt is a real signal: the run sends itself SIGINT or SIGTERM from its
``on_eval`` callback, the loop finishes that block, writes the checkpoint and
results, and raises ``Interrupted``; ``run(..., resume=True)`` then continues.
Everything a run reports is compared bitwise except the wall-clock fields (``WALL``).
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

from fedjax_het.front import cli, config
from fedjax_het.front.sweep import Cell, sweep
from fedjax_het.results import NotWritten, OutDirError
from fedjax_het.training import checkpoint, simulate
from fedjax_het.training.interrupt import Interrupted

TINY = [
    'data.name="synthetic"', "data.num_clients=8", "sampler.clients_per_round=3",
    "model.name=mlp", "model.hidden=[8]", "rounds=8", "eval_every=2", "engine.devices=1",
]
DEADLINE = ['system.devices="lognormal"', "system.dropout=0.2", 'policy.kind="deadline"',
            "policy.deadline=5.0"]
# Fields of the moment, not of the run: wall-clock times and the free memory the chunk plan saw.
# What depends on the process, not on the run: times, the free memory the chunk was planned
# from, and what the compilation cache held (a resumed run finds programs the first wrote).
WALL = (
    "wall_s", "first_block_s_with_compile", "to_accuracy", "checkpoint", "chunk_plan",
    "compile_cache",
)


@pytest.fixture(autouse=True)
def interactive():
    """SIGINT handled as in a terminal, even where the tests run as a background job (whose
    SIGINT is ignored, and an ignored signal stays ignored, ``interrupt.deferred``)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# ``fedjax-het`` in a child process with SIGINT handled as in a terminal (a child inherits an
# ignored SIGINT; ``preexec_fn`` would fork a multithreaded JAX process).
FROM_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                   "sys.argv[0] = 'fedjax-het'; runpy.run_module('fedjax_het.front.cli', run_name='__main__')")


def experiment(*extra: str) -> config.Experiment:
    return config.build(config.load(None, [*TINY, *extra]))


def run(exp: config.Experiment, out, *, stop_at: int | None = None, signum=signal.SIGINT,
        **kwargs) -> simulate.History:
    """``simulate.run`` of ``exp`` into ``out``; sends itself ``signum`` after round ``stop_at``."""

    def on_eval(line):
        if line["round"] == stop_at:
            os.kill(os.getpid(), signum)

    return simulate.run(
        exp.data,
        *exp.options(**kwargs, out_dir=out, config=exp.config, progress=False, on_eval=on_eval),
    )


def interrupted_then_resumed(exp, out, stop_at, **kwargs) -> tuple[Interrupted, simulate.History]:
    with pytest.raises(Interrupted) as stopped:
        run(exp, out, stop_at=stop_at, **kwargs)
    return stopped.value, run(exp, out, resume=True, **kwargs)


def without_wall(line: dict) -> dict:
    return {k: v for k, v in line.items() if k not in WALL}


def assert_same_run(resumed: simulate.History, whole: simulate.History) -> None:
    assert [without_wall(m) for m in resumed.metrics] == [without_wall(m) for m in whole.metrics]
    assert without_wall(resumed.summary) == without_wall(whole.summary)
    for name, value in whole.round_metrics.items():
        np.testing.assert_array_equal(resumed.round_metrics[name], value, err_msg=name)
    np.testing.assert_array_equal(resumed.client_accuracy, whole.client_accuracy)
    jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)
    jax.tree.map(np.testing.assert_array_equal, resumed.state, whole.state)
    if whole.schedule is not None:
        jax.tree.map(np.testing.assert_array_equal, resumed.schedule, whole.schedule)


CASES = {
    "fedavg": (),
    "fedadam_deadline": ('algorithm.name="fedadam"', "algorithm.server_lr=0.01", *DEADLINE),
    "scaffold_host_states": ('algorithm.name="scaffold"', 'engine.client_state="host"',
                             *DEADLINE),
    "scaffold_device_states": ('algorithm.name="scaffold"', 'engine.client_state="device"'),
    "power_of_choice_online": (*DEADLINE, 'selection.name="power_of_choice"',
                               "selection.candidates=6"),
    "fedbuff_async": ('algorithm.name="fedbuff"', 'system.devices="lognormal"',
                      "system.dropout=0.2", 'server.mode="async"', "server.concurrency=5",
                      "server.buffer_size=3", "server.max_staleness=2"),
    "biasprompt_stale_tasks": ('algorithm.name="biasprompt_plus"', *DEADLINE[:-1],
                               "policy.deadline=0.5", "policy.max_staleness=2"),
}


@pytest.mark.slow
@pytest.mark.parametrize("extra", CASES.values(), ids=CASES.keys())
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, extra):
    exp = experiment(*extra)
    whole = run(exp, tmp_path / "whole")
    stopped, resumed = interrupted_then_resumed(exp, tmp_path / "cut", stop_at=4)
    assert (stopped.done, stopped.exit_code) == (4, 130)
    assert_same_run(resumed, whole)
    on_disk = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in on_disk] == [0, 2, 4, 6, 8]


def test_an_interrupted_run_writes_its_results_marked_interrupted(tmp_path):
    exp = experiment()
    with pytest.raises(Interrupted) as stopped:
        run(exp, tmp_path / "run", stop_at=2, signum=signal.SIGTERM)
    assert stopped.value.exit_code == 143
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 2
    assert summary["interrupted"] == {"signal": "SIGTERM", "round": 2}
    assert summary["checkpoint"]["round"] == 2 and summary["checkpoint"]["bytes"] > 0
    for name in ("arrays.npz", "curves.png", "metrics.jsonl", checkpoint.FILE):
        assert (tmp_path / "run" / name).exists(), name
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_periodic_checkpoints_and_a_resume_from_one_after_a_hard_kill(tmp_path):
    """A process killed without warning resumes from its last periodic checkpoint; the
    metrics it wrote after that checkpoint are dropped and recomputed."""
    exp = experiment("engine.checkpoint_every=4")
    whole = run(exp, tmp_path / "whole")
    assert whole.summary["checkpoint"]["round"] == 8  # the last one, at the end

    kept = {}

    def kill_after_six(line):  # keep the round-4 checkpoint, as a SIGKILL at round 6 would
        if line["round"] == 6:  # (evaluated before the block's checkpoint is due)
            kept["file"] = (tmp_path / "cut" / checkpoint.FILE).read_bytes()

    simulate.run(
        exp.data,
        *exp.options(
            out_dir=tmp_path / "cut",
            config=exp.config,
            progress=False,
            on_eval=kill_after_six,
        ),
    )
    (tmp_path / "cut" / checkpoint.FILE).write_bytes(kept["file"])
    assert checkpoint.load(tmp_path / "cut").done == 4
    assert_same_run(run(exp, tmp_path / "cut", resume=True), whole)


def test_resuming_with_another_config_names_the_keys_that_differ(tmp_path):
    exp = experiment()
    with pytest.raises(Interrupted):
        run(exp, tmp_path / "run", stop_at=2)
    other = experiment("algorithm.client_lr=0.2", "seed=3")
    with pytest.raises(checkpoint.CheckpointError, match=r"algorithm.client_lr: 0.05 -> 0.2; seed: 0 -> 3"):
        run(other, tmp_path / "run", resume=True)


def test_a_checkpoint_of_another_model_is_refused_by_leaf(tmp_path):
    exp = experiment()
    with pytest.raises(Interrupted):
        run(exp, tmp_path / "run", stop_at=2)
    wider = experiment("model.hidden=[9]")
    with pytest.raises(checkpoint.CheckpointError, match=r"Dense_0'\]\['bias'\] is float32\[8\], this run's is float32\[9\]"):
        simulate.run(
            wider.data,
            *wider.options(out_dir=tmp_path / "run", resume=True, progress=False),
        )


def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    """Writing is atomic: an error while writing (a full disk) leaves the last good checkpoint,
    and the run ends saying which file it could not write."""
    exp = experiment("engine.checkpoint_every=2")
    calls = {"n": 0}
    real_savez = np.savez

    def savez_failing_the_second_time(file, **arrays):
        calls["n"] += 1
        if calls["n"] == 2:
            file.write(b"partial")
            raise OSError(28, "No space left on device")
        return real_savez(file, **arrays)

    monkeypatch.setattr(np, "savez", savez_failing_the_second_time)
    with pytest.raises(NotWritten, match=r"checkpoint.npz \(round 4: No space left on device\)"):
        run(exp, tmp_path / "run", rounds=4)
    assert checkpoint.load(tmp_path / "run").done == 2
    assert not (tmp_path / "run" / (checkpoint.FILE + ".tmp")).exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed_not_written"  # not "completed": a file is missing
    assert "checkpoint.npz" in summary["not_written"]


def test_an_existing_run_directory_is_not_overwritten_unless_asked(tmp_path):
    exp = experiment()
    run(exp, tmp_path / "run", rounds=2)
    with pytest.raises(OutDirError, match="already holds files"):
        run(exp, tmp_path / "run", rounds=2)
    assert run(exp, tmp_path / "run", rounds=2, overwrite=True).summary["rounds"] == 2


@pytest.mark.slow
def test_a_resumed_sweep_equals_the_uninterrupted_sweep(tmp_path, monkeypatch):
    """Three cells, two at a time: the first chunk finishes, the second is interrupted;
    the resume reads the first chunk's last checkpoint and continues the second."""
    exp = experiment(*DEADLINE)
    kwargs = {k: v for k, v in exp.run_kwargs().items() if k not in ("seed", "hyper", "select", "system")}

    def go(out, resume=False):
        cells = [Cell(seed, {"client_lr": lr}, exp.system, out / f"c{i}", exp.config)
                 for i, (seed, lr) in enumerate([(0, 0.05), (1, 0.1), (2, 0.05)])]
        return sweep(exp.data, exp.model, exp.algorithm, exp.sampler, cells=cells,
                     cells_at_once=2, checkpoints=out / "checkpoints", resume=resume,
                     progress=False, **kwargs)

    whole = go(tmp_path / "whole")
    record = simulate.Recorder.record

    def record_then_interrupt(self, done, block, ev):
        if done == 4 and self.writer.out_dir.name == "c2":
            os.kill(os.getpid(), signal.SIGINT)
        return record(self, done, block, ev)

    monkeypatch.setattr(simulate.Recorder, "record", record_then_interrupt)
    with pytest.raises(Interrupted) as stopped:
        go(tmp_path / "cut")
    monkeypatch.undo()
    statuses = [h.summary["status"] for h in stopped.value.history]
    assert statuses == ["completed", "completed", "interrupted"]
    for a, b in zip(go(tmp_path / "cut", resume=True), whole, strict=True):
        assert_same_run(a, b)


@pytest.mark.slow
def test_ctrl_c_on_the_command_line_then_resume(tmp_path, capsys):
    """The real thing: ``fedjax-het run`` in a child process gets SIGINT mid-run, says in one
    line how to resume and exits 130; ``--resume`` finishes it, equal to a run never stopped."""
    sets = [a for s in [*TINY, "rounds=600", "eval_every=10"]
            for a in ("--set", s)]
    out = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", FROM_A_TERMINAL, "run", *sets, "--out", str(out), "--no-progress"],
        stderr=subprocess.PIPE, text=True,
    )
    metrics = out / "metrics.jsonl"
    while child.poll() is None and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    err = child.communicate(timeout=120)[1].strip()
    assert child.returncode == 130, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.endswith(f"continue with: fedjax-het run --resume {out}")
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"

    assert cli.main(["run", "--resume", str(out), "--set", "seed=1", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().endswith("differs from the checkpoint's in seed: 0 -> 1")
    assert "seed = 0" in (out / "config.toml").read_text()  # the refused resume changed nothing
    assert cli.main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert cli.main(["run", *sets, "--out", str(tmp_path / "whole"), "--no-progress"]) == 0
    lines = lambda d: [without_wall(json.loads(x)) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert lines(out) == lines(tmp_path / "whole") and lines(out)[-1]["round"] == 600


def test_an_ignored_signal_stays_ignored(tmp_path):
    """``nohup fedjax-het run ...``: SIGINT is ignored before the run, so it is during it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    history = run(experiment(), tmp_path / "run", stop_at=2)
    assert history.summary["status"] == "completed" and history.summary["rounds"] == 8
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
