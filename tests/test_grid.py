"""A grid of runs: axes parsed, cells validated and grouped into programs, each cell what
``simulate.run`` of its config trains, written so that ``fedjax-het run`` reproduces a cell."""

import csv
import json
import logging
import tomllib

import jax
import numpy as np
import pytest

from fedjax_het.front import cli, grid
from fedjax_het.front import config as config_lib
from fedjax_het.front.config import ConfigError
from fedjax_het.front.sweep import Cell, sweep
from fedjax_het.training import simulate

TINY = [
    'data.name="synthetic"', "data.num_clients=6", "data.num_features=8", "data.num_classes=3",
    "sampler.clients_per_round=3", "model.name=logistic_regression", "rounds=4", "eval_every=2",
    "local.batch_size=5",
]
# Log-normal devices and a deadline with partial work, so the system numbers change who
# finishes what (with 6 local steps of 0.1 s at the median, 0.4 s cuts most clients short).
SYSTEM = [
    'system.devices="lognormal"', "system.step_time=0.1", "system.step_time_sigma=0.8",
    'policy.kind="deadline"', 'policy.on_late="partial"',
]
# Batched matrix products may round differently from one run's: 1e-5 relative (tests/test_sweep).
RTOL, ATOL = 1e-5, 1e-6


def sets(*extra: str) -> list[str]:
    return [*TINY, *extra]


def plan(*specs: str, extra: tuple[str, ...] = (), **kwargs) -> grid.Plan:
    return grid.plan(None, sets(*extra), [grid.parse_axis(s) for s in specs], **kwargs)


# --- parsing -------------------------------------------------------------------------------


def test_axes_read_lists_ranges_and_toml_values():
    assert grid.parse_axis("algorithm.client_lr=0.01, 0.03,0.1").values == (0.01, 0.03, 0.1)
    assert grid.parse_axis("seed=0..3").values == (0, 1, 2, 3)
    assert grid.parse_axis("seed=-1..1,10").values == (-1, 0, 1, 10)
    assert grid.parse_axis("model.hidden=[100, 100],[200]").values == ([100, 100], [200])
    assert grid.parse_axis('engine.weighting="uniform",examples').values == ("uniform", "examples")
    assert grid.parse_axis("local.shuffle=true,false").values == (True, False)
    axis = grid.parse_axis("data.name='a,b',c")
    assert axis.key == "data.name" and axis.values == ("a,b", "c")


@pytest.mark.parametrize("spec, message", [
    ("seed", "expects KEY=V1,V2"),
    ("=1,2", "expects KEY=V1,V2"),
    ("seed=", "empty value"),
    ("algorithm.client_lr=0.1,,0.2", "empty value"),
    ("seed=3..1", "range 3..1 is empty"),
    ("seed=0..2,1", "value 1 appears twice"),
])
def test_bad_axes_are_one_line_errors(spec, message):
    with pytest.raises(ConfigError, match=message) as error:
        grid.parse_axis(spec)
    assert "\n" not in str(error.value)


def test_every_cell_is_validated_and_an_error_names_the_cell_and_key():
    with pytest.raises(ConfigError, match=r"grid cell 0 \(algorithm\.client_rate=0\.1\): unknown "
                       r"key 'algorithm\.client_rate' \(did you mean 'algorithm\.client_lr'\?\)"):
        plan("algorithm.client_rate=0.1,0.2")
    with pytest.raises(ConfigError, match=r"grid cell 1 \(seed=0, algorithm\.client_lr=-1\): "
                       r"algorithm\.client_lr must lie in \(0, inf\), got -1"):
        plan("seed=0,1", "algorithm.client_lr=0.1,-1")
    with pytest.raises(ConfigError, match="'seed' is given twice"):
        plan("seed=0,1", "seed=2")
    with pytest.raises(ConfigError, match="at least one --grid"):
        grid.plan(None, TINY, [])


# --- grouping ------------------------------------------------------------------------------


