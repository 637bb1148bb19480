#!/usr/bin/env bash
# The sampler's block build by thread count (issue 14, "sampling ≥ 8× at 16 threads"): the
# serial build (one pass over the edges with the id table) against the parallel one (the id
# table split among owners by cache line, four passes), on the three blocks of a GDP batch of
# a 200k-vertex graph (table in the L2) and of a 3M-vertex graph (beyond it), in rayon pools
# of 1, 2, 4, … threads up to the cores; and the batch's whole sampling with every hop done
# each way (all draws then either build, or draws and numbering overlapped) and as
# `sample_blocks` does it (overlapped on 2-7 threads, the parallel build from 8 threads and
# 32k edges). Those two thresholds are arithmetic until this runs on a many-core host.
#
#   benchmarks/block_build.sh                      # ~1 minute on 2 cores, build included
#   BUILD_THREADS=1,4,16 LABEL=h100host benchmarks/block_build.sh
#   SAMPLER_TEST=.gpu/tests/sampler-<hash> benchmarks/block_build.sh   # a staged test binary
#                                                  # (the GPU host has no Rust toolchain)
#
# Runs the ignored test `block_build_timings` of tests/sampler.rs (release), which prints one
# JSON object per (graph, threads); adds the machine, its load and LABEL, appends them to $OUT
# (default benchmarks/results/block_build.jsonl) and writes the tables of everything in it to
# ${OUT%.jsonl}.md.
#
# Environment: SAMPLER_TEST (the test binary; default: built with cargo), BUILD_THREADS (comma
# list), BUILD_ROUNDS (default 5), BUILD_GRAPHS (small: the 200k graph only), LABEL (default
# the commit), OUT.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
OUT="${OUT:-$here/results/block_build.jsonl}"
LABEL="${LABEL:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo current)}"
log() { echo "[block_build $(date +%H:%M:%S)] $*" >&2; }

if [[ -z "${SAMPLER_TEST:-}" ]]; then
    log "building the sampler tests (release)"
    SAMPLER_TEST=$(cd "$root" && cargo test --release --test sampler --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "sampler":
        print(m["executable"])')
fi
[[ -x "$SAMPLER_TEST" ]] || { echo "block_build: no sampler test binary at '$SAMPLER_TEST'" >&2; exit 1; }

cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || echo unknown)
load=$(cut -d' ' -f1 /proc/loadavg)
log "running $(basename "$SAMPLER_TEST") block_build_timings on $(nproc) cores ($cpu), load $load"
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
"$SAMPLER_TEST" block_build_timings --ignored --nocapture --test-threads=1 |
    { grep -o '{"bench": "block_build".*}' || true; } >"$lines"
[[ -s "$lines" ]] || { echo "block_build: the test printed no timings" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
LABEL="$LABEL" CPU="$cpu" LOAD="$load" HOST="$(hostname)" python3 - "$OUT" "$lines" <<'PY'
import json, os, sys
out, lines = sys.argv[1], sys.argv[2]
extra = {"label": os.environ["LABEL"], "cpu": os.environ["CPU"],
         "host": os.environ["HOST"], "loadavg": float(os.environ["LOAD"])}
rows = [dict(json.loads(l), **extra) for l in open(lines) if l.strip()]
with open(out, "a") as f:
    for r in rows:
        print(json.dumps(r))
        f.write(json.dumps(r) + "\n")
PY
python3 - "$OUT" <<'PY'
import json, sys
from collections import defaultdict
path = sys.argv[1]
rows = [json.loads(l) for l in open(path) if l.strip()]
groups = defaultdict(list)
for r in rows:
    groups[(r["label"], r["host"], r["cpu"], r["vertices"], r["mean_degree"])].append(r)
md = ["# Block builds and a batch's sampling by thread count (`benchmarks/block_build.sh`)", "",
      "Milliseconds per GDP batch (1,024 seeds, fanouts 15/10/5), fastest of the rounds.",
      "*serial*, *parallel*: building its three blocks from the same draws; *par ×*: the",
      "parallel build's speed-up over its own one-thread time; *par vs serial*: serial /",
      "parallel at that thread count (above 1: the parallel build wins). The sampling columns",
      "time the whole batch (draws and builds) with every hop done one way: all draws then the",
      "serial build, all draws then the parallel build, draws and numbering overlapped",
      "(`sample_hop_pipelined`), and `sample_blocks`, which overlaps on 2-7 threads of a",
      "frontier of 4,096+ and builds in parallel from 8 threads (`PAR_MIN_THREADS`) and 32k",
      "edges; *window*: as many batches as threads side by side, each on a thread of its own",
      "(`--sample-ahead`, `sample::ahead`), per batch. Rows of builds before those",
      "columns existed show –.", ""]
ways = ["draws_then_serial_ms", "draws_then_parallel_ms", "pipelined_ms", "sample_blocks_ms", "window_ms"]
def ms(r, k):
    return f"{r[k]:.2f}" if k in r else "–"
for (label, host, cpu, n, deg), rs in groups.items():
    rs.sort(key=lambda r: r["threads"])
    one = next((r["parallel_ms"] for r in rs if r["threads"] == 1), None)
    md += [f"## {label}: {n:,} vertices, mean degree {deg}, {rs[0]['edges_per_batch']:,} edges a batch",
           f"{host}, {rs[0]['cores']} cores ({cpu}), load {rs[0]['loadavg']}", "",
           "| threads | serial ms | parallel ms | par × | par vs serial | sampling: draws + serial | draws + parallel | overlapped | `sample_blocks` | window |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        scale = f"{one / r['parallel_ms']:.2f}×" if one else "–"
        md.append(f"| {r['threads']} | {r['serial_ms']:.2f} | {r['parallel_ms']:.2f} | {scale} | "
                  f"{r['serial_ms'] / r['parallel_ms']:.2f} | "
                  + " | ".join(ms(r, k) for k in ways) + " |")
    md.append("")
open(path[:-len(".jsonl")] + ".md", "w").write("\n".join(md))
PY
log "wrote $OUT and ${OUT%.jsonl}.md"
