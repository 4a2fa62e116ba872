"""The device check's new targets and their summaries, on hand-made rows (no device needed).

Expected values are derived by hand from the shapes: a dense layer of ``i`` inputs and
``o`` units costs ``2 i o`` forward FLOPs a row, so the tiny MLP 4-8-8-3 costs
``2 (32 + 64 + 24) = 240`` and at width 1/2 (4-4-4-3) ``2 (16 + 16 + 12) = 88``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))

import bench_throughput
import compute_bound
import device_summary
import width_share
from test_bench_harness import engine_row

from fedjax_het import models
from fedjax_het.algorithms.heterofl import heterofl

TINY = models.mlp((4,), 3, hidden=(8, 8))
H200 = "gpu:NVIDIA H200"


def test_a_cohorts_width_share_is_the_mean_of_its_clients_flop_shares():
    share = width_share.cohort_share(TINY, (4,), (1.0, 0.5), [0, 1, 2, 3, 5])
    half = 88 / 240  # levels 0, 1, 0, 1, 1
    assert share["mean_width"] == pytest.approx((1 + 0.5 + 1 + 0.5 + 0.5) / 5)
    assert share["width_flop_share"] == pytest.approx((2 + 3 * half) / 5)
    assert share["width_flop_limit"] == pytest.approx(1.25 * (2 + 3 * half) / 5)
    # the one model at the mean width 0.7: ceil(0.7 x 8) = 6 units, 2 (24 + 36 + 18) = 156
    assert share["mean_width_model_flop_share"] == pytest.approx(156 / 240)


def test_widths_are_dealt_as_heterofl_deals_them():
    algorithm = heterofl(widths=(1.0, 0.5, 0.25))
    params = TINY.init(jax.random.key(0))
    state = algorithm.server_init(params, algorithm.hyper(), 7)
    np.testing.assert_array_equal(state.levels, width_share.dealt_levels(range(7), 3))


def test_the_compute_bound_is_three_forward_passes_at_the_datasheets_rate():
    flops = compute_bound.round_flops(TINY, (4,), 10)
    assert flops == 3 * 240 * 10
    assert compute_bound.bound_s(flops, H200) == pytest.approx(flops / 67e12)
    assert compute_bound.peak_float32("gpu:NVIDIA H100 PCIe") == 51e12  # not the SXM's 67
    assert compute_bound.bound_s(flops, "cpu:cpu") is None


def judged(rows, device=H200):
    targets = bench_throughput.evaluate_targets(
        rows, bench_throughput.SUITES["gpu"], quick=False, device=device
    )
    return {(t["claim"].split()[0], t["workload"], t["cohort"], t["algorithm"]): t for t in targets}


@pytest.mark.parametrize(("ratio", "status"), [(0.42, "PASS"), (0.43, "FAIL")])
def test_the_heterofl_target_scales_with_the_cohorts_width_share(ratio, status):
    share = {"width_flop_share": 0.338, "mean_width": 0.47, "mean_width_model_flop_share": 0.23}
    row = engine_row("W2", 100, algorithm="heterofl", ratio_to_fedavg=ratio, median_s=0.05)
    rows = [{**row, **share}]
    target = judged(rows)[("HeteroFL", "W2", 100, "heterofl")]
    assert target["limit"] == pytest.approx(1.25 * 0.338)  # 0.4225
    assert target["status"] == status
    assert "0.338" in target["note"] and "mean width 0.470" in target["note"]


def test_a_heterofl_row_without_its_share_has_no_limit_to_be_judged_by():
    rows = [engine_row("W2", 100, algorithm="heterofl", ratio_to_fedavg=0.1, median_s=0.05)]
    target = judged(rows)[("HeteroFL", "W2", 100, "heterofl")]
    assert (target["limit"], target["status"]) == (None, "no value")


def test_the_w2_1000_runs_targets_carry_the_plans_chunk_and_bytes():
    plan = {"needed": 3 * 2**30, "free": 130 * 2**30, "source": "xla"}
    rows = [
        engine_row("W2", 1000, median_s=0.9, chunk=500, plan_bytes=plan),
        engine_row("W2", 1000, algorithm="scaffold", error="RESOURCE_EXHAUSTED: out of memory"),
    ]
    targets = judged(rows)
    fedavg = targets[("FedAvg", "W2", 1000, "fedavg")]
    assert fedavg["status"] == "PASS" and fedavg["note"].startswith("chunk 500: needs 3")
    assert targets[("SCAFFOLD", "W2", 1000, "scaffold")]["status"] == "FAIL"
    assert judged(rows, "cpu:cpu")[("FedAvg", "W2", 1000, "fedavg")]["status"] == "not an H100/H200"


def test_evaluate_leaves_out_another_benchmarks_rows(tmp_path):
    path = tmp_path / "throughput.jsonl"
    rows = [
        {"benchmark": "conv", "workload": "W2", "cohort": 100, "implementation": "engine"},
        {**engine_row("W2", 1000, median_s=0.9), "suite": "gpu", "quick": False},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench_throughput.evaluate_file(str(path), None)
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["evaluated_rows"] == 1


def conv_rows(device="NVIDIA H200", cohort=100, auto_s=0.06, loop_s=0.15, bound_s=0.02):
    shared = {"benchmark": "conv", "device": device, "cohort": cohort, "compute_bound_s": bound_s}
    plan = {"chunk_from": "run's plan", "chunk": cohort}
    return [
        {**shared, "implementation": "loop", "conv": "xla", "median_s": loop_s},
        {
            **shared,
            **plan,
            "implementation": "engine",
            "engine_conv": "auto",
            "conv": "xla",
            "median_s": auto_s,
            "ratio_to_loop": auto_s / loop_s,
            "ratio_to_compute_bound": None if bound_s is None else auto_s / bound_s,
        },
        {
            **shared,
            **plan,
            "implementation": "engine",
            "engine_conv": "the other formulation",
            "conv": "patches",
            "error": "RESOURCE_EXHAUSTED",
        },
    ]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_conv_summary_judges_the_plans_round_against_the_loop_and_the_bound(tmp_path):
    lines = device_summary.conv(write(tmp_path / "t.jsonl", conv_rows()))
    text = "\n".join(lines)
    assert "xla at chunk 100, 0.0600 s a round, 0.40x the loop, 3.00x the bound" in text
    assert "the other formulation: RESOURCE_EXHAUSTED" in text
    assert lines[-2].endswith("0.40x, PASS") and lines[-1].endswith("3.00x, FAIL")
    fast = "\n".join(device_summary.conv(write(tmp_path / "f.jsonl", conv_rows(auto_s=0.039))))
    assert fast.endswith("1.95x, PASS")
    elsewhere = device_summary.conv(
        write(tmp_path / "c.jsonl", conv_rows("cpu", 2, 9.0, 8.0, None))
    )
    assert elsewhere[-2].endswith("1.12x, not judged")
    assert elsewhere[-1].endswith("-, no value (no peak float32 figure for this device)")
    assert device_summary.conv(tmp_path / "none.jsonl")[0].endswith(
        "not measured (no bench_conv rows in throughput.jsonl)."
    )


def headline_row(wall_s, rounds=1500, device="NVIDIA H200"):
    return {
        "setting": "fedjax_emnist",
        "rounds": rounds,
        "clients": 3400,
        "device": device,
        "wall_s": wall_s,
        "data_and_build_s": 4.0,
        "final_test_accuracy": 0.8,
        "chunk_plan": "chunk 50 of 50",
    }


def scale_row(system, median_s, population=1_000_000, device=H200):
    return {
        "benchmark": "scale",
        "implementation": "engine",
        "system": system,
        "population": population,
        "cohort": 10_000,
        "median_s": median_s,
        "data_s": 9.0,
        "peak_rss_gb": {"after_data_gb": 3.1, "after_timing_gb": 4.2},
        "env": {"device": device},
    }


@pytest.mark.parametrize(
    ("rows", "statuses"),
    [
        ([headline_row(59.0)], ["target 60 s: PASS"]),
        ([headline_row(61.0)], ["target 60 s: FAIL"]),
        ([headline_row(10.0, rounds=2)], ["target 60 s: not judged"]),
        (
            [scale_row("none", 0.15), scale_row("flash-deadline", 0.25)],
            ["target 0.2 s: PASS", "target 0.2 s: FAIL"],
        ),
        ([scale_row("none", 0.1, population=1000)], ["target 0.2 s: not judged"]),
        ([scale_row("none", 0.1)], ["peak RSS 4.2 GB"]),
    ],
)
def test_the_end_to_end_summary_judges_the_headline_and_the_scale_rows(tmp_path, rows, statuses):
    lines = device_summary.end_to_end(write(tmp_path / "e.jsonl", rows))
    found = [line for line in lines if "target" in line]
    assert len(found) == len(statuses)
    assert all(status in line for status, line in zip(statuses, found))


def test_the_end_to_end_summary_says_what_was_not_measured(tmp_path):
    lines = device_summary.end_to_end(tmp_path / "missing.jsonl")
    assert [line.split(":")[0] for line in lines] == [
        "Headline (FedJAX's EMNIST setting)",
        "Scale",
    ]
    assert all("not measured" in line for line in lines)


def sweep_row(sweep_vmap_s, device=H200):
    e2e = {"sweep_map_s": 9.0, "sweep_vmap_s": sweep_vmap_s, "sequential_s": 40.0}
    return {
        "end_to_end": {**e2e, "ratio_sequential_over_sweep_vmap": 40.0 / sweep_vmap_s},
        "env": {"device": device},
    }


@pytest.mark.parametrize(
    ("sweep_vmap_s", "device", "status"),
    [
        (10.0, H200, "0.25x the sequential runs (target 0.25x: PASS)"),
        (10.5, H200, "0.26x the sequential runs (target 0.25x: FAIL)"),
        (5.0, "cpu:cpu", "0.12x the sequential runs (target 0.25x: not judged)"),
    ],
)
def test_the_sweep_summary_judges_the_vmap_sweep_against_the_sequential_runs(
    tmp_path, sweep_vmap_s, device, status
):
    (line,) = device_summary.sweep(write(tmp_path / "s.jsonl", [sweep_row(sweep_vmap_s, device)]))
    assert status in line
