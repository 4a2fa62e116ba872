#!/usr/bin/env bash
# The device check: one prepared run on a lent accelerator (an H100 or H200) that measures every
# target in one call of at most 9 minutes of wall time, on a machine with python3 and a CUDA JAX
# installed and no network.
#
#   experiments/device_check.sh OUT_DIR [--quick]
#   make device-check OUT=OUT_DIR [ARGS=--quick]
#
# Stages, each under `timeout` (its cap, clipped to what is left of the budget, some seconds
# kept for the summary), in the order of the targets they measure:
#
#   install      the package without its dependencies and without network, into a temporary
#                folder put on PYTHONPATH: pip from a copy of the sources (--no-deps
#                --no-build-isolation --no-index), else, when pip cannot build (setuptools
#                older than pyproject.toml's >= 77, no pip), the same layout copied by hand
#                with a dist-info holding pyproject.toml's entry points (the algorithm
#                registry reads them); skipped when this checkout's package is importable
#   environment  nvidia-smi, Python, package versions, jax devices and memory limit
#   W1-1000, W1-10000, W2-100
#                bench_throughput.py --suite gpu, one cell each (issue "Accelerator
#                throughput II", items 3 and 4): the engine's homogeneous and flash-deadline
#                rounds built as `fedjax-het run` builds them (its chunk plan, the plan's
#                line in each row), SCAFFOLD's homogeneous round at W1, the bare vmap, and the
#                per-client loop only where the cohort is at most 1,000 clients; each program
#                compiled once (gate and timed rounds share it under "highest"); 5 timed
#                rounds at most, timing stops past 2 s after 3
#   [conv]       slot for the convolution formulation's W2 rows (the conv helper's), after W2
#   precision    experiments/precision.py: the default experiment for 20 rounds under float32,
#                matmul "high", matmul "default" (TF32) and bfloat16 compute, each gated
#                against float32 (accuracy within 0.5 points) beside its speed-up (item 5)
#   startup      experiments/bench_startup.py: the default experiment (200 rounds) in a fresh
#                process with an empty compilation cache, then again with the warm one (item 6)
#   sweep        experiments/sweep_vs_sequential.py: a 16-cell sweep against 16 runs (item 7)
#   invariance   pytest tests/test_engine_invariance.py (skipped, and said, without pytest)
#   summary      the targets over every throughput row (bench_throughput.py --evaluate), the
#                precision gates, the start-up walls and the sweep's ratios
#
# Files written to OUT_DIR (at most 8, no folders; the device tool brings back 8): device_check.log
# (everything printed), environment.txt, throughput.jsonl (one row per implementation and cell,
# then the targets line), precision.json, startup.jsonl, sweep.jsonl, summary.md. A stage cut by
# its limit leaves what it had written.
#
# --quick is a CPU dry run of the same stages at tiny sizes.
# Environment: PYTHON (default python3), MATMUL_PRECISION (timed programs: highest, the default,
# or default = TF32 on NVIDIA GPUs, high; gates always run under highest), DEVICE_CHECK_INSTALL
# (auto, the default; pip; layout; skip), DEVICE_CHECK_BUDGET_S (default 540; give the device
# call a timeout_s of 600).
# Exit status: 0 when every stage ended or was cut by its limit, 1 when one failed, 2 on bad
# arguments, 3 when a full check finds no accelerator.
set -u -o pipefail

