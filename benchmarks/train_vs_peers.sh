#!/usr/bin/env bash
# Issue 3 benchmark: gnnpar's training epoch against DGL and PyTorch Geometric, side by side in
# one run, on the same dataset.h5 files and the same machine.
#
# Workloads (the configurations of shared/peers/README.md):
#   sage-tolokers, sage-facebook, sage-synth200k  GraphSAGE mean, 3 layers, hidden 256, fanouts
#                                                 15,10,5, batch 1024, Adam lr 0.003
#                                                 (inputs/sage-bench.toml)
#   gcn-cora, gcn-tolokers                        full-batch 2-layer GCN, hidden 256, lr 0.01
#                                                 (inputs/gcn-bench.toml)
# For every (workload, system) one JSON line goes to benchmarks/results/train_vs_peers.jsonl:
# median epoch time, peak RSS, the metric at the best validation epoch, the time split, and the
# load average around the run; benchmarks/results/train_vs_peers.md gets the table.
#
#   benchmarks/train_vs_peers.sh
#   WORKLOADS="sage-tolokers gcn-cora" benchmarks/train_vs_peers.sh     # a subset
#   SYSTEMS="gnnpar dgl" benchmarks/train_vs_peers.sh                   # skip PyG
#   PYG_SYNTH200K=1 benchmarks/train_vs_peers.sh   # also PyG on the 200k graph (~12 min/epoch)
#   SEED=1 SAGE_EPOCHS=20 benchmarks/train_vs_peers.sh  # another seed, longer SAGE runs
#                                                       # (benchmarks/accuracy_vs_peers.sh)
#
# Environment: GNNPAR (binary, default target/release/gnnpar, built if missing), GNNPAR_DATA
# (the real datasets, default ../shared/datasets next to the crate), PEERS_DIR (the peer
# scripts, default benchmarks/peers), PEERS_VENV (their virtualenv, default $PEERS_DIR/.venv,
# made by $PEERS_DIR/setup.sh), THREADS (2), BENCH_WORK (scratch, default
# benchmarks/work/train), RESULTS (output directory, default benchmarks/results).
# Without the peers' virtualenv gnnpar runs alone and the peers' lines say
# "peer": "not installed".
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
GNNPAR="${GNNPAR:-$root/target/release/gnnpar}"
GNNPAR_DATA="${GNNPAR_DATA:-$root/../shared/datasets}"
PEERS_DIR="${PEERS_DIR:-$here/peers}"
PEERS_VENV="${PEERS_VENV:-$PEERS_DIR/.venv}"
peer_python="$PEERS_VENV/bin/python"
THREADS="${THREADS:-2}"
SEED="${SEED:-0}"
SAGE_EPOCHS="${SAGE_EPOCHS:-3}"
GCN_EPOCHS="${GCN_EPOCHS:-200}"
WORKLOADS="${WORKLOADS:-sage-tolokers sage-facebook sage-synth200k gcn-cora gcn-tolokers}"
SYSTEMS="${SYSTEMS:-gnnpar dgl pyg}"
work="${BENCH_WORK:-$here/work/train}"
results="${RESULTS:-$here/results}"
measure=("python3" "$here/lib/measure.py")

log() { echo "[train bench $(date +%H:%M:%S)] $*" >&2; }

if [[ ! -x "$GNNPAR" ]]; then
    log "building gnnpar (release)"
    (cd "$root" && cargo build --release --quiet)
fi
mkdir -p "$work/data" "$work/runs" "$results"
export HDF5_USE_FILE_LOCKING=FALSE

peers_ok=1
if [[ ! -x "$peer_python" ]]; then
    peers_ok=0
    log "peer virtualenv not found at $PEERS_VENV (run $PEERS_DIR/setup.sh): gnnpar runs alone"
elif [[ ! -f "$PEERS_DIR/dgl_bench.py" || ! -f "$PEERS_DIR/pyg_bench.py" ]]; then
    peers_ok=0
    log "peer scripts not found in $PEERS_DIR: gnnpar runs alone"
fi

# ---- datasets (prepared once, cached in $work/data; not measured) ---------------------------

