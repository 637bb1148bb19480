#!/usr/bin/env python3
"""Charts of a distributed-benchmark results file (the JSON lines of `collect_dist.py record`).

One panel per dataset, each with its own y scale; one stacked bar per run, grouped by strategy
with the rank counts rising; a failed run (or one the device refused) gets an empty bar marked
with its status. Writes PNG and SVG of both figures:

  OUT_time.{png,svg}    epoch time by phase, max over ranks (runs stopped early are scaled to a
                        full epoch)
  OUT_bytes.{png,svg}   MB sent per step by operation kind, summed over ranks (training only)

  python plots.py results/strategies.jsonl --title "Strategies" --out results/strategies

Needs matplotlib (see ensure_matplotlib.sh); everything else is in collect_dist.py.
"""

import argparse
import sys

import matplotlib.pyplot as plt  # without a display it draws with Agg
from collect_dist import BYTE_GROUPS, MB, PHASES, device_label, load_results, run_label

PHASE_COLOURS = dict(zip(PHASES, ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
                                  "#9c755f"]))
BYTE_COLOURS = dict(zip(BYTE_GROUPS, ["#f28e2b", "#76b7b2", "#4e79a7", "#b07aa1", "#bab0ac"]))
# Reproducible SVG files: fixed element ids, no creation date.
plt.rcParams["svg.hashsalt"] = "gnnpar-benchmarks"


def phase_values(r):
    scale = r["epoch_seconds_full"] / r["epoch_seconds"] if r["epoch_seconds"] else 1.0
    return {p: r["phases_max"][p] * scale for p in PHASES}


def byte_values(r):
    return {g: b / MB / r["steps"] for g, b in r["bytes_by_group"].items()}


def epoch_subtitle(r):
    if r["epoch_complete"]:
        return f"full epoch of {r['steps_per_epoch']} steps"
    return f"scaled from {r['steps']} of {r['steps_per_epoch']} steps"


def bar_label(r, several_devices):
    label = run_label(r)
    if several_devices:
        label += f" {r.get('device', 'cpu')}"
    if (r.get("ranks_per_gpu") or 1) > 1:
        label += f" ({r['ranks_per_gpu']}/GPU)"
    return label


def device_line(results):
    """The figure's second title line: where the runs computed, and whether ranks shared GPUs."""
    labels = sorted({device_label(r, sharing=False) for r in results})
    line = "device: " + "; ".join(labels)
    if any((r.get("ranks_per_gpu") or 1) > 1 for r in results):
        line += " — bars marked n/GPU: n ranks share one GPU"
    return line


def draw_panel(ax, runs, series, colours, value_fn, several_devices):
    strategies = list(dict.fromkeys(r.get("strategy") for r in runs))
    runs = sorted(runs, key=lambda r: (strategies.index(r.get("strategy")), r.get("ranks", 0),
                                       r.get("cache_mb") or 0))
    xs, x = [], 0.0
    for i, r in enumerate(runs):
        if i and r.get("strategy") != runs[i - 1].get("strategy"):
            x += 0.5  # a gap between strategies
        xs.append(x)
        x += 1.0
    values = [value_fn(r) if r.get("status") == "ok" else {} for r in runs]
    bottoms = [0.0] * len(runs)
    for s in series:
        heights = [v.get(s, 0.0) for v in values]
        ax.bar(xs, heights, 0.75, bottom=bottoms, color=colours[s], label=s)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, r, total in zip(xs, runs, bottoms):
        if r.get("status") == "ok":
            ax.text(x, total, f"{total:.3g}", ha="center", va="bottom", fontsize=7)
        else:
            ax.text(x, 0, f" {r.get('status', 'failed')}", ha="center", va="bottom", rotation=90,
                    color="red", fontsize=8)
    # Room for the totals (a limit by hand: stacked segments pin autoscaling to their bottoms).
    ax.set_ylim(0, 1.08 * max(bottoms) if any(bottoms) else 1)
    ax.set_xticks(xs, [bar_label(r, several_devices) for r in runs], rotation=40, ha="right",
                  fontsize=8)
    ax.grid(axis="y", color="#ddd")
    ax.set_axisbelow(True)


def draw(results, title, ylabel, series, colours, value_fn, subtitle_fn, out):
    datasets = list(dict.fromkeys(r["dataset"] for r in results if "dataset" in r))
    if not datasets:
        raise SystemExit("plots.py: no runs to draw")
    per_dataset = {d: [r for r in results if r.get("dataset") == d] for d in datasets}
    most = max(len(runs) for runs in per_dataset.values())
    several_devices = len({r.get("device", "cpu") for r in results}) > 1
    fig, axes = plt.subplots(1, len(datasets), squeeze=False,
                             figsize=(len(datasets) * max(3.5, 0.42 * most + 1.2), 5.2))
    for ax, d in zip(axes[0], datasets):
        runs = per_dataset[d]
        ok = [r for r in runs if r.get("status") == "ok"]
        ax.set_title(d + (f"\n{subtitle_fn(ok[0])}" if ok else ""), fontsize=10)
        draw_panel(ax, runs, series, colours, value_fn, several_devices)
    axes[0][0].set_ylabel(ylabel)
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.02, 1),
                       fontsize=9, frameon=False)
    fig.suptitle(f"{title}\n{device_line(results)}", fontsize=11)
    fig.tight_layout()
    paths = [f"{out}.{ext}" for ext in ("png", "svg")]
    fig.savefig(paths[0], dpi=110, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return paths


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="JSON lines written by collect_dist.py record")
    ap.add_argument("--title", required=True)
    ap.add_argument("--out", required=True, help="path prefix: OUT_time.png, OUT_bytes.svg, ...")
    args = ap.parse_args(argv)
    results = load_results(args.results)
    written = draw(results, args.title + ": epoch time by phase (max over ranks)",
                   "seconds per epoch", PHASES, PHASE_COLOURS, phase_values, epoch_subtitle,
                   args.out + "_time")
    written += draw(results, args.title + ": bytes sent per step (sum over ranks)",
                    "MB per step", BYTE_GROUPS, BYTE_COLOURS, byte_values,
                    lambda r: "training only, eval excluded", args.out + "_bytes")
    print("wrote " + " ".join(written))


if __name__ == "__main__":
    main(sys.argv[1:])