usage() {
    echo "usage: $0 OUT_DIR [--quick]" >&2
    exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
QUICK=0
if [ $# -eq 2 ]; then
    [ "$2" = --quick ] || usage
    QUICK=1
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
PY=${PYTHON:-python3}
case $PY in */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;; esac
PRECISION_TIMED=${MATMUL_PRECISION:-highest}
INSTALL=${DEVICE_CHECK_INSTALL:-auto}
TOTAL=${DEVICE_CHECK_BUDGET_S:-540}
RESERVE=15 # seconds kept for the summary stage

# Stage caps in seconds: 20 + 20 + 70 + 80 + 70 + 80 + 60 + 60 + 40 = 500, the summary in the
# reserve. On one H200 (2026-11-26) install took 2 s, environment 7, a W1 cell with 7 variants
# about 90 s and its 10,000 clients were never reached within the old stage's 230 s; the
# default experiment 37 s, the invariance tests 39 s.
CAP_INSTALL=20 CAP_ENV=20 CAP_W1K=70 CAP_W10K=80 CAP_W2=70 CAP_PRECISION=80 CAP_STARTUP=60
CAP_SWEEP=60 CAP_INVARIANCE=40 CAP_SUMMARY=15
COMMON=(--reps 5 --warmup 1 --max-timing-s 2)
if [ "$QUICK" = 1 ]; then
    # XLA's backend at optimisation level 0 compiles about twice as fast; the figures of a
    # dry run are not results (the rows record XLA_FLAGS).
    FAST=(env "XLA_FLAGS=${XLA_FLAGS:-} --xla_backend_optimization_level=0")
    # A dry run is no device call: on a shared CPU its stages get four times the caps.
    TOTAL=${DEVICE_CHECK_BUDGET_S:-2000}
    for cap in CAP_INSTALL CAP_ENV CAP_W1K CAP_W10K CAP_W2 CAP_PRECISION CAP_STARTUP CAP_SWEEP \
        CAP_INVARIANCE CAP_SUMMARY; do
        eval "$cap=\$((4 * $cap))"
    done
    COMMON=(--quick --reps 3 --warmup 0 --max-timing-s 1)
    W1K=(--workloads W1 --cohorts 16 --baselines loop,bare_vmap --algorithms fedavg,scaffold)
    W10K=(--workloads W1 --cohorts 64 --baselines bare_vmap --algorithms fedavg,scaffold)
    W2=(--workloads W2 --cohorts 4 --baselines loop,bare_vmap --algorithms fedavg)
    PRECISION=(--quick --options float32,bfloat16)
    STARTUP=(--reps 1 --variants cold,warm --rounds 30)
    SWEEP=(--rounds 4 --eval-every 2 --reps 2)
    INVARIANCE=(-k test_vmapped_chunks_of_any_size_give_the_same_bits)
else
    FAST=()
    W1K=(--workloads W1 --cohorts 1000 --baselines loop,bare_vmap --algorithms fedavg,scaffold)
    W10K=(--workloads W1 --cohorts 10000 --baselines bare_vmap --algorithms fedavg,scaffold)
    W2=(--workloads W2 --cohorts 100 --baselines loop,bare_vmap --algorithms fedavg)
    PRECISION=(--rounds 20 --repeats 1)
    STARTUP=(--reps 1 --variants cold,warm --rounds 200)
    SWEEP=(--rounds 20 --reps 3)
    INVARIANCE=()
fi

LOG=$OUT/device_check.log
RESULTS=$OUT/throughput.jsonl
SUMMARY=$OUT/summary.md
rm -f "$LOG" "$RESULTS" "$SUMMARY" "$OUT/environment.txt" "$OUT/precision.json" \
    "$OUT/startup.jsonl" "$OUT/sweep.jsonl"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device_check.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
SITE=$WORK/site
export PYTHONUNBUFFERED=1 PY REPO SITE WORK
: >"$WORK/stages.tsv"

say() { echo "$*" | tee -a "$LOG"; }

# run_stage NAME CAP COMMAND...: COMMAND in $WORK (so that the checkout's fedjax_het folder,
# which lacks algorithms/ and sampling/, is not what `import fedjax_het` finds) under
# `timeout`, its output to the terminal, the log and $WORK/NAME.out; one line in stages.tsv.
FAILED=0
run_stage() {
    local name=$1 cap=$2 left limit start rc status
    shift 2
    left=$((TOTAL - SECONDS - RESERVE))
    limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 5 ]; then
        say "== $name: skipped, ${left} s left of the ${TOTAL} s"
        printf '%s\tskipped (out of time)\t0\t0\n' "$name" >>"$WORK/stages.tsv"
        return 0
    fi
    say "== $name (limit ${limit} s, at ${SECONDS} s of ${TOTAL} s)"
    start=$SECONDS
    (cd "$WORK" && exec timeout -k 5 "$limit" "$@") 2>&1 | tee -a "$LOG" "$WORK/$name.out"
    rc=${PIPESTATUS[0]}
    case $rc in
    0) status=ok ;;
    124 | 137) status="cut at its limit (partial)" ;;
    *) status="failed (exit $rc)" FAILED=1 ;;
    esac
    say "== $name: $status in $((SECONDS - start)) s"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" "$limit" >>"$WORK/stages.tsv"
    return "$rc"
}

# importable DIR: does `import fedjax_het` in $WORK find DIR/fedjax_het, with its entry points?
importable() {
    (cd "$WORK" && "$PY" - "$1" <<'EOF'
import sys
from pathlib import Path

import fedjax_het
from fedjax_het import registry

assert Path(fedjax_het.__file__).resolve().parent.parent == Path(sys.argv[1]).resolve()
registry.lookup("algorithm", "scaffold")
EOF
    ) >/dev/null 2>&1
}

