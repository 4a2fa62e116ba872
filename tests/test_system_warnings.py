"""The end of a run with a system warns about what a researcher would want to know."""

from fedjax_het.training.metrics import GINI_WARNING, system_warnings


def test_a_healthy_run_has_no_warnings():
    totals = {"clients_never_participated": 0, "participation_gini": 0.2,
              "rounds_nobody_counted": 0}  # fmt: skip
    assert system_warnings(totals, 100, 50) == []


def test_each_problem_is_named_with_its_cause_and_option():
    totals = {"clients_never_participated": 99, "participation_gini": 0.99,
              "rounds_nobody_counted": 7}  # fmt: skip
    never, concentrated, empty = system_warnings(totals, 100, 50)
    assert never.startswith("99 of 100 clients never trained") and "policy.start" in never
    assert "Gini 0.99" in concentrated and "system.availability" in concentrated
    assert empty.startswith("7 of 50 rounds aggregated no update") and "policy.deadline" in empty


def test_the_gini_threshold_and_async_events():
    at = {"participation_gini": GINI_WARNING}
    assert system_warnings(at, 10, 5) == []
    stalled = system_warnings({"stalled_events": 3, "participation_gini": 0.1}, 10, 40)
    assert stalled == [stalled[0]] and stalled[0].startswith("3 of 40 server events")
