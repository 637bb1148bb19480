#!/usr/bin/env bash
# Issue 13 benchmark: gnnpar's CUDA backend on one GPU.
#
#   1. Full batch, side by side with PyTorch Geometric on the same GPU in one run: GCN (2 x 256)
#      and GraphSAGE mean (3 x 256), dropout 0.5, on a 200k-vertex / 8M-edge SBM, Tolokers,
#      Facebook (4,714 features) and a 1M-vertex / 40M-edge SBM (128 features) that PyG's
#      per-edge messages do not fit. Epoch time (median) and peak device memory.
#   2. Mini-batch `inputs/sage-bench.toml` on Tolokers, Facebook and the 200k SBM: the same
#      binary with --device cuda against --device cpu on all the host's cores, with the phase
#      breakdown (sample / gather / forward / backward / optimizer) of the GPU run.
#
# On the GPU machine: `bash ../shared/tools/gpu-stage.sh` here, then the device tool with
# carry [".gpu"] and `bash .gpu/run.sh bench` (which runs this script). The device tool stops a
# command after 10 minutes: results accumulate in benchmarks/results/gpu.jsonl, so run subsets:
#   WORKLOADS="full-sbm200k full-tolokers" bash .gpu/run.sh bench
#   WORKLOADS="mb-tolokers mb-facebook" bash .gpu/run.sh bench
# Workloads: full-{sbm200k,tolokers,facebook,sbm1m}, mb-{tolokers,facebook,sbm200k}
# (default: all). SYSTEMS="gnnpar pyg gnnpar-cpu" (default: all three).
#
# GPU_BENCH_SMOKE=1 checks this script where there is no GPU: tiny graphs, gnnpar's CUDA
# backend on its CPU emulator (GNNPAR_CUDA_EMULATOR=1), PyG (if importable) on the CPU; results
# go to $BENCH_WORK/smoke, never to benchmarks/results. Its numbers mean nothing.
#
# Environment: GNNPAR (binary, default target/release/gnnpar), GNNPAR_DATA (default
# ../shared/datasets), PYTHON (python3 with torch + torch_geometric for the peer), FULL_EPOCHS
# (20), MB_EPOCHS (4), CPU_THREADS (nproc), RUN_TIMEOUT (seconds per run, 300), BENCH_WORK
# (scratch, default benchmarks/work/gpu), RESULTS (default benchmarks/results).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
GNNPAR="${GNNPAR:-$root/target/release/gnnpar}"
GNNPAR_DATA="${GNNPAR_DATA:-$root/../shared/datasets}"
PYTHON="${PYTHON:-python3}"
FULL_EPOCHS="${FULL_EPOCHS:-20}"
MB_EPOCHS="${MB_EPOCHS:-4}"
CPU_THREADS="${CPU_THREADS:-$(nproc)}"
RUN_TIMEOUT="${RUN_TIMEOUT:-300}"
SMOKE="${GPU_BENCH_SMOKE:-0}"
ALL="full-sbm200k full-tolokers full-facebook full-sbm1m mb-tolokers mb-facebook mb-sbm200k"
WORKLOADS="${WORKLOADS:-$ALL}"
SYSTEMS="${SYSTEMS:-gnnpar pyg gnnpar-cpu}"
work="${BENCH_WORK:-$here/work/gpu}"
results="${RESULTS:-$here/results}"
collect=("python3" "$here/lib/collect_gpu.py")
pyg_device=cuda
if [[ "$SMOKE" == 1 ]]; then
    work="$work/smoke"
    results="$work/results"
    export GNNPAR_CUDA_EMULATOR=1
    pyg_device=cpu
    FULL_EPOCHS=2 MB_EPOCHS=1
fi
export HDF5_USE_FILE_LOCKING=FALSE

log() { echo "[gpu bench $(date +%H:%M:%S)] $*" >&2; }

[[ -x "$GNNPAR" ]] || { log "no gnnpar binary at $GNNPAR (cargo build --release)"; exit 1; }
mkdir -p "$work/data" "$work/runs" "$results"
jsonl="$results/gpu.jsonl"
if [[ "$SMOKE" != 1 ]] && ! nvidia-smi -L > /dev/null 2>&1; then
    log "nvidia-smi finds no GPU: run this on a GPU node (or GPU_BENCH_SMOKE=1 to check the script)"
    exit 1
fi
peer_ok=1
if ! "$PYTHON" -c "import torch, torch_geometric, numpy" 2> /dev/null; then
    peer_ok=0
    log "$PYTHON cannot import torch, torch_geometric and numpy: PyG runs are recorded as not installed"
fi