# The dist-info of a copied layout: its name, version and pyproject.toml's entry points.
cat >"$WORK/dist_info.py" <<'EOF'
import sys
import tomllib
from pathlib import Path

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
info = Path(sys.argv[2]) / f"{project['name']}-{project['version']}.dist-info"
info.mkdir()
info.joinpath("METADATA").write_text(
    f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
)
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
info.joinpath("entry_points.txt").write_text(
    "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items()) + "\n"
        for group, entries in groups.items()
    )
)
EOF

install_package() { # runs under timeout through bash -c
    set -u
    mode=$1
    if [ "$mode" != layout ]; then
        # A copy of what the build reads, so that the build leaves nothing in the checkout.
        mkdir -p "$WORK/src"
        cp -R "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/fedjax_het" "$REPO/algorithms" \
            "$REPO/sampling" "$WORK/src/"
        if "$PY" -m pip install --quiet --no-deps --no-build-isolation --no-index --no-compile \
            --disable-pip-version-check --target "$SITE" "$WORK/src"; then
            echo "installed with pip (no dependencies, no build isolation, no index) into $SITE"
            return 0
        fi
        [ "$mode" = pip ] && return 1
        echo "pip could not build the package here; copying the layout instead"
        rm -rf "$SITE"
    fi
    # pyproject.toml's [tool.setuptools.package-dir]: algorithms/ and sampling/ are
    # fedjax_het.algorithms and fedjax_het.sampling. The dist-info carries the entry points.
    mkdir -p "$SITE" &&
        cp -R "$REPO/fedjax_het" "$SITE/" &&
        cp -R "$REPO/algorithms" "$SITE/fedjax_het/algorithms" &&
        cp -R "$REPO/sampling" "$SITE/fedjax_het/sampling" &&
        "$PY" "$WORK/dist_info.py" "$REPO/pyproject.toml" "$SITE" &&
        echo "copied the package layout and its entry points into $SITE"
}

say "device check$([ "$QUICK" = 1 ] && echo ' (--quick: CPU dry run at tiny sizes)') of $REPO -> $OUT"
say "python: $PY; timed matmul precision: $PRECISION_TIMED (gates: highest); budget ${TOTAL} s"

# 1. install
if [ "$INSTALL" = skip ] || { [ "$INSTALL" = auto ] && importable "$REPO"; }; then
    say "== install: skipped, this checkout's fedjax_het is importable"
    printf 'install\tskipped (importable)\t0\t0\n' >>"$WORK/stages.tsv"
else
    [ "$INSTALL" = auto ] && INSTALL=any
    run_stage install "$CAP_INSTALL" bash -c "$(declare -f install_package); install_package $INSTALL"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    importable "$SITE" || say "warning: the installed package does not import with its entry points"
fi

