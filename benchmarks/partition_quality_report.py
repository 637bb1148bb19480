#!/usr/bin/env python3
"""Collect partition_quality.sh's per-run records into one JSON file, an SVG bar chart and a
Markdown table on stdout. Standard library only (the SVG is written as plain text)."""

import argparse
import json
import platform
from datetime import datetime, timezone
from html import escape

METHODS = ["gsplit", "nodes-only", "edge", "random"]
COLORS = {"gsplit": "#1f77b4", "nodes-only": "#6baed6", "edge": "#ff7f0e", "random": "#9e9e9e"}
LABELS = {
    "gsplit": "GSplit (vertex + edge weights)",
    "nodes-only": "vertex weights only",
    "edge": "Edge (METIS: edges, train)",
    "random": "random",
}


def by_layer(run, field):
    """Values of `field` ordered by GNN layer 1, 2, … (layer 1 reads the input features)."""
    return [h[field] for h in sorted(run["hops"], key=lambda h: h["gnn_layer"])]


def nice_max(x):
    """A round axis maximum at or above x."""
    if x <= 0:
        return 1.0
    step = 10 ** len(str(int(x))) / 10 if x >= 1 else 0.1
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= x:
            return m * step
    return 10 * step


def panel(x0, y0, w, h, title, groups, series, ylabel):
    """One grouped bar chart. `series[method]` is a list with one value per group."""
    out = []
    left, bottom, top = 48, 30, 24
    pw, ph = w - left - 8, h - bottom - top
    vmax = nice_max(max((v for vals in series.values() for v in vals), default=1.0))
    ox, oy = x0 + left, y0 + top + ph
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + 14}" text-anchor="middle" '
               f'font-size="13" font-weight="bold">{escape(title)}</text>')
    for i in range(6):
        v = vmax * i / 5
        y = oy - ph * i / 5
        out.append(f'<line x1="{ox}" y1="{y:.1f}" x2="{ox + pw}" y2="{y:.1f}" '
                   f'stroke="#ddd" stroke-width="1"/>')
        out.append(f'<text x="{ox - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">'
                   f'{v:g}</text>')
    out.append(f'<text x="{x0 + 10}" y="{y0 + top + ph / 2}" font-size="10" text-anchor="middle" '
               f'transform="rotate(-90 {x0 + 10} {y0 + top + ph / 2})">{escape(ylabel)}</text>')
    methods = [m for m in METHODS if m in series]
    gw = pw / max(len(groups), 1)
    bw = gw * 0.8 / max(len(methods), 1)
    for g, name in enumerate(groups):
        gx = ox + g * gw + gw * 0.1
        for k, m in enumerate(methods):
            v = series[m][g]
            bh = ph * v / vmax
            out.append(f'<rect x="{gx + k * bw:.1f}" y="{oy - bh:.1f}" width="{bw - 1:.1f}" '
                       f'height="{bh:.1f}" fill="{COLORS[m]}"><title>{escape(LABELS[m])}: '
                       f'{v:.2f}</title></rect>')
        out.append(f'<text x="{ox + g * gw + gw / 2:.1f}" y="{oy + 16}" text-anchor="middle" '
                   f'font-size="11">{escape(name)}</text>')
    out.append(f'<line x1="{ox}" y1="{oy}" x2="{ox + pw}" y2="{oy}" stroke="#000"/>')
    out.append(f'<line x1="{ox}" y1="{oy}" x2="{ox}" y2="{oy - ph}" stroke="#000"/>')
    return out


