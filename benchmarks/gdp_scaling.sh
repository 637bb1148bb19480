#!/usr/bin/env bash
# GDP scaling benchmark (issue 4): `gnnpar train --strategy gdp` on 1, 2 and 4 MPI ranks (RANKS) of
# this machine, on Tolokers, Facebook and a 200k-vertex SBM graph, with and without a feature
# cache. Records per run: epoch time and its breakdown (max over ranks), bytes moved per
# operation kind (summed over ranks), feature bytes, cache hit rate, /proc/loadavg, the device.
#
#   benchmarks/gdp_scaling.sh                 # everything, ~10-20 minutes on 2 loaded cores
#   DATASETS="tolokers" RANKS="1 2" benchmarks/gdp_scaling.sh
#   DEVICE=cuda RANKS="1 2 4 8" benchmarks/gdp_scaling.sh      # on the GPU machine
#   benchmarks/gdp_scaling.sh plot path/to/gdp_scaling.jsonl   # table + charts of earlier runs
#
# Outputs (written next to each other, replaced only when the whole script finished; NAME is
# gdp_scaling, or gdp_scaling_$DEVICE when DEVICE is not cpu):
#   $RESULTS/NAME.jsonl      one JSON object per run (see lib/collect_dist.py record)
#   $RESULTS/NAME.md         markdown table
#   $RESULTS/NAME_time.{png,svg}    epoch time by phase, per dataset (lib/plots.py)
#   $RESULTS/NAME_bytes.{png,svg}   bytes moved per step by kind, per dataset
# The charts need matplotlib: lib/ensure_matplotlib.sh finds it or installs it into a venv;
# where it can do neither (no network) the charts are skipped with a line saying so, and
# `plot` draws them later from the .jsonl.
# Datasets, partitions and per-run logs go to $BENCH_WORK (default: out/bench, git-ignored).
#
# Environment knobs:
#   GNNPAR_DATA   the shared datasets (default ../shared/datasets, else /work/shared/datasets)
#   GNNPAR        the binary (default target/release/gnnpar, built with cargo when cargo
#                 exists and GNNPAR is not set)
#   BENCH_WORK    scratch folder for inputs and logs
#   RESULTS       folder of the outputs (default benchmarks/results)
#   APPEND        1: add this run's lines to an existing NAME.jsonl (and redraw from all of
#                 them) instead of replacing it: for studies split over several calls
#   DATASETS      subset of "tolokers facebook sbm200k" (default: all three), sbmwide (50k
#                 vertices, 1M edges, 2,048 dense features: NFP's case), or sbm3k: a
#                 3,000-vertex SBM that checks the scripts in seconds (its numbers mean nothing)
#   RANKS         rank counts (default "1 2 4"; every count above 1 also runs with a cache)
#   DEVICE        --device of every run (default cpu, comparable with earlier results; cuda
#                 records the GPUs nvidia-smi lists and how many ranks share one)
#   CACHE_MB      cache size of the cached runs (default 64)
#   SAMPLE_AHEAD  --sample-ahead of every run (default: gnnpar's, windows from 4 rank threads;
#                 GDP's ranks sample a window together, each hop in one exchange); the table
#                 names the window each run used (the summary's `sample_window`):
#                 SAMPLE_AHEAD=1 (each batch in its step) against the default compares the two
#   CORES         cores of the machine (default nproc); threads per rank = max(1, CORES/ranks)
#   RUN_TIMEOUT   seconds before one run is killed and recorded as failed (default 600)
#   FACEBOOK_STEPS, SBM_STEPS   optimizer steps measured on these graphs (default 5 and 8;
#                 their full epochs take minutes on 2 cores). Tolokers runs two full epochs
#                 and the second (warm) one is measured; so does every graph when DEVICE is
#                 not cpu (the first epoch there compiles the kernels).
#
# This file is also sourced by strategies.sh for its helper functions; `main` runs only when
# the file is executed.
set -euo pipefail

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_DIR="$BENCH_ROOT/benchmarks"
RESULTS_DIR="${RESULTS:-$BENCH_DIR/results}"
BENCH_WORK="${BENCH_WORK:-$BENCH_ROOT/out/bench}"
BUILD_GNNPAR=0
if [[ -z "${GNNPAR:-}" ]]; then
    GNNPAR="$BENCH_ROOT/target/release/gnnpar"
    # The GPU machine has no Rust toolchain: there the staged binary is used as it is.
    if command -v cargo >/dev/null; then BUILD_GNNPAR=1; fi
