"""``fedjax-het compare`` and ``results.load``: run directories read back and set side by side."""

import json

import numpy as np
import pytest

from fedjax_het import results
from fedjax_het.front import cli, compare, summary_lines

SYSTEM = [
    "rounds=6", "eval_every=3", "data.num_clients=12", "sampler.clients_per_round=4",
    "system.devices=lognormal", "system.step_time=0.2", "policy.kind=deadline",
    "policy.deadline=30", "data.name=synthetic", "model.name=logistic_regression",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of FedAvg at one learning rate, one at another: two groups."""
    root = tmp_path_factory.mktemp("runs")
    made = {}
    for name, extra in {
        "a0": ["seed=0"], "a1": ["seed=1"], "b0": ["seed=0", "algorithm.client_lr=0.3"],
    }.items():  # fmt: skip
        args = ["run", "--out", str(root / name), "--no-progress"]
        for item in SYSTEM + extra:
            args += ["--set", item]
        assert cli.main(args) == 0
        made[name] = root / name
    return made


def test_load_reads_a_run_back(runs):
    record = results.load(runs["a1"])
    assert record.status == "completed" and record.config["seed"] == 1
    assert [m["round"] for m in record.metrics] == [0, 3, 6]
    np.testing.assert_array_equal(
        record.series("test_accuracy"),
        [json.loads(line)["test_accuracy"] for line in (runs["a1"] / "metrics.jsonl").read_text().splitlines()],
    )
    assert record.metrics[-1]["virtual_s"] > 0


def test_seeds_group_and_labels_name_what_differs(runs):
    groups = compare.group_runs([results.load(p) for p in runs.values()])
    assert [len(g.runs) for g in groups] == [2, 1]
    assert [r.path.name for r in groups[0].runs] == ["a0", "a1"]
    assert groups[1].label == "client_lr=0.3"
    assert groups[0].label.startswith("client_lr=") and "seed" not in groups[0].label


def test_the_table_has_each_groups_figures_and_the_time_to_target(runs, tmp_path):
    records = [results.load(p) for p in runs.values()]
    low = min(r.metrics[-1]["test_accuracy"] for r in records)
    result = compare.compare(list(runs.values()), x="virtual_hours", target=low,
                             figure=tmp_path / "c.png")  # fmt: skip
    assert (tmp_path / "c.png").stat().st_size > 0
    lines = result.table.splitlines()
    assert len(lines) == 2 + 2 and "virtual h to" in lines[0]
    group_a = [r for r in records if r.path.name.startswith("a")]
    finals = [r.metrics[-1]["test_accuracy"] for r in group_a]
    assert f"{np.mean(finals):.4g} ({min(finals):.4g}-{max(finals):.4g})" in lines[2]
    # every run reached the lowest final accuracy, at the latest in its last evaluation
    hours = [compare.reached(r, "test_accuracy", low, "virtual_hours") for r in records]
    assert all(h is not None and h <= r.metrics[-1]["virtual_s"] / 3600 for h, r in zip(hours, records))


def test_the_command_writes_the_plot_and_table_and_keeps_existing_files(runs, tmp_path, capsys):
    out = tmp_path / "cmp.png"
    args = ["compare", *map(str, runs.values()), "--x", "bytes", "--target", "0.3", "--out", str(out)]
    assert cli.main(args) == 0
    assert out.is_file() and out.with_suffix(".md").read_text().startswith("| run |")
    assert "MB to 0.3" in capsys.readouterr().out
    assert cli.main(args) == 2
    assert "already exist" in capsys.readouterr().err
    assert cli.main([*args, "--overwrite"]) == 0


def test_bad_inputs_are_one_line_errors(runs, tmp_path, capsys):
    assert cli.main(["compare", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert cli.main(["compare", str(runs["a0"]), "--metric", "nope", "--out", str(tmp_path / "y.png")]) == 2
    assert "no 'nope' in the metrics" in capsys.readouterr().err
    with pytest.raises(ValueError, match="x must be one of"):
        compare.compare([runs["a0"]], x="hours")


def test_the_end_of_a_run_with_a_system_says_what_it_cost(runs):
    summary = results.load(runs["a0"]).summary
    lines = summary_lines.system_lines(summary, 12)
    assert lines[0].startswith(f"system: {summary['virtual_s'] / 3600:.3g} virtual hours")
    assert f"outcomes ok {summary['outcomes']['ok']}" in lines[0] and " up" in lines[0]
    never = summary["clients_never_participated"]
    assert lines[1] == (f"participation: Gini {summary['participation_gini']:.3f}, "
                        f"{never} of 12 clients never trained")  # fmt: skip
    assert lines[2].startswith("to accuracy: 0.5 ")
    assert "at event" in summary_lines.system_lines(summary, 12, "event")[2] or "not reached" in lines[2]
    assert summary_lines.system_lines({"rounds": 3, "final_test_accuracy": 0.5}, 12) == []
