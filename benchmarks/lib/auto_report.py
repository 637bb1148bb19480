#!/usr/bin/env python3
"""Report of benchmarks/auto.sh: pick quality, prediction error per strategy, and where the best
fixed strategy loses by >= 1.5x. Writes OUT.md and (unless --no-plot) OUT.{png,svg}.

  python auto_report.py results/auto.jsonl --out results/auto
"""

import argparse
import json
import statistics
from collections import defaultdict


# Each planner phase and the training phases that measure it (the summary's `prediction.phases`).
PHASES = {"build": ["sample"], "load": ["gather"], "shuffle": ["shuffle"],
          "train": ["forward", "backward"], "sync": ["allreduce"], "optimizer": ["optimizer"]}


def phase_table(cases):
    """Median measured / predicted per strategy and phase, where the runs timed the hidden
    rows' shuffles apart (a `shuffle` among the measured phases; older runs counted them in
    `gather` and `forward`, so their phases do not compare)."""
    ratios = defaultdict(list)
    for runs in cases.values():
        for s, r in runs.items():
            m, p = r.get("measured_phases") or {}, r.get("predicted_phases") or {}
            if "shuffle" not in m:
                continue
            for phase, parts in PHASES.items():
                measured = sum(m.get(x, 0.0) for x in parts)
                if p.get(phase, 0.0) > 0.0 and measured > 0.0:
                    ratios[(s, phase)].append(measured / p[phase])
    if not ratios:
        return []
    strategies = sorted({s for s, _ in ratios})
    out = ["", "Median measured / predicted per phase (build = sample, load = gather, "
           "train = forward + backward, sync = allreduce):", "",
           "| strategy | " + " | ".join(PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for s in strategies:
        cells = [f"{statistics.median(ratios[(s, ph)]):.2f}" if ratios[(s, ph)] else "-"
                 for ph in PHASES]
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return out


def scores(cases, predicted="predicted_step", choice="choice"):
    """Picks within 10 % of the fastest, and per strategy the relative errors (absolute and
    signed), of the predictions and picks held under `predicted` and `choice`."""
    good, errors, signed = 0, defaultdict(list), defaultdict(list)
    for runs in cases.values():
        fastest = min(r["measured_step"] for r in runs.values())
        pick = next(iter(runs.values()))[choice]
        good += pick in runs and runs[pick]["measured_step"] <= 1.10 * fastest
        for s, r in runs.items():
            e = (r[predicted] - r["measured_step"]) / r["measured_step"]
            errors[s].append(abs(e))
            signed[s].append(e)
    return good, errors, signed


def grid_calibration_lines(cases):
    """Picks and errors had every case been priced by the calibration its rank count began
    with (grids that calibrate each case again keep that prediction too): the first table
    measures the cost model against a calibration of the host's state at the time, this one
    the model plus the host's drift since the grid's calibration."""
    if not all("predicted_step_grid_calibration" in r
               for runs in cases.values() for r in runs.values()):
        return []
    good, errors, signed = scores(cases, "predicted_step_grid_calibration",
                                  "choice_grid_calibration")
    return ["", "Priced instead by the calibration each rank count began with (a cached "
            f"calibration): picks {good}/{len(cases)}; median abs error "
            + ", ".join(f"{s} {100 * statistics.median(errors[s]):.0f}% "
                        f"({100 * statistics.median(signed[s]):+.0f}%)" for s in sorted(errors))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.jsonl) if line.strip()]
    cases = defaultdict(dict)
    for r in rows:
        if not r["failed"] and r["measured_step"]:
            cases[(r["dataset"], r["model"], r["hidden"], r["ranks"])][r["strategy"]] = r
    # The strategies measured, in the planner's order (grids before nfp was pickable
    # measured the first four).
    order = [s for s in ["gdp", "split", "dnp", "snp", "nfp"]
             if any(s in runs for runs in cases.values())]
    lines = [f"| dataset | model | hidden | ranks | measured s/step ({', '.join(order)}) "
             "| predicted s/step | pick | fastest | pick/fastest |", "|" + "---|" * 9]
    losses, spread = [], defaultdict(list)
    good, errors, signed = scores(cases)
    total = len(cases)
    for key, runs in sorted(cases.items()):
        fastest = min(runs, key=lambda s: runs[s]["measured_step"])
        choice = next(iter(runs.values()))["choice"]
        ratio = (runs[choice]["measured_step"] / runs[fastest]["measured_step"]
                 if choice in runs else float("nan"))
        for s, r in runs.items():
            # How far the case's single rounds lie from the median reported: the error a
            # prediction of that median exactly would have against one round.
            rounds = r.get("measured_rounds") or []
            if len(rounds) > 1:
                spread[s].append(statistics.median(
                    abs(x - r["measured_step"]) / r["measured_step"] for x in rounds))
        worst = max(runs.values(), key=lambda r: r["measured_step"])["measured_step"]
        best_fixed_loss = worst / runs[fastest]["measured_step"]
        if best_fixed_loss >= 1.5:
            slow = [s for s in runs if runs[s]["measured_step"] >= 1.5 * runs[fastest]["measured_step"]]
            losses.append(f"{'/'.join(map(str, key))}: {fastest} beats {', '.join(slow)} by "
                          f">= 1.5x (worst {best_fixed_loss:.2f}x)")
        fmt = lambda f: ", ".join(f"{runs[s][f]:.4f}" if s in runs else "-"
                                  for s in order)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {fmt('measured_step')} "
                     f"| {fmt('predicted_step')} | {choice} | {fastest} | {ratio:.2f} |")
    summary = [f"Pick fastest or within 10%: {good}/{total} cases "
               f"({100.0 * good / max(total, 1):.1f}%)", "",
               "| strategy | median abs(pred - meas)/meas | signed median | cases "
               "| rounds' median spread |", "|---|---|---|---|---|"]
    for s in sorted(errors):
        noise = f"{100 * statistics.median(spread[s]):.0f}%" if spread[s] else "-"
        summary.append(f"| {s} | {100 * statistics.median(errors[s]):.0f}% "
                       f"| {100 * statistics.median(signed[s]):+.0f}% | {len(errors[s])} "
                       f"| {noise} |")
    # The calibration's check against the host at the start of each training run (its
    # products, and its gathers, timed again / the times it holds; absent in grids before the
    # checks existed): far from 1 on a rank count, the predictions of that rank count are off
    # by about as much (the products for the cores, the gathers for the caches and memory).
    for key, what in [("calibration_products_now", "products"),
                      ("calibration_gathers_now", "gathers")]:
        checks = defaultdict(list)
        for runs in cases.values():
            for r in runs.values():
                if r.get(key):
                    checks[r["ranks"]].append(r[key])
        if checks:
            summary += ["", f"Calibration check (the calibration's {what} timed again at the "
                        "start of each run / the time it holds; median and range over runs): "
                        + "; ".join(f"{n} ranks {statistics.median(v):.2f} "
                                    f"({min(v):.2f}-{max(v):.2f})"
                                    for n, v in sorted(checks.items()))]
    summary += grid_calibration_lines(cases)
    summary += phase_table(cases)
    summary += ["", "Cases where a fixed strategy loses by >= 1.5x to the fastest:", ""]
    summary += [f"- {x}" for x in losses] or ["- none"]
    text = "\n".join(["# Calibrated planner vs measurement", ""] + summary + ["", *lines, ""])
    open(a.out + ".md", "w").write(text)
    print(text)
    if not a.no_plot:
        import matplotlib.pyplot as plt
        plt.rcParams["svg.hashsalt"] = "gnnpar-benchmarks"
        fig, ax = plt.subplots(figsize=(6, 5))
        for s in sorted(errors):
            xs = [r["measured_step"] for k in cases for t, r in cases[k].items() if t == s]
            ys = [r["predicted_step"] for k in cases for t, r in cases[k].items() if t == s]
            ax.scatter(xs, ys, label=s, s=14)
        lo = min([r["measured_step"] for k in cases for r in cases[k].values()] or [1e-3])
        hi = max([r["measured_step"] for k in cases for r in cases[k].values()] or [1])
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured s/step")
        ax.set_ylabel("predicted s/step")
        ax.set_title("Calibrated planner: predicted vs measured")
        ax.legend()
        fig.tight_layout()
        for ext in ("png", "svg"):
            fig.savefig(f"{a.out}.{ext}", metadata={"Date": None} if ext == "svg" else None)


if __name__ == "__main__":
    main()
