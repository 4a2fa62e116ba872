#!/usr/bin/env bash
# The device check: one prepared run on a lent accelerator (an H100 or H200) that measures every
# target of the issue "Accelerator throughput II" in one call of at most 9 minutes of wall time,
# on a machine with python3 and a CUDA JAX installed and no network.
#
#   experiments/device_check.sh OUT_DIR [--quick]
#   make device-check OUT=OUT_DIR [ARGS=--quick]
#
# Stages, each under `timeout` (its cap, clipped to what is left of the budget, RESERVE seconds
# kept for the summary), in the order of the issue's targets (item numbers in brackets):
#
#   install      the package without its dependencies and without network, into a temporary
#                folder put on PYTHONPATH: pip from a copy of the sources (--no-deps
#                --no-build-isolation --no-index), else, when pip cannot build (setuptools
#                older than pyproject.toml's >= 77, no pip), the same layout copied by hand
#                with a dist-info holding pyproject.toml's entry points (the algorithm
#                registry reads them); skipped when this checkout's package is importable
#   environment  nvidia-smi, Python, package versions, jax devices and memory limit
#   conv-W2-100  [1] bench_conv.py at W2/100: the per-client loop, the round as `fedjax-het
#                run` builds it (engine.conv "auto": the plan's chunk and formulation) and the
#                same round with the other formulation (engine.conv "xla" / "patches", planned
#                likewise); the round's float32 compute bound
#   throughput-W2-1000
#                [1, 2] FedAvg's and SCAFFOLD's engine rounds at W2/1,000 (population 2,000)
#                as run builds them, nothing else (a bare vmap needs about 69 GiB): do they
#                run, with the chunk the plan chose against the compiled program's memory
#                analysis (each row's chunk_plan and plan_bytes)
#   throughput-W1-1000, throughput-W1-10000
#                [3, 4] bench_throughput.py --suite gpu, one cell each: the engine's
#                homogeneous and flash-deadline rounds as run builds them (the default
#                path), SCAFFOLD's homogeneous round, the bare vmap, and the per-client loop
#                only where the cohort is at most 1,000 clients
#   throughput-W2-100
#                [3] the same at W2/100 with the bare vmap as baseline (the loop is the conv
#                stage's) and HeteroFL's mixed-width round, as dense levels and as masks
#   precision    [5] experiments/precision.py: the default experiment for 20 rounds under
#                float32, matmul "high", matmul "default" (TF32) and bfloat16 compute, each
#                gated against float32 (accuracy within 0.5 points) beside its speed-up
#   startup      [6] experiments/bench_startup.py: the default experiment (200 rounds) in a
#                fresh process with an empty compilation cache, then with the warm one
#   sweep        [7] experiments/sweep_vs_sequential.py: a 16-cell sweep against 16 runs
#   headline     [8] experiments/headline_emnist.py: FedJAX's EMNIST setting, 1,500 rounds of
#                50 clients on generated femnist_like data, end to end
#   scale        [8] experiments/bench_scale.py: 1,000,000 clients, 10,000 a round, the
#                engine's homogeneous and flash-deadline rounds
#   invariance   pytest tests/test_engine_invariance.py, last, with whatever time is left
#                (skipped, and said, without pytest or time)
#   summary      bench_conv's rows (device_summary.py conv), the targets over every
#                throughput row (bench_throughput.py --evaluate), the precision gates, the
#                start-up walls, the sweep's ratios, the headline and scale rows
#
# Every throughput program is compiled once (gate and timed rounds share it under "highest");
# at most 5 timed rounds after one warm-up, timing stopped past 2 s after 3 (W1/10,000 and
# W2/1,000: 3 rounds, no warm-up, past 1 s).
#
# Caps (seconds). Measured on one H200 (2026-11-26, an older revision): install 2, environment
# 7, a throughput program 3-12 s to compile (a bare vmap 11-12, the loop 4-10, an engine round
# 3-12), a W1/1,000 cell of 6 programs about 90 s, the default experiment 37 s, the
# invariance tests 39-45 s. The new stages' caps are estimates from those figures, to be reset
# from the first full run's stage seconds (summary.md):
#   install 10        measured 2 s
#   conv 45           3 programs (loop ~7 s, two engine rounds each with their plan's own
#                     compile of the chunk program, patches the larger) + ~5 s to start
#   W2-1000 50        2 engine programs and their plans, 0.8 GB of data, SCAFFOLD's 53 GB of
#                     client states; first rounds measured 0.86 s and 0.97 s
#   W1-1000 65        6 programs (about 45 s of compiles measured) + the loops' rounds (0.43
#                     and 0.25 s, 7 each)
#   W1-10000 65       4 programs (no loop) + 4 GB of generated data; 3 rounds of ~0.1 s
#   W2-100 60         5 programs (the bare vmap 11 s; HeteroFL's dense levels: one program per
#                     width, about twice the masks' compile)
#   precision 35      4 options x 20 rounds in one process, a compile each
#   startup 30        the targets are 12 s cold and 5 s warm; a cap that a passing run fits
#                     twice over
#   sweep 40          the 16 runs each compile once, the sweep twice (map and vmap modes)
#   headline 70       the target is 60 s from the first line of the run; 10 s more for the
#                     interpreter, imports and the device's start
#   scale 45          data of 1,000,000 clients (being made fast), 2 programs, 5 rounds each
#   invariance 40     what is left, at most its measured 39-45 s
# 10 + 45 + 50 + 65 + 65 + 60 + 35 + 30 + 40 + 70 + 45 = 515 s, with the environment's 7 s
# within the 540 s budget less the summary's 15 (RESERVE); the invariance tests run only on
# what the others leave.
#
# Files written to OUT_DIR (8, no folders; the device tool brings back 8): device_check.log
# (everything printed), environment.txt, throughput.jsonl (bench_conv's rows, marked
# "benchmark": "conv", then one row per implementation and cell, then the targets line),
# precision.json, startup.jsonl, sweep.jsonl, end_to_end.jsonl (the headline's row, then
# bench_scale's rows), summary.md. A stage cut by its limit leaves what it had written; a stage
# that fails is recorded and the check goes on.
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

