"""The device check's summary of its stages beside the throughput targets (Markdown).

Reads what ``device_check.sh`` left in its output folder, a part each (issue "Accelerator
throughput II"; judged on an H100 or H200 only, "not judged" elsewhere):

* ``conv`` (item 1): ``bench_conv.py``'s rows in ``throughput.jsonl`` (``benchmark``
  "conv"): W2's round as ``run`` builds it (the plan's formulation of the convolutions) at
  most LOOP_RATIO = 0.5x the per-client loop and at most ``compute_bound.BOUND_FACTOR`` =
  2x its float32 compute bound, beside the other formulation's round;
* ``precision`` (item 5): ``precision.json`` (``precision.py``: each option's gate against
  float32 and its speed-up);
* ``startup`` (item 6): ``startup.jsonl`` (``bench_startup.py``): the default experiment
  from a fresh process with an empty compilation cache, then a warm one, from the
  process's start to its exit: at most COLD_S and WARM_S;
* ``sweep`` (item 7): ``sweep.jsonl`` (``sweep_vs_sequential.py``): the 16-cell sweep in
  its ``vmap`` mode (an accelerator's default), end to end, at most SWEEP_RATIO of the 16
  runs one after another;
* ``end_to_end`` (item 8): ``end_to_end.jsonl``: ``headline_emnist.py``'s row (FedJAX's
  EMNIST setting, HEADLINE_ROUNDS rounds within HEADLINE_S end to end) and
  ``bench_scale.py``'s rows (each system's engine round within SCALE_S at SCALE_CLIENTS
  clients, SCALE_COHORT a round).

    python experiments/device_summary.py OUT_DIR [PART ...]   # default: every part
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLD_S, WARM_S = 12.0, 5.0
SWEEP_RATIO = 0.25
LOOP_RATIO = 0.5
BOUND_FACTOR = 2.0  # compute_bound.BOUND_FACTOR (this module imports no JAX)
HEADLINE_S, HEADLINE_ROUNDS = 60.0, 1500
SCALE_S, SCALE_CLIENTS, SCALE_COHORT = 0.2, 1_000_000, 10_000
TARGET_DEVICES = ("H100", "H200")


def on_target(device: str) -> bool:
    return any(name in device for name in TARGET_DEVICES)


def judge(value: float | None, limit: float, judged: bool) -> str:
    """PASS / FAIL of ``value <= limit``; "no value" without one; "not judged" off target."""
    if value is None:
        return "no value"
    if not judged:
        return "not judged"
    return "PASS" if value <= limit else "FAIL"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def precision(path: Path) -> list[str]:
    if not path.exists():
        return ["Precision options: not measured (no precision.json)."]
    report = json.loads(path.read_text())
    lines = [
        (
            f"Precision options ({report['rounds']} rounds of the default experiment, "
            f"{report['backend']}; gate: accuracy within 0.5 points of float32):"
        ),
        "",
        "| option | accuracy | gap (points) | params distance | gate | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["options"].items():
        speed = row["speed_up_over_float32"]
        lines.append(
            f"| {name} | {row['final_test_accuracy']:.4f} | {row['accuracy_gap_points']:+.2f} "
            f"| {row['params_distance_to_float32']:.2e} "
            f"| {'PASS' if row['gate']['passed'] else 'FAIL'} "
            f"| {'-' if speed is None else f'{speed:.2f}x'} |"
        )
    return lines


def startup(path: Path) -> list[str]:
    if not path.exists():
        return ["Start-up: not measured (no startup.jsonl)."]
    rows = [r for r in _rows(path) if r.get("variant") in ("cold", "warm") and "rep" in r]
    device = next((r["env"].get("device", "") for r in _rows(path) if "env" in r), "")
    judged = on_target(device)
    lines = []
    for row in rows:
        limit = COLD_S if row["variant"] == "cold" else WARM_S
        status = ("PASS" if row["to_end_s"] <= limit else "FAIL") if judged else "not judged"
        lines.append(
            f"Start-up {row['variant']}: {row['rounds']} rounds, {row['to_end_s']:.2f} s to exit "
            f"(target {limit:g} s: {status}), first round ~{row['to_first_round_s_est']} s, "
            f"imported {row['to_imported_s']:.2f} s, built {row['to_built_s']:.2f} s, "
            f"accuracy {row['final_test_accuracy']:.4f}, cache {row['summary_compile_cache']}"
        )
    return lines or ["Start-up: no rows."]


def sweep(path: Path) -> list[str]:
    if not path.exists():
        return ["Sweep vs sequential: not measured (no sweep.jsonl)."]
    rows = [r for r in _rows(path) if "end_to_end" in r]
    if not rows:
        return ["Sweep vs sequential: no rows."]
    e2e, device = rows[-1]["end_to_end"], rows[-1].get("env", {}).get("device", "")
    ratios = ", ".join(f"{k[len('ratio_') :]} x{v:.2f}" for k, v in e2e.items() if "ratio" in k)
    swept = e2e["sweep_vmap_s"] / e2e["sequential_s"]
    status = judge(swept, SWEEP_RATIO, on_target(device))
    line = (
        f"Sweep vs sequential (16 cells, end to end): {ratios}; the vmap sweep (an "
        f"accelerator's default) {swept:.2f}x the sequential runs (target {SWEEP_RATIO}x: "
        f"{status})."
    )
    return [line]


def _plan_line(option: str, row: dict, auto: dict | None) -> str:
    """One run's plan of bench_conv: its formulation, chunk, seconds and ratios."""
    if "median_s" not in row:
        return f"- engine.conv = {option}: {row.get('error', 'not timed')[:200]}"
    line = (
        f"- engine.conv = {option}: {row['conv']} at chunk {row['chunk']}, "
        f"{row['median_s']:.4f} s a round, {_ratio(row.get('ratio_to_loop'))} the loop, "
        f"{_ratio(row.get('ratio_to_compute_bound'))} the bound"
    )
    if row is not auto and auto is not None and "median_s" in auto:
        line += f", {row['median_s'] / auto['median_s']:.2f}x the plan's"
    return line


