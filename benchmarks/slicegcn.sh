#!/usr/bin/env bash
# SliceGCN (issue 15): accuracy against the paper's Table IV, and epochs per second and peak
# memory per rank against the 1-rank full-batch GCN.
#
#   benchmarks/slicegcn.sh                 # both parts (accuracy ~20-40 min on 2 loaded cores)
#   PART=accuracy benchmarks/slicegcn.sh   # Table IV only
#   PART=speed benchmarks/slicegcn.sh      # throughput / memory only
#
# Accuracy: Minesweeper (7 layers) and Tolokers (4 layers), hidden 128, lr 0.001, dropout 0.5,
# 500 epochs, Adam with cosine annealing, test ROC-AUC at the best validation epoch (evaluated
# every 5 epochs, to fit the 2-core budget). Each
# rank's GCN has the heterophilous benchmark's shape (input projection, residual, layer norm,
# neighbours-only aggregation, per-row output layer; inputs/minesweeper-gcn.toml says why: a
# plain GCN stays ~15 points lower on these sets). "GCN" is SliceGCN at p = 1 without encoding
# or fusion: one full-width GCN + the MLP head. EPOCHS overrides the 500. SPLITS picks the
# datasets' predefined splits (default "0"; the heterophilous benchmark's protocol, which the
# paper's numbers follow, is the mean over all ten: SPLITS="0 1 2 3 4 5 6 7 8 9"); with more
# than one, the table gives mean ± std over them. DATASETS narrows the rows ("minesweeper",
# "tolokers" or both, the default), SLICES the slice counts (default "2 3").
#
# Speed: p = 1..4 (RANKS) of SliceGCN against the 1-rank full-batch GCN (`--strategy gdp
# --full-batch`, the ordinary engine, same shape without the head) on Minesweeper, Tolokers and
# an SBM of SBM_NODES vertices (default 1,000,000; 10 edges per vertex, 256 features), SPEED_EPOCHS
# epochs each (median epoch time; evaluation only at the end). More ranks than cores are
# oversubscribed: on 2 cores, 3 and 4 ranks time-share them.
#
# Outputs: $RESULTS/slicegcn_accuracy.{jsonl,md}, $RESULTS/slicegcn_speed.{jsonl,md}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GNNPAR="${GNNPAR:-$ROOT/target/release/gnnpar}"
DATA="${GNNPAR_DATA:-$ROOT/../shared/datasets}"
RESULTS="${RESULTS:-$ROOT/benchmarks/results}"
WORK="${WORK:-/tmp/gnnpar-slicegcn}"
PART="${PART:-all}"
SPLITS="${SPLITS:-0}"
DATASETS="${DATASETS:-minesweeper tolokers}"
SLICES="${SLICES:-2 3}"
EPOCHS="${EPOCHS:-500}"
RANKS="${RANKS:-1 2 3 4}"
SPEED_EPOCHS="${SPEED_EPOCHS:-5}"
SBM_NODES="${SBM_NODES:-1000000}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$WORK" "$RESULTS"

prepare() { # name npz [split]
    local h5="$WORK/$1.h5"
    [[ -n "${3:-}" ]] && h5="$WORK/$1-split$3.h5"
    [[ -f "$h5" ]] || "$GNNPAR" prepare "$DATA/heterophilous/$2" ${3:+--split "$3"} -o "$h5" >/dev/null
}

# run NP LABEL ARGS...: one training run; appends its summary (with LABEL, and SPLIT when set)
# to $OUT.
run() {
    local np="$1" label="$2" split="${SPLIT:-0}"
    shift 2
    local log="$WORK/run.log" summary="$WORK/summary.json"
    rm -f "$summary"
    if mpirun -np "$np" --oversubscribe --bind-to none "$GNNPAR" train --summary "$summary" "$@" \
        >"$log" 2>&1; then
        python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); s["label"]=sys.argv[2]; s["np"]=int(sys.argv[3]); s["split"]=int(sys.argv[4]); print(json.dumps(s))' \
            "$summary" "$label" "$np" "$split" >>"$OUT"
    else
        echo "FAILED: $label (np $np): $(tail -3 "$log")" >&2
        python3 -c 'import json,sys; print(json.dumps({"label":sys.argv[1],"np":int(sys.argv[2]),"split":int(sys.argv[3]),"status":"failed"}))' \
            "$label" "$np" "$split" >>"$OUT"
    fi
    tail -1 "$OUT" | cut -c1-200
}

shape=(--model gcn --hidden 128 --dropout 0.5 --lr 0.001 --lr-schedule cosine
    --input-proj true --residual true --norm layer --linear-output true --init fan-in)