# Stage caps in seconds (the header gives the reasons).
CAP_INSTALL=10 CAP_ENV=20 CAP_CONV=45 CAP_W2K=50 CAP_W1K=65 CAP_W10K=65 CAP_W2=60
CAP_PRECISION=35 CAP_STARTUP=30 CAP_SWEEP=40 CAP_HEADLINE=70 CAP_SCALE=45 CAP_INVARIANCE=40
CAP_SUMMARY=15
COMMON=(--reps 5 --warmup 1 --max-timing-s 2)
SHORT=(--reps 3 --warmup 0 --max-timing-s 1) # the cells of 10,000 clients and of W2/1,000
SCALE=(--clients 1000000 --per-round 10000 --baselines none --systems none,flash-deadline
       --reps 5 --max-timing-s 20)
if [ "$QUICK" = 1 ]; then
    # XLA's backend at optimisation level 0 compiles about twice as fast, and runs the CNN
    # about three times slower (bench_conv at W2/2: 147 s against 93 s on 2 shared cores):
    # the W1 cells only. The figures of a dry run are not results (rows record XLA_FLAGS).
    FAST=(env "XLA_FLAGS=${XLA_FLAGS:-} --xla_backend_optimization_level=0")
    # A dry run is no device call: on a shared CPU its stages get six times the caps (on 2
    # cores it took 870 s at load 7, 598 s at load 4; W2/2, its bare vmap included, 248 s
    # at load 7: more than 4 x its cap of 60).
    TOTAL=${DEVICE_CHECK_BUDGET_S:-2400}
    for cap in CAP_INSTALL CAP_ENV CAP_CONV CAP_W2K CAP_W1K CAP_W10K CAP_W2 CAP_PRECISION \
        CAP_STARTUP CAP_SWEEP CAP_HEADLINE CAP_SCALE CAP_INVARIANCE CAP_SUMMARY; do
        eval "$cap=\$((6 * $cap))"
    done
    COMMON=(--quick --reps 3 --warmup 0 --max-timing-s 1)
    SHORT=("${COMMON[@]}")
    CONV=(--cohort 2 --reps 3 --warmup 0 --max-s 1)
    W2K=(--workloads W2 --cohorts 4)
    W1K=(--workloads W1 --cohorts 16 --baselines loop,bare_vmap --algorithms fedavg,scaffold)
    W10K=(--workloads W1 --cohorts 64 --baselines bare_vmap --algorithms fedavg,scaffold)
    W2=(--workloads W2 --cohorts 2)
    PRECISION=(--quick --options float32,bfloat16)
    STARTUP=(--reps 1 --variants cold,warm --rounds 30)
    SWEEP=(--rounds 4 --eval-every 2 --reps 2)
    HEADLINE=(--rounds 2 --clients 8 --set sampler.clients_per_round=4)
    SCALE+=(--quick)
    INVARIANCE=(-k test_vmapped_chunks_of_any_size_give_the_same_bits)
else
    FAST=()
    CONV=(--cohort 100 --reps 5 --warmup 1 --max-s 2)
    W2K=(--workloads W2 --cohorts 1000)
    W1K=(--workloads W1 --cohorts 1000 --baselines loop,bare_vmap --algorithms fedavg,scaffold)
    W10K=(--workloads W1 --cohorts 10000 --baselines bare_vmap --algorithms fedavg,scaffold)
    W2=(--workloads W2 --cohorts 100)
    PRECISION=(--rounds 20 --repeats 1)
    STARTUP=(--reps 1 --variants cold,warm --rounds 200)
    SWEEP=(--rounds 20 --reps 3)
    HEADLINE=()
    INVARIANCE=()
fi
W2K+=(--systems none --baselines none --algorithms fedavg,scaffold)
W2+=(--baselines bare_vmap --algorithms fedavg,heterofl,heterofl_masks)

