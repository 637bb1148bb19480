#!/usr/bin/env bash
# The first call of a session that is lent a GPU machine (16 host cores): the measurements the
# open issues wait for, most wanted first, inside one device call. Device time is scarce (15
# minutes a session, machine start included), so every step runs under what is left of
# BUDGET and is skipped, with a line saying so, when too little is left; what finished is in
# $OUT whatever happens after.
#
#   bash ../shared/tools/gpu-stage.sh                      # here: stage binary, tests, data
#   device tool, carry [".gpu"], timeout_s 600:
#   OUT=$OUT bash .gpu/run.sh bash benchmarks/device_session.sh
#   STEPS="threads gdp" OUT=/tmp/s bash benchmarks/device_session.sh   # a subset, anywhere
#
# Steps (STEPS, default all, in this order):
#   tests    every staged test binary (the GPU conformance cases run instead of SKIPPED);
#            tests.log (issues 13-15)
#   auto-cuda  the calibrated planner on GPU ranks: `benchmarks/auto.sh` with DEVICE=cuda,
#            2 and 4 ranks sharing the GPU, hidden 256, one round, every case priced by its
#            rank count's calibration; auto-cuda/ (issue 16's GPU half). At most AUTO_CUDA_CAP
#            seconds (300), so that the next step has time
#   auto-cpu the same on CPU ranks, 4 ranks of 4 threads on the 16 cores, none oversubscribed;
#            auto-cpu/ (issue 16's 4-rank cases, which a 2-core machine can only oversubscribe)
#   block    the sampler alone, 1 / 4 / 16 threads: one batch's sampling against a window of
#            batches side by side; block_build.{jsonl,md} (issue 14, sampling ≥ 8×)
#   threads  one rank on the 200k SBM at 1 / 4 / 16 threads, each batch sampled in its step
#            (LABEL in-step) against the default windows; threads.{jsonl,md} (issue 14,
#            the epoch at 16 threads ≥ 8× one thread)
#   gdp      GDP on 4 ranks (the cores shared: 4 threads each on 16) of the same graph, windows sampled together against
#            each batch in its step (SAMPLE_AHEAD=1); gdp/gdp_scaling.{jsonl,md} (issue 14,
#            ranks against one rank)
#   gpu      the mini-batch GPU workloads against the host's cores (benchmarks/gpu.sh
#            mb-*); gpu/ (issue 13, ≥ 20×)
#
# Environment: OUT (results; default out/device_session), BUDGET (seconds for all steps,
# default 540: a device call stops at 600), STEPS, TESTS_DIR (the test binaries; default
# .gpu/tests, the step is skipped without them), GNNPAR (default target/release/gnnpar).
# The auto steps: AUTO_DATASETS (tolokers facebook sbm200k rmat), AUTO_MODELS (sage gcn),
# AUTO_HIDDEN (256), AUTO_CUDA_RANKS (2 4), AUTO_CPU_RANKS (4), AUTO_CUDA_CAP (300), AUTO_WORK
# (their datasets and calibrations, outside OUT: /tmp/gnnpar-auto-work). A step cut off at its
# limit leaves the cases it finished in `auto-*/auto.jsonl.tmp`; `benchmarks/auto.sh report`
# tables them.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/device_session}"
BUDGET="${BUDGET:-540}"
STEPS="${STEPS:-tests auto-cuda auto-cpu block threads gdp gpu}"
TESTS_DIR="${TESTS_DIR:-$ROOT/.gpu/tests}"
export GNNPAR="${GNNPAR:-$ROOT/target/release/gnnpar}"
START=$SECONDS
DEADLINE=$(($(date +%s) + BUDGET))
mkdir -p "$OUT"
LOG="$OUT/session.log"
CORES=$(nproc)
HOST_LABEL="$(hostname -s)-${CORES}cores"

say() { echo "[session +$((SECONDS - START))s] $*" | tee -a "$LOG" >&2; }

# step NAME MINIMUM COMMAND...: run COMMAND under the budget left, when at least MINIMUM
# seconds are; its output goes to $OUT/NAME.out.
step() {
    local name="$1" minimum="$2"
    shift 2
    [[ " $STEPS " == *" $name "* ]] || return 0
    local left=$((BUDGET - (SECONDS - START)))
    if ((left < minimum)); then
        say "$name: SKIPPED, ${left}s of the budget left (needs ${minimum}s)"
        return 0
    fi
    say "$name: started with ${left}s left"
    local rc=0
    # A function runs in a shell of its own under timeout (exported below).
    timeout --kill-after=5 "$left" bash -c "$*" >"$OUT/$name.out" 2>&1 || rc=$?
    if ((rc == 124 || rc == 137)); then
        say "$name: stopped at the budget's end (what it finished is in $OUT)"
    else
        say "$name: exit status $rc"
    fi
}