fi
DEVICE="${DEVICE:-cpu}"
APPEND="${APPEND:-0}"
CONFIG="inputs/sage-bench.toml"
BATCH_SIZE=1024 # passed explicitly so that steps per epoch = ceil(train / BATCH_SIZE)
CORES="${CORES:-$(nproc)}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
FACEBOOK_STEPS="${FACEBOOK_STEPS:-5}"
SBM_STEPS="${SBM_STEPS:-8}"
ALL_DATASETS="tolokers facebook sbm200k"
GDP_TITLE="GDP scaling (GraphSAGE, inputs/sage-bench.toml)"

# GPUs this run can use, for the record (0 without nvidia-smi, e.g. on the CUDA emulator).
count_gpus() {
    local n
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || n=0
    if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        local visible
        visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .) || visible=0
        if ((visible < n)); then n=$visible; fi
    fi
    echo "$n"
}
GPUS=0
if [[ "$DEVICE" != cpu ]]; then GPUS=$(count_gpus); fi

if [[ -z "${GNNPAR_DATA:-}" ]]; then
    if [[ -d "$BENCH_ROOT/../shared/datasets" ]]; then
        GNNPAR_DATA="$BENCH_ROOT/../shared/datasets"
    else
        GNNPAR_DATA=/work/shared/datasets
    fi
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# HDF5 file locks leak into MPI child processes; the ranks only read.
export HDF5_USE_FILE_LOCKING=FALSE

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }

# prepare_inputs PARTS...: build the release binary (see GNNPAR) and create every input that is
# missing: the datasets and their METIS partitions into each of PARTS parts.
prepare_inputs() {
    if ((BUILD_GNNPAR)); then
        log "cargo build --release"
        (cd "$BENCH_ROOT" && cargo build --release --quiet)
    fi
    if [[ ! -x "$GNNPAR" ]]; then
        echo "no gnnpar binary at $GNNPAR (cargo build --release, or set GNNPAR)" >&2
        exit 1
    fi
    if [[ "$DEVICE" != cpu ]]; then
        log "--device $DEVICE; nvidia-smi lists $GPUS GPU(s)" \
            "${GNNPAR_CUDA_EMULATOR:+(GNNPAR_CUDA_EMULATOR is set: the CPU emulator)}"
    fi
    mkdir -p "$BENCH_WORK/logs"
    local d
    for d in ${DATASETS:-$ALL_DATASETS}; do
        local h5="$BENCH_WORK/$d.h5"
        if [[ ! -f "$h5" ]]; then
            log "creating $h5"
            case "$d" in
            tolokers) "$GNNPAR" prepare "$GNNPAR_DATA/heterophilous/tolokers.npz" -o "$h5" ;;
            facebook) "$GNNPAR" prepare "$GNNPAR_DATA/facebook_page_page/facebook.npz" -o "$h5" ;;
            sbm200k)
                "$GNNPAR" generate sbm --nodes 200000 --edges 4000000 --features 128 \
                    --classes 16 -o "$h5" >/dev/null
                ;;
            sbmwide)
                # Wide dense features (2,048 columns, all set) on a small graph: where
                # feature-sliced NFP should beat moving whole rows (issue 15).
                "$GNNPAR" generate sbm --nodes 50000 --edges 1000000 --features 2048 \
                    --classes 16 -o "$h5" >/dev/null
                ;;
            sbm3k)
                "$GNNPAR" generate sbm --nodes 3000 --edges 30000 --features 24 --classes 4 \
                    -o "$h5" >/dev/null
                ;;
            *)
                echo "unknown dataset '$d' (expected one of: $ALL_DATASETS sbmwide sbm3k)" >&2
                exit 2
                ;;
            esac
        fi
        local p
        for p in "$@"; do
            if [[ ! -f "$BENCH_WORK/$d-p$p/meta.h5" ]]; then
                log "partitioning $d into $p parts (METIS)"
                rm -rf "$BENCH_WORK/$d-p$p"
                "$GNNPAR" partition "$h5" --parts "$p" -o "$BENCH_WORK/$d-p$p" --json \
                    >"$BENCH_WORK/$d-p$p.partition.json"
            fi
        done
    done
}

