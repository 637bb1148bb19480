#!/usr/bin/env python3
"""Reporting helper of the distributed-training benchmarks (python3 stdlib only).

`gdp_scaling.sh` and `strategies.sh` run `gnnpar train` and call this script to

* ``record``: turn one run (its `--metrics` JSON lines, its stdout, its stderr) into one result
  JSON line: epoch time, phase breakdown (max over ranks), bytes moved per operation kind
  (summed over ranks), feature bytes, cache hit rate, split statistics; or a ``failed`` line
  that quotes the command and the end of its stderr;
* ``table``: print a markdown table of a results file.

The charts are drawn from the same results file by ``plots.py`` (matplotlib), which imports the
groupings below.

Conventions, so that runs stopped early by ``--max-steps`` compare with full epochs:

* the measured epoch is the last line of the metrics file; its steps are the optimizer steps
  taken in it; ``epoch_seconds`` is rank 0's wall time of that epoch (evaluation excluded —
  every step ends in a collective, so the ranks finish an epoch together);
* ``phases_max`` are the per-phase seconds of that epoch, max over ranks;
* ``epoch_seconds_full`` scales the measured epoch to a whole epoch
  (× steps_per_epoch / steps); it equals the measurement when the epoch ran to its end;
* bytes are ``bytes_sent`` summed over ranks (bytes a rank keeps for itself are not counted
  by `comm`), for the training kinds; the ``eval_*`` kinds of the final evaluation are kept
  apart.
"""

import argparse
import json
import math
import sys

PHASES = ["sample", "gather", "forward", "backward", "shuffle", "allreduce", "optimizer"]
# Operation kinds of `comm`, grouped for the tables and charts.
SAMPLING_KINDS = {
    "sample_ids", "sample_counts", "sample_nbrs", "split_frontier_ids", "plan_ids", "train_ids",
    # SNP routes the input layer's edges to their sources' owners.
    "snp_vdsts", "snp_edge_ids", "snp_edge_weights",
}
# Hidden rows and their gradients (split's input-layer features are counted as features).
HIDDEN_KINDS = {
    "split_rows", "split_grads", "dnp_rows", "dnp_grads",
    "snp_rows", "snp_grads", "snp_partials", "snp_partial_grads",
}
ALLREDUCE_KINDS = {"allreduce", "allreduce_small"}
BYTE_GROUPS = ["features", "hidden rows + grads", "sampling", "allreduce", "other"]
MB = 1e6


# ---------------------------------------------------------------------------------------------
# record


def parse_meta(pairs):
    """`key=value` pairs from the shell; values that parse as JSON numbers become numbers."""
    meta = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"collect_dist.py record: --meta expects key=value, got {pair!r}")
        try:
            meta[key] = json.loads(value) if value and value[0] in "-0123456789" else value
        except json.JSONDecodeError:
            meta[key] = value
    return meta


