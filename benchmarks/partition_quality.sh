#!/usr/bin/env bash
# Partition quality as in GSplit §6.3: how well four partitionings serve split parallelism.
#
#   gsplit      METIS with pre-sampling weights: one vertex constraint per layer + edge weights
#   nodes-only  METIS with the same vertex constraints but no edge weights (--no-edge-weights)
#   edge        unweighted METIS balancing edges and training vertices (--balance edges,train)
#   random      a seeded random assignment
#
# on Tolokers, Facebook and an R-MAT graph, 4 parts, fanouts 15,10,5, batch 1024. Weights are
# pre-sampled with seed 1 (PRESAMPLE_EPOCHS epochs); every partition is then measured on
# EVAL_EPOCHS epochs sampled with seed 2, mini-batches the partitioner never saw. Per layer:
# load imbalance (max / mean per part of computed vertices and of aggregated edges) and the %
# of sampled edges whose endpoints lie in different parts.
#
# Writes benchmarks/results/partition_quality.json and partition_quality.svg.
# Environment: GNNPAR_BIN (default: build and use target/release/gnnpar), GNNPAR_DATA
# (default ../shared/datasets), PRESAMPLE_EPOCHS (10), EVAL_EPOCHS (5), RMAT_NODES (65536),
# RMAT_EDGES (1048576), WORK (scratch directory; default a temporary one, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PARTS=4
FANOUTS=15,10,5
BATCH=1024
PRESAMPLE_EPOCHS=${PRESAMPLE_EPOCHS:-10}
EVAL_EPOCHS=${EVAL_EPOCHS:-5}
PRESAMPLE_SEED=1
EVAL_SEED=2
RMAT_NODES=${RMAT_NODES:-65536}
RMAT_EDGES=${RMAT_EDGES:-1048576}
DATA=${GNNPAR_DATA:-$ROOT/../shared/datasets}
OUT=$ROOT/benchmarks/results
mkdir -p "$OUT"

if [ -z "${GNNPAR_BIN:-}" ]; then
  cargo build --release --quiet
  GNNPAR_BIN=$ROOT/target/release/gnnpar
fi
BIN=$GNNPAR_BIN
export HDF5_USE_FILE_LOCKING=FALSE

if [ -z "${WORK:-}" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"
RUNS=$WORK/runs.jsonl
: >"$RUNS"

last_line() { tail -n 1; }

# Append one JSON record per (dataset, partitioning) to $RUNS.
measure() { # dataset-name dataset.h5
  local name=$1 data=$2 dir=$WORK/$1
  mkdir -p "$dir"
  echo "== $name: pre-sampling $PRESAMPLE_EPOCHS epochs" >&2
  local sample_opts=(--fanouts "$FANOUTS" --batch-size "$BATCH")
  "$BIN" presample "$data" --epochs "$PRESAMPLE_EPOCHS" --seed "$PRESAMPLE_SEED" \
    "${sample_opts[@]}" -o "$dir/weights.h5" | last_line >"$dir/presample.json"
  "$BIN" presample "$data" --epochs "$PRESAMPLE_EPOCHS" --seed "$PRESAMPLE_SEED" \
    "${sample_opts[@]}" --no-edge-weights -o "$dir/weights-nodes.h5" >/dev/null
  local method
  for method in gsplit nodes-only edge random; do
    local opts
    case $method in
      gsplit) opts=(--weights "$dir/weights.h5") ;;
      nodes-only) opts=(--weights "$dir/weights-nodes.h5") ;;
      edge) opts=(--balance edges,train) ;;
      random) opts=(--method random) ;;
    esac
    echo "== $name: partition $method, then measure $EVAL_EPOCHS epochs" >&2
    "$BIN" partition "$data" -p "$PARTS" --seed 0 "${opts[@]}" -o "$dir/parts-$method" --json \
      | last_line >"$dir/partition-$method.json"
    "$BIN" presample "$data" --epochs "$EVAL_EPOCHS" --seed "$EVAL_SEED" "${sample_opts[@]}" \
      --evaluate "$dir/parts-$method" | last_line >"$dir/eval-$method.json"
    python3 - "$name" "$method" "$dir" >>"$RUNS" <<'EOF'
import json, sys
name, method, d = sys.argv[1:4]
part = json.load(open(f"{d}/partition-{method}.json"))
ev = json.load(open(f"{d}/eval-{method}.json"))["presample"]
st = ev["split_stats"]
cross = sum(h["cross_edges"] for h in st["hops"])
edges = sum(h["edges"] for h in st["hops"])
print(json.dumps({
    "dataset": name,
    "partitioning": method,
    "num_nodes": ev["num_nodes"],
    "num_edges": ev["num_edges"],
    "static_edge_cut_percent": part["edge_cut_percent"],
    "partition_seconds": part["partition_seconds"],
    "constraints": part["constraints"],
    "eval_batches": st["batches"],
    "hops": [{k: h[k] for k in ("hop", "gnn_layer", "vertex_imbalance", "edge_imbalance",
                                "cross_edge_percent", "vertex_load", "edge_load")}
             for h in st["hops"]],
    "input_imbalance": st["input_imbalance"],
    "total_cross_edge_percent": 100.0 * cross / edges if edges else 0.0,
    "epoch_seconds": None,
}))
EOF
  done
}

# Tolokers and Facebook from the shared datasets (skipped, loudly, when absent).
for spec in "tolokers heterophilous/tolokers.npz" "facebook facebook_page_page/facebook.npz"; do
  set -- $spec
  if [ -f "$DATA/$2" ]; then
    "$BIN" prepare "$DATA/$2" -o "$WORK/$1.h5" >/dev/null
    measure "$1" "$WORK/$1.h5"
  else
    echo "SKIPPED: $1 ($DATA/$2 not found; set GNNPAR_DATA)" >&2
  fi
done
"$BIN" generate rmat --nodes "$RMAT_NODES" --edges "$RMAT_EDGES" --seed 3 \
  -o "$WORK/rmat.h5" >/dev/null
measure rmat "$WORK/rmat.h5"

python3 "$ROOT/benchmarks/partition_quality_report.py" "$RUNS" \
  --parts "$PARTS" --fanouts "$FANOUTS" --batch-size "$BATCH" \
  --presample-epochs "$PRESAMPLE_EPOCHS" --presample-seed "$PRESAMPLE_SEED" \
  --eval-epochs "$EVAL_EPOCHS" --eval-seed "$EVAL_SEED" \
  --rmat "$RMAT_NODES,$RMAT_EDGES" \
  --json "$OUT/partition_quality.json" --svg "$OUT/partition_quality.svg"