accuracy() {
    OUT="$RESULTS/slicegcn_accuracy.jsonl"
    : >"$OUT"
    local slice=(--strategy slicegcn --epochs "$EPOCHS" --full-batch --eval-every 5)
    local cfg="$WORK/accuracy.toml"
    printf 'self_loops = false\n' >"$cfg"
    # The variants' suffixes name what they add to direct slicing: -SE the slice encoding,
    # -FF the feature fusion (-FFSE both).
    local plain=(--slice-encoding off --feature-fusion off)
    local se=(--slice-encoding on --feature-fusion off)
    local ff=(--slice-encoding off --feature-fusion on)
    for SPLIT in $SPLITS; do
        for ds in $DATASETS; do
            # Each dataset's depth and the variant the paper adds on it.
            local layers variant
            case "$ds" in
            minesweeper) layers=7 variant=FF ;;
            tolokers) layers=4 variant=SE ;;
            *) echo "DATASETS: unknown '$ds' (minesweeper, tolokers)" >&2 && exit 2 ;;
            esac
            local extra=("${ff[@]}")
            [[ $variant == SE ]] && extra=("${se[@]}")
            prepare "$ds" "$ds.npz" "$SPLIT"
            local data=(--data "$WORK/$ds-split$SPLIT.h5" --config "$cfg" --layers "$layers"
                "${shape[@]}" "${slice[@]}")
            run 1 "$ds GCN" "${data[@]}" "${plain[@]}"
            for p in $SLICES; do
                run "$p" "$ds SliceGCN" "${data[@]}" "${plain[@]}"
                run "$p" "$ds SliceGCN-$variant" "${data[@]}" "${extra[@]}"
            done
        done
    done
    python3 - "$OUT" "$RESULTS/slicegcn_accuracy.md" <<'PY'
import json, statistics, sys
paper = {("minesweeper GCN", 1): 92.90, ("minesweeper SliceGCN", 2): 92.47,
         ("minesweeper SliceGCN", 3): 92.53, ("minesweeper SliceGCN-FF", 2): 92.85,
         ("minesweeper SliceGCN-FF", 3): 93.12, ("tolokers GCN", 1): 82.94,
         ("tolokers SliceGCN", 2): 83.39, ("tolokers SliceGCN", 3): 84.20,
         ("tolokers SliceGCN-SE", 2): 84.06, ("tolokers SliceGCN-SE", 3): 84.31}
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
# One table row per variant and rank count: the mean over the splits run (± the sample std
# where there are several), failed runs counted apart.
groups = {}
for r in rows:
    groups.setdefault((r["label"], r["np"]), []).append(r)
out = ["| dataset / variant | p | splits | test ROC-AUC (best val) | paper | diff | within 1.5 | best epoch | s/epoch |",
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for (label, np_), runs in groups.items():
    want = paper.get((label, np_))
    ok = [r for r in runs if r.get("status") != "failed"]
    failed = len(runs) - len(ok)
    splits = ", ".join(str(r.get("split", 0)) for r in ok) + (f" ({failed} failed)" if failed else "")
    if not ok:
        out.append(f"| {label} | {np_} | {splits} | failed | {want} | | no | | |")
        continue
    test = [100 * r["test"] for r in ok]
    got = statistics.mean(test)
    shown = f"{got:.2f}" + (f" ± {statistics.stdev(test):.2f}" if len(test) > 1 else "")
    diff = got - want if want is not None else float("nan")
    best = statistics.median(r["best_epoch"] for r in ok)
    secs = statistics.median(r["epoch_time_median"] for r in ok)
    out.append(f"| {label} | {np_} | {splits} | {shown} | {want} | {diff:+.2f} | "
               f"{'yes' if abs(diff) <= 1.5 else 'no'} | {best:.0f} | {secs:.3f} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

speed() {
    prepare minesweeper minesweeper.npz
    prepare tolokers tolokers.npz
    local sbm="$WORK/sbm-$SBM_NODES.h5"
    [[ -f "$sbm" ]] || "$GNNPAR" generate sbm --nodes "$SBM_NODES" --edges $((SBM_NODES * 10)) \
        --features 256 --classes 8 --seed 1 -o "$sbm" >/dev/null
    OUT="$RESULTS/slicegcn_speed.jsonl"
    : >"$OUT"
    local cfg="$WORK/speed.toml"
    printf 'self_loops = false\n' >"$cfg"
    local common=(--config "$cfg" --epochs "$SPEED_EPOCHS" --eval-every 0 --full-batch "${shape[@]}")
    # The SBM twice: at 2 layers the GCN's only hidden x hidden product is the head's, and at
    # 4 the per-rank GCN's hidden layers (which shrink as 1/p^2) carry more of the step.
    for ds in minesweeper tolokers sbm sbm-4; do
        local data="$WORK/$ds.h5" layers=4 name="$ds"
        [[ $ds == sbm* ]] && data="$sbm" && layers=2
        [[ $ds == sbm-4 ]] && layers=4 && name="sbm (4 layers)"
        [[ $ds == minesweeper ]] && layers=7
        run 1 "$name GCN (1 rank, gdp)" --data "$data" --layers "$layers" "${common[@]}" --strategy gdp
        for p in $RANKS; do
            run "$p" "$name SliceGCN" --data "$data" --layers "$layers" "${common[@]}" --strategy slicegcn
        done
    done
    python3 - "$OUT" "$RESULTS/slicegcn_speed.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = ["| graph / model | ranks | epochs/s | peak host MiB per rank (max) | per rank | parameters per rank |",
       "| --- | --- | --- | --- | --- | --- |"]
for r in rows:
    if r.get("status") == "failed":
        out.append(f"| {r['label']} | {r['np']} | failed | | | |")
        continue
    m = r["memory"]
    per = ", ".join(f"{v:.0f}" for v in m["host_peak_mb"])
    params = ", ".join(str(v) for v in m.get("params", []))
    out.append(f"| {r['label']} | {r['np']} | {1 / r['epoch_time_median']:.2f} | "
               f"{m['host_peak_mb_max']:.0f} | {per} | {params} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
}

case "$PART" in
accuracy) accuracy ;;
speed) speed ;;
all) accuracy && speed ;;
*) echo "PART must be accuracy, speed or all" >&2 && exit 2 ;;
esac