# Optimizer steps of one full epoch on dataset $1: ceil(training vertices / batch size).
steps_per_epoch() {
    local train
    train=$("$GNNPAR" info "$BENCH_WORK/$1.h5" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["train"])')
    echo $(((train + BATCH_SIZE - 1) / BATCH_SIZE))
}

# The step limit of dataset $1: "--epochs 2" (two full epochs) or "--epochs 1 --max-steps N".
step_args() {
    # On a device the first epoch compiles the kernels and starts the libraries: two whole
    # epochs everywhere, the second measured (as Tolokers on the CPU).
    if [[ "$DEVICE" != cpu ]]; then
        echo "--epochs 2"
        return
    fi
    case "$1" in
    facebook) echo "--epochs 1 --max-steps $FACEBOOK_STEPS" ;;
    sbm200k | sbmwide) echo "--epochs 1 --max-steps $SBM_STEPS" ;;
    *) echo "--epochs 2" ;;
    esac
}

# run_one BENCH DATASET STRATEGY RANKS CACHE_MB [RANKS_PER_NODE]: one `gnnpar train` under
# mpirun; appends one result JSON line (ok, failed or not implemented) to $RESULTS_TMP. With
# RANKS_PER_NODE, ranks form pretend nodes of that size and read the partition into that many
# parts (hybrid: every node a full replica).
run_one() {
    local bench="$1" dataset="$2" strategy="$3" ranks="$4" cache_mb="$5" rpn="${6:-}"
    local threads=$((CORES / ranks))
    ((threads >= 1)) || threads=1
    local data="$BENCH_WORK/$dataset.h5"
    ((ranks == 1)) || data="$BENCH_WORK/$dataset-p$ranks"
    # NFP slices feature columns of the unpartitioned dataset (it refuses a partition).
    if [[ "$strategy" == nfp ]]; then data="$BENCH_WORK/$dataset.h5"; fi
    local tag="$bench-$dataset-$strategy-r$ranks-c$cache_mb-$DEVICE"
    if [[ -n "$rpn" ]]; then
        data="$BENCH_WORK/$dataset-p$rpn"
        if ((rpn == 1)); then data="$BENCH_WORK/$dataset.h5"; fi
        tag="$tag-n$rpn"
    fi
    local logs="$BENCH_WORK/logs/$tag"
    rm -f "$logs".*
    local -a cmd=(timeout --kill-after=10 "$RUN_TIMEOUT"
        mpirun -np "$ranks" --oversubscribe --bind-to none
        "$GNNPAR" train --data "$data" --config "$CONFIG" --batch-size "$BATCH_SIZE"
        --strategy "$strategy" --threads "$threads" --device "$DEVICE"
        --metrics "$logs.metrics.jsonl")
    # shellcheck disable=SC2207 # word splitting of the fixed step arguments is intended
    cmd+=($(step_args "$dataset"))
    if [[ "$cache_mb" != 0 ]]; then cmd+=(--cache-mb "$cache_mb"); fi
    if [[ -n "$rpn" ]]; then cmd+=(--ranks-per-node "$rpn"); fi
    if [[ -n "${SAMPLE_AHEAD:-}" ]]; then cmd+=(--sample-ahead "$SAMPLE_AHEAD"); fi
    local load_before load_after start end rc=0
    load_before=$(cat /proc/loadavg)
    log "$tag: ${cmd[*]}"
    if [[ "$DEVICE" != cpu ]] && ((GPUS > 0 && ranks > GPUS)); then
        log "$tag: $ranks ranks share $GPUS GPU(s)"
    fi
    start=$(date +%s.%N)
    "${cmd[@]}" >"$logs.stdout" 2>"$logs.stderr" || rc=$?
    end=$(date +%s.%N)
    load_after=$(cat /proc/loadavg)
    local extra_meta=()
    # shellcheck disable=SC2016 # the backquotes are part of the message
    if ((rc != 0)) && grep -q 'unknown `strategy`' "$logs.stderr"; then
        extra_meta=("status=not implemented")
    fi
    if [[ "$DEVICE" != cpu ]]; then
        extra_meta+=("gpus=$GPUS")
        if ((GPUS > 0)); then extra_meta+=("ranks_per_gpu=$(((ranks + GPUS - 1) / GPUS))"); fi
        if [[ "${GNNPAR_CUDA_EMULATOR:-}" == 1 ]]; then extra_meta+=("cuda_emulator=1"); fi
    fi
    local line
    line=$(python3 "$BENCH_DIR/lib/collect_dist.py" record --metrics "$logs.metrics.jsonl" \
        --stdout "$logs.stdout" --stderr "$logs.stderr" --meta \
        "bench=$bench" "dataset=$dataset" "strategy=$strategy" "ranks=$ranks" "device=$DEVICE" \
        "threads=$threads" "cache_mb=$cache_mb" "ranks_per_node=${rpn:-}" "rc=$rc" \
        "sample_ahead=${SAMPLE_AHEAD:-}" \
        "steps_per_epoch=$(steps_per_epoch "$dataset")" \
        "wall_seconds=$(python3 -c "print(round($end - $start, 3))")" \
        "loadavg_before=$load_before" "loadavg_after=$load_after" \
        "data=${data#"$BENCH_ROOT"/}" "command=${cmd[*]}" "${extra_meta[@]}")
    echo "$line" >>"$RESULTS_TMP"
    if ((rc != 0)); then
        log "$tag: exit status $rc; stderr tail:"
        tail -n 5 "$logs.stderr" >&2
    fi
}

