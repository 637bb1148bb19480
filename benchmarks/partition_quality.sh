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
# of sampled edges whose endpoints lie in different parts. Then GSplit training on each
# partitioning (4 MPI ranks, `--strategy split`, inputs/sage-bench.toml, TRAIN_STEPS optimizer
# steps of epoch 0): seconds per step (every step ends in a collective, so the slowest rank
# sets it), the phase breakdown (max over ranks), bytes moved, and the epoch time scaled to
# all the steps of one epoch.
#
# Writes benchmarks/results/partition_quality.json and partition_quality.svg.
# Environment: GNNPAR_BIN (default: build and use target/release/gnnpar), GNNPAR_DATA
# (default ../shared/datasets), PRESAMPLE_EPOCHS (10), EVAL_EPOCHS (5), RMAT_NODES (65536),
# RMAT_EDGES (1048576), TRAIN_STEPS (6; 0 skips training), TRAIN_TIMEOUT (900 s), WORK (scratch directory; default a temporary one, removed at the end).
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
TRAIN_STEPS=${TRAIN_STEPS:-6}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-900}
DATA=${GNNPAR_DATA:-$ROOT/../shared/datasets}
OUT=$ROOT/benchmarks/results
mkdir -p "$OUT"

if [ -z "${GNNPAR_BIN:-}" ]; then
  cargo build --release --quiet
  GNNPAR_BIN=$ROOT/target/release/gnnpar
fi
BIN=$GNNPAR_BIN
export HDF5_USE_FILE_LOCKING=FALSE
# Open MPI refuses root without these (CI and containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ -z "${WORK:-}" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK"
RUNS=$WORK/runs.jsonl
: >"$RUNS"

last_line() { tail -n 1; }

# Split-parallel training on one partitioning; writes $dir/train-$method.json (one record from
# lib/collect_dist.py's `record`, or {"status": "skipped"}).
train_on() { # dataset.h5 dir method
  local data=$1 dir=$2 method=$3 logs=$2/train-$3
  if ((TRAIN_STEPS == 0)); then
    echo '{"status": "skipped"}' >"$logs.json"
    return
  fi
  local train steps rc=0
  train=$("$BIN" info "$data" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["train"])')
  steps=$(((train + BATCH - 1) / BATCH))
  echo "== $name: split training on parts-$method, $TRAIN_STEPS of $steps steps" >&2
  timeout --kill-after=10 "$TRAIN_TIMEOUT" \
    mpirun -np "$PARTS" --oversubscribe --bind-to none \
    "$BIN" train --data "$dir/parts-$method" --config "$ROOT/inputs/sage-bench.toml" \
    --strategy split --fanouts "$FANOUTS" --batch-size "$BATCH" --seed "$EVAL_SEED" \
    --epochs 1 --max-steps "$TRAIN_STEPS" --metrics "$logs.metrics.jsonl" \
    >"$logs.stdout" 2>"$logs.stderr" || rc=$?
  ((rc == 0)) || { echo "training on parts-$method failed:" >&2; tail -n 5 "$logs.stderr" >&2; }
  python3 "$ROOT/benchmarks/lib/collect_dist.py" record --metrics "$logs.metrics.jsonl" \
    --stdout "$logs.stdout" --stderr "$logs.stderr" \
    --meta "rc=$rc" "ranks=$PARTS" "strategy=split" "steps_per_epoch=$steps" >"$logs.json"
}

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
    train_on "$data" "$dir" "$method"
    python3 - "$name" "$method" "$dir" >>"$RUNS" <<'EOF'
import json, sys
name, method, d = sys.argv[1:4]
part = json.load(open(f"{d}/partition-{method}.json"))
train = json.load(open(f"{d}/train-{method}.json"))
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
    "train": {k: train.get(k) for k in (
        "status", "steps", "steps_per_epoch", "step_seconds", "epoch_seconds_full",
        "phases_max", "bytes_total", "feature_bytes", "bytes_by_group", "loadavg_before")},
    "step_seconds": train.get("step_seconds"),
    "epoch_seconds": train.get("epoch_seconds_full"),
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
