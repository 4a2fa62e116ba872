"""What the benchmark measures is what runs: the harness plans its engine rows as ``run`` does.

A flash-deadline config (FLASH devices, a deadline with partial work, dropouts)
is run as ``fedjax-het run`` runs it (``simulate.run`` on the config's
experiment, as ``front.cli`` calls it) and planned by the harness
(``bench_harness.run_setup``); the chunk plan the harness builds its engine row
from must be the one ``run`` records in ``summary.json``. The plan is made for an
accelerator (``step_cost.planning_backend``), with a step threshold small enough
that this tiny model's varying cohort is split into work-sorted chunks.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import bench_harness as harness
import bench_throughput

from fedjax_het import models
from fedjax_het.engine import cohort, memory_estimate, step_cost
from fedjax_het.front import config
from fedjax_het.training import simulate

FLASH_DEADLINE = [
    'data.name="synthetic"', "data.num_clients=32", "sampler.clients_per_round=16",
    "model.name=mlp", "model.hidden=[8]", "rounds=1", "eval_every=1", "engine.devices=1",
    'system.devices="flash"', "system.dropout=0.1", 'policy.kind="deadline"',
    "policy.deadline=20.0", 'policy.on_late="partial"',
]  # fmt: skip


def without_free(line: str) -> str:
    """The plan's line less the free memory it saw (of the moment, not of the plan)."""
    return re.sub(r" of [0-9.]+ [KMGT]?i?B free", "", line)


@pytest.fixture
def accelerator(monkeypatch):
    monkeypatch.setattr(step_cost, "planning_backend", lambda: "gpu")
    monkeypatch.setattr(cohort, "CHUNK_STEP_FLOPS", 1.0)  # WORK_CHUNKS chunks, however small
    # No compiled chunk programs (seconds each on XLA:CPU; tests/test_memory_compiled.py
    # checks them): the plan is the conservative one of a backend without the analysis.
    monkeypatch.setattr(memory_estimate, "chunk_program_bytes", lambda *args: None)


def test_a_flash_deadline_configs_plan_in_the_harness_is_the_one_run_records(
    tmp_path, accelerator
):
    experiment = config.build(config.load(None, FLASH_DEADLINE))
    simulate.run(
        experiment.data,
        *experiment.options(progress=False, out_dir=tmp_path, config=experiment.config),
    )  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    planned = harness.run_setup(
        experiment.data, experiment.model, experiment.algorithm, experiment.sampler,
        **experiment.run_kwargs(),
    )  # fmt: skip
    assert planned.chunk_plan.chunk == summary["chunk"] == 16 // cohort.WORK_CHUNKS
    assert without_free(planned.chunk_plan.describe()) == without_free(summary["chunk_plan"])
    assert "work varies" in summary["chunk_plan"]


@pytest.mark.slow  # compiles two rounds and a schedule
def test_the_throughput_benchmark_builds_its_engine_rows_through_runs_plan(accelerator):
    tiny = bench_throughput.Workload("T", lambda: models.mlp((5,), 3, hidden=(7,)), (5,), 12, 4)
    data = bench_throughput.make_data(tiny, 16)
    setup = bench_throughput.make_setup(tiny, 16, data)
    cell, _ = bench_throughput.variants(
        setup, data, systems=["none", "flash-deadline"], baselines=[], chunks=["auto"],
        unrolls=(1,), algorithms=["fedavg"], algorithm_systems=["none"], loop_clients=None,
    )  # fmt: skip
    rows = {variant.settings["system"]: variant.build().settings for variant in cell}
    assert rows["none"]["chunk"] == 16  # equal work: the whole cohort
    assert rows["flash-deadline"]["chunk"] == 16 // cohort.WORK_CHUNKS
    assert "work varies" in rows["flash-deadline"]["chunk_plan"]
    assert "work varies" not in rows["none"]["chunk_plan"]
