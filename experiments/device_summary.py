"""The device check's summary of its precision, start-up and sweep stages (Markdown).

Reads what ``device_check.sh`` left in its output folder: ``precision.json``
(``precision.py``: each option's gate against float32 and its speed-up),
``startup.jsonl`` (``bench_startup.py``: the default experiment from a fresh
process with an empty compilation cache, then a warm one) and ``sweep.jsonl``
(``sweep_vs_sequential.py``). Start-up targets (issue "Accelerator throughput
II", item 6, judged on an H100 or H200 only): the cold run's wall at most
COLD_S, the warm one's at most WARM_S, from the process's start to its exit.

    python experiments/device_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLD_S, WARM_S = 12.0, 5.0
TARGET_DEVICES = ("H100", "H200")


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
    judged = any(name in device for name in TARGET_DEVICES)
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
    e2e = rows[-1]["end_to_end"]
    ratios = ", ".join(f"{k[len('ratio_'):]} x{v:.2f}" for k, v in e2e.items() if "ratio" in k)
    return [f"Sweep vs sequential (16 cells, end to end): {ratios}."]


def main(out: str) -> None:
    folder = Path(out)
    for part in (precision, startup, sweep):
        print("\n".join(part(folder / f"{part.__name__}.{'json' if part is precision else 'jsonl'}")))
        print()


if __name__ == "__main__":
    main(sys.argv[1])
