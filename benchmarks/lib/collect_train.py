#!/usr/bin/env python3
"""Turn the runs of `train_vs_peers.sh` into one JSON line per (workload, system) and a table.

Each run left, in the runs directory, `WORKLOAD.SYSTEM.meta` (key=value lines written by the
shell script), and when it ran: `.measure.json` (wall time and peak RSS from measure.py),
`.out` / `.err` (the command's output), and for gnnpar `.summary.json` and
`.metrics.jsonl`. Every JSON line carries the same fields whatever the system, so the
systems can be read side by side:

    workload, model, dataset, system, seed, version, status ("ok", "skipped", "failed"), note,
    epochs, epoch_time_median, epoch_seconds, peak_rss_mb (measured from outside, the same way
    for every system), wall_seconds and cpu_seconds (whole process), metric_name, val, test, best_epoch, final_loss,
    split_per_epoch (seconds per epoch by phase: gnnpar's sample / gather / forward / backward /
    optimizer, the peers' sample / train), threads, loadavg_before, loadavg_after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

SYSTEM_NAMES = {"gnnpar": "gnnpar", "dgl": "DGL", "pyg": "PyG"}


def read_meta(path: str) -> dict:
    meta = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            meta[key] = value
    return meta


def last_json_line(path: str):
    """The last line of `path` that parses as a JSON object, or None."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def tail(path: str, n: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(line.strip() for line in f.read().splitlines()[-n:])
    except OSError:
        return ""


def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def gnnpar_fields(base: str, epochs: int) -> dict:
    summary = last_json_line(base + ".out")
    if summary is None:
        raise ValueError("no summary JSON line on stdout")
    epoch_seconds = []
    try:
        with open(base + ".metrics.jsonl") as f:
            epoch_seconds = [json.loads(line)["epoch_seconds"] for line in f if line.strip()]
    except OSError:
        pass
    runs = max(summary.get("epochs_run", epochs), 1)
    phases = summary.get("seconds", {})
    split = {k: round(phases.get(k, 0.0) / runs, 4)
             for k in ("sample", "gather", "forward", "backward", "optimizer")}
    return {
        "version": None,
        "epochs": summary.get("epochs_run"),
        "epoch_time_median": summary.get("epoch_time_median"),
        "epoch_seconds": [round(s, 4) for s in epoch_seconds],
        "self_reported_peak_rss_mb": summary.get("peak_rss_mb"),
        "metric_name": summary.get("metric"),
        "val": finite(summary.get("val")),
        "test": finite(summary.get("test")),
        "best_epoch": summary.get("best_epoch"),
        "final_loss": finite(summary.get("final_loss")),
        "split_per_epoch": split,
    }


def peer_fields(base: str) -> dict:
    out = last_json_line(base + ".out")
    if out is None:
        raise ValueError("no JSON line on stdout")
    runs = max(len(out.get("epoch_seconds", [])), 1)
    fields = {
        "version": out.get("version"),
        "epochs": out.get("epochs"),
        "epoch_time_median": out.get("epoch_time_median"),
        "epoch_seconds": out.get("epoch_seconds"),
        "self_reported_peak_rss_mb": out.get("peak_rss_mb"),
        "metric_name": out.get("metric_name"),
        "val": out.get("val"),
        "test": out.get("test"),
        "best_epoch": out.get("best_epoch"),
        "final_loss": out.get("final_loss"),
        "split_per_epoch": {"sample": round(out.get("sample_seconds", 0.0) / runs, 4),
                            "train": round(out.get("train_seconds", 0.0) / runs, 4)},
    }
    if out.get("sampler"):
        fields["sampler"] = out["sampler"]
    return fields