def last_json_line(path):
    """The last line of `path` that parses as a JSON object, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def tail(path, n_lines):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "\n".join(f.read().splitlines()[-n_lines:])
    except OSError as e:
        return f"(no stderr: {e})"


def read_metrics(path):
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    return records


def byte_totals(rank_reports):
    """bytes_sent per operation kind, summed over ranks; training kinds and eval kinds apart."""
    train, evaluation = {}, {}
    for report in rank_reports:
        for kind, c in report.get("comm", {}).items():
            dest = evaluation if kind.startswith("eval_") else train
            dest[kind] = dest.get(kind, 0) + c.get("bytes_sent", 0)
    return train, evaluation


def feature_bytes(strategy, train_bytes):
    """Bytes of input-feature rows moved.

    GDP and DNP fetch remote feature rows through the store (`store_rows`); split shuffles the
    input layer's feature rows as `split_features` (hidden rows as `split_rows`); SNP moves none
    (its input layer sends partial rows of the hidden width, `snp_partials`).
    """
    if strategy in ("split", "hybrid"):
        return train_bytes.get("split_features", 0)
    return train_bytes.get("store_rows", 0)


def byte_groups(strategy, train_bytes):
    feats = feature_bytes(strategy, train_bytes)
    groups = dict.fromkeys(BYTE_GROUPS, 0)
    groups["features"] = feats
    for kind, b in train_bytes.items():
        if kind in ("store_rows", "split_features"):
            continue
        if kind in HIDDEN_KINDS:
            groups["hidden rows + grads"] += b
        elif kind in SAMPLING_KINDS:
            groups["sampling"] += b
        elif kind in ALLREDUCE_KINDS:
            groups["allreduce"] += b
        else:
            groups["other"] += b
    if strategy in ("split", "hybrid"):
        groups["hidden rows + grads"] -= feats
    return groups


def cmd_record(args):
    meta = parse_meta(args.meta)
    result = dict(meta)
    rc = int(meta.get("rc", 1))
    summary = last_json_line(args.stdout)
    records = []
    if rc == 0:
        try:
            records = read_metrics(args.metrics)
        except (OSError, json.JSONDecodeError) as e:
            result["status"] = "failed"
            result["error"] = f"metrics file {args.metrics}: {e}"
    if rc != 0 or not records:
        # The caller may classify the failure (e.g. "not implemented": the strategy is unknown).
        result["status"] = meta.get("status", "failed")
        # Ranks write to one stderr: keep the last "gnnpar: error:" of an interleaved line.
        errors = [line[max(line.rfind("gnnpar: error:"), 0):]
                  for line in tail(args.stderr, 500).splitlines() if "error" in line.lower()]
        if rc == 124 or rc == 137:
            result.setdefault("error", f"timed out (exit status {rc})")
        fallback = "no metrics" if rc == 0 else f"exit status {rc}"
        result.setdefault("error", errors[0].strip() if errors else fallback)
        result["stderr_tail"] = tail(args.stderr, 25)
        print(json.dumps(result, sort_keys=True))
        return
    last = records[-1]
    prev_steps = records[-2]["steps"] if len(records) > 1 else 0
    steps = last["steps"] - prev_steps
    ranks = last.get("ranks") or {"ranks": [], "max": {}, "mean": {}}
    rmax = ranks.get("max", {})
    phases_max = {p: rmax.get(f"seconds.{p}", last["seconds"].get(p, 0.0)) for p in PHASES}
    train_bytes, eval_bytes = byte_totals(ranks.get("ranks", []))
    strategy = meta.get("strategy", "gdp")
    store = {k: 0 for k in ("cache_hits", "fetched_rows", "local_rows")}
    for report in ranks.get("ranks", []):
        for k in store:
            store[k] += report.get("store", {}).get(k, 0)
    remote = store["cache_hits"] + store["fetched_rows"]
    full_steps = int(meta.get("steps_per_epoch", steps)) or steps
    scale = full_steps / steps if steps else float("nan")
    result.update(
        {
            "status": "ok",
            "epoch": last["epoch"],
            "steps": steps,
            "epoch_complete": steps >= full_steps,
            "epoch_seconds": last["epoch_seconds"],
            "step_seconds": last["epoch_seconds"] / steps if steps else None,
            "epoch_seconds_full": last["epoch_seconds"] * scale,
            "phases_max": phases_max,
            "phases_rank0": {p: last["seconds"].get(p, 0.0) for p in PHASES},
            "eval_seconds": last["seconds"].get("eval", 0.0),
            "bytes_by_kind": train_bytes,
            "eval_bytes_by_kind": eval_bytes,
            "bytes_total": sum(train_bytes.values()),
            "feature_bytes": feature_bytes(strategy, train_bytes),
            "bytes_by_group": byte_groups(strategy, train_bytes),
            "store": store,
            # Remote feature rows served by the cache, over all remote rows needed (GDP).
            "cache_hit_rate": (store["cache_hits"] / remote) if remote else None,
            "loss": last.get("loss"),
            "nodes": last.get("nodes"),
            "edges": last.get("edges"),
            "input_rows": last.get("input_rows"),
        }
    )
    if last.get("split"):
        result["split"] = last["split"]
    if summary:
        result["peak_rss_mb"] = summary.get("peak_rss_mb")
        result["total_seconds"] = summary.get("total_seconds")
        # What rank 0 computed on (the GPU's name with --device cuda) and its device memory.
        result["device_name"] = summary.get("device")
        result["peak_device_mb"] = summary.get("peak_device_mb")
        # The batches sampled at once ahead of their steps, as the run resolved them.
        result["sample_window"] = summary.get("sample_window")
    print(json.dumps(result, sort_keys=True))


# ---------------------------------------------------------------------------------------------
# table


def load_results(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def per_step_mb(r, b):
    return b / MB / r["steps"]


def run_label(r):
    label = f"{r['strategy']} ×{r['ranks']}"
    if r.get("cache_mb"):
        label += f" +{r['cache_mb']:g}MB"
    return label


def strategy_cell(r):
    """The strategy, with the window its batches were sampled in ahead of their steps where
    the run sampled in windows (the summary's `sample_window`), or the `--sample-ahead` it
    was given (SAMPLE_AHEAD) where the summary predates the field."""
    window = r.get("sample_window")
    if window is None:
        window = r.get("sample_ahead")
    return r.get("strategy", "?") + ("" if window in (None, "", 1) else f" (window {window})")


def device_label(r, sharing=True):
    """Where the run computed; for CUDA the GPUs seen and (sharing) how many ranks share one."""
    device = r.get("device", "cpu")
    if device == "cpu":
        return "cpu"
    if r.get("cuda_emulator"):
        return f"{device} (CPU emulator)"
    gpus = r.get("gpus") or 0
    if not gpus:
        return f"{device} (no GPU seen)"
    label = f"{device}, {gpus} GPU"
    if sharing and (r.get("ranks_per_gpu") or 1) > 1:
        label += f", {r['ranks_per_gpu']} ranks share a GPU"
    return label


def cmd_table(args):
    results = load_results(args.results)
    split_layers = max((len(r.get("split", [])) for r in results), default=0)
    # CPU-only files (every run before the GPU study) keep their columns.
    devices = any(r.get("device", "cpu") != "cpu" for r in results)
    head = [
        "dataset", "strategy", "ranks", *(["device"] if devices else []), "thr", "cache MB",
        "steps", "epoch s",
        "s/step", *[f"{p} s/step" for p in PHASES],
        "feature MB/step", "total MB/step", "cache hit %", "loadavg",
    ]
    if args.split:
        head += [f"L{i} imb / cross %" for i in range(split_layers)]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        dev = [device_label(r)] if devices else []
        if r.get("status") != "ok":
            cells = [r.get("dataset", "?"), strategy_cell(r), str(r.get("ranks", "?")), *dev,
                     str(r.get("threads", "?")), fmt(r.get("cache_mb"), 0),
                     f"**{r.get('status')}**: {r.get('error', '')}"]
            cells += [""] * (len(head) - len(cells))
            print("| " + " | ".join(cells) + " |")
            continue
        steps = r["steps"]
        steps_cell = f"{steps}" if r["epoch_complete"] else f"{steps} of {r['steps_per_epoch']}"
        epoch_cell = fmt(r["epoch_seconds_full"], 2) + ("" if r["epoch_complete"] else " (est.)")
        hit = r.get("cache_hit_rate")
        cells = [
            r["dataset"], strategy_cell(r), str(r["ranks"]), *dev, str(r["threads"]),
            fmt(r.get("cache_mb") or 0, 0), steps_cell, epoch_cell, fmt(r["step_seconds"]),
            *[fmt(r["phases_max"][p] / steps) for p in PHASES],
            fmt(per_step_mb(r, r["feature_bytes"]), 2), fmt(per_step_mb(r, r["bytes_total"]), 2),
            "–" if hit is None else fmt(100 * hit, 1),
            str(r.get("loadavg_before", "")).split(" ")[0],
        ]
        if args.split:
            layers = r.get("split", [])
            for i in range(split_layers):
                cells.append(f"{layers[i]['imbalance']:.3f} / {layers[i]['cross_pct']:.1f}"
                             if i < len(layers) else "")
        print("| " + " | ".join(cells) + " |")
    print()
    print(TABLE_NOTES)
    if devices:
        print(DEVICE_NOTE)


TABLE_NOTES = """\
*steps*: optimizer steps measured ("k of n": stopped by `--max-steps` after k of the n steps of an
epoch); *epoch s*: rank 0's wall time of the measured epoch, evaluation excluded ("est.": scaled
to n steps); phase columns: seconds per step, max over ranks (a phase ending in a collective
also holds the time spent waiting for the slowest rank); *MB/step*: `bytes_sent` summed over
ranks (bytes a rank keeps are not counted; `allreduce` counts the gradient buffer once per
rank; nothing at 1 rank); *feature MB*: GDP / DNP `store_rows`, split `split_features`;
*cache hit %*: remote feature rows served by the cache; *loadavg*: 1-minute load of the machine
when the run started."""
DEVICE_NOTE = """\
*device*: `--device` of the run; with CUDA, the GPUs `nvidia-smi -L` lists and, where there are
more ranks than GPUs, how many ranks share one GPU (their times then include waiting for it)."""


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="one run → one result JSON line on stdout")
    rec.add_argument("--metrics", required=True)
    rec.add_argument("--stdout", required=True)
    rec.add_argument("--stderr", required=True)
    rec.add_argument("--meta", nargs="*", default=[], help="key=value pairs copied into the line")
    tab = sub.add_parser("table", help="markdown table of a results file")
    tab.add_argument("results")
    tab.add_argument("--split", action="store_true", help="add split's per-layer statistics")
    args = ap.parse_args(argv)
    {"record": cmd_record, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main(sys.argv[1:])
