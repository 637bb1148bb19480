#!/usr/bin/env bash
# GDP scaling benchmark (issue 4): `gnnpar train --strategy gdp` on 1, 2 and 4 MPI ranks of
# this machine, on Tolokers, Facebook and a 200k-vertex SBM graph, with and without a feature
# cache. Records per run: epoch time and its breakdown (max over ranks), bytes moved per
# operation kind (summed over ranks), feature bytes, cache hit rate, /proc/loadavg.
#
#   benchmarks/gdp_scaling.sh                 # everything, ~10-20 minutes on 2 loaded cores
#   DATASETS="tolokers" benchmarks/gdp_scaling.sh
#
# Outputs (written next to each other, replaced only when the whole script finished):
#   benchmarks/results/gdp_scaling.jsonl      one JSON object per run (lib/collect_dist.py record)
#   benchmarks/results/gdp_scaling.md         markdown table
#   benchmarks/results/gdp_scaling_time.{png,svg}    epoch time by phase, per dataset (lib/plots.py)
#   benchmarks/results/gdp_scaling_bytes.{png,svg}   bytes moved per step by kind, per dataset
# The charts need matplotlib: lib/ensure_matplotlib.sh finds it or installs it into a venv;
# where it can do neither (no network) the charts are skipped with a line saying so.
# Datasets, partitions and per-run logs go to $BENCH_WORK (default: out/bench, git-ignored).
#
# Environment knobs:
#   GNNPAR_DATA   the shared datasets (default ../shared/datasets, else /work/shared/datasets)
#   BENCH_WORK    scratch folder for inputs and logs
#   DATASETS      subset of "tolokers facebook sbm200k"
#   CACHE_MB      cache size of the cached runs (default 64)
#   CORES         cores of the machine (default nproc); threads per rank = max(1, CORES/ranks)
#   RUN_TIMEOUT   seconds before one run is killed and recorded as failed (default 600)
#   FACEBOOK_STEPS, SBM_STEPS   optimizer steps measured on these graphs (default 5 and 8;
#                 their full epochs take minutes on 2 cores). Tolokers runs two full epochs
#                 and the second (warm) one is measured.
#
# This file is also sourced by strategies.sh for its helper functions; `main` runs only when
# the file is executed.
set -euo pipefail

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_DIR="$BENCH_ROOT/benchmarks"
RESULTS_DIR="$BENCH_DIR/results"
BENCH_WORK="${BENCH_WORK:-$BENCH_ROOT/out/bench}"
GNNPAR="$BENCH_ROOT/target/release/gnnpar"
CONFIG="inputs/sage-bench.toml"
BATCH_SIZE=1024 # passed explicitly so that steps per epoch = ceil(train / BATCH_SIZE)
CORES="${CORES:-$(nproc)}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
FACEBOOK_STEPS="${FACEBOOK_STEPS:-5}"
SBM_STEPS="${SBM_STEPS:-8}"
ALL_DATASETS="tolokers facebook sbm200k"

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

# Build the release binary and create every input that is missing: the three datasets and
# their METIS partitions into 2 and 4 parts.
prepare_inputs() {
    log "cargo build --release"
    (cd "$BENCH_ROOT" && cargo build --release --quiet)
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
            *)
                echo "unknown dataset '$d' (expected one of: $ALL_DATASETS)" >&2
                exit 2
                ;;
            esac
        fi
        local p
        for p in 2 4; do
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
    case "$1" in
    facebook) echo "--epochs 1 --max-steps $FACEBOOK_STEPS" ;;
    sbm200k) echo "--epochs 1 --max-steps $SBM_STEPS" ;;
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
    local tag="$bench-$dataset-$strategy-r$ranks-c$cache_mb"
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
        --strategy "$strategy" --threads "$threads" --metrics "$logs.metrics.jsonl")
    # shellcheck disable=SC2207 # word splitting of the fixed step arguments is intended
    cmd+=($(step_args "$dataset"))
    if [[ "$cache_mb" != 0 ]]; then cmd+=(--cache-mb "$cache_mb"); fi
    if [[ -n "$rpn" ]]; then cmd+=(--ranks-per-node "$rpn"); fi
    local load_before load_after start end rc=0
    load_before=$(cat /proc/loadavg)
    log "$tag: ${cmd[*]}"
    start=$(date +%s.%N)
    "${cmd[@]}" >"$logs.stdout" 2>"$logs.stderr" || rc=$?
    end=$(date +%s.%N)
    load_after=$(cat /proc/loadavg)
    local status_meta=()
    # shellcheck disable=SC2016 # the backquotes are part of the message
    if ((rc != 0)) && grep -q 'unknown `strategy`' "$logs.stderr"; then
        status_meta=("status=not implemented")
    fi
    local line
    line=$(python3 "$BENCH_DIR/lib/collect_dist.py" record --metrics "$logs.metrics.jsonl" \
        --stdout "$logs.stdout" --stderr "$logs.stderr" --meta \
        "bench=$bench" "dataset=$dataset" "strategy=$strategy" "ranks=$ranks" \
        "threads=$threads" "cache_mb=$cache_mb" "ranks_per_node=${rpn:-}" "rc=$rc" \
        "steps_per_epoch=$(steps_per_epoch "$dataset")" \
        "wall_seconds=$(python3 -c "print(round($end - $start, 3))")" \
        "loadavg_before=$load_before" "loadavg_after=$load_after" \
        "data=${data#"$BENCH_ROOT"/}" "command=${cmd[*]}" "${status_meta[@]}")
    echo "$line" >>"$RESULTS_TMP"
    if ((rc != 0)); then
        log "$tag: exit status $rc; stderr tail:"
        tail -n 5 "$logs.stderr" >&2
    fi
}

# finish NAME TITLE [table options]: move the results into place and draw the table and charts.
finish() {
    local name="$1" title="$2"
    shift 2
    mkdir -p "$RESULTS_DIR"
    local base="$RESULTS_DIR/$name" py
    mv "$RESULTS_TMP" "$base.jsonl"
    python3 "$BENCH_DIR/lib/collect_dist.py" table "$base.jsonl" "$@" >"$base.md.tmp"
    mv "$base.md.tmp" "$base.md"
    log "wrote $base.jsonl and $base.md"
    if py=$(bash "$BENCH_DIR/lib/ensure_matplotlib.sh"); then
        "$py" "$BENCH_DIR/lib/plots.py" "$base.jsonl" --title "$title" --out "$base" >&2 ||
            log "charts failed (see above); the JSON lines and the table are written"
    else
        log "charts skipped: no matplotlib here; the JSON lines and the table are written"
    fi
    cat "$base.md"
}

main() {
    prepare_inputs
    mkdir -p "$RESULTS_DIR"
    RESULTS_TMP="$RESULTS_DIR/.gdp_scaling.jsonl.tmp"
    : >"$RESULTS_TMP"
    local d
    for d in ${DATASETS:-$ALL_DATASETS}; do
        # A cache only matters when there are remote rows: 1 rank runs without one.
        run_one gdp_scaling "$d" gdp 1 0
        run_one gdp_scaling "$d" gdp 2 0
        run_one gdp_scaling "$d" gdp 2 "${CACHE_MB:-64}"
        run_one gdp_scaling "$d" gdp 4 0
        run_one gdp_scaling "$d" gdp 4 "${CACHE_MB:-64}"
    done
    finish gdp_scaling "GDP scaling (GraphSAGE, inputs/sage-bench.toml)"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
