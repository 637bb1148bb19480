#!/usr/bin/env bash
# Issue 3's "at equal accuracy": gnnpar, DGL and PyG trained longer than the timing runs, on
# several seeds, and the test metric at the best validation epoch compared as mean ± std.
#
# It runs benchmarks/train_vs_peers.sh once per seed (the same configurations, files and
# scripts, side by side), with SAGE_EPOCHS epochs for the mini-batch SAGE workloads (20 by
# default, where the 3-epoch timing runs are still climbing) and GCN_EPOCHS for full-batch
# GCN, and collects the per-seed lines into benchmarks/results/accuracy_vs_peers.{jsonl,md}.
#
#   benchmarks/accuracy_vs_peers.sh
#   SEEDS="0 1 2 3 4" WORKLOADS="sage-tolokers" benchmarks/accuracy_vs_peers.sh
#
# Environment: SEEDS ("0 1 2"), WORKLOADS ("sage-tolokers gcn-cora gcn-tolokers"; the
# Facebook and 200k-node SAGE workloads take PyG minutes per epoch), SYSTEMS ("gnnpar dgl
# pyg"), SAGE_EPOCHS (20), GCN_EPOCHS (200), RESULTS (benchmarks/results), and everything
# train_vs_peers.sh reads (GNNPAR, GNNPAR_DATA, PEERS_VENV, THREADS, BENCH_WORK).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SEEDS="${SEEDS:-0 1 2}"
export WORKLOADS="${WORKLOADS:-sage-tolokers gcn-cora gcn-tolokers}"
export SYSTEMS="${SYSTEMS:-gnnpar dgl pyg}"
export SAGE_EPOCHS="${SAGE_EPOCHS:-20}"
export GCN_EPOCHS="${GCN_EPOCHS:-200}"
results="${RESULTS:-$here/results}"
work="${BENCH_WORK:-$here/work/train}"
per_seed="$work/accuracy"
mkdir -p "$per_seed" "$results"

jsonls=()
for seed in $SEEDS; do
    [[ "$seed" =~ ^[0-9]+$ ]] || { echo "error: SEEDS must be non-negative integers, got '$seed'" >&2; exit 1; }
    echo "[accuracy bench $(date +%H:%M:%S)] seed $seed" >&2
    SEED="$seed" RESULTS="$per_seed/seed$seed" BENCH_WORK="$work" \
        bash "$here/train_vs_peers.sh" > /dev/null
    jsonls+=("$per_seed/seed$seed/train_vs_peers.jsonl")
done

python3 "$here/lib/collect_accuracy.py" --workloads "$WORKLOADS" --systems "$SYSTEMS" \
    --jsonl "$results/accuracy_vs_peers.jsonl" --markdown "$results/accuracy_vs_peers.md" \
    "${jsonls[@]}"