def conv(path: Path) -> list[str]:
    rows = [r for r in _rows(path) if r.get("benchmark") == "conv"] if path.exists() else []
    if not rows:
        return ["Convolutions (W2): not measured (no bench_conv rows in throughput.jsonl)."]
    first = rows[0]
    device, judged = first["device"], on_target(first["device"]) and first["cohort"] == 100
    plans = {r["engine_conv"]: r for r in rows if "engine_conv" in r}
    auto = plans.get("auto")
    head = (
        f"Convolutions at W2/{first['cohort']} on {device} (bench_conv.py; the loop keeps "
        f"XLA's convolution; compute bound {_seconds(first['compute_bound_s'])}):"
    )
    lines = [
        head,
        "",
        *(_plan_line(option, row, auto) for option, row in plans.items()),
        "",
    ]
    if auto is None or "median_s" not in auto:
        return [*lines, "Convolution targets: no value (the plan's round was not timed)."]
    loop, bound = auto.get("ratio_to_loop"), auto.get("ratio_to_compute_bound")
    unknown = "" if bound is not None else " (no peak float32 figure for this device)"
    return [
        *lines,
        (
            f"Target: W2/100 round as planned <= {LOOP_RATIO}x the per-client loop: "
            f"{_ratio(loop)}, {judge(loop, LOOP_RATIO, judged)}"
        ),
        (
            f"Target: W2/100 round as planned <= {BOUND_FACTOR:g}x the float32 compute "
            f"bound: {_ratio(bound)}, {judge(bound, BOUND_FACTOR, judged)}{unknown}"
        ),
    ]


def _seconds(value: float | None) -> str:
    return "not known for this device" if value is None else f"{value:.4f} s"


def headline(rows: list[dict]) -> list[str]:
    found = [r for r in rows if r.get("setting") == "fedjax_emnist"]
    if not found:
        return ["Headline (FedJAX's EMNIST setting): not measured (no row; see its stage)."]
    row = found[-1]
    judged = on_target(row["device"]) and row["rounds"] == HEADLINE_ROUNDS
    status = judge(row["wall_s"], HEADLINE_S, judged)
    return [
        (
            f"Headline (FedJAX's EMNIST setting, {row['rounds']} rounds, {row['clients']} "
            f"writers, {row['device']}): {row['wall_s']:.1f} s end to end (target "
            f"{HEADLINE_S:g} s: {status}), data and build {row['data_and_build_s']:.1f} s, "
            f"final accuracy {row['final_test_accuracy']:.4f}; {row['chunk_plan']}"
        )
    ]


def scale(rows: list[dict]) -> list[str]:
    found = [r for r in rows if r.get("benchmark") == "scale" and r["implementation"] == "engine"]
    if not found:
        return ["Scale: not measured (no engine row; see its stage)."]
    lines = []
    for row in found:
        big = row["population"] >= SCALE_CLIENTS and row["cohort"] >= SCALE_COHORT
        judged = big and on_target(row.get("env", {}).get("device", ""))
        median = row.get("median_s")
        status = judge(median, SCALE_S, judged) if "error" not in row else row["error"][:200]
        lines.append(
            f"Scale ({row['population']:,} clients, {row['cohort']:,} a round, "
            f"{row['system']}): {'-' if median is None else f'{median:.3f}'} s a round "
            f"(target {SCALE_S:g} s: {status}), data {row['data_s']:.1f} s, peak RSS "
            f"{max(row['peak_rss_gb'].values()):.1f} GB"
        )
    return lines


def end_to_end(path: Path) -> list[str]:
    rows = _rows(path) if path.exists() else []
    return [*headline(rows), *scale(rows)]


PARTS = {  # name: (file in the output folder, summary)
    "conv": ("throughput.jsonl", conv),
    "precision": ("precision.json", precision),
    "startup": ("startup.jsonl", startup),
    "sweep": ("sweep.jsonl", sweep),
    "end_to_end": ("end_to_end.jsonl", end_to_end),
}


def main(out: str, parts: list[str]) -> None:
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(
            f"device_summary: no part {', '.join(unknown)} (parts: {', '.join(PARTS)})"
        )
    folder = Path(out)
    for name in parts or PARTS:
        file, part = PARTS[name]
        print("\n".join(part(folder / file)))
        print()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