run_tests() {
    if [[ ! -d "$TESTS_DIR" ]]; then
        echo "SKIPPED: no test binaries in $TESTS_DIR (staged by ../shared/tools/gpu-stage.sh)"
        return 0
    fi
    local t
    for t in "$TESTS_DIR"/*; do
        echo "== $(basename "$t")"
        "$t" --test-threads=4 2>&1 | grep -E "^test result|FAILED|panicked|SKIPPED"
    done | tee "$OUT/tests.log"
}

# capped SECONDS COMMAND...: COMMAND in a session of its own, every process of which is
# stopped after SECONDS; status 124 when it was. (A `timeout` around auto.sh would
# stop it, but not the runs it started: each of those runs under a `timeout` of its own, in
# its own process group.)
capped() {
    local cap=$1 waited=0 pid
    shift
    setsid "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= cap)); then
            pkill -TERM -s "$pid"
            sleep 3
            pkill -KILL -s "$pid"
            wait "$pid"
            return 124
        fi
        sleep 1
        waited=$((waited + 1))
    done
    wait "$pid"
}

# run_auto DEVICE RANKS [CAP]: auto.sh's grid of the AUTO_* cases on DEVICE ranks (stopped
# after CAP seconds where given, and at the budget's end) into $OUT/auto-DEVICE, with the
# rank counts' calibrations beside it (their operators are what the planner would be
# refitted to).
run_auto() {
    # Never past the session's budget: the step's own timeout cannot reach a grid that runs
    # in a session of its own.
    local left=$((DEADLINE - $(date +%s) - 5))
    ((left > 1)) || left=1
    local device=$1 ranks=$2 cap=${3:-$left} rc=0 out="$OUT/auto-$1"
    ((cap < left)) || cap=$left
    mkdir -p "$out" "$AUTO_WORK"
    # STEPS is this script's list of steps where auto.sh reads it as steps per run.
    capped "$cap" env DEVICE="$device" RANKS="$ranks" DATASETS="$AUTO_DATASETS" \
        MODELS="$AUTO_MODELS" HIDDEN="$AUTO_HIDDEN" STEPS=8 ROUNDS=1 RECALIBRATE=grid \
        RUN_TIMEOUT=120 RESULTS="$out" WORK="$AUTO_WORK" bash benchmarks/auto.sh || rc=$?
    cp "$AUTO_WORK"/calibration-"$device"-*.json "$AUTO_WORK"/calibrate-*.log "$out"/ 2>/dev/null
    if ((rc == 124)); then
        echo "auto-$device: stopped after ${cap}s; finished cases in $out/auto.jsonl.tmp"
        return 0
    fi
    return $rc
}

run_auto_cuda() {
    run_auto cuda "$AUTO_CUDA_RANKS" "$AUTO_CUDA_CAP"
}

run_auto_cpu() {
    run_auto cpu "$AUTO_CPU_RANKS"
}

run_block() {
    local sampler=()
    if [[ -d "$TESTS_DIR" ]]; then
        sampler=("SAMPLER_TEST=$(ls "$TESTS_DIR"/sampler-* | head -1)")
    fi
    env "${sampler[@]}" LABEL="$HOST_LABEL" BUILD_THREADS=1,4,16 OUT="$OUT/block_build.jsonl" \
        bash benchmarks/block_build.sh
}

run_threads() {
    local common=(DATASETS=sbm200k THREADS="1 4 16" PREFETCH=off OUT="$OUT/threads.jsonl")
    env "${common[@]}" LABEL="in-step" SAMPLE_AHEAD=1 bash benchmarks/threads.sh &&
        env "${common[@]}" LABEL="windows" bash benchmarks/threads.sh
}

run_gdp() {
    local common=(DATASETS=sbm200k RANKS=4 CACHE_MB=0 CORES="$CORES" RESULTS="$OUT/gdp")
    env "${common[@]}" SAMPLE_AHEAD=1 APPEND=0 bash benchmarks/gdp_scaling.sh &&
        env "${common[@]}" APPEND=1 bash benchmarks/gdp_scaling.sh
}

run_gpu() {
    WORKLOADS="mb-tolokers mb-facebook mb-sbm200k" RESULTS="$OUT/gpu" bash benchmarks/gpu.sh
}

AUTO_DATASETS="${AUTO_DATASETS:-tolokers facebook sbm200k rmat}"
AUTO_MODELS="${AUTO_MODELS:-sage gcn}"
AUTO_HIDDEN="${AUTO_HIDDEN:-256}"
AUTO_CUDA_RANKS="${AUTO_CUDA_RANKS:-2 4}"
AUTO_CPU_RANKS="${AUTO_CPU_RANKS:-4}"
AUTO_CUDA_CAP="${AUTO_CUDA_CAP:-300}"
AUTO_WORK="${AUTO_WORK:-/tmp/gnnpar-auto-work}"
export OUT TESTS_DIR HOST_LABEL CORES DEADLINE AUTO_DATASETS AUTO_MODELS AUTO_HIDDEN AUTO_CUDA_RANKS \
    AUTO_CPU_RANKS AUTO_CUDA_CAP AUTO_WORK
export -f run_tests capped run_auto run_auto_cuda run_auto_cpu run_block run_threads run_gdp run_gpu
say "device session on $HOST_LABEL: steps '$STEPS', budget ${BUDGET}s, results in $OUT"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >>"$LOG" 2>&1
else
    say "no nvidia-smi: the gpu step measures nothing here"
fi
step tests 60 run_tests
step auto-cuda 120 run_auto_cuda
step auto-cpu 90 run_auto_cpu
step block 60 run_block
step threads 120 run_threads
step gdp 90 run_gdp
step gpu 120 run_gpu
say "done"
