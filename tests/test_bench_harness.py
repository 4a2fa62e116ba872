"""The benchmark harness (experiments/bench_harness.py) and the suite's target table.

On a tiny MLP population: the engine's round on a heterogeneous schedule row
(partial work, late and dropped clients) matches a per-client loop that runs
each client's own steps and skips the clients that do not count (float32:
rel. 1e-5 of the round's update), and differs from the homogeneous round; the
gate rejects a round whose update is off by 1 %; a loop timed on part of its
cohort is labelled as extrapolated; a variant that fails leaves a row with its
error while the others are timed; the gate round runs a program compiled under
"highest" matmul precision and the timed rounds one compiled under the run's;
the target table says PASS / FAIL only on the target devices.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import bench_harness as harness
import bench_throughput

from fedjax_het import models
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import ClientArrays
from fedjax_het.system.schedule import OK

COHORT, EXAMPLES = 8, 12


@pytest.fixture(scope="module")
def setup() -> harness.Setup:
    population = 2 * COHORT
    data = np.random.default_rng(0)
    x = data.standard_normal((population * EXAMPLES, 5), dtype=np.float32)
    y = data.integers(0, 3, population * EXAMPLES, dtype=np.int32)
    offset = np.arange(population, dtype=np.int32) * EXAMPLES
    train = ClientArrays(x, y, offset, np.full(population, EXAMPLES, np.int32))
    model = models.mlp((5,), 3, hidden=(7,))
    return harness.make_setup(model, train, LocalWork(4, epochs=1.0), COHORT)


def rounds(setup, *implementations):
    return [jax.device_get(impl.run()[0]) for impl in implementations]


def test_heterogeneous_round_matches_loop_and_differs_from_homogeneous(setup):
    plan, summary = harness.flash_deadline_plan(setup, dropout=0.3)
    outcome, done = np.asarray(plan.outcome), np.asarray(plan.steps_done)
    full = setup.round_.spec.max_steps
    assert np.any(outcome != OK) and np.any((outcome == OK) & (done < full)), summary
    het_loop, het_engine, engine = rounds(
        setup,
        harness.per_client_loop(setup, plan),
        harness.engine(setup, 1, 1, plan=plan),
        harness.engine(setup, 1, 1),
    )
    assert harness.gate_error(het_engine, het_loop, setup.params) < 1e-5
    assert harness.gate_error(engine, het_loop, setup.params) > 1e-1


def test_gate_rejects_an_update_off_by_one_percent_and_records_failures(setup):
    loop = harness.per_client_loop(setup)
    (reference,) = rounds(setup, loop)
    off = jax.tree.map(lambda p, q: q + 1.01 * (p - q), reference, setup.params)

    def broken():
        raise MemoryError("RESOURCE_EXHAUSTED: out of memory")

    variants = [
        harness.Variant("loop", {"system": "none"}, lambda: loop),
        harness.Variant("engine", {"system": "none", "chunk": 1}, broken),
        harness.Variant(
            "engine",
            {"system": "none", "chunk": 2},
            lambda: harness.Implementation(lambda: (off, off), 0.0),
        ),
        harness.Variant(
            "engine", {"system": "none", "chunk": 4}, lambda: harness.engine(setup, 4, 1)
        ),
    ]
    rows = harness.measure(setup.params, variants, warmup=0, reps=1, max_s=1.0)
    assert "MemoryError" in rows[1]["error"] and "median_s" not in rows[1]
    assert not rows[2]["gate"]["passed"] and "median_s" not in rows[2]
    assert rows[3]["gate"]["passed"] and rows[3]["reps_timed"] == 1 and "ratio_to_loop" in rows[3]


def test_a_round_failing_while_timed_keeps_the_other_rows(setup):
    """On a GPU the interleaved timing holds every implementation's buffers; one running out
    of memory there must not lose the cell's other rows."""
    loop = harness.per_client_loop(setup)
    (reference,) = rounds(setup, loop)
    calls = []

    def flaky():  # the gate round passes, the timed ones run out of memory
        calls.append(1)
        if len(calls) > 1:
            raise MemoryError("RESOURCE_EXHAUSTED: out of memory")
        return reference, reference

    variants = [
        harness.Variant("loop", {"system": "none"}, lambda: loop),
        harness.Variant("bare_vmap", {"system": "none"}, lambda: harness.Implementation(flaky, 0.0)),
    ]
    rows = harness.measure(setup.params, variants, warmup=0, reps=2, max_s=1.0)
    assert rows[0]["reps_timed"] == 2 and "median_s" in rows[0]
    assert "timed round: MemoryError" in rows[1]["error"] and "median_s" not in rows[1]


