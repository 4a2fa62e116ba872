"""GANDALF end to end (``fedjax_het.gandalf.pipeline``): options, the pipeline, and what it reports.

- ``gandalf_options``: the paper's defaults; every bad option is a one-line
  ``ValueError`` naming the option (tau 0 and 1.5, M_g 0, M_c 0, both or
  neither of group_size/num_mediators, heartbeat above T_R, J above M_g ...).
- Phases 1-2 on ragged clients that hold every class, with ``tau = 1`` and a
  static cap that never binds: each client's real rows come first, unchanged,
  and its class counts afterwards equal ``max_c n_c`` for every class (the
  closed form of ``H = max(n) - n`` filled completely); rows are added by GANs
  as well as by static copies. Exact (integer counts, bitwise rows).
- A one-example client with ``gan=True`` is skipped by the GAN (documented)
  and the run completes; data in which no client has two rows is an error.
- ``run_gandalf`` is deterministic for a seed (twice: bitwise equal params,
  evaluations and metrics), and with ``gan=False`` equals ``run_mediator`` on
  ``kl_groups`` of the same data (bitwise). Virtual seconds at each evaluation
  equal the running sum of round durations (rtol 1e-6) and the rounds/seconds
  to each target are re-derived by a loop over the evaluations.
- Progress: with ``progress`` the GAN phase's, the synthetic rows' and the mediator rounds'
  bars reach 100% on stderr; without it (and with the CLI's ``--no-progress``) nothing is
  printed.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedjax_het import models
from fedjax_het.algorithms import fedavg
from fedjax_het.data import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.gandalf import pipeline as gandalf
from fedjax_het.gandalf import rebalance
from fedjax_het.gandalf.mediator import kl_groups, run_mediator
from fedjax_het.system.profiles import uniform_profiles

F, C = 4, 3
CLASS_COUNTS = np.array([[6, 2, 1], [1, 7, 3], [2, 1, 5], [5, 5, 1], [1, 3, 8], [4, 1, 2]])
N = len(CLASS_COUNTS)
WORK = LocalWork(batch_size=4, epochs=1.0)
LOGREG = models.logistic_regression((F,), C)
ALGORITHM = fedavg()
HYPER = {"client_lr": 0.1}
TINY_GAN = {"gan_hidden": (8,), "gan_batch_size": 8, "gan_passes": 2}


def make_data(class_counts=CLASS_COUNTS, seed: int = 0) -> FederatedData:
    gen = np.random.default_rng(seed)
    xs, ys = [], []
    for row in class_counts:
        y = np.repeat(np.arange(C), row).astype(np.int32)
        y = y[gen.permutation(len(y))]
        xs.append((gen.normal(0.0, 1.0, (len(y), F)) + y[:, None]).astype(np.float32))
        ys.append(y)
    return FederatedData.from_client_arrays(xs, ys, test_xs=xs, test_ys=ys, num_classes=C)


def one_line(fn, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


def test_defaults_are_the_papers():
    options = gandalf.gandalf_options()
    assert (options.gan_groups, options.num_mediators, options.tau) == (2, 2, 0.5)
    assert (options.generator_steps, options.critic_steps, options.passes) == (3, 2, 1)
    assert (options.gans_per_client, options.gan_batch_size, options.static_cap) == (None, 256, 2.0)
    assert gandalf.gandalf_options(group_size=3).num_mediators is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tau": 0.0}, "tau"),
        ({"tau": 1.5}, "tau"),
        ({"gan_groups": 0}, "gan_groups"),
        ({"num_mediators": 0}, "num_mediators"),
        ({"num_mediators": None}, "exactly one"),
        ({"group_size": 2, "num_mediators": 2}, "exactly one"),
        ({"group_size": 0}, "exactly one|group_size"),
        ({"passes": 0}, "passes"),
        ({"max_wait": 0.0}, "max_wait"),
        ({"max_wait": float("inf")}, "max_wait"),
        ({"max_wait": 10.0, "heartbeat": 11.0}, "heartbeat"),
        ({"heartbeat": -1.0}, "heartbeat"),
        ({"gans_per_client": 3, "gan_groups": 2}, "gans_per_client"),
        ({"gans_per_client": 0}, "gans_per_client"),
        ({"critic_steps": 0}, "critic_steps"),
        ({"generator_steps": 1.5}, "generator_steps"),
        ({"gan_passes": 0}, "gan_passes"),
        ({"gan_batch_size": 0}, "gan_batch_size"),
        ({"gan_hidden": (8, 0)}, "gan_hidden"),
        ({"gan_output": "relu"}, "gan_output"),
        ({"static_cap": -1.0}, "static_cap"),
        ({"fault_tolerance": 1}, "fault_tolerance"),
        ({"gan": "yes"}, "gan"),
        ({"chunk": 0}, "chunk"),
        ({"taus": 0.5}, "unknown"),
    ],
)
def test_bad_options_are_one_line_errors(kwargs, match):
    one_line(lambda: gandalf.gandalf_options(**kwargs), match)


def test_bad_run_inputs_are_one_line_errors():
    data = make_data()
    common = {"rounds": 1, "work": WORK, "hyper": HYPER, "progress": False}
    options = gandalf.gandalf_options(gan=False, num_mediators=N + 1)
    one_line(lambda: gandalf.run_gandalf(data, LOGREG, ALGORITHM, options, **common), "M_c")
    options = gandalf.gandalf_options(gan_groups=N + 1, **TINY_GAN)
    one_line(lambda: gandalf.run_gandalf(data, LOGREG, ALGORITHM, options, **common), "M_g")
    options = gandalf.gandalf_options(gan=False)
    one_line(
        lambda: gandalf.run_gandalf(data, LOGREG, ALGORITHM, options, targets=(1.5,), **common),
        "targets",
    )
    singles = make_data(np.eye(C, dtype=int)[[0, 1, 2, 0]])
    options = gandalf.gandalf_options(**TINY_GAN)
    one_line(lambda: gandalf.gandalf_data(singles, options, seed=0), ">= 2 training examples")


def test_augmentation_balances_every_client_and_keeps_real_rows():
    data = make_data()
    options = gandalf.gandalf_options(tau=1.0, static_cap=100.0, **TINY_GAN)
    augmented = gandalf.gandalf_data(data, options, seed=3)
    train = augmented.data.train
    for k in range(N):
        x_k, y_k = train.client(k)
        x_real, y_real = data.train.client(k)
        n_real = len(y_real)
        np.testing.assert_array_equal(x_k[:n_real], x_real)
        np.testing.assert_array_equal(y_k[:n_real], y_real)
        assert np.all(augmented.origin[train.offset[k] : train.offset[k] + n_real] == 0)
        after = np.bincount(y_k, minlength=C)
        np.testing.assert_array_equal(after, np.full(C, CLASS_COUNTS[k].max()))
    assert np.any(augmented.origin == rebalance.GAN)
    assert np.any(augmented.origin == rebalance.STATIC)


def test_one_example_client_is_skipped_by_the_gan():
    counts = CLASS_COUNTS.copy()
    counts[2] = [0, 1, 0]
    data = make_data(counts)
    options = gandalf.gandalf_options(gan_groups=2, num_mediators=2, **TINY_GAN)
    result = gandalf.run_gandalf(
        data, LOGREG, ALGORITHM, options, rounds=2, work=WORK, hyper=HYPER, progress=False
    )
    assert result.summary["synthetic_rows"] > 0
    assert np.isfinite(result.summary["best_accuracy"])


def faulty_profiles():
    return uniform_profiles(N, step_time=1.0, dropout=0.4)


def test_runs_are_deterministic_and_report_consistently():
    data = make_data()
    options = gandalf.gandalf_options(max_wait=20.0, heartbeat=2.0, **TINY_GAN)
    run = lambda: gandalf.run_gandalf(
        data, LOGREG, ALGORITHM, options, rounds=4, work=WORK, hyper=HYPER, seed=5,
        profiles=faulty_profiles(), start=7.0, targets=(0.3, 0.99), progress=False,
    )  # fmt: skip
    first, second = run(), run()
    for a, b in zip(jax.tree.leaves(first.history.params), jax.tree.leaves(second.history.params)):
        np.testing.assert_array_equal(a, b)
    assert first.evaluations == second.evaluations
    for name, values in first.round_metrics.items():
        np.testing.assert_array_equal(values, second.round_metrics[name])
    assert first.summary["synthetic_rows"] > 0
    assert first.history.round_metrics["failures"].sum() > 0
    clock = np.cumsum(first.round_metrics["duration"].astype(np.float64))
    for ev in first.evaluations:
        np.testing.assert_allclose(ev["virtual_s"], clock[ev["round"] - 1], rtol=1e-6)
    for target, reached in first.targets.items():
        expected = {"round": None, "virtual_s": None}
        for ev in first.evaluations:
            if ev["test_accuracy"] >= target:
                expected = {"round": ev["round"], "virtual_s": ev["virtual_s"]}
                break
        assert reached == expected
    assert first.targets[0.99]["round"] is None or first.summary["best_accuracy"] >= 0.99


def test_progress_shows_bars_of_the_gan_phase_and_the_rounds_and_nothing_when_off(capsys):
    data = make_data()
    options = gandalf.gandalf_options(gan_groups=2, **TINY_GAN)
    run = lambda progress: gandalf.run_gandalf(
        data, LOGREG, ALGORITHM, options, rounds=2, work=WORK, hyper=HYPER, progress=progress
    )
    run(True)
    out, err = capsys.readouterr()
    visits = 2 * gan_members(data, options)  # 2 passes over the largest group's members
    assert "GAN phase (2 groups): 100%" in err and f"{visits}/{visits}" in err
    assert "visit" in err and "wasserstein=" in err and "synthetic rows: 100%" in err
    assert "mediator rounds: 100%" in err and "2/2" in err and "acc=" in err
    assert "synthetic rows added" in out and "gandalf: 2 rounds" in out
    run(False)
    assert capsys.readouterr() == ("", "")


def gan_members(data, options) -> int:
    """Member slots of the largest GAN group (the bar's visits per pass)."""
    counts = rebalance.class_counts(data.train, C)
    groups = rebalance.label_groups(counts, options.gan_groups, 0)
    return int(np.bincount(groups).max())


def test_mediator_only_equals_run_mediator_on_kl_groups():
    data = make_data()
    options = gandalf.gandalf_options(gan=False, group_size=2, passes=2, fault_tolerance=False,
                                      max_wait=20.0)  # fmt: skip
    result = gandalf.run_gandalf(
        data, LOGREG, ALGORITHM, options, rounds=3, work=WORK, hyper=HYPER, seed=1,
        profiles=faulty_profiles(), eval_every=3, progress=False,
    )  # fmt: skip
    groups = kl_groups(CLASS_COUNTS, group_size=2)
    np.testing.assert_array_equal(result.groups.members, groups.members)
    reference = run_mediator(
        data, LOGREG, ALGORITHM, groups, rounds=3, work=WORK, max_wait=20.0, passes=2,
        profiles=faulty_profiles(), hyper=HYPER, seed=1, eval_every=3,
    )  # fmt: skip
    for a, b in zip(jax.tree.leaves(result.history.params), jax.tree.leaves(reference.params)):
        np.testing.assert_array_equal(a, b)
    assert result.summary["synthetic_rows"] == 0
    assert result.evaluations[-1]["test_accuracy"] == reference.evaluations[-1]["accuracy"]


# ---- from the command line: algorithm.name = "gandalf" | "mediator" -------------------------

CLI_SETS = ("data.name='synthetic'", "data.num_clients=8", "sampler.clients_per_round=4",
            "rounds=2", "eval_every=1", "system.dropout=0.3", "algorithm.group_size=4",
            "algorithm.gan_hidden=[16]", "algorithm.gan_batch_size=16")


def _cli(*args: str) -> int:
    from fedjax_het.front import cli

    sets = [a for item in CLI_SETS for a in ("--set", item)]
    return cli.main([*args, *sets])


@pytest.mark.parametrize("name", ["mediator", "gandalf"])
def test_the_cli_runs_mediated_algorithms_and_their_config_reproduces_them(name, tmp_path, capsys):
    import json

    assert _cli("run", "--set", f"algorithm.name={name!r}", "--out", str(tmp_path / "a"),
                "--no-progress") == 0
    out, err = capsys.readouterr()
    assert "best test accuracy" in out and "GAN phase" not in err and "rounds:" not in err
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (summary["synthetic_rows"] > 0) == (name == "gandalf")
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["round"] for line in lines] == [1, 2]
    from fedjax_het.front import cli

    assert cli.main(["run", str(tmp_path / "a" / "config.toml"), "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err  # with progress: the bars
    assert "mediator rounds: 100%" in err and ("GAN phase" in err) == (name == "gandalf")
    again = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert {k: v for k, v in again.items() if "wall" not in k} == {
        k: v for k, v in summary.items() if "wall" not in k}


@pytest.mark.parametrize("setting,message", [
    ("algorithm.tau=1.5", "[algorithm] tau must be in (0, 1]"),
    ("algorithm.gan_groups=0", "[algorithm] gan_groups must be an integer >= 1"),
    ("algorithm.heartbeat=100.0", "[algorithm] heartbeat must be in [0, max_wait=60.0]"),
    ("server.mode='async'", "it takes no [server] table"),
])
def test_bad_mediated_options_are_one_line_config_errors(setting, message, capsys):
    capsys.readouterr()
    assert _cli("config", "--set", "algorithm.name='gandalf'", "--set", setting) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err, err