# dataset_file NAME: print the dataset.h5 of NAME, preparing it first if needed; prints nothing
# (and logs why) when its source is missing.
dataset_file() {
    local name="$1" out="$work/data/$1.h5" src=""
    if [[ -f "$out" ]]; then
        echo "$out"
        return
    fi
    case "$name" in
        cora) src="$GNNPAR_DATA/planetoid/cora.npz" ;;
        tolokers) src="$GNNPAR_DATA/heterophilous/tolokers.npz" ;;
        facebook) src="$GNNPAR_DATA/facebook_page_page/facebook.npz" ;;
        synth200k)
            log "generating the 200k-node SBM"
            "$GNNPAR" generate sbm --nodes 200000 --edges 4000000 --features 128 --classes 16 \
                --seed 0 -o "$out" > "$work/data/$name.log" 2>&1
            echo "$out"
            return
            ;;
        *) echo "error: unknown dataset $name" >&2; exit 1 ;;
    esac
    if [[ ! -f "$src" ]]; then
        log "SKIPPED: $src not found (set GNNPAR_DATA)"
        return
    fi
    log "preparing $name from $src (split 0)"
    "$GNNPAR" prepare "$src" --split 0 --name "$name" -o "$out" > "$work/data/$name.log" 2>&1
    echo "$out"
}

# ---- runs -----------------------------------------------------------------------------------

# epochs WORKLOAD SYSTEM: epochs to run (0: skip). Few epochs where an epoch is long.
epochs() {
    case "$1:$2" in
        sage-synth200k:pyg) [[ "${PYG_SYNTH200K:-0}" == 1 ]] && echo 1 || echo 0 ;;
        sage-synth200k:*) echo 1 ;;
        sage-*) echo "$SAGE_EPOCHS" ;;
        gcn-*) echo "$GCN_EPOCHS" ;;
    esac
}

# run_one WORKLOAD SYSTEM: run it measured; leaves $work/runs/WORKLOAD.SYSTEM.{out,err,
# measure.json,meta}. The collector turns them into JSON lines.
run_one() {
    local workload="$1" system="$2" model="${1%%-*}" dataset="${1#*-}"
    local base="$work/runs/$workload.$system" n data
    rm -f "$base".*
    n="$(epochs "$workload" "$system")"
    data="$(dataset_file "$dataset")"
    {
        echo "workload=$workload"
        echo "system=$system"
        echo "model=$model"
        echo "dataset=$dataset"
        echo "epochs=$n"
        echo "seed=$SEED"
    } > "$base.meta"
    if [[ -z "$data" ]]; then
        echo "skipped=dataset $dataset not found under $GNNPAR_DATA" >> "$base.meta"
        return
    fi
    if [[ "$n" == 0 ]]; then
        echo "skipped=PyG takes ~12 minutes per epoch here (shared/peers/README.md); PYG_SYNTH200K=1 runs it" >> "$base.meta"
        return
    fi
    local cmd
    case "$system" in
        gnnpar)
            cmd=("$GNNPAR" train --data "$data" --config "$root/inputs/$model-bench.toml"
                --threads "$THREADS" --epochs "$n" --eval-every 1 --seed "$SEED"
                --metrics "$base.metrics.jsonl" --summary "$base.summary.json")
            ;;
        dgl | pyg)
            if [[ "$peers_ok" == 0 ]]; then
                echo "skipped=not installed" >> "$base.meta"
                return
            fi
            cmd=("$peer_python" "$PEERS_DIR/${system}_bench.py" --data "$data" --model "$model"
                --epochs "$n" --threads "$THREADS" --seed "$SEED")
            ;;
    esac
    echo "loadavg_before=$(cat /proc/loadavg)" >> "$base.meta"
    log "$workload / $system: ${cmd[*]}"
    "${measure[@]}" --label "$workload.$system" --stdout "$base.out" --stderr "$base.err" \
        -- "${cmd[@]}" > "$base.measure.json"
    echo "loadavg_after=$(cat /proc/loadavg)" >> "$base.meta"
    log "$workload / $system: $(cat "$base.measure.json")"
}

for workload in $WORKLOADS; do
    case "$workload" in
        sage-tolokers | sage-facebook | sage-synth200k | gcn-cora | gcn-tolokers) ;;
        *) echo "error: unknown workload $workload" >&2; exit 1 ;;
    esac
    for system in $SYSTEMS; do
        case "$system" in
            gnnpar | dgl | pyg) run_one "$workload" "$system" ;;
            *) echo "error: unknown system $system (gnnpar, dgl, pyg)" >&2; exit 1 ;;
        esac
    done
done

python3 "$here/lib/collect_train.py" --runs "$work/runs" --workloads "$WORKLOADS" \
    --systems "$SYSTEMS" --threads "$THREADS" --jsonl "$results/train_vs_peers.jsonl" \
    --markdown "$results/train_vs_peers.md"
