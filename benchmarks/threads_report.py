#!/usr/bin/env python3
"""Records and tables of benchmarks/threads.sh.

  threads_report.py exec --times t.json -- cmd ...   # run cmd, write its wall and CPU seconds
  threads_report.py record --metrics run.metrics.jsonl --times t.json --meta key=value ...
  threads_report.py table results.jsonl              # markdown

A record sums each phase's seconds over the run's epochs (the per-epoch JSON lines of
`gnnpar train --metrics`); `train_s` is the epochs' wall time without evaluation, `run_s` adds
the evaluation; `cores` is the process's CPU seconds over its wall seconds: how many cores the
run actually got (on a shared machine, fewer than its threads when neighbours are busy). The
table shows every run with its speedup against the run of 1 thread of the same build (label),
device, dataset and prefetch setting; with several runs of one setting (REPEAT), the fastest.
"""
import argparse
import json
import resource
import subprocess
import sys
import time

PHASES = ["sample", "gather", "prefetch_wait", "forward", "backward", "shuffle", "allreduce", "optimizer", "eval"]


def execute(args):
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    rc = subprocess.call(cmd)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(args.times, "w") as f:
        json.dump({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}, f)
    return rc


def record(args):
    rec = {}
    for kv in args.meta:
        k, _, v = kv.partition("=")
        rec[k] = int(v) if v.lstrip("-").isdigit() else v
    try:
        with open(args.metrics) as f:
            epochs = [json.loads(line) for line in f if line.strip()]
    except OSError:
        epochs = []
    if not epochs:
        rec["status"] = "failed"
        print(json.dumps(rec))
        return
    try:
        with open(args.times) as f:
            rec.update(json.load(f))
        rec["cores"] = round(rec["cpu_s"] / rec["wall_s"], 2)
    except (OSError, TypeError, ValueError, KeyError, ZeroDivisionError):
        pass
    sec = {p: round(sum(e["seconds"].get(p, 0.0) for e in epochs), 4) for p in PHASES}
    train = sum(e["epoch_seconds"] for e in epochs)
    rec.update(
        status="ok",
        epochs=len(epochs),
        steps=epochs[-1]["steps"],
        input_rows=sum(e.get("input_rows", 0) for e in epochs),
        train_s=round(train, 4),
        eval_s=sec["eval"],
        run_s=round(train + sec["eval"], 4),
        seconds=sec,
    )
    print(json.dumps(rec))


def fmt(x, digits=3):
    return "–" if x is None else f"{x:.{digits}f}"


def speedup(base, x):
    return "–" if not base or not x else f"{base / x:.1f}×"


def table(args):
    runs = []
    with open(args.jsonl) as f:
        for line in f:
            if line.strip():
                runs.append(json.loads(line))
    # Several runs of one setting (REPEAT): keep the fastest, the one least slowed by neighbours.
    best = {}
    for r in runs:
        k = (r["dataset"], r["label"], r.get("device", "cpu"), r["prefetch"], r["threads"])
        if k not in best or (r.get("status") == "ok" and (
                best[k].get("status") != "ok" or r["run_s"] < best[k]["run_s"])):
            best[k] = r
    runs = list(best.values())
    out = []
    for ds in dict.fromkeys(r["dataset"] for r in runs):
        out.append(f"### {ds}\n")
        out.append(
            "| build | device | prefetch | threads | steps | train s | eval s | run s | sample s | gather s "
            "| wait s | forward s | backward s | run × | train × | sample × | gather × | fwd+bwd × | cores | load |"
        )
        out.append("|" + "---|" * 20)
        rows = [r for r in runs if r["dataset"] == ds]
        for r in rows:
            if r.get("status") != "ok":
                out.append(
                    f"| {r['label']} | {r.get('device', 'cpu')} | {r['prefetch']} | {r['threads']} "
                    f"| failed (rc {r.get('rc')}) "
                    + "|" * 16
                )
                continue
            base = next(
                (
                    b
                    for b in rows
                    if b.get("status") == "ok"
                    and b["threads"] == 1
                    and b["label"] == r["label"]
                    and b.get("device") == r.get("device")
                    and b["prefetch"] == r["prefetch"]
                ),
                None,
            )
            s, bs = r["seconds"], (base or {}).get("seconds", {})
            fb = s["forward"] + s["backward"]
            bfb = (bs.get("forward", 0) + bs.get("backward", 0)) or None
            out.append(
                f"| {r['label']} | {r.get('device', 'cpu')} | {r['prefetch']} | {r['threads']} "
                f"| {r['steps']} "
                f"| {fmt(r['train_s'], 2)} | {fmt(r['eval_s'], 2)} | {fmt(r['run_s'], 2)} "
                f"| {fmt(s['sample'])} | {fmt(s['gather'])} | {fmt(s['prefetch_wait'])} "
                f"| {fmt(s['forward'], 2)} | {fmt(s['backward'], 2)} "
                f"| {speedup(base and base['run_s'], r['run_s'])} "
                f"| {speedup(base and base['train_s'], r['train_s'])} "
                f"| {speedup(bs.get('sample'), s['sample'])} "
                f"| {speedup(bs.get('gather'), s['gather'])} "
                f"| {speedup(bfb, fb)} | {r.get('cores', '–')} | {r.get('loadavg', '')} |"
            )
        out.append("")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("exec")
    e.add_argument("--times", required=True)
    e.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("record")
    r.add_argument("--metrics", required=True)
    r.add_argument("--times", default="")
    r.add_argument("--meta", nargs="*", default=[])
    t = sub.add_parser("table")
    t.add_argument("jsonl")
    args = ap.parse_args()
    return {"exec": execute, "record": record, "table": table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