LOG=$OUT/device_check.log
RESULTS=$OUT/throughput.jsonl
SUMMARY=$OUT/summary.md
END_TO_END=$OUT/end_to_end.jsonl
rm -f "$LOG" "$RESULTS" "$SUMMARY" "$END_TO_END" "$OUT/environment.txt" "$OUT/precision.json" \
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

# 3. convolutions at W2/100: the loop and run's two plans (item 1), rows to throughput.jsonl
run_stage conv-W2-100 "$CAP_CONV" "$PY" "$REPO/experiments/bench_conv.py" "${CONV[@]}" \
    --xla-chunks "" --patches-chunks "" --bare "" \
    --matmul-precision "$PRECISION_TIMED" --out "$RESULTS"

# 4. throughput, one stage per cell, in the order of the targets (items 1-4)
BENCH=("$PY" "$REPO/experiments/bench_throughput.py" --suite gpu --no-targets
       --matmul-precision "$PRECISION_TIMED" --out "$RESULTS")
run_stage throughput-W2-1000 "$CAP_W2K" "${BENCH[@]}" "${SHORT[@]}" "${W2K[@]}"
run_stage throughput-W1-1000 "$CAP_W1K" ${FAST[@]+"${FAST[@]}"} "${BENCH[@]}" "${COMMON[@]}" \
    "${W1K[@]}"
run_stage throughput-W1-10000 "$CAP_W10K" ${FAST[@]+"${FAST[@]}"} "${BENCH[@]}" "${SHORT[@]}" \
    "${W10K[@]}"
run_stage throughput-W2-100 "$CAP_W2" "${BENCH[@]}" "${COMMON[@]}" "${W2[@]}"

# 5. precision options, each gated against float32 (item 5)
run_stage precision "$CAP_PRECISION" "$PY" "$REPO/experiments/precision.py" "${PRECISION[@]}" \
    --out "$OUT/precision.json"

# 6. the default experiment from a fresh process, empty cache then warm (item 6)
run_stage startup "$CAP_STARTUP" "$PY" "$REPO/experiments/bench_startup.py" "${STARTUP[@]}" \
    --out "$OUT/startup.jsonl"

# 7. a 16-cell sweep against 16 sequential runs (item 7)
run_stage sweep "$CAP_SWEEP" "$PY" "$REPO/experiments/sweep_vs_sequential.py" "${SWEEP[@]}" \
    --out "$OUT/sweep.jsonl"

# 8. end to end: the headline run, then the scale test (item 8), rows to end_to_end.jsonl
run_stage headline "$CAP_HEADLINE" "$PY" "$REPO/experiments/headline_emnist.py" \
    ${HEADLINE[@]+"${HEADLINE[@]}"} --no-progress --out "$END_TO_END"
run_stage scale "$CAP_SCALE" "$PY" "$REPO/experiments/bench_scale.py" "${SCALE[@]}" \
    --out "$END_TO_END"

# 9. chunk invariance, on what is left
if (cd "$WORK" && "$PY" -c "import pytest" 2>/dev/null); then
    run_stage invariance "$CAP_INVARIANCE" "$PY" -m pytest -q -p no:cacheprovider \
        --rootdir "$REPO" -c "$REPO/pyproject.toml" "$REPO/tests/test_engine_invariance.py" \
        ${INVARIANCE[@]+"${INVARIANCE[@]}"}
else
    say "== invariance: skipped, pytest is not installed for $PY"
    printf 'invariance\tskipped (no pytest)\t0\t0\n' >>"$WORK/stages.tsv"
fi

# 10. summary
part() { # device_summary.py's PARTS, or its failure said in one line
    (cd "$WORK" && timeout "$CAP_SUMMARY" "$PY" "$REPO/experiments/device_summary.py" \
        "$OUT" "$@") || echo "$*: could not be summarised (see device_check.log)."
}
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
    part conv
    if grep -qv '"benchmark"' "$RESULTS" 2>/dev/null; then
        (cd "$WORK" && timeout "$CAP_SUMMARY" "$PY" "$REPO/experiments/bench_throughput.py" \
            --evaluate "$RESULTS" --markdown "$WORK/targets.md") >>"$LOG" 2>&1 &&
            cat "$WORK/targets.md" ||
            echo "Targets: could not be evaluated (see device_check.log)."
    else
        echo "Targets of the throughput cells: not measured (no throughput rows were written)."
    fi
    echo
    part precision startup sweep end_to_end
    result=$(grep -E '(passed|failed|error|no tests ran)' "$WORK/invariance.out" 2>/dev/null | tail -1)
    echo "Invariance tests: ${result:-no pytest result line (see the stage status and the log)}"
}
say "== summary"
summarise >"$SUMMARY"
tee -a "$LOG" <"$SUMMARY"
say "wrote $(find "$OUT" -maxdepth 1 -type f | wc -l) files to $OUT in ${SECONDS} s"
exit "$FAILED"