def test_loop_timed_on_part_of_the_cohort_is_labelled_extrapolated(setup):
    variants = [
        harness.Variant("loop", {"system": "none"}, lambda: harness.per_client_loop(setup, None, 2))
    ]
    (row,) = harness.measure(setup.params, variants, warmup=0, reps=1, max_s=1.0)
    assert row["extrapolated"] and row["timed_clients"] == 2 and row["reps_timed"] == 1


def test_gate_round_runs_under_highest_precision_and_timed_rounds_under_the_runs(setup):
    built = []

    def engine():
        built.append(jax.config.jax_default_matmul_precision)
        return harness.engine(setup, 1, 1)

    variants = [
        harness.Variant("loop", {"system": "none"}, lambda: harness.per_client_loop(setup)),
        harness.Variant("engine", {"system": "none", "chunk": 1}, engine),
    ]
    rows = harness.measure(
        setup.params, variants, warmup=0, reps=1, max_s=1.0, matmul_precision="default"
    )
    assert built == ["highest", "default"]  # two compilations: the gate's, then the timed one
    for row in rows:
        assert (row["gate_matmul_precision"], row["matmul_precision"]) == ("highest", "default")
        assert row["timed_reference"] == "loop" and row["timed_rel_l2_to_reference"] < 1e-5
        assert "gate_compile_s" in row and row["reps_timed"] == 1
    built.clear()
    (row,) = harness.measure(setup.params, variants[1:], warmup=0, reps=1, max_s=1.0)
    assert built == ["highest"] and row["matmul_precision"] == "highest"  # one program


def engine_row(workload, cohort, system="none", algorithm="fedavg", **values):
    """A benchmark row of the engine at ``workload``/``cohort`` with ``values``."""
    return {
        "workload": workload,
        "cohort": cohort,
        "implementation": "engine",
        "algorithm": algorithm,
        "system": system,
        **values,
    }


def test_targets_are_judged_only_on_the_target_devices():
    suite = bench_throughput.SUITES["gpu"]

    rows = [
        engine_row("W1", 1000, "flash-deadline", ratio_to_bare_vmap=1.2, ratio_to_homogeneous=0.7),
        engine_row("W1", 1000, "none", ratio_to_bare_vmap=1.1, ratio_to_loop=0.4),
        engine_row("W1", 1000, "none", "scaffold", ratio_to_fedavg=1.4),
        engine_row("W2", 100, "flash-deadline", ratio_to_bare_vmap=1.3),
        engine_row("W2", 1000, "none", "scaffold", median_s=2.0),
        {"workload": "W1", "cohort": 10000, "implementation": None, "error": "OOM"},
    ]
    judged = {
        (t["metric"], t["workload"], t["cohort"], t["system"], t["algorithm"]): t
        for t in bench_throughput.evaluate_targets(
            rows, suite, quick=False, device="gpu:NVIDIA H200"
        )
    }
    status = {key[:4]: t["status"] for key, t in judged.items()}
    het = "flash-deadline"
    assert status[("ratio_to_bare_vmap", "W1", 1000, het)] == "PASS"  # 1.2 <= 1.25
    assert judged[("ratio_to_bare_vmap", "W1", 1000, het, "fedavg")]["homogeneous_value"] == 1.1
    assert status[("ratio_to_homogeneous", "W1", 1000, het)] == "PASS"  # 0.7 <= 0.75
    assert status[("ratio_to_bare_vmap", "W2", 100, het)] == "FAIL"  # 1.3 > 1.25
    assert status[("ratio_to_bare_vmap", "W1", 10000, het)] == "error"  # the cell's OOM row
    assert status[("ratio_to_loop", "W1", 1000, "none")] == "PASS"  # 0.4 <= 0.5
    assert status[("ratio_to_loop", "W2", 10, "none")] == "not measured"
    assert judged[("ratio_to_fedavg", "W1", 1000, "none", "scaffold")]["status"] == "FAIL"  # 1.4
    assert judged[("runs", "W2", 1000, "none", "scaffold")]["status"] == "PASS"
    assert len(judged) == len(suite.targets) == 25  # W1/10,000 homogeneous vs bare; SCAFFOLD there
    elsewhere = bench_throughput.evaluate_targets(rows, suite, quick=False, device="cpu:cpu")
    assert {t["status"] for t in elsewhere} == {
        "not an H100/H200",
        "not measured",
        "error",
        "no value",  # the W2/100 heterogeneous row has no ratio_to_homogeneous
    }
    cpu = bench_throughput.evaluate_targets(
        [engine_row("W1", 100, "flash-deadline", ratio_to_homogeneous=0.8)],
        bench_throughput.SUITES["cpu"],
        quick=False,
        device="cpu:cpu",
    )
    assert [t["status"] for t in cpu] == ["not measured"] * 3 + ["FAIL"]
