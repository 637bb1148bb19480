#!/usr/bin/env bash
# Issue 2 benchmark: gnnpar's METIS partitioner against Debian's `gpmetis` on the same graph.
#
# Generates an R-MAT graph (default 1M vertices, 20M stored edges = 10M undirected), then
#   1. gnnpar partition --method metis (default constraints: vertices, edges, train nodes),
#   2. gnnpar partition --method metis --balance vertices (one constraint, like gpmetis),
#   3. gpmetis -seed=0 on the same graph exported with `gnnpar export --format metis`,
# each measured for wall time and peak RSS (benchmarks/lib/measure.py), and writes one JSON
# object per step plus the ratios to benchmarks/results/partition_vs_gpmetis.json (and prints
# them, one per line). Takes a few minutes at the default size.
#
#   benchmarks/partition_vs_gpmetis.sh
#   NODES=100000 EDGES=2000000 benchmarks/partition_vs_gpmetis.sh   # a quick small run
#
# Environment: GNNPAR (binary, default target/release/gnnpar, built if missing), GPMETIS
# (default gpmetis), NODES, EDGES, PARTS (4), SEED (0), BENCH_WORK (scratch directory,
# default benchmarks/work/partition), RESULT (output JSON path).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
NODES="${NODES:-1000000}"
EDGES="${EDGES:-20000000}"
PARTS="${PARTS:-4}"
SEED="${SEED:-0}"
GNNPAR="${GNNPAR:-$root/target/release/gnnpar}"
GPMETIS="${GPMETIS:-gpmetis}"
work="${BENCH_WORK:-$here/work/partition}"
result="${RESULT:-$here/results/partition_vs_gpmetis.json}"
measure=("python3" "$here/lib/measure.py")

log() { echo "[partition bench $(date +%H:%M:%S)] $*" >&2; }

if [[ ! -x "$GNNPAR" ]]; then
    log "building gnnpar (release)"
    (cd "$root" && cargo build --release --quiet)
fi
if ! command -v "$GPMETIS" > /dev/null; then
    echo "error: \`$GPMETIS\` not found (Debian/Ubuntu package \`metis\`); set GPMETIS" >&2
    exit 1
fi
mkdir -p "$work" "$(dirname "$result")"
# Measured steps must not inherit HDF5 locks from one another (see .cargo/config.toml).
export HDF5_USE_FILE_LOCKING=FALSE
load_before="$(cat /proc/loadavg)"

# step LABEL COMMAND...: run COMMAND measured; its stdout/stderr land in $work/LABEL.{out,err},
# the measurement in $work/LABEL.measure.json. Stops the benchmark if the command fails.
step() {
    local label="$1"
    shift
    log "$label: $*"
    "${measure[@]}" --label "$label" --stdout "$work/$label.out" --stderr "$work/$label.err" \
        -- "$@" > "$work/$label.measure.json"
    local rc
    rc="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rc"])' \
        "$work/$label.measure.json")"
    if [[ "$rc" != 0 ]]; then
        echo "error: step $label failed (exit $rc); its stderr ($work/$label.err) ends with:" >&2
        tail -n 20 "$work/$label.err" >&2
        exit 1
    fi
    log "$label: $(cat "$work/$label.measure.json")"
}

data="$work/rmat.h5"
step generate "$GNNPAR" generate rmat --nodes "$NODES" --edges "$EDGES" --features 16 \
    --classes 4 --seed "$SEED" -o "$data"
step export "$GNNPAR" export "$data" --format metis -o "$work/rmat.metis"
step gnnpar_metis_default "$GNNPAR" partition "$data" --parts "$PARTS" --method metis \
    --seed "$SEED" --json -o "$work/parts-default"
step gnnpar_metis_vertices "$GNNPAR" partition "$data" --parts "$PARTS" --method metis \
    --balance vertices --seed "$SEED" --json -o "$work/parts-vertices"
rm -f "$work/rmat.metis.part.$PARTS"
step gpmetis "$GPMETIS" -seed="$SEED" "$work/rmat.metis" "$PARTS"
load_after="$(cat /proc/loadavg)"

python3 - "$work" "$result" "$PARTS" "$load_before" "$load_after" <<'PY'
"""Collect the measurements and the tools' own reports into one JSON document."""
import json
import os
import re
import subprocess
import sys
from collections import Counter

work, result, parts, load_before, load_after = sys.argv[1:6]
parts = int(parts)


def measured(label):
    with open(os.path.join(work, f"{label}.measure.json")) as f:
        return json.load(f)


