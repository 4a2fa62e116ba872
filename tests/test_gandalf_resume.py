"""GANDALF and mediator runs are checkpointed, interruptible and resumable like the others.

A signal stops the run after the block of rounds it is computing, with its checkpoint,
metrics so far and a summary; ``--resume`` goes on bit for bit, and extends a finished run
by more rounds; a signal during the GAN phases stops at once, in one line.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from fedjax_het import results
from fedjax_het.front import cli
from fedjax_het.training import checkpoint

SETS = ("data.name='synthetic'", "data.num_clients=8", "sampler.clients_per_round=4",
        "eval_every=1", "system.dropout=0.3", "algorithm.group_size=4",
        "algorithm.gan_hidden=[16]", "algorithm.gan_batch_size=16")


@pytest.fixture(autouse=True)
def interactive():
    """SIGINT handled as in a terminal, even where the tests run as a background job."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def run(out, *extra: str, resume: bool = False) -> int:
    sets = [a for item in (*SETS, *extra) for a in ("--set", item)]
    where = ["--resume", str(out)] if resume else ["--out", str(out)]
    return cli.main(["run", *where, *sets, "--no-progress"])


def lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def signal_after_round(monkeypatch, signum: int, after: int) -> None:
    """Sends ``signum`` to this process once the metrics line of round ``after`` is written."""
    append = results.RunWriter.append

    def append_then_signal(self, line):
        append(self, line)
        if line["round"] == after:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(results.RunWriter, "append", append_then_signal)


def final_params(out) -> dict[str, np.ndarray]:
    return checkpoint.load(out).group("state")


@pytest.mark.parametrize("name,signum", [("mediator", signal.SIGINT), ("gandalf", signal.SIGTERM)])
def test_an_interrupted_run_resumes_bit_for_bit(name, signum, tmp_path, monkeypatch, capsys):
    algorithm = f"algorithm.name={name!r}"
    assert run(tmp_path / "whole", algorithm, "rounds=4") == 0
    with monkeypatch.context() as patched:
        signal_after_round(patched, signum, after=2)
        assert run(tmp_path / "cut", algorithm, "rounds=4") == 128 + signum
    err = capsys.readouterr().err
    assert f"interrupted by {signal.Signals(signum).name} after round 2" in err
    assert f"fedjax-het run --resume {tmp_path / 'cut'}" in err
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary == {"status": "interrupted", "rounds_done": 2}
    assert [line["round"] for line in lines(tmp_path / "cut")] == [1, 2]
    assert checkpoint.load(tmp_path / "cut").done == 2

    assert run(tmp_path / "cut", algorithm, "rounds=4", resume=True) == 0
    assert lines(tmp_path / "cut") == lines(tmp_path / "whole")
    whole, cut = final_params(tmp_path / "whole"), final_params(tmp_path / "cut")
    assert whole.keys() == cut.keys()
    for name_ in whole:
        np.testing.assert_array_equal(cut[name_], whole[name_], err_msg=name_)
    strip = lambda s: {k: v for k, v in s.items() if "wall" not in k}
    assert strip(json.loads((tmp_path / "cut" / "summary.json").read_text())) == strip(
        json.loads((tmp_path / "whole" / "summary.json").read_text())
    )


def test_a_finished_run_extended_by_more_rounds_equals_the_longer_run(tmp_path):
    algorithm = "algorithm.name='mediator'"
    assert run(tmp_path / "long", algorithm, "rounds=3") == 0
    assert run(tmp_path / "short", algorithm, "rounds=2") == 0
    assert run(tmp_path / "short", algorithm, "rounds=3", resume=True) == 0
    assert lines(tmp_path / "short") == lines(tmp_path / "long")
    long, short = final_params(tmp_path / "long"), final_params(tmp_path / "short")
    for name in long:
        np.testing.assert_array_equal(short[name], long[name], err_msg=name)


def test_a_resume_with_another_config_is_refused_in_one_line(tmp_path, capsys):
    assert run(tmp_path / "a", "algorithm.name='mediator'", "rounds=2") == 0
    assert run(tmp_path / "a", "algorithm.name='mediator'", "rounds=2", "seed=5", resume=True) == 2
    assert "the config differs from the checkpoint's in seed" in capsys.readouterr().err


def test_a_signal_during_the_gan_phases_stops_at_once_in_one_line(tmp_path, monkeypatch, capsys):
    from fedjax_het.gandalf import pipeline

    def interrupted_gan(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal should have stopped the GAN phase")

    monkeypatch.setattr(pipeline, "gandalf_data", interrupted_gan)
    assert run(tmp_path / "g", "algorithm.name='gandalf'", "rounds=2") == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "fedjax-het: interrupted by SIGTERM before the first round: nothing was trained"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are restored
    assert not (tmp_path / "g" / "checkpoint.npz").exists()
