"""The end of a run with a system (and ``hetero describe``) warns about what a researcher would
want to know, naming the actual cause: a client never selected is told from one that was
selected but always unavailable, late or dropped."""

import json
import types

import numpy as np

from fedjax_het.system.participation import GINI_WARNING, never_trained
from fedjax_het.system.participation import warnings as system_warnings
from fedjax_het.system.schedule_row import DROPPED, EMPTY, LATE, OK, UNAVAILABLE


def _schedule(selected, outcome, valid=None):
    selected, outcome = np.array(selected), np.array(outcome)
    valid = np.ones(selected.shape, bool) if valid is None else np.array(valid)
    return types.SimpleNamespace(selected=selected, outcome=outcome, valid=valid)


def test_a_healthy_run_has_no_warnings():
    totals = {
        "clients_never_participated": 0,
        "participation_gini": 0.2,
        "rounds_nobody_counted": 0,
    }
    assert system_warnings(totals, 100, 50) == []


def test_never_trained_tells_each_cause_apart():
    # client 0 trains every round; 1 is always unavailable, 2 always late, 3 always dropped,
    # 4 late once and dropped once, 5 never selected; the last slot of round 3 is empty
    s = _schedule(
        [[0, 1], [0, 2], [0, 3], [0, 4], [0, 4], [0, 0]],
        [[OK, UNAVAILABLE], [OK, LATE], [OK, DROPPED], [OK, LATE], [OK, DROPPED], [OK, EMPTY]],
        [[True, True]] * 5 + [[True, False]],
    )
    assert never_trained(s, 6) == {
        "clients_never_selected": 1,
        "never_trained_because": {"unavailable": 1, "late": 1, "dropped": 1, "mixed": 1},
    }
    totals = {"clients_never_participated": 5, **never_trained(s, 6)}
    (line,) = system_warnings(totals, 6, 6)
    assert line.startswith("5 of 6 clients never trained: 1 was never selected in 6 rounds")
    assert "1 was selected but always unavailable (policy.start" in line
    assert "1 was selected but always late (policy.deadline" in line
    assert "1 was selected but always dropped (system.dropout)" in line
    assert "1 was selected but always unavailable, late or dropped in turn" in line


def test_clients_only_unselected_are_not_blamed_on_their_devices():
    # the README's compression example: every outcome ok, 16 of 100 never drawn
    totals = {
        "clients_never_participated": 16,
        "clients_never_selected": 16,
        "never_trained_because": {"unavailable": 0, "late": 0, "dropped": 0, "mixed": 0},
        "participation_gini": 0.3,
        "rounds_nobody_counted": 0,
    }
    (line,) = system_warnings(totals, 100, 20)
    assert line.startswith("16 of 100 clients never trained: 16 were never selected in 20 rounds")
    for blamed in ("ready", "FLASH", "late", "dropped", "deadline"):
        assert blamed not in line


def test_concentration_and_empty_rounds():
    totals = {
        "clients_never_participated": 0,
        "participation_gini": 0.99,
        "rounds_nobody_counted": 7,
    }
    concentrated, empty = system_warnings(totals, 100, 50)
    assert "Gini 0.99" in concentrated and "system.availability" in concentrated
    assert empty.startswith("7 of 50 rounds aggregated no update") and "policy.deadline" in empty


def test_the_gini_threshold_and_async_events():
    at = {"participation_gini": GINI_WARNING}
    assert system_warnings(at, 10, 5) == []
    stalled = system_warnings({"stalled_events": 3, "participation_gini": 0.1}, 10, 40)
    assert stalled == [stalled[0]] and stalled[0].startswith("3 of 40 server events")
    never = system_warnings({"clients_never_participated": 2, "stalled_events": 0}, 10, 40)
    assert never[0].startswith("2 of 10 clients never trained: none of their updates")


SMALL = [
    "--set",
    'data.name="synthetic"',
    "--set",
    "data.num_clients=20",
    "--set",
    "model.name=logistic_regression",
    "--set",
    "sampler.clients_per_round=4",
]


def test_a_privacy_budget_that_cuts_the_run_says_so_first_and_last(tmp_path, capsys):
    from fedjax_het.front import cli
    from fedjax_het.transforms import privacy
    from fedjax_het.transforms.schema import budget_notes

    budget = ["privacy.noise_multiplier=1.0", "privacy.target_epsilon=4.0", "rounds=30"]
    cut = privacy.rounds_within(4.0, 1.0, 4, 20, 1e-5, most=30)
    assert cut < 30
    sets = [arg for item in budget for arg in ("--set", item)]
    args = ["run", *SMALL, *sets, "--set", "eval_every=100", "--out", str(tmp_path / "r")]
    assert cli.main([*args, "--no-progress"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("note: privacy.target_epsilon = 4 at delta 1e-05 allows ")
    assert f"allows {cut} of the 30 rounds asked" in err[0]
    assert err[-1] == err[0]  # first, and again at the end of the summary
    assert budget_notes({"target_epsilon": 4.0}, 30, 30) == ()  # nothing cut, nothing said


def test_hetero_describe_warns_as_a_run_does(tmp_path, capsys):
    from fedjax_het.front import cli

    args = [
        "hetero",
        "describe",
        *SMALL,
        "--set",
        "rounds=5",
        "--set",
        "system.devices=flash",
        "--set",
        "system.availability=strict",
        "--set",
        "policy.kind=readiness",
        "--mc-rounds",
        "5",
        "--mc-trips",
        "5",
        "--out",
        str(tmp_path / "h"),
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "h" / "system_summary.json").read_text())
    s = summary["schedule"]
    never = s["participation"]["never"]
    assert never > 0 and summary["warnings"][0].startswith(f"{never} of 20 clients never trained")
    assert f"warning: {summary['warnings'][0]}" in out
    unready = s.get("never_selected_never_ready", 0)
    verb = "was" if unready == 1 else "were"
    assert unready > 0 and f"{unready} {verb} never ready when a round started" in out