def collect(runs: str, workload: str, system: str, threads: int) -> dict:
    base = os.path.join(runs, f"{workload}.{system}")
    meta = read_meta(base + ".meta") if os.path.exists(base + ".meta") else {}
    line = {
        "workload": workload,
        "model": meta.get("model", workload.split("-", 1)[0]),
        "dataset": meta.get("dataset", workload.split("-", 1)[1]),
        "system": system,
        "threads": threads,
        "seed": int(meta["seed"]) if meta.get("seed", "").isdigit() else None,
    }
    if "skipped" in meta or not meta:
        line["status"] = "skipped"
        note = meta.get("skipped", "not run")
        line["note"] = note
        if system != "gnnpar" and note == "not installed":
            line["peer"] = "not installed"
        return line
    line["loadavg_before"] = meta.get("loadavg_before")
    line["loadavg_after"] = meta.get("loadavg_after")
    with open(base + ".measure.json") as f:
        measured = json.load(f)
    line["wall_seconds"] = measured["wall_seconds"]
    line["peak_rss_mb"] = measured["peak_rss_mb"]
    # CPU seconds of the whole process (start-up, loading, training, evaluation): less
    # sensitive than wall time to other work sharing the cores.
    line["cpu_seconds"] = round(measured["user_seconds"] + measured["system_seconds"], 3)
    if measured["rc"] != 0:
        line["status"] = "failed"
        line["note"] = f"exit {measured['rc']}: {tail(base + '.err')}"
        return line
    try:
        fields = gnnpar_fields(base, int(meta["epochs"])) if system == "gnnpar" \
            else peer_fields(base)
    except (ValueError, KeyError, OSError) as e:
        line["status"] = "failed"
        line["note"] = f"unreadable output ({e}): {tail(base + '.err')}"
        return line
    line.update(fields)
    line["status"] = "ok"
    if len(line.get("epoch_seconds") or []) == 1:
        line["note"] = "one epoch only: its time includes warm-up"
    return line


def fmt(x, digits=3):
    return "—" if x is None else f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def metric_cell(line: dict) -> str:
    if line.get("status") != "ok" or line.get("test") is None:
        return "—"
    name = "AUC" if line.get("metric_name") == "roc_auc" else "acc"
    return f"{name} {100 * line['test']:.1f}"


def markdown(lines: list[dict], workloads: list[str], systems: list[str]) -> str:
    by = {(l["workload"], l["system"]): l for l in lines}
    peers = [s for s in systems if s != "gnnpar"]
    head = ["workload"] + [f"{SYSTEM_NAMES[s]} epoch s" for s in systems]
    if "gnnpar" in systems and peers:
        head.append("gnnpar / faster peer")
    head += [f"{SYSTEM_NAMES[s]} RSS MB" for s in systems]
    head += [f"{SYSTEM_NAMES[s]} test metric" for s in systems]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes = []
    for w in workloads:
        cells = [w]
        for s in systems:
            l = by.get((w, s), {})
            if l.get("status") == "ok":
                cells.append(f"{l['epoch_time_median']:.3f}")
            else:
                cells.append(l.get("status", "—"))
                if l.get("note"):
                    notes.append(f"- {w} / {SYSTEM_NAMES[s]}: {l['status']}: {l['note']}")
        if "gnnpar" in systems and peers:
            g = by.get((w, "gnnpar"), {})
            peer_times = [by[(w, p)]["epoch_time_median"] for p in peers
                          if by.get((w, p), {}).get("status") == "ok"]
            if g.get("status") == "ok" and peer_times:
                cells.append(f"{g['epoch_time_median'] / min(peer_times):.2f}")
            else:
                cells.append("—")
        for s in systems:
            l = by.get((w, s), {})
            cells.append(f"{l['peak_rss_mb']:.0f}" if l.get("status") == "ok" else "—")
        for s in systems:
            cells.append(metric_cell(by.get((w, s), {})))
        rows.append("| " + " | ".join(cells) + " |")
    loads = sorted({l["loadavg_before"].split()[0] for l in lines if l.get("loadavg_before")}
                   | {l["loadavg_after"].split()[0] for l in lines if l.get("loadavg_after")},
                   key=float)
    text = ["# Training epoch time: gnnpar against DGL and PyG", "",
            "Produced by `benchmarks/train_vs_peers.sh` (one run, systems side by side). Epoch "
            "time is the median over the epochs run, evaluation excluded; RSS is the peak of the "
            "whole process, measured from outside the same way for every system; the metric is "
            "the test value at the best validation epoch (after few epochs: a sanity check, not "
            "converged quality). The ratio divides gnnpar's epoch time by the faster peer's "
            "(issue 3's goal: at most 0.5).", ""]
    text += rows
    if loads:
        text += ["", f"1-minute load average during the runs: {loads[0]} to {loads[-1]} "
                 f"(2-core machine; other work shares it)."]
    if notes:
        text += ["", "Notes:"] + notes
    return "\n".join(text) + "\n"


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True)
    p.add_argument("--workloads", required=True, help="space-separated")
    p.add_argument("--systems", required=True, help="space-separated")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--jsonl", required=True)
    p.add_argument("--markdown", required=True)
    args = p.parse_args()
    workloads, systems = args.workloads.split(), args.systems.split()
    lines = [collect(args.runs, w, s, args.threads) for w in workloads for s in systems]
    write_atomic(args.jsonl, "".join(json.dumps(l) + "\n" for l in lines))
    table = markdown(lines, workloads, systems)
    write_atomic(args.markdown, table)
    for l in lines:
        print(json.dumps(l))
    print(table, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