def test_seeds_hyperparameters_and_system_numbers_share_one_program():
    grid_ = plan("algorithm.client_lr=0.05,0.5", "seed=0,1", "system.step_time=0.05,0.1",
                 "policy.deadline=0.4,2.0", extra=tuple(SYSTEM), one_program=True)
    assert len(grid_.cells) == 16 and len(grid_.programs) == 1 and grid_.splitting == ()
    assert grid_.programs[0].swept
    cell = grid_.cells[5]  # client_lr 0.05, seed 1, step_time 0.05, deadline 2.0
    assert cell.values == {"algorithm.client_lr": 0.05, "seed": 1, "system.step_time": 0.05,
                           "policy.deadline": 2.0}
    assert cell.seed == 1 and cell.hyper == {"client_lr": 0.05}
    assert cell.config["policy"]["deadline"] == 2.0 and cell.config["system"]["step_time"] == 0.05


def test_keys_that_change_the_program_split_it_and_are_named():
    grid_ = plan("algorithm.client_lr=0.05,0.5", "local.batch_size=5,10", "seed=0,1")
    assert len(grid_.programs) == 2 and grid_.splitting == ("local.batch_size",)
    assert [p.cells for p in grid_.programs] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    with pytest.raises(ConfigError, match=r"--one-program: the grid needs 2 programs: "
                       r"local\.batch_size changes the compiled program; one program varies only "
                       r"seed, algorithm\.client_lr, algorithm\.server_lr"):
        plan("algorithm.client_lr=0.05,0.5", "local.batch_size=5,10", one_program=True)
    # A seed of Bernoulli availability draws another availability store: systems that do
    # not stack (simulate.plan_runs) are separate programs, even though the key is a number.
    bernoulli = plan("system.seed=0,1", extra=('system.availability="bernoulli"',))
    assert bernoulli.splitting == ("system.seed",)


def test_configs_a_sweep_cannot_run_go_cell_by_cell():
    grid_ = plan("seed=0,1", extra=('algorithm.name="scaffold"', 'engine.client_state="host"'))
    assert [(p.cells, p.swept) for p in grid_.programs] == [((0,), False), ((1,), False)]
    with pytest.raises(ConfigError, match="grid cell 0 cannot share a program"):
        plan("seed=0,1", extra=('engine.client_state="host"',), one_program=True)


# --- running -------------------------------------------------------------------------------


def alone(config) -> simulate.History:
    """``simulate.run`` of one cell's resolved config, as ``fedjax-het run`` would train it."""
    exp = config_lib.build(config)
    return simulate.run(
        exp.data,
        *exp.options(progress=False),
    )


def test_each_cell_trains_what_run_trains_from_its_config(tmp_path):
    grid_ = plan("algorithm.client_lr=0.05,0.5", "policy.deadline=0.4,2.0", "seed=0,1",
                 extra=tuple(SYSTEM), one_program=True)
    histories = grid.run(grid_, tmp_path, progress=False)
    assert len(histories) == 8
    for i in (2, 5):  # (0.05, deadline 2.0, seed 0) and (0.5, deadline 0.4, seed 1)
        want = alone(grid_.cells[i].config)
        # On CPU the sweep runs its cells one at a time in the program: bitwise equal.
        assert histories[i].summary["cell_batch"] == 1
        for got, ref in zip(jax.tree.leaves(histories[i].params), jax.tree.leaves(want.params)):
            np.testing.assert_array_equal(got, ref)
        assert histories[i].summary["outcomes"] == want.summary["outcomes"]
        assert [m["test_loss"] for m in histories[i].metrics] == [
            m["test_loss"] for m in want.metrics]
    # The cells really differ: by learning rate alone (0 vs 4), by deadline alone (0 vs 2).
    first = jax.tree.leaves(histories[0].params)[0]
    for other in (4, 2):
        assert not np.allclose(first, jax.tree.leaves(histories[other].params)[0], rtol=1e-3)


