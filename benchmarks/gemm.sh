#!/usr/bin/env bash
# Issue 13 benchmark: gnnpar's products (backend::cpu::gemm: the `gemm` crate in blocks fixed by
# the shape with a per-block epilogue; backend::cpu::sparse_rows) against the `gemm` crate
# (candle's CPU GEMM) called whole and OpenBLAS, side by side in one run, on the products of a
# GraphSAGE training step (inputs/sage-bench.toml) on Tolokers, Facebook and a 200k-vertex SBM,
# plus 512³ and 2048³, at 1 thread and at all cores.
#
#   benchmarks/gemm.sh                      # 6-11 min on a shared 2-core VM, build included
#   MIN_TIME=1 ROUNDS=8 benchmarks/gemm.sh  # longer, steadier medians
#
# Installs libopenblas-dev with apt when it is missing (sudo when not root), builds the
# separate crate benchmarks/gemm/ (release; its own target/), prepares the datasets once into
# $BENCH_WORK, and runs it. Stdout: one JSON object per (product, implementation, threads),
# then the markdown report. Writes benchmarks/results/gemm.json (machine, shapes, every result,
# per-step totals) and benchmarks/results/gemm.md (the report under the verdict block kept
# from the previous gemm.md, between <!-- verdict:begin --> and <!-- verdict:end -->).
#
# Environment: GNNPAR (binary used to prepare the datasets, default target/release/gnnpar,
# built if missing), GNNPAR_DATA (default ../shared/datasets; without it the row counts
# recorded in benchmarks/gemm/src/shapes.rs are used), THREADS (default "1,$(nproc)"),
# ROUNDS (4), MIN_REPS (8), MIN_TIME (0.3 s per product, implementation and thread count),
# BENCH_WORK (default benchmarks/work/gemm), RESULTS (default benchmarks/results).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
GNNPAR="${GNNPAR:-$root/target/release/gnnpar}"
GNNPAR_DATA="${GNNPAR_DATA:-$root/../shared/datasets}"
work="${BENCH_WORK:-$here/work/gemm}"
results="${RESULTS:-$here/results}"
nproc_all="$(nproc)"
if [[ -z "${THREADS:-}" ]]; then
    THREADS=1
    [[ "$nproc_all" -gt 1 ]] && THREADS="1,$nproc_all"
fi
t0=$(date +%s)

log() { echo "[gemm bench $(date +%H:%M:%S)] $*" >&2; }

# ---- system packages (only what is missing) -------------------------------------------------
missing=()
for p in libopenblas-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    SUDO=""
    [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
    log "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# gnnpar's own build dependencies (HDF5, MPI, libclang...), also only when missing.
bash "$root/scripts/install-deps.sh"

# ---- builds -----------------------------------------------------------------------------------
if [[ ! -x "$GNNPAR" ]]; then
    log "building gnnpar (release)"
    (cd "$root" && cargo build --release --quiet)
fi
log "building benchmarks/gemm (release)"
cargo build --release --quiet --manifest-path "$here/gemm/Cargo.toml"
bench="$here/gemm/target/release/gnnpar-gemm-bench"

# ---- datasets (prepared once, cached in $work; not measured) ----------------------------------
mkdir -p "$work" "$results"
export HDF5_USE_FILE_LOCKING=FALSE
data_args=()
prepare() { # NAME NPZ
    local out="$work/$1.h5"
    if [[ ! -f "$out" ]]; then
        if [[ ! -f "$2" ]]; then
            log "$2 not found (set GNNPAR_DATA): $1 uses the recorded row counts"
            data_args+=(--data "$1=$out")
            return
        fi
        log "preparing $1"
        "$GNNPAR" prepare "$2" -o "$out" > "$work/$1.log" 2>&1
    fi
    data_args+=(--data "$1=$out")
}
prepare tolokers "$GNNPAR_DATA/heterophilous/tolokers.npz"
prepare facebook "$GNNPAR_DATA/facebook_page_page/facebook.npz"
if [[ ! -f "$work/sbm200k.h5" ]]; then
    log "generating the 200k-vertex SBM"
    "$GNNPAR" generate sbm --nodes 200000 --edges 8000000 --features 128 --classes 16 --seed 1 \
        -o "$work/sbm200k.h5" > "$work/sbm200k.log" 2>&1
fi
data_args+=(--data "sbm200k=$work/sbm200k.h5")

# ---- run ----------------------------------------------------------------------------------------
# The bench sets every library's thread count itself (rayon pools, gemm's Parallelism::Rayon,
# openblas_set_num_threads); these only size the pools the libraries start with.
export OPENBLAS_NUM_THREADS="$nproc_all" RAYON_NUM_THREADS="$nproc_all"
log "running on threads $THREADS ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
report="$work/report.md"
set +e
"$bench" "${data_args[@]}" --threads "$THREADS" --rounds "${ROUNDS:-4}" \
    --min-reps "${MIN_REPS:-8}" --min-time "${MIN_TIME:-0.3}" \
    --json "$results/gemm.json" --md "$report" | tee "$work/stdout.jsonl"
rc=${PIPESTATUS[0]}
set -e

# ---- gemm.md: the kept verdict, then this run's report ------------------------------------------
md="$results/gemm.md"
verdict="$work/verdict.md"
if [[ -f "$md" ]] && grep -q '<!-- verdict:begin -->' "$md"; then
    sed -n '/<!-- verdict:begin -->/,/<!-- verdict:end -->/p' "$md" > "$verdict"
else
    printf '<!-- verdict:begin -->\n(No verdict written for this run yet.)\n<!-- verdict:end -->\n' > "$verdict"
fi
if [[ -f "$report" ]]; then
    {
        echo "# GEMM: gnnpar vs the gemm crate vs OpenBLAS (issue 13)"
        echo
        echo "Written by \`benchmarks/gemm.sh\` on $(date -u +%Y-%m-%d) (\`results/gemm.json\` has every number)."
        echo
        cat "$verdict"
        echo
        cat "$report"
    } > "$md.tmp-$$"
    mv "$md.tmp-$$" "$md"
fi
log "done in $(( $(date +%s) - t0 )) s: $results/gemm.json, $md"
exit "$rc"