# dataset NAME: print the dataset.h5 of NAME, making it first (not measured).
dataset() {
    local name="$1" out="$work/data/$1.h5"
    if [[ ! -f "$out" ]]; then
        local gen=()
        if [[ "$SMOKE" == 1 ]]; then
            gen=(--nodes 3000 --edges 30000 --features 24 --classes 4)
        else
            case "$name" in
                sbm200k) gen=(--nodes 200000 --edges 8000000 --features 128 --classes 16) ;;
                sbm1m) gen=(--nodes 1000000 --edges 40000000 --features 128 --classes 16) ;;
            esac
        fi
        if [[ ${#gen[@]} -gt 0 ]]; then
            log "generating $name (${gen[*]})"
            "$GNNPAR" generate sbm "${gen[@]}" --seed 1 -o "$out" > "$work/data/$name.log" 2>&1
        else
            local src
            case "$name" in
                tolokers) src="$GNNPAR_DATA/heterophilous/tolokers.npz" ;;
                facebook) src="$GNNPAR_DATA/facebook_page_page/facebook.npz" ;;
            esac
            log "preparing $name from $src (split 0)"
            "$GNNPAR" prepare "$src" --split 0 --name "$name" -o "$out" > "$work/data/$name.log" 2>&1
        fi
    fi
    echo "$out"
}

# as_npz NAME: the dataset as numpy arrays for the peer (the GPU image need not have h5py).
as_npz() {
    local h5 npz="$work/data/$1.npz"
    h5="$(dataset "$1")"
    [[ -f "$npz" ]] || "$GNNPAR" export "$h5" --format npz -o "$npz" > /dev/null
    echo "$npz"
}

# run_gnnpar WORKLOAD SYSTEM DATASET MODEL MODE ARGS...: one gnnpar training, one JSON record.
run_gnnpar() {
    local w="$1" sys="$2" ds="$3" model="$4" mode="$5"
    shift 5
    local base="$work/runs/$w.$sys"
    log "$w / $sys: gnnpar train $*"
    timeout "$RUN_TIMEOUT" "$GNNPAR" train --data "$(dataset "$ds")" "$@" \
        --eval-every 0 --metrics "$base.metrics.jsonl" > "$base.out" 2> "$base.err" || true
    "${collect[@]}" gnnpar "$base.out" "$base.err" workload="$w" system="$sys" dataset="$ds" \
        model="$model" mode="$mode" >> "$jsonl"
}

# run_pyg WORKLOAD DATASET MODEL: the PyG full-batch peer, one JSON record.
run_pyg() {
    local w="$1" ds="$2" model="$3" base="$work/runs/$1.pyg"
    if [[ "$peer_ok" != 1 ]]; then
        echo "{\"workload\": \"$w\", \"system\": \"pyg\", \"dataset\": \"$ds\", \"model\": \"$model\", \"mode\": \"full-batch\", \"status\": \"not installed\"}" >> "$jsonl"
        return
    fi
    log "$w / pyg"
    timeout "$RUN_TIMEOUT" "$PYTHON" "$here/peers/pyg_gpu_full.py" --npz "$(as_npz "$ds")" \
        --model "$model" --epochs "$FULL_EPOCHS" --device "$pyg_device" \
        > "$base.out" 2> "$base.err" || true
    "${collect[@]}" peer "$base.out" "$base.err" workload="$w" system=pyg dataset="$ds" \
        model="$model" mode=full-batch >> "$jsonl"
}

wants() { [[ " $SYSTEMS " == *" $1 "* ]]; }

for w in $WORKLOADS; do
    case "$w" in
        full-*)
            ds="${w#full-}"
            for model in gcn sage; do
                layers=$([[ $model == gcn ]] && echo 2 || echo 3)
                lr=$([[ $model == gcn ]] && echo 0.01 || echo 0.003)
                wants gnnpar && run_gnnpar "$w-$model" gnnpar "$ds" "$model" full-batch \
                    --model "$model" --layers "$layers" --hidden 256 --dropout 0.5 \
                    --input-dropout 0 --lr "$lr" --full-batch --epochs "$FULL_EPOCHS" --device cuda
                wants pyg && run_pyg "$w-$model" "$ds" "$model"
            done
            ;;
        mb-*)
            ds="${w#mb-}"
            wants gnnpar && run_gnnpar "$w" gnnpar "$ds" sage mini-batch \
                --config "$root/inputs/sage-bench.toml" --epochs "$MB_EPOCHS" --device cuda
            wants gnnpar-cpu && run_gnnpar "$w" gnnpar-cpu "$ds" sage mini-batch \
                --config "$root/inputs/sage-bench.toml" --epochs "$MB_EPOCHS" --device cpu \
                --threads "$CPU_THREADS"
            ;;
        *) log "unknown workload $w (known: $ALL)"; exit 1 ;;
    esac
done

"${collect[@]}" table "$jsonl" > "$results/gpu.md.tmp"
{
    echo "# gnnpar on one GPU (benchmarks/gpu.sh, $(date -u +%Y-%m-%d))"
    echo
    echo "Device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || echo 'none (smoke run)')."
    echo "Host: $(nproc) cores. Goals (issue 13): full batch ≤ 0.5× PyG's epoch time and"
    echo "device memory; the 1M-vertex graph under 10 GB; mini-batch ≥ 20× the host's CPU cores."
    echo
    cat "$results/gpu.md.tmp"
} > "$results/gpu.md"
rm -f "$results/gpu.md.tmp"
cat "$results/gpu.md"