def last_json(label):
    """The last line of a step's stdout that parses as JSON (gnnpar's machine-readable line)."""
    with open(os.path.join(work, f"{label}.out")) as f:
        for line in reversed(f.read().splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    sys.exit(f"error: no JSON line in {work}/{label}.out")


def seconds(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"error: gpmetis output has no {what} line ({work}/gpmetis.out)")
    return float(m.group(1))


generate = last_json("generate")["generate"]
export = last_json("export")["export"]
undirected_edges = export["edges"]

systems = []
for label, desc in [("gnnpar_metis_default", "vertices,edges,train constraints"),
                    ("gnnpar_metis_vertices", "one constraint: vertices (like gpmetis)")]:
    m, s = measured(label), last_json(label)
    systems.append({
        "system": "gnnpar",
        "step": label,
        "balance": desc,
        "constraints": s["constraints"],
        "parts": s["num_parts"],
        # The whole command: read dataset.h5, symmetrise, METIS, relabel, write parts/.
        "wall_seconds": m["wall_seconds"],
        # CPU seconds (user + system) of the whole command: what gpmetis' timers count.
        "cpu_seconds": round(m["user_seconds"] + m["system_seconds"], 3),
        # Symmetrising and the METIS call only (gnnpar's own timer, wall clock).
        "partition_seconds": round(s["partition_seconds"], 3),
        "peak_rss_mb": m["peak_rss_mb"],
        # gnnpar counts both directions of a cut edge; METIS counts undirected edges.
        "edge_cut": s["edge_cut"] // 2,
        "edge_cut_percent": round(100.0 * (s["edge_cut"] // 2) / max(undirected_edges, 1), 3),
        "vertex_imbalance": round(s["vertex_imbalance"], 4),
        "edge_imbalance": round(s["edge_imbalance"], 4),
        "train_imbalance": round(s["train_imbalance"], 4),
    })

m = measured("gpmetis")
with open(os.path.join(work, "gpmetis.out")) as f:
    text = f.read()
cut = re.search(r"Edgecut:\s*(\d+)", text)
if not cut:
    sys.exit(f"error: gpmetis output has no Edgecut line ({work}/gpmetis.out)")
version = re.search(r"(METIS [0-9.]+)", text)
try:
    package = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "metis"],
                             capture_output=True, text=True).stdout.strip() or None
except OSError:
    package = None
with open(os.path.join(work, f"rmat.metis.part.{parts}")) as f:
    assignment = [int(line) for line in f]
sizes = Counter(assignment)
vertex_imbalance = max(sizes.values()) / (len(assignment) / parts)
systems.append({
    "system": "gpmetis",
    "step": "gpmetis",
    "version": version.group(1) if version else None,
    "debian_package": f"metis {package}" if package else None,
    "balance": "one constraint: vertices",
    "parts": parts,
    # The whole command: reading the text graph, partitioning, writing the .part file.
    "wall_seconds": m["wall_seconds"],
    "cpu_seconds": round(m["user_seconds"] + m["system_seconds"], 3),
    # gpmetis' own timers. They count CPU seconds of the process (GKlib's gk_CPUSeconds is
    # getrusage user + system), not wall time: on a loaded machine they stay put while the
    # wall time grows.
    "io_cpu_seconds": seconds(r"I/O:\s*([0-9.]+)", text, "I/O"),
    "partition_seconds": seconds(r"Partitioning:\s*([0-9.]+)", text, "Partitioning"),
    "peak_rss_mb": m["peak_rss_mb"],
    "edge_cut": int(cut.group(1)),
    "edge_cut_percent": round(100.0 * int(cut.group(1)) / max(undirected_edges, 1), 3),
    "vertex_imbalance": round(vertex_imbalance, 4),
})

gp = systems[-1]


def ratios(s):
    return {
        "step": s["step"],
        # The like-for-like figure: CPU seconds of the whole command against gpmetis' (both
        # read the graph, partition it and write the result; wall time depends on the load).
        "cpu_seconds_vs_gpmetis_cpu": round(s["cpu_seconds"] / gp["cpu_seconds"], 3),
        # gnnpar's partition step (wall) against gpmetis' Partitioning timer (CPU seconds).
        "partition_seconds_vs_gpmetis_partitioning": round(
            s["partition_seconds"] / gp["partition_seconds"], 3),
        "wall_seconds_vs_gpmetis_wall": round(s["wall_seconds"] / gp["wall_seconds"], 3),
        "edge_cut_vs_gpmetis": round(s["edge_cut"] / max(gp["edge_cut"], 1), 3),
        "peak_rss_vs_gpmetis": round(s["peak_rss_mb"] / gp["peak_rss_mb"], 3),
    }


def cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return None


doc = {
    "benchmark": "partition_vs_gpmetis",
    "graph": {
        "generator": "rmat", "nodes": generate["summary"]["nodes"],
        "stored_edges": generate["summary"]["edges"], "undirected_edges": undirected_edges,
        "features": 16, "classes": 4, "metis_file_bytes": export["bytes"],
    },
    "machine": {
        "nproc": os.cpu_count(), "cpu": cpu(),
        "loadavg_before": load_before, "loadavg_after": load_after,
    },
    "steps": {
        label: {"wall_seconds": measured(label)["wall_seconds"],
                "cpu_seconds": round(measured(label)["user_seconds"]
                                     + measured(label)["system_seconds"], 3),
                "peak_rss_mb": measured(label)["peak_rss_mb"]}
        for label in ("generate", "export")
    },
    "systems": systems,
    "ratios": [ratios(s) for s in systems[:-1]],
    "aim": "gnnpar partition step within 1.5x of gpmetis; peak RSS under 6 GB",
}
tmp = result + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(tmp, result)
for s in systems:
    print(json.dumps(s))
for r in doc["ratios"]:
    print(json.dumps({"ratio": r}))
print(f"wrote {result}", file=sys.stderr)
PY