def test_chunks_of_cells_reuse_one_compilation_and_match_one_vmap(caplog):
    exp = config_lib.build(config_lib.load(None, TINY))
    kwargs = {k: v for k, v in exp.run_kwargs().items()
              if k not in ("seed", "hyper", "system", "select")}
    kwargs["devices"] = 1  # on a mesh the first block's unsharded state compiles a second block
    cells = [Cell(seed=s, hyper={"client_lr": lr}) for lr in (0.05, 0.5) for s in (0, 1)]
    together = sweep(exp.data, exp.model, exp.algorithm, exp.sampler, cells=cells,
                     cell_batch=4, progress=False, **kwargs)
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        chunked = sweep(exp.data, exp.model, exp.algorithm, exp.sampler, cells=cells,
                        cells_at_once=3, progress=False, **kwargs)
    # Two chunks of 3 (the second padded with a copy of cell 3): one compiled block. The
    # chunks run their cells one at a time (CPU), against all 4 in one vmap.
    assert sum("run_block" in r.getMessage() for r in caplog.records
               if r.getMessage().startswith("Finished XLA compilation")) == 1
    assert [(h.summary["cells_at_once"], h.summary["cell_batch"]) for h in chunked] == [(3, 1)] * 4
    assert together[0].summary["cell_batch"] == 4
    for a, b in zip(together, chunked):
        for got, want in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_cells_are_checked_before_compiling():
    exp = config_lib.build(config_lib.load(None, TINY))
    kwargs = {"rounds": 2, "work": exp.work, "progress": False}
    with pytest.raises(ValueError, match="cell 1: fedavg: client_lr must lie in"):
        sweep(exp.data, exp.model, exp.algorithm, exp.sampler,
              cells=[Cell(hyper={"client_lr": 0.1}), Cell(hyper={"client_lr": -0.1})], **kwargs)
    with pytest.raises(ValueError, match="cells, or systems and seeds, not both"):
        sweep(exp.data, exp.model, exp.algorithm, exp.sampler, cells=[Cell()], seeds=(1, 2),
              **kwargs)


# --- the command ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "grid"
    args = [a for s in TINY for a in ("--set", s)]
    code = cli.main(["sweep", *args, "--grid", "algorithm.client_lr=0.05,0.5", "--grid",
                     "seed=0..1", "--out", str(out), "--no-progress"])
    assert code == 0
    return out


def test_sweep_writes_the_table_the_plot_and_a_directory_per_cell(swept):
    with (swept / "grid.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["algorithm.client_lr"], r["seed"], r["dir"]) for r in rows] == [
        ("0.05", "0", "cell-000"), ("0.05", "1", "cell-001"), ("0.5", "0", "cell-002"),
        ("0.5", "1", "cell-003"),
    ]
    record = json.loads((swept / "grid.json").read_text())
    assert record["programs"] == 1 and record["axes"] == {"algorithm.client_lr": [0.05, 0.5],
                                                          "seed": [0, 1]}
    for row in record["rows"]:
        summary = json.loads((swept / row["dir"] / "summary.json").read_text())
        assert row["final_test_accuracy"] == summary["final_test_accuracy"]
        config = tomllib.loads((swept / row["dir"] / "config.toml").read_text())
        assert (config["algorithm"]["client_lr"], config["seed"]) == (
            row["algorithm.client_lr"], row["seed"])
    assert (swept / "grid.png").stat().st_size > 0


def test_run_of_a_cell_config_reproduces_the_cell(swept, tmp_path):
    cell = swept / "cell-002"
    assert cli.main(["run", str(cell / "config.toml"), "--out", str(tmp_path), "--no-progress"]) == 0
    read = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    got, want = read(cell), read(tmp_path)
    assert [m["round"] for m in got] == [m["round"] for m in want] == [0, 2, 4]
    for key in ("test_loss", "test_accuracy", "client_accuracy_mean"):
        np.testing.assert_allclose([m[key] for m in got], [m[key] for m in want], rtol=RTOL,
                                   atol=ATOL)


def test_sweep_config_errors_are_one_line_with_exit_code_2(capsys):
    args = [a for s in TINY for a in ("--set", s)]
    assert cli.main(["sweep", *args, "--grid", "model.name=mlp,logistic_regression",
                     "--one-program"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.name changes the compiled program" in err
    assert cli.main(["sweep", *args, "--grid", "sampler.clients_per_round=3,60"]) == 2
    assert "grid cell 1 (sampler.clients_per_round=60)" in capsys.readouterr().err