# 2. environment
environment() {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm)"
    echo "git: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)" \
        "($(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | wc -l) files changed)"
    echo "budget: ${TOTAL} s; timed matmul precision: $PRECISION_TIMED; gates: highest"
    echo "--- nvidia-smi"
    if command -v nvidia-smi >/dev/null; then
        timeout 20 nvidia-smi
    else
        echo "nvidia-smi: not found"
    fi
    echo "--- python"
    (cd "$WORK" && timeout "$CAP_ENV" "$PY" - <<'EOF'
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

print("python", platform.python_version(), sys.executable)
for name in ("jax", "jaxlib", "flax", "optax", "chex", "numpy", "scipy", "tqdm", "matplotlib",
             "setuptools", "pip", "pytest", "hypothesis", "fedjax_het"):
    try:
        print(f"  {name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(f"  {name}: not installed")
print("env:", {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_", "CUDA_"))})
import jax

import fedjax_het

print("fedjax_het from", Path(fedjax_het.__file__).parent)
print("backend", jax.default_backend(), "devices", jax.devices())
device = jax.local_devices()[0]
stats = device.memory_stats() or {}
print("memory limit (GB):", round(stats.get("bytes_limit", 0) / 1e9, 1) or "not reported")
Path(os.environ["WORK"], "device.txt").write_text(
    f"{device.platform}:{device.device_kind}, jax {jax.__version__}\n"
)
Path(os.environ["WORK"], "backend.txt").write_text(jax.default_backend())
EOF
    )
}
say "== environment"
environment 2>&1 | tee "$OUT/environment.txt" >>"$LOG"
cat "$OUT/environment.txt"
printf 'environment\t%s\t-\t-\n' "$([ -s "$WORK/device.txt" ] && echo ok || echo 'failed (jax)')" \
    >>"$WORK/stages.tsv"
BACKEND=$(cat "$WORK/backend.txt" 2>/dev/null || echo unknown)
if [ "$QUICK" = 0 ] && [ "$BACKEND" != gpu ]; then
    why="jax backend $BACKEND, no GPU: a full check needs one (--quick is the CPU dry run)"
    [ "$BACKEND" = unknown ] && why="jax did not start (see environment.txt)"
    say "stopping: $why"
    printf '# Device check: not run\n\n%s.\n' "$why" >"$SUMMARY"
    exit 3
fi

# 3. throughput, one stage per cell, in the order of the targets (rows appended to one file)
BENCH=(${FAST[@]+"${FAST[@]}"} "$PY" "$REPO/experiments/bench_throughput.py" --suite gpu --no-targets
       --matmul-precision "$PRECISION_TIMED" --out "$RESULTS" "${COMMON[@]}")
run_stage throughput-W1-1000 "$CAP_W1K" "${BENCH[@]}" "${W1K[@]}"
run_stage throughput-W1-10000 "$CAP_W10K" "${BENCH[@]}" "${W10K[@]}"
run_stage throughput-W2-100 "$CAP_W2" "${BENCH[@]}" "${W2[@]}"
# CONV SLOT: the convolution formulation's W2 rows go here (a stage of their own, its cap
# taken from the stages above), appended to "$RESULTS".

# 4. precision options, each gated against float32 (item 5)
run_stage precision "$CAP_PRECISION" "$PY" "$REPO/experiments/precision.py" "${PRECISION[@]}" \
    --out "$OUT/precision.json"

# 5. the default experiment from a fresh process, empty cache then warm (item 6)
run_stage startup "$CAP_STARTUP" "$PY" "$REPO/experiments/bench_startup.py" "${STARTUP[@]}" \
    --out "$OUT/startup.jsonl"

# 6. a 16-cell sweep against 16 sequential runs (item 7)
run_stage sweep "$CAP_SWEEP" "$PY" "$REPO/experiments/sweep_vs_sequential.py" "${SWEEP[@]}" \
    --out "$OUT/sweep.jsonl"

# 7. chunk invariance
if (cd "$WORK" && "$PY" -c "import pytest" 2>/dev/null); then
    run_stage invariance "$CAP_INVARIANCE" "$PY" -m pytest -q -p no:cacheprovider \
        --rootdir "$REPO" -c "$REPO/pyproject.toml" "$REPO/tests/test_engine_invariance.py" \
        ${INVARIANCE[@]+"${INVARIANCE[@]}"}
else
    say "== invariance: skipped, pytest is not installed for $PY"
    printf 'invariance\tskipped (no pytest)\t0\t0\n' >>"$WORK/stages.tsv"
fi

# 8. summary
summarise() {
    echo "# Device check$([ "$QUICK" = 1 ] && echo ' (--quick: a CPU dry run, not results)')"
    echo
    echo "$(cat "$WORK/device.txt" 2>/dev/null || echo 'device unknown'); git" \
        "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown);" \
        "timed matmul precision $PRECISION_TIMED, gates highest; $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo "| stage | status | seconds | limit s |"
    echo "|---|---|---|---|"
    while IFS=$'\t' read -r name status seconds limit; do
        echo "| $name | $status | $seconds | $limit |"
    done <"$WORK/stages.tsv"
    echo
    if [ -s "$RESULTS" ]; then
        (cd "$WORK" && timeout "$CAP_SUMMARY" "$PY" "$REPO/experiments/bench_throughput.py" \
            --evaluate "$RESULTS" --markdown "$WORK/targets.md") >>"$LOG" 2>&1 &&
            cat "$WORK/targets.md" ||
            echo "Targets: could not be evaluated (see device_check.log)."
    else
        echo "Targets: no throughput rows were written."
    fi
    echo
    result=$(grep -E '(passed|failed|error|no tests ran)' "$WORK/invariance.out" 2>/dev/null | tail -1)
    echo "Invariance tests: ${result:-no pytest result line (see the stage status and the log)}"
    echo
    (cd "$WORK" && timeout "$CAP_SUMMARY" "$PY" "$REPO/experiments/device_summary.py" "$OUT") ||
        echo "Precision, start-up and sweep: could not be summarised (see device_check.log)."
}
say "== summary"
summarise >"$SUMMARY"
tee -a "$LOG" <"$SUMMARY"
say "wrote $(find "$OUT" -maxdepth 1 -type f | wc -l) files to $OUT in ${SECONDS} s"
exit "$FAILED"
