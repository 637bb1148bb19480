#!/usr/bin/env bash
# Thread scaling inside one rank (issue 14, "Scaling on CPUs"): the same `gnnpar train` run
# (inputs/sage-bench.toml, one rank, --device cpu) at 1, 2, 4, 8 and 16 threads, with and
# without the prefetch thread, on Tolokers (2 epochs), Facebook (2 epochs) and the 200k SBM
# (20 steps), each followed by the run's one evaluation. Thread counts above this machine's
# cores are skipped (and said so): 16 threads need a 16-core host.
#
#   benchmarks/threads.sh                             # ~5 minutes on 2 cores, ~3 on 16
#   DATASETS="sbm200k" THREADS="1 2" PREFETCH="off" benchmarks/threads.sh
#   GNNPAR=/tmp/gnnpar-old LABEL=before OUT=/tmp/t.jsonl benchmarks/threads.sh   # another build
#
# Prints one JSON object per run (the phase seconds summed over the run's epochs, from the
# per-epoch JSON lines `--metrics` writes), then a markdown table per dataset with each
# phase's speedup against 1 thread. Writes the JSON lines to $OUT (default
# benchmarks/results/threads.jsonl, appended to: runs of several builds share one table) and
# the tables of everything in it to ${OUT%.jsonl}.md.
#
# Environment knobs:
#   GNNPAR      the binary (default target/release/gnnpar, built if missing)
#   GNNPAR_DATA the shared datasets (default ../shared/datasets, else /work/shared/datasets)
#   BENCH_WORK  scratch folder for the prepared datasets and logs (default out/bench)
#   DATASETS    subset of "tolokers facebook sbm200k"
#   THREADS     thread counts (default "1 2 4 8 16"; those above the cores are skipped)
#   PREFETCH    prefetch settings to run (default "off on"; a build without --prefetch: "-")
#   LABEL       a name for the build measured (default "current"), a column of the table
#   DEVICE      --device of the runs (default cpu; cuda puts the model on the GPU, and the
#               threads then only do the host's share: sampling and input rows)
#   SBM_STEPS   optimizer steps on the SBM graph (default 20)
#   REPEAT      runs of every setting (default 1); the table keeps the fastest of them
#   RUN_TIMEOUT seconds before one run is killed and recorded as failed (default 900)
#   SAMPLE_AHEAD --sample-ahead of the runs (default: gnnpar's, the threads from 4 threads
#               on, up to 16; 1 samples each batch in its step, as builds before 2026-12-05
#               did); name the setting measured in LABEL, e.g. LABEL=in-step SAMPLE_AHEAD=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GNNPAR="${GNNPAR:-$ROOT/target/release/gnnpar}"
BENCH_WORK="${BENCH_WORK:-$ROOT/out/bench}"
OUT="${OUT:-$ROOT/benchmarks/results/threads.jsonl}"
LABEL="${LABEL:-current}"
DEVICE="${DEVICE:-cpu}"
THREADS="${THREADS:-1 2 4 8 16}"
PREFETCH="${PREFETCH:-off on}"
SBM_STEPS="${SBM_STEPS:-20}"
REPEAT="${REPEAT:-1}"
RUN_TIMEOUT="${RUN_TIMEOUT:-900}"
CORES="$(nproc)"
if [[ -z "${GNNPAR_DATA:-}" ]]; then
    GNNPAR_DATA="$ROOT/../shared/datasets"
    [[ -d "$GNNPAR_DATA" ]] || GNNPAR_DATA=/work/shared/datasets
fi
export HDF5_USE_FILE_LOCKING=FALSE

log() { echo "[threads $(date +%H:%M:%S)] $*" >&2; }

if [[ ! -x "$GNNPAR" ]]; then
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release --quiet)
fi
mkdir -p "$BENCH_WORK/logs" "$(dirname "$OUT")"

prepare() {
    local h5="$BENCH_WORK/$1.h5"
    [[ -f "$h5" ]] && return
    log "creating $h5"
    case "$1" in
    tolokers) "$GNNPAR" prepare "$GNNPAR_DATA/heterophilous/tolokers.npz" -o "$h5" >/dev/null ;;
    facebook) "$GNNPAR" prepare "$GNNPAR_DATA/facebook_page_page/facebook.npz" -o "$h5" >/dev/null ;;
    sbm200k)
        "$GNNPAR" generate sbm --nodes 200000 --edges 4000000 --features 128 --classes 16 \
            -o "$h5" >/dev/null
        ;;
    *)
        echo "unknown dataset '$1' (expected tolokers, facebook or sbm200k)" >&2
        exit 2
        ;;
    esac
}

steps() {
    case "$1" in
    sbm200k) echo "--epochs 1 --max-steps $SBM_STEPS" ;;
    *) echo "--epochs 2" ;;
    esac
}

run=()
for t in $THREADS; do
    if ((t > CORES)); then
        log "skipping $t threads: this machine has $CORES cores"
    else
        run+=("$t")
    fi
done

for d in ${DATASETS:-tolokers facebook sbm200k}; do
    prepare "$d"
    for rep in $(seq "$REPEAT"); do
        for p in $PREFETCH; do
            for t in "${run[@]}"; do
                tag="$LABEL-$DEVICE-$d-t$t-p$p-r$rep"
                logs="$BENCH_WORK/logs/threads-$tag"
                rm -f "$logs".*
                # shellcheck disable=SC2046 # the step arguments are meant to split
                cmd=("$GNNPAR" train --data "$BENCH_WORK/$d.h5"
                    --config "$ROOT/inputs/sage-bench.toml" --device "$DEVICE" --threads "$t"
                    --metrics "$logs.metrics.jsonl" $(steps "$d"))
                [[ "$p" == "-" ]] || cmd+=(--prefetch "$p")
                [[ -z "${SAMPLE_AHEAD:-}" ]] || cmd+=(--sample-ahead "$SAMPLE_AHEAD")
                log "$tag: ${cmd[*]}"
                rc=0
                load=$(cut -d' ' -f1 /proc/loadavg)
                timeout --kill-after=10 "$RUN_TIMEOUT" python3 "$ROOT/benchmarks/threads_report.py" \
                    exec --times "$logs.times.json" -- "${cmd[@]}" \
                    >"$logs.stdout" 2>"$logs.stderr" || rc=$?
                ((rc == 0)) || {
                    log "$tag: exit status $rc"
                    tail -n 3 "$logs.stderr" >&2
                }
                python3 "$ROOT/benchmarks/threads_report.py" record \
                    --metrics "$logs.metrics.jsonl" --times "$logs.times.json" \
                    --meta "label=$LABEL" "device=$DEVICE" "dataset=$d" "threads=$t" \
                    "prefetch=$p" "repeat=$rep" "rc=$rc" "cores_present=$CORES" \
                    "loadavg=$load" "command=${cmd[*]}" | tee -a "$OUT"
            done
        done
    done
done
python3 "$ROOT/benchmarks/threads_report.py" table "$OUT" >"${OUT%.jsonl}.md.tmp"
mv "${OUT%.jsonl}.md.tmp" "${OUT%.jsonl}.md"
cat "${OUT%.jsonl}.md"
