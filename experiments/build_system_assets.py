"""Build the system-heterogeneity assets shipped in ``fedjax_het/system/assets``.

The sources are the two converted FLASH data sets kept beside the repository (their READMEs
give the provenance, schema and cleaning):

- ``flash_device_profiles/``: the AI-Benchmark ranking table (333 rows) and the 19 network
  throughput profiles that the FLASH platform ships (Yang et al., "Characterizing Impacts of
  Heterogeneity in Federated Learning upon Large-Scale Smartphone Data", WWW 2021);
- ``flash_availability_2018/``: 3,478 real 48-hour "ready" traces from FLASH's early code base,
  under a strict (charging) and a loose (charging or battery okay) rule.

Both are BSD-2-Clause, "Copyright (c) 2018, TalwalkarLab" (the LEAF licence that FLASH keeps).

Run from the repository root::

    python experiments/build_system_assets.py            # reads ../shared/data
    python experiments/build_system_assets.py --source DIR

The two device CSVs are copied byte for byte. The traces become one ``.npz`` of int32 arrays
per rule: ``{rule}_start`` and ``{rule}_end`` (seconds since 2018-03-06 00:00 local, intervals
``[start, end)``, client after client, sorted) and ``{rule}_count`` (intervals per client,
``[3478]``), plus ``period_s`` (172,800). Every input is checked against the SHA-256 its README
states and against the invariants the README promises (sorted, disjoint, non-empty, inside the
window, counts equal to ``clients.csv``) before anything is written. The ``.npz`` is written
with fixed member timestamps (``build_fashion_mnist_subset.write_npz``), so a re-run gives
byte-identical files (same numpy and zlib). Only numpy and the standard library are used.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import shutil
from pathlib import Path

import numpy as np
from build_fashion_mnist_subset import sha256, write_npz

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO.parent / "shared" / "data"
DEFAULT_OUT = REPO / "fedjax_het" / "system" / "assets"

PERIOD_S = 172_800  # the 48-hour observation window, 2018-03-06 00:00 to 2018-03-08 00:00
NUM_CLIENTS = 3_478
RULES = ("strict", "loose")
TRACES_ASSET = "flash_availability_2018.npz"
MAX_TOTAL_BYTES = 2_000_000

# SHA-256 of every input, as stated in the source READMEs.
_SOURCE_SHA256 = {
    "flash_device_profiles/ai_benchmark_devices.csv": (
        "add1caf2e38a0e48a18618c98f0cdb8c53d9f9a018dbf818dfac11b8ed0c8acd"
    ),
    "flash_device_profiles/network_speed_profiles.csv": (
        "074862d35f3e04fd53554430ce86e09301362f6f18573184ae88a6ba500dc7d5"
    ),
    "flash_availability_2018/availability_strict.csv": (
        "5ebc22f44aba5d713271faeba22237c34911f02270f6b8736f22f2b5c88ac4dc"
    ),
    "flash_availability_2018/availability_loose.csv": (
        "88ab9cfe79e48123aaf8110888fb78a5d4f57372c445229b3fa398bfaf70d6e6"
    ),
    "flash_availability_2018/clients.csv": (
        "a3f80c9e35c27576c4dbc183c87badfd565d5d96d9f150882762748c22f251b6"
    ),
}
_COPIED = ("ai_benchmark_devices.csv", "network_speed_profiles.csv")


def check_sources(source: Path) -> None:
    """Raises ValueError unless every input file exists with its documented SHA-256."""
    for name, expected in _SOURCE_SHA256.items():
        path = source / name
        if not path.is_file():
            raise ValueError(f"missing source file {path}")
        found = hashlib.sha256(path.read_bytes()).hexdigest()
        if found != expected:
            raise ValueError(f"{path}: SHA-256 {found}, the README states {expected}")


def read_int_csv(path: Path, columns: tuple[str, ...]) -> np.ndarray:
    """The named integer columns of a CSV as an int64 ``[rows, len(columns)]`` array."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [[int(row[c]) for c in columns] for row in reader]
    return np.asarray(rows, np.int64).reshape(-1, len(columns))


def trace_arrays(source: Path) -> dict[str, np.ndarray]:
    """The flat per-rule interval arrays, checked against the README's promises."""
    clients = read_int_csv(
        source / "flash_availability_2018" / "clients.csv", ("client", "n_strict", "n_loose")
    )
    if not np.array_equal(clients[:, 0], np.arange(NUM_CLIENTS)):
        raise ValueError(f"clients.csv must list clients 0..{NUM_CLIENTS - 1} in order")
    arrays: dict[str, np.ndarray] = {}
    for column, rule in enumerate(RULES, start=1):
        table = read_int_csv(
            source / "flash_availability_2018" / f"availability_{rule}.csv",
            ("client", "start_s", "end_s"),
        )
        client, start, end = table.T
        if np.any(np.diff(client) < 0):
            raise ValueError(f"{rule}: rows are not grouped by client in increasing order")
        if np.any(start < 0) or np.any(end > PERIOD_S) or np.any(end <= start):
            raise ValueError(f"{rule}: an interval is empty or leaves [0, {PERIOD_S})")
        same = client[1:] == client[:-1]
        if np.any(same & (start[1:] <= end[:-1])):
            raise ValueError(f"{rule}: intervals of a client overlap, touch or are unsorted")
        count = np.bincount(client, minlength=NUM_CLIENTS)
        if count.shape != (NUM_CLIENTS,) or not np.array_equal(count, clients[:, column]):
            raise ValueError(f"{rule}: interval counts differ from clients.csv n_{rule}")
        arrays[f"{rule}_start"] = start.astype(np.int32)
        arrays[f"{rule}_end"] = end.astype(np.int32)
        arrays[f"{rule}_count"] = count.astype(np.int32)
    arrays["period_s"] = np.asarray(PERIOD_S, np.int32)
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the shared data dir")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the assets directory")
    args = parser.parse_args()

    check_sources(args.source)
    arrays = trace_arrays(args.source)
    args.out.mkdir(parents=True, exist_ok=True)
    write_npz(args.out / TRACES_ASSET, arrays)
    for name in _COPIED:
        shutil.copyfile(args.source / "flash_device_profiles" / name, args.out / name)

    total = 0
    for name in (TRACES_ASSET, *_COPIED):
        size = (args.out / name).stat().st_size
        total += size
        print(f"{name:32s} {size:>9,} B  sha256 {sha256(args.out / name)}")
    for rule in RULES:
        count = arrays[f"{rule}_count"]
        print(f"{rule}: {count.sum():,} intervals, {np.sum(count == 0)} clients never ready")
    if total > MAX_TOTAL_BYTES:
        raise SystemExit(f"assets take {total:,} bytes, over the {MAX_TOTAL_BYTES:,}-byte budget")


if __name__ == "__main__":
    main()
