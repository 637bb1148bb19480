#!/usr/bin/env python3
"""Records and tables of benchmarks/gpu.sh (standard library only: the GPU image's python).

    collect_gpu.py gnnpar OUT ERR KEY=VALUE...   one JSON line from a gnnpar run's files
    collect_gpu.py peer OUT ERR KEY=VALUE...     one JSON line from pyg_gpu_full.py's stdout
    collect_gpu.py table RESULTS.jsonl           the markdown tables of the latest records

KEY=VALUE pairs (workload, dataset, model, mode, system, ...) are copied into the record.
A run that printed no JSON becomes a record with "status": "failed" and the tail of its
stderr, so a failure shows in the table instead of vanishing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def last_json(path: str) -> dict | None:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def tail(path: str, n: int = 6) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def record(kind: str, out: str, err: str, pairs: list[str]) -> dict:
    rec = dict(p.split("=", 1) for p in pairs)
    got = last_json(out)
    if got is None:
        rec.update(status="failed", error=tail(err))
        return rec
    if kind == "peer":
        rec.update(got)
        rec["system"] = rec.get("system", "pyg")
        return rec
    # gnnpar's summary line: per-phase seconds are totals over the run; per epoch here.
    epochs = max(int(got.get("epochs_run") or 1), 1)
    rec.update(
        status="ok",
        device=got.get("device"),
        threads=got.get("threads"),
        ranks=got.get("ranks"),
        epochs=got.get("epochs_run"),
        epoch_time_median=got.get("epoch_time_median"),
        peak_device_mb=got.get("peak_device_mb"),
        device_transfer_mb_per_epoch={k: v / epochs for k, v in
                                      (got.get("device_transfer_mb") or {}).items()},
        peak_rss_mb=got.get("peak_rss_mb"),
        phases_per_epoch={k: v / epochs for k, v in (got.get("seconds") or {}).items()},
        val=got.get("val"),
        test=got.get("test"),
        final_loss=got.get("final_loss"),
        # Calls into the device per training step (launches, copies, waits); absent from
        # builds before 2026-12-06.
        device_calls_per_step=(got.get("device_calls") or {}).get("per_step"),
    )
    warm_epochs(rec, out)
    return rec


def warm_epochs(rec: dict, out: str) -> None:
    """Time and phases of the epochs after the first, from the run's per-epoch metrics.

    The first epoch on a GPU compiles the kernels (NVRTC), starts cuBLAS and touches fresh
    device memory: with the few epochs of a mini-batch run it would be half the median. Its
    time stays in the record as `first_epoch_seconds`.
    """
    metrics = Path(out[: -len(".out")] + ".metrics.jsonl") if out.endswith(".out") else None
    if metrics is None or not metrics.is_file():
        return
    epochs = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
    if len(epochs) < 2:
        return
    warm = epochs[1:]
    times = sorted(e["epoch_seconds"] for e in warm)
    mid = len(times) // 2
    rec["first_epoch_seconds"] = epochs[0]["epoch_seconds"]
    rec["epoch_time_median"] = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    rec["epoch_time_basis"] = f"median of epochs 2..{len(epochs)}"
    phases: dict[str, float] = {}
    for e in warm:
        for k, v in (e.get("seconds") or {}).items():
            phases[k] = phases.get(k, 0.0) + v / len(warm)
    rec["phases_per_epoch"] = phases


def fmt(x, scale=1.0, digits=1):
    return "—" if x is None else f"{x * scale:.{digits}f}"


def ratio(a, b):
    return "—" if a is None or b in (None, 0) else f"{a / b:.2f}"


def calls(rec: dict) -> str:
    """A run's calls into the device per step: launches and GEMMs, uploads, and the calls that
    wait for the device (downloads and synchronizations)."""
    c = rec.get("device_calls_per_step")
    if not c:
        return "—"
    launches = c.get("launches", 0) + c.get("gemms", 0)
    waits = c.get("downloads", 0) + c.get("synchronizes", 0)
    return f"{launches:.0f}, {c.get('uploads', 0):.0f}, {waits:.2f}"


def table(path: str) -> str:
    latest: dict[tuple, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            latest[(r.get("workload"), r.get("system"))] = r
    rows = list(latest.values())
    out = ["## Full batch, one GPU: gnnpar vs PyG (epoch ms, peak device MB)", "",
           "| dataset | model | gnnpar ms | PyG ms | gnnpar / PyG | gnnpar MB | PyG MB | "
           "gnnpar / PyG | status |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w in sorted({r["workload"] for r in rows if r.get("mode") == "full-batch"}):
        g = latest.get((w, "gnnpar"), {})
        p = latest.get((w, "pyg"), {})
        gt, pt = g.get("epoch_time_median"), p.get("epoch_time_median")
        gm, pm = g.get("peak_device_mb"), p.get("peak_device_mb")
        status = f"gnnpar {g.get('status', '—')}, PyG {p.get('status', '—')}"
        out.append(f"| {g.get('dataset') or p.get('dataset')} | {g.get('model') or p.get('model')} "
                   f"| {fmt(gt, 1e3)} | {fmt(pt, 1e3)} | {ratio(gt, pt)} | {fmt(gm, 1, 0)} "
                   f"| {fmt(pm, 1, 0)} | {ratio(gm, pm)} | {status} |")
    out += ["", "## Mini-batch (`inputs/sage-bench.toml`): gnnpar on the GPU vs the host's CPU "
            "cores (s/epoch, median of the epochs after the first; GPU phases s/epoch; sampling runs "
            "on the prefetch workers, summed over them, so it can exceed the epoch; `wait` is the "
            "time the GPU's step waited for them; `blocked` is the part of gather, forward, "
            "backward and optimizer that the host spent waiting for the GPU: near their sum the "
            "GPU bounds the step, near 0 the host does; — where the run predates it)", "",
            "| dataset | CPU s/epoch (threads) | GPU s/epoch | speedup | sample | wait | gather | "
            "forward | backward | optimizer | blocked | MB to GPU / epoch | GPU peak MB | "
            "calls / step (launches, uploads, waits) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for w in sorted({r["workload"] for r in rows if r.get("mode") == "mini-batch"}):
        c = latest.get((w, "gnnpar-cpu"), {})
        g = latest.get((w, "gnnpar"), {})
        ct, gt = c.get("epoch_time_median"), g.get("epoch_time_median")
        ph = g.get("phases_per_epoch") or {}
        out.append(f"| {g.get('dataset') or c.get('dataset')} | {fmt(ct, 1, 3)} "
                   f"({c.get('threads', '—')}) | {fmt(gt, 1, 3)} | {ratio(ct, gt)} | "
                   + " | ".join(fmt(ph.get(k), 1, 3) for k in
                                ("sample", "prefetch_wait", "gather", "forward", "backward",
                                          "optimizer", "device_blocked"))
                   + f" | {fmt((g.get('device_transfer_mb_per_epoch') or {}).get('to_device'))}"
                   + f" | {fmt(g.get('peak_device_mb'), 1, 0)} | {calls(g)} |")
    failed = [r for r in rows if r.get("status") not in ("ok", None)]
    if failed:
        out += ["", "Runs that did not finish:", ""]
        for r in failed:
            err = (r.get("error") or "").replace("\n", " ")[-240:]
            out.append(f"- {r.get('workload')} / {r.get('system')}: {r.get('status')}: {err}")
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] in ("gnnpar", "peer"):
        print(json.dumps(record(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])))
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        sys.stdout.write(table(sys.argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
