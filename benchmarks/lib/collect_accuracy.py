#!/usr/bin/env python3
"""Summarise `accuracy_vs_peers.sh`: per (workload, system), the test metric at the best
validation epoch over seeds (mean, standard deviation, range), next to the epoch time.

Input: the per-seed JSON lines of `train_vs_peers.sh` (one file per seed). Output: one JSON
line per (workload, system) and a markdown table. A system "matches" when its mean lies
within two standard errors of the difference from the best system's mean (or within 0.5
points when both spreads are zero); the table says so per row, so that "at equal accuracy"
is a measured statement, not a reading of two single runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collect_train import SYSTEM_NAMES, write_atomic  # noqa: E402


def summarise(lines: list[dict]) -> dict:
    ok = [l for l in lines if l.get("status") == "ok" and l.get("test") is not None]
    out = {"runs": len(lines), "ok_runs": len(ok)}
    if not ok:
        notes = sorted({l.get("note", l.get("status", "")) for l in lines})
        out["note"] = "; ".join(n for n in notes if n)
        return out
    tests = [100 * l["test"] for l in ok]
    out.update({
        "metric_name": ok[0].get("metric_name"),
        "epochs": ok[0].get("epochs"),
        "seeds": [l.get("seed") for l in ok],
        "test_mean": round(statistics.fmean(tests), 2),
        "test_std": round(statistics.stdev(tests), 2) if len(tests) > 1 else 0.0,
        "test_min": round(min(tests), 2),
        "test_max": round(max(tests), 2),
        "best_epochs": [l.get("best_epoch") for l in ok],
        "epoch_time_median": round(statistics.median(l["epoch_time_median"] for l in ok), 4),
    })
    return out


def matches(a: dict, best: dict) -> bool:
    """Whether `a`'s mean is within noise of `best`'s (two standard errors of the difference)."""
    if a is best:
        return True
    se = math.sqrt(a["test_std"] ** 2 / a["ok_runs"] + best["test_std"] ** 2 / best["ok_runs"])
    return best["test_mean"] - a["test_mean"] <= max(2 * se, 0.5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", required=True)
    p.add_argument("--systems", required=True)
    p.add_argument("--jsonl", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("inputs", nargs="+", help="per-seed train_vs_peers.jsonl files")
    args = p.parse_args()
    workloads, systems = args.workloads.split(), args.systems.split()
    runs: dict[tuple[str, str], list[dict]] = {}
    for path in args.inputs:
        with open(path) as f:
            for line in f:
                if line.strip():
                    l = json.loads(line)
                    runs.setdefault((l["workload"], l["system"]), []).append(l)
    out_lines, rows = [], []
    head = ["workload", "epochs", "seeds"] + [f"{SYSTEM_NAMES[s]} test" for s in systems] + \
        ["gnnpar within noise of the best"]
    rows += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for w in workloads:
        summary = {s: summarise(runs.get((w, s), [])) for s in systems}
        for s in systems:
            out_lines.append({"workload": w, "system": s, **summary[s]})
        done = [summary[s] for s in systems if "test_mean" in summary[s]]
        best = max(done, key=lambda x: x["test_mean"]) if done else None
        cells = [w, str(done[0]["epochs"]) if done else "—",
                 str(len(done[0]["seeds"])) if done else "—"]
        for s in systems:
            x = summary[s]
            if "test_mean" not in x:
                cells.append("—")
                continue
            name = "AUC" if x["metric_name"] == "roc_auc" else "acc"
            cells.append(f"{name} {x['test_mean']:.1f} ± {x['test_std']:.1f}"
                         f" ({x['test_min']:.1f}–{x['test_max']:.1f})")
        g = summary.get("gnnpar", {})
        cells.append("—" if "test_mean" not in g or best is None
                     else ("yes" if matches(g, best) else "no"))
        rows.append("| " + " | ".join(cells) + " |")
    text = ["# Accuracy: gnnpar against DGL and PyG", "",
            "Produced by `benchmarks/accuracy_vs_peers.sh`: the configurations of "
            "`train_vs_peers.sh`, run longer and on several seeds; each cell is the test "
            "metric at the best validation epoch, mean ± standard deviation over seeds (range "
            "in brackets), in percent. The last column compares gnnpar with the best system: "
            "within two standard errors of the difference (at least 0.5 points).", ""] + rows
    write_atomic(args.jsonl, "".join(json.dumps(l) + "\n" for l in out_lines))
    write_atomic(args.markdown, "\n".join(text) + "\n")
    print("\n".join(text), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