def svg(runs, config):
    datasets = list(dict.fromkeys(r["dataset"] for r in runs))
    pw, ph = 380, 240
    width, height = 2 * pw + 20, 60 + len(datasets) * (ph + 10) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="18" font-size="14" font-weight="bold">Partition quality for split '
           f'parallelism ({config["parts"]} parts, fanouts {config["fanouts"]}, batch '
           f'{config["batch_size"]}; measured on {config["eval_epochs"]} unseen epochs)</text>']
    for k, m in enumerate(METHODS):
        x = 10 + k * 185
        out.append(f'<rect x="{x}" y="30" width="12" height="12" fill="{COLORS[m]}"/>')
        out.append(f'<text x="{x + 16}" y="40" font-size="11">{escape(LABELS[m])}</text>')
    for d, name in enumerate(datasets):
        mine = {r["partitioning"]: r for r in runs if r["dataset"] == name}
        layers = [f"layer {h['gnn_layer']}" for h in
                  sorted(next(iter(mine.values()))["hops"], key=lambda h: h["gnn_layer"])]
        y = 55 + d * (ph + 10)
        cross = {m: by_layer(r, "cross_edge_percent") for m, r in mine.items()}
        imb = {m: [100 * (v - 1) for v in by_layer(r, "edge_imbalance")] for m, r in mine.items()}
        out += panel(10, y, pw, ph, f"{name}: cross-split edges", layers, cross, "% of sampled edges")
        out += panel(10 + pw, y, pw, ph, f"{name}: edge-load imbalance", layers, imb,
                     "max/mean − 1 (%)")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def timing(run):
    """Split training columns: seconds per step, epoch seconds, MB moved per step."""
    t = run.get("train") or {}
    if t.get("status") != "ok" or not t.get("steps"):
        return " | ".join([t.get("status") or "–"] + ["–"] * 2)
    mb = t["bytes_total"] / t["steps"] / 1e6
    return f"{t['step_seconds']:.3f} | {t['epoch_seconds_full']:.2f} | {mb:.1f}"


def table(runs):
    lines = ["| dataset | partitioning | cross-split % (layer 1/2/3) | all layers | "
             "vertex imbalance (layer 1/2/3) | edge imbalance (layer 1/2/3) | input rows imb. | "
             "static edge cut % | split s/step | epoch s | MB/step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        f = lambda field, fmt: " / ".join(fmt.format(v) for v in by_layer(r, field))
        lines.append(f"| {r['dataset']} | {r['partitioning']} | {f('cross_edge_percent', '{:.1f}')} | "
                     f"{r['total_cross_edge_percent']:.1f} | {f('vertex_imbalance', '{:.3f}')} | "
                     f"{f('edge_imbalance', '{:.3f}')} | {r['input_imbalance']:.3f} | "
                     f"{r['static_edge_cut_percent']:.1f} | {timing(r)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", help="JSON lines, one per (dataset, partitioning)")
    ap.add_argument("--parts", type=int, required=True)
    ap.add_argument("--fanouts", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--presample-epochs", type=int, required=True)
    ap.add_argument("--presample-seed", type=int, required=True)
    ap.add_argument("--eval-epochs", type=int, required=True)
    ap.add_argument("--eval-seed", type=int, required=True)
    ap.add_argument("--rmat", required=True, help="nodes,edges of the R-MAT graph")
    ap.add_argument("--json", required=True)
    ap.add_argument("--svg", required=True)
    a = ap.parse_args()
    with open(a.runs) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    if not runs:
        raise SystemExit("partition_quality_report: no runs recorded")
    nodes, edges = (int(x) for x in a.rmat.split(","))
    config = {
        "parts": a.parts,
        "fanouts": a.fanouts,
        "batch_size": a.batch_size,
        "presample_epochs": a.presample_epochs,
        "presample_seed": a.presample_seed,
        "eval_epochs": a.eval_epochs,
        "eval_seed": a.eval_seed,
        "rmat": {"nodes": nodes, "edges_requested": edges, "seed": 3},
        "host": platform.node(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    doc = {
        "benchmark": "partition_quality (GSplit §6.3)",
        "config": config,
        "definitions": {
            "partitionings": LABELS,
            "vertex_imbalance": "per layer, max / mean over parts of the destinations each part "
                                "computes (owner computes), summed over the evaluation batches",
            "edge_imbalance": "per layer, max / mean over parts of the sampled edges aggregated "
                              "by each part (by the destination's owner)",
            "cross_edge_percent": "per layer, % of sampled edges whose endpoints lie in "
                                  "different parts (each needs a row shuffled)",
            "input_imbalance": "max / mean over parts of input feature rows loaded",
            "static_edge_cut_percent": "% of stored edges cut (gnnpar partition's own figure)",
        },
        "notes": {
            "epoch_seconds": "GSplit training (`gnnpar train --strategy split`, parts ranks, "
                             "inputs/sage-bench.toml) for a few steps of epoch 0; seconds per "
                             "step times the steps of a full epoch. Wall times on a shared "
                             "machine: compare partitionings of one run, not across runs",
            "evaluation": "weights are pre-sampled with presample_seed; every partition is "
                          "measured on eval_epochs epochs sampled with eval_seed, i.e. on "
                          "mini-batches the partitioner never saw",
        },
        "results": runs,
    }
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(a.svg, "w") as f:
        f.write(svg(runs, config))
    print(table(runs))
    print(f"\nwrote {a.json} and {a.svg}")


if __name__ == "__main__":
    main()