# results_name NAME: NAME, with the device appended when it is not the CPU (so that GPU runs
# do not replace the CPU results).
results_name() {
    if [[ "$DEVICE" == cpu ]]; then echo "$1"; else echo "$1_$DEVICE"; fi
}

# report JSONL TITLE [table options]: the markdown table (JSONL with .md) and the charts
# (JSONL without .jsonl, then _time / _bytes .png / .svg) next to the results file.
report() {
    local jsonl="$1" title="$2"
    shift 2
    local base="${jsonl%.jsonl}" py
    python3 "$BENCH_DIR/lib/collect_dist.py" table "$jsonl" "$@" >"$base.md.tmp"
    mv "$base.md.tmp" "$base.md"
    log "wrote $base.jsonl and $base.md"
    if py=$(bash "$BENCH_DIR/lib/ensure_matplotlib.sh"); then
        "$py" "$BENCH_DIR/lib/plots.py" "$jsonl" --title "$title" --out "$base" >&2 ||
            log "charts failed (see above); the JSON lines and the table are written"
    else
        log "charts skipped: no matplotlib here. Draw them where pip works:" \
            "benchmarks/$(basename "$0") plot $(basename "$jsonl")"
    fi
    cat "$base.md"
}

# finish NAME TITLE [table options]: move the results into place (or append them, APPEND=1)
# and draw the table and charts.
finish() {
    local name="$1" title="$2"
    shift 2
    mkdir -p "$RESULTS_DIR"
    local jsonl="$RESULTS_DIR/$name.jsonl"
    if [[ "$APPEND" == 1 && -f "$jsonl" ]]; then
        cat "$RESULTS_TMP" >>"$jsonl"
        rm "$RESULTS_TMP"
    else
        mv "$RESULTS_TMP" "$jsonl"
    fi
    report "$jsonl" "$title" "$@"
}

# dispatch MAIN TITLE [table options] -- ARGS: run MAIN, or `plot JSONL` redraws earlier results.
dispatch() {
    local main="$1" title="$2" opts=()
    shift 2
    while [[ "$1" != -- ]]; do opts+=("$1"); shift; done
    shift
    local usage
    usage="usage: $(basename "$0") [plot RESULTS.jsonl] (settings: environment, see its header)"
    case "${1:-}" in
    "") "$main" ;;
    plot)
        [[ $# == 2 && -f "$2" ]] || { echo "$usage" >&2; exit 2; }
        report "$2" "$title" "${opts[@]}"
        ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
}

main() {
    local ranks="${RANKS:-1 2 4}" r parts=()
    for r in $ranks; do
        if ((r > 1)); then parts+=("$r"); fi
    done
    prepare_inputs "${parts[@]}"
    mkdir -p "$RESULTS_DIR"
    local name
    name=$(results_name gdp_scaling)
    RESULTS_TMP="$RESULTS_DIR/.$name.jsonl.tmp"
    : >"$RESULTS_TMP"
    local d
    for d in ${DATASETS:-$ALL_DATASETS}; do
        for r in $ranks; do
            run_one gdp_scaling "$d" gdp "$r" 0
            # A cache only matters when there are remote rows: 1 rank runs without one.
            if ((r > 1)); then run_one gdp_scaling "$d" gdp "$r" "${CACHE_MB:-64}"; fi
        done
    done
    finish "$name" "$GDP_TITLE"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    dispatch main "$GDP_TITLE" -- "$@"
fi
