//! The calibrated planner end to end: `calibrate` writes a file that `plan` then uses (and says
//! so, and twice gives the same prediction), a calibration of another host or version is ignored
//! with a log line, `auto` picks the same strategy on every rank, and all of it runs on
//! emulated CUDA ranks. Every `mpirun` runs with `--oversubscribe` and a timeout.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

/// Each run's limit, against a hang. Most runs here calibrate (or `auto` does), and a
/// calibration times every kernel in turns where ranks share the cores, so it grows with the
/// ranks on a small host: 4 ranks took 82 s alone on the 2-core Zen 3 VM, and past 180 s
/// beside another test's runs (`--test-threads=2`).
const TIMEOUT: Duration = Duration::from_secs(600);

fn have_mpirun() -> bool {
    common::have_mpirun("tests/plan.rs")
}

/// `mpirun -np N gnnpar ARGS` to completion (killed after `TIMEOUT`); must succeed.
fn mpirun_ok(np: usize, args: &[&str]) -> (String, String) {
    succeeded(common::mpirun_command(np, args), args)
}

/// `cmd` (an `mpirun` of `gnnpar args`) run to completion (killed after `TIMEOUT`); its
/// stdout and stderr. It must succeed.
fn succeeded(cmd: std::process::Command, args: &[&str]) -> (String, String) {
    let out = common::run_with_timeout(cmd, TIMEOUT).expect_ok(&format!("mpirun {args:?}"));
    (out.stdout, out.stderr)
}

/// A small in-process synthetic run (no dataset file).
const MODEL: &[&str] = &[
    "--layers",
    "2",
    "--hidden",
    "16",
    "--fanouts",
    "5,3",
    "--batch-size",
    "128",
];

/// A temporary directory holding `cal.json`, calibrated by `np` ranks, and its stdout.
fn calibrated(np: usize) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("cal.json");
    let (stdout, _) = mpirun_ok(np, &["calibrate", "--calibration", cal.to_str().unwrap()]);
    (dir, cal, stdout)
}

fn with<'a>(head: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    head.iter().chain(MODEL).chain(extra).copied().collect()
}

/// `train` of the small model under `strategy` for `steps` steps (one epoch, no evaluation)
/// with calibration `cal`, writing its summary to `summary`.
fn train_args<'a>(
    strategy: &'a str,
    steps: &'a str,
    cal: &'a str,
    summary: &'a str,
) -> Vec<&'a str> {
    with(
        &["train"],
        &[
            "--strategy",
            strategy,
            "--max-steps",
            steps,
            "--epochs",
            "1",
            "--eval-every",
            "0",
            "--calibration",
            cal,
            "--summary",
            summary,
        ],
    )
}

/// Two GDP steps on 2 ranks with `--calibration cal`, writing `summary`; its JSON.
fn train_gdp_two_steps(cal: &str, summary: &Path) -> serde_json::Value {
    mpirun_ok(2, &train_args("gdp", "2", cal, summary.to_str().unwrap()));
    common::read_json(summary)
}

#[test]
fn calibrate_writes_a_file_that_plan_then_uses() {
    if !have_mpirun() {
        return;
    }
    let (_dir, cal, stdout) = calibrated(2);
    let cal_s = cal.to_str().unwrap();
    assert!(stdout.contains("alltoallv_world"), "{stdout}");
    let v = common::read_json(&cal);
    assert_eq!(v["key"]["ranks"], 2, "{v}");
    for op in ["gemm", "gemm_tn", "gemm_nt"] {
        assert!(
            v["operators"][op]["per_unit_s"].as_f64().unwrap() > 0.0,
            "{op}: {v}"
        );
    }
    let written = std::fs::read_to_string(&cal).unwrap();

    let (stdout, stderr) = mpirun_ok(2, &with(&["plan"], &["--calibration", cal_s]));
    assert!(
        stderr.contains(&format!("calibration: using cached `{cal_s}`")),
        "{stderr}"
    );
    // Used, not measured again: the file is as calibrate wrote it.
    assert_eq!(std::fs::read_to_string(&cal).unwrap(), written);
    for s in ["gdp", "split", "dnp", "snp", "nfp"] {
        assert!(stdout.lines().any(|l| l.starts_with(s)), "{s}:\n{stdout}");
    }
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // A cached calibration is checked against the host: a few of its products timed again.
    assert!(
        stderr.contains("calibration: checked") || stderr.contains("this host now runs its"),
        "{stderr}"
    );
    let choice = json["plan"]["choice"].as_str().unwrap();
    assert!(stdout.contains(&format!("choice: {choice}")), "{stdout}");
    assert!(
        ["gdp", "split", "dnp", "snp", "nfp"].contains(&choice),
        "{choice}"
    );
    // On several ranks over a dataset file (here the synthetic default) every candidate may
    // be picked, NFP too: a run that picks it loads its column slices after the plan.
    for s in ["gdp", "split", "dnp", "snp", "nfp"] {
        assert_eq!(
            json["plan"]["strategies"][s]["pickable"], true,
            "{s}: {json}"
        );
    }

    // Deterministic with a given calibration: the dry run counts what sampling does instead
    // of timing it, so a second plan prints the same prediction, bit for bit.
    let (again, _) = mpirun_ok(2, &with(&["plan"], &["--calibration", cal_s]));
    assert_eq!(
        again.lines().last(),
        stdout.lines().last(),
        "two plans with one calibration differ"
    );
    // The build phase (sampling and its id exchanges), the optimizer's step and the hidden
    // activations' passes are priced, not free.
    for op in ["optimizer", "elementwise"] {
        assert!(
            v["operators"][op]["per_unit_s"].as_f64().unwrap() > 0.0,
            "{op}: {v}"
        );
    }
    // Mostly-zero input rows are gathered as CSR on a path of their own, timed on its own:
    // 4 row counts at 2 non-zero counts.
    let sparse_gather = v["operators"]["gather_sparse"]["points"]
        .as_array()
        .unwrap();
    assert_eq!(sparse_gather.len(), 8, "{v}");
    // The dense gathers are timed from tables far larger than the host's caches too (3 row
    // widths × 4 row counts, as the near ones), and the host's cache is in the file: the
    // planner mixes the two by how much of a store that cache holds.
    let far = v["operators"]["gather_far"]["points"].as_array().unwrap();
    assert_eq!(far.len(), 12, "{v}");
    assert!(v["cache_bytes"].as_f64().unwrap() > 0.0, "{v}");
    // Between them, how far a store's size takes its gathers from the near price to the far
    // one is measured on tables of 32 MB and up (at least 32 and 64 MB: the far tables are
    // 128 MB or more): from 0 at the near table to 1 at the far one, never falling. Where
    // this run timed the far gather no slower than the near one (a busy host: these are
    // timings, not a property of the code), there is nothing to interpolate and no shares.
    let time_of = |op: &str| {
        let o = &v["operators"][op];
        let (points, bytes) = (
            o["points"].as_array().unwrap(),
            o["point_bytes"].as_array().unwrap(),
        );
        points
            .iter()
            .zip(bytes)
            .find(|(p, b)| p[0].as_f64() == Some(16384.0) && b.as_f64() == Some(16384.0 * 512.0))
            .map(|(p, _)| p[1].as_f64().unwrap())
            .expect("16,384 rows of 128 columns timed")
    };
    let shares = v["far_shares"].as_array().unwrap();
    if shares.is_empty() {
        assert!(
            time_of("gather_far") <= time_of("gather"),
            "no shares although the far gather was slower: {v}"
        );
    } else {
        assert!(shares.len() >= 4, "{v}");
        let pairs: Vec<(f64, f64)> = shares
            .iter()
            .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
            .collect();
        assert_eq!(pairs[0], (16.0 * 1048576.0, 0.0), "{v}");
        assert_eq!(pairs[pairs.len() - 1].1, 1.0, "{v}");
        assert!(
            pairs
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{pairs:?}"
        );
    }
    // The aggregation is priced through its points (its cost per edge × column grows once
    // its sources outgrow the caches), the optimizer by its line.
    assert_eq!(v["operators"]["aggregate"]["by_points"], true, "{v}");
    assert_eq!(v["operators"]["optimizer"]["by_points"], false, "{v}");
    // The ranks' drift between collectives is measured on several ranks: three stretches of
    // work, each with the mean wait it left (never negative: the slowest rank less each).
    let drift = v["operators"]["drift"]["points"].as_array().unwrap();
    assert_eq!(drift.len(), 3, "{v}");
    for p in drift {
        assert!(
            p[0].as_f64().unwrap() > 0.0 && p[1].as_f64().unwrap() >= 0.0,
            "{p}"
        );
    }
    for s in ["gdp", "split", "dnp", "snp"] {
        for phase in ["build", "optimizer"] {
            assert!(
                json["plan"]["strategies"][s]["phases"][phase]
                    .as_f64()
                    .unwrap()
                    > 0.0,
                "{s} {phase}: {json}"
            );
        }
    }
}

#[test]
fn ranks_of_four_threads_calibrate_their_samplers_in_windows() {
    if !have_mpirun() {
        return;
    }
    // From 4 rank threads on, batches are sampled in windows by default: GDP's ranks route
    // each hop of a window to the owners together, NFP's sample locally. Both windowed
    // samplers are timed at the window the ranks agree on (4 here): four seed counts each,
    // a window's edges growing with them.
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("cal.json");
    mpirun_ok(
        2,
        &[
            "calibrate",
            "--threads",
            "4",
            "--calibration",
            cal.to_str().unwrap(),
        ],
    );
    let v = common::read_json(&cal);
    assert_eq!(v["sample_window"], 4, "{v}");
    for op in ["sample_ahead", "sample_ahead_routed"] {
        let points = v["operators"][op]["points"].as_array().unwrap();
        assert_eq!(points.len(), 4, "{op}: {v}");
        let xs: Vec<f64> = points.iter().map(|p| p[0].as_f64().unwrap()).collect();
        assert!(xs.windows(2).all(|w| w[0] < w[1]), "{op}: {xs:?}");
        assert!(
            points.iter().all(|p| p[1].as_f64().unwrap() > 0.0),
            "{op}: {v}"
        );
    }
}

#[test]
fn the_feature_cache_is_priced_per_strategy() {
    if !have_mpirun() {
        return;
    }
    let (_dir, cal, _) = calibrated(2);
    let cal_s = cal.to_str().unwrap();
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["--calibration", cal_s];
        args.extend(extra);
        let (stdout, _) = mpirun_ok(2, &with(&["plan"], &args));
        serde_json::from_str::<serde_json::Value>(stdout.lines().last().unwrap()).unwrap()["plan"]
            .clone()
    };
    // The two ranks share a host: rows are fetched as from other hosts, for a cache to
    // serve.
    let fetching = ["--shared-features", "off"];
    let (without, with_cache) = (
        plan(&fetching),
        plan(&[&fetching[..], &["--cache-mb", "64"]].concat()),
    );
    let bytes =
        |p: &serde_json::Value, s: &str| p["strategies"][s]["bytes_per_step"].as_f64().unwrap();
    // gdp, split and dnp priced with fewer bytes under `fewer` than under `without`.
    let fewer_bytes = |fewer: &serde_json::Value, what: &str| {
        for s in ["gdp", "split", "dnp"] {
            assert!(
                bytes(fewer, s) < bytes(&without, s),
                "{s}: {} bytes {what}, {} without",
                bytes(fewer, s),
                bytes(&without, s)
            );
        }
    };
    // A cache of every remote row: gdp, split and dnp fetch fewer rows (the cache is chosen
    // from half the dry run and read by the other half, so not necessarily none)...
    fewer_bytes(&with_cache, "with a cache");
    // ... and SNP, which reads only its own rows, is priced as before.
    assert_eq!(
        with_cache["strategies"]["snp"],
        without["strategies"]["snp"]
    );
    // `auto` sizes the cache from the node's memory: on this small graph every remote row
    // the dry run reads fits, as in 64 MiB.
    let auto = plan(&[&fetching[..], &["--cache-mb", "auto"]].concat());
    for s in ["gdp", "split", "dnp", "snp"] {
        assert_eq!(bytes(&auto, s), bytes(&with_cache, s), "{s}");
    }
    // Rows shared on the host (the default) are priced as read there: gdp, split and dnp
    // move fewer bytes than fetching (no feature row; split and dnp still move hidden rows).
    let shared = plan(&[]);
    fewer_bytes(&shared, "shared");
    assert_eq!(shared["strategies"]["snp"], without["strategies"]["snp"]);
}

#[test]
fn a_calibration_of_another_host_or_version_is_ignored_with_a_log_line() {
    if !have_mpirun() {
        return;
    }
    let (_dir, cal, _) = calibrated(2);
    let cal_s = cal.to_str().unwrap();
    let good = common::read_json(&cal);
    for (field, value) in [("host", "another-host"), ("version", "0.0.0-other")] {
        let mut v = good.clone();
        v["key"][field] = serde_json::json!(value);
        // Absurd numbers: were they used, the run would say so in its prediction.
        v["operators"]["gemm"]["per_unit_s"] = serde_json::json!(1.0);
        std::fs::write(&cal, v.to_string()).unwrap();
        let (_, stderr) = mpirun_ok(2, &with(&["plan"], &["--calibration", cal_s]));
        assert!(
            stderr.contains(&format!("calibration: ignoring `{cal_s}`")) && stderr.contains(value),
            "{field}:\n{stderr}"
        );
        assert!(!stderr.contains("using cached"), "{stderr}");
        // Measured again for this host and version, and written over the foreign file.
        let now = common::read_json(&cal);
        assert_eq!(now["key"][field], good["key"][field]);
        assert!(now["operators"]["gemm"]["per_unit_s"].as_f64().unwrap() < 1e-3);
    }
}

#[test]
fn a_calibration_far_from_the_host_is_used_and_the_log_and_summary_say_so() {
    if !have_mpirun() {
        return;
    }
    let (dir, cal, _) = calibrated(2);
    let cal_s = cal.to_str().unwrap();
    // As if measured on a machine state 1000× slower at products and gathers: no noise comes
    // near that.
    let mut v = common::read_json(&cal);
    for op in ["gemm", "gather"] {
        for p in v["operators"][op]["points"].as_array_mut().unwrap() {
            p[1] = serde_json::json!(p[1].as_f64().unwrap() * 1000.0);
        }
    }
    let slow = v.to_string();
    std::fs::write(&cal, &slow).unwrap();
    let (stdout, stderr) = mpirun_ok(2, &with(&["plan"], &["--calibration", cal_s]));
    assert!(stderr.contains("using cached"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "now runs its products in 0.00× and its gathers in 0.00× the time `{cal_s}` holds"
        )) && stderr.contains("(products and gathers off)"),
        "{stderr}"
    );
    assert!(stdout.contains("choice: "), "{stdout}");
    // Used as it is, not measured again behind the user's back.
    assert_eq!(std::fs::read_to_string(&cal).unwrap(), slow);
    // A training run with that calibration carries the check in its summary's prediction.
    let v = train_gdp_two_steps(cal_s, &dir.path().join("summary.json"));
    for check in ["calibration_products_now", "calibration_gathers_now"] {
        let now = v["prediction"][check].as_f64();
        assert!(now.is_some_and(|r| r < 0.01), "{check}: {v}");
    }
}

/// Every rank's "strategy auto: chose X" line.
fn choices(stderr: &str) -> Vec<(String, String)> {
    stderr
        .lines()
        .filter_map(|l| {
            let (head, rest) = l.split_once("strategy auto: chose ")?;
            let rank = head.split_once("[INFO ")?.1.split(']').next()?.to_string();
            Some((rank, rest.split(' ').next()?.to_string()))
        })
        .collect()
}

#[test]
fn auto_picks_the_same_strategy_on_every_rank_with_a_given_calibration() {
    if !have_mpirun() {
        return;
    }
    let (dir, cal, _) = calibrated(4);
    let cal_s = cal.to_str().unwrap();
    // Four single-thread ranks on fewer cores (CI's 2) time the kernels in turns and price
    // them at their share of the cores; on 4 cores or more every rank has its own.
    let written = common::read_json(&cal);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 4 {
        assert_eq!(
            written["shared_cores"]["turns"],
            4usize.div_ceil(cores),
            "{written}"
        );
        assert_eq!(
            written["shared_cores"]["factor"].as_f64(),
            Some(4.0 / cores as f64),
            "{written}"
        );
    } else {
        assert!(written.get("shared_cores").is_none(), "{written}");
    }
    let summary = dir.path().join("summary.json");
    let (_, stderr) = mpirun_ok(
        4,
        &train_args("auto", "3", cal_s, summary.to_str().unwrap()),
    );
    assert!(stderr.contains("calibration: using cached"), "{stderr}");
    let picked = choices(&stderr);
    assert_eq!(picked.len(), 4, "one line per rank:\n{stderr}");
    let mut ranks: Vec<&str> = picked.iter().map(|(r, _)| r.as_str()).collect();
    ranks.sort();
    assert_eq!(ranks, ["r0", "r1", "r2", "r3"], "{stderr}");
    assert!(
        picked.iter().all(|(_, s)| *s == picked[0].1),
        "ranks disagree: {picked:?}"
    );
    let v = common::read_json(&summary);
    assert_eq!(v["strategy"], picked[0].1.as_str());
    let p = &v["prediction"];
    assert_eq!(p["strategy"], picked[0].1.as_str(), "{p}");
    // Three steps ran; the first, which pays one-time costs, is reported apart.
    let m = &p["measured"];
    assert_eq!(
        (m["steps_run"].as_u64(), m["steps"].as_u64()),
        (Some(3), Some(2)),
        "{p}"
    );
    let f = |k: &str| m[k].as_f64().unwrap();
    assert!(f("first_step_seconds") > 0.0, "{p}");
    assert!(
        f("step_seconds_with_first")
            <= (f("first_step_seconds") + 2.0 * f("step_seconds")) / 3.0 * (1.0 + 1e-9),
        "{p}"
    );
    // A rank's wait at the epoch's end for the slowest is reported apart from the steps.
    assert!(f("end_wait_seconds") >= 0.0, "{p}");
    assert!(
        p["predicted"]["step_seconds"].as_f64().unwrap() > 0.0,
        "{p}"
    );
}

#[test]
fn a_fixed_strategy_without_a_cached_calibration_says_why_it_has_no_prediction() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("none.json");
    let v = train_gdp_two_steps(cal.to_str().unwrap(), &dir.path().join("summary.json"));
    assert!(
        !Path::new(&cal).exists(),
        "a fixed strategy must not calibrate"
    );
    assert!(v["prediction"].is_null(), "{v}");
    assert!(
        v["prediction_skipped"]
            .as_str()
            .unwrap()
            .contains("no calibration"),
        "{v}"
    );
}

/// `mpirun -np N gnnpar ARGS --device cuda` on the CPU emulator of the device (killed after
/// `TIMEOUT`); must succeed.
fn mpirun_emulated_ok(np: usize, args: &[&str]) -> (String, String) {
    let mut cmd = common::mpirun_command(np, args);
    cmd.args(["--device", "cuda"])
        .env("GNNPAR_CUDA_EMULATOR", "1");
    succeeded(cmd, args)
}

/// The planner on CUDA ranks end to end, on the device's CPU emulator: `calibrate` times the
/// host↔device copies and the device's kernels (once each: an emulator's timings describe no
/// GPU, and its log says so), `plan` prices every candidate as a prefetched step, and `train
/// --strategy auto` checks the cached file on the device, runs its pick and reports its own
/// error. The same calls run on a real GPU; what this holds is the device path through the
/// planner, not its numbers.
#[test]
fn calibrate_plan_and_auto_run_on_emulated_cuda_ranks() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cal = dir.path().join("cal.json");
    let cal_s = cal.to_str().unwrap();
    let (_, stderr) = mpirun_emulated_ok(2, &["calibrate", "--calibration", cal_s]);
    assert!(
        stderr.contains("the device is emulated on the CPU"),
        "{stderr}"
    );
    let v = common::read_json(&cal);
    let device = v["key"]["device"].as_str().unwrap();
    assert!(device.starts_with("CUDA on CUDA emulator"), "{v}");
    // Copies both ways at every message size, each taking time; the host keeps none.
    for op in ["h2d", "d2h"] {
        let points = v["operators"][op]["points"].as_array().unwrap();
        assert_eq!(points.len(), 7, "{op}: {v}");
        assert!(
            points.iter().all(|p| p[1].as_f64().unwrap() > 0.0),
            "{op}: {v}"
        );
    }
    // The device's products at every shape (a cached file is checked on some of them), in
    // each form: forward, weight gradient, input gradient.
    for op in ["gemm", "gemm_tn", "gemm_nt"] {
        let points = v["operators"][op]["points"].as_array().unwrap();
        assert_eq!(points.len(), 14, "{op}: {v}");
        assert!(
            points.iter().all(|p| p[1].as_f64().unwrap() > 0.0),
            "{op}: {v}"
        );
    }
    // The device's products with sparse input rows (2 row counts × 4 widths) and the host's
    // gather of CSR rows (4 row counts × 2 non-zero counts), which price bag-of-words inputs.
    for op in ["spmm", "gather_sparse"] {
        let points = v["operators"][op]["points"].as_array().unwrap();
        assert_eq!(points.len(), 8, "{op}: {v}");
    }

    let (stdout, stderr) = mpirun_emulated_ok(2, &with(&["plan"], &["--calibration", cal_s]));
    assert!(
        stderr.contains(&format!("calibration: using cached `{cal_s}`")),
        "{stderr}"
    );
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let choice = json["plan"]["choice"].as_str().unwrap();
    // Any candidate of 2 ranks over this file, nfp included: the emulator's timings describe
    // no GPU, so which one wins changes from run to run.
    assert!(
        ["gdp", "split", "dnp", "snp", "nfp"].contains(&choice),
        "{choice}"
    );
    // Device ranks prefetch: their step is the slower of the preparing and the training side.
    for s in ["gdp", "split", "dnp", "snp"] {
        let p = &json["plan"]["strategies"][s];
        assert!(
            p["note"].as_str().unwrap().contains("prefetch worker"),
            "{s}: {p}"
        );
        assert!(p["step_seconds"].as_f64().unwrap() > 0.0, "{s}: {p}");
    }

    let summary = dir.path().join("summary.json");
    let (_, stderr) = mpirun_emulated_ok(
        2,
        &train_args("auto", "3", cal_s, summary.to_str().unwrap()),
    );
    assert!(
        stderr.contains("calibration: checked") || stderr.contains("this host now runs its"),
        "{stderr}"
    );
    let picked = choices(&stderr);
    assert_eq!(picked.len(), 2, "one line per rank:\n{stderr}");
    assert!(picked.iter().all(|(_, s)| s == choice), "{picked:?}");
    let s = common::read_json(&summary);
    assert!(s["device"].as_str().unwrap().contains("emulator"), "{s}");
    let p = &s["prediction"];
    assert_eq!(p["strategy"], choice, "{p}");
    assert!(p["calibration_products_now"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["calibration_gathers_now"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["measured"]["step_seconds"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["relative_error"].as_f64().is_some(), "{p}");
}

/// The bounds a log line of `stderr` containing `marker` gives (`… bounds [a, b, c]`).
fn logged_bounds(stderr: &str, marker: &str) -> String {
    let line = stderr
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no `{marker}` in:\n{stderr}"));
    let at = line.find("bounds [").expect("bounds in the line") + "bounds ".len();
    line[at..=at + line[at..].find(']').unwrap()].to_string()
}

/// The planner prices NFP's ranks by the column slices the loader will cut: on bag-of-words
/// features (Cora) by equal non-zeros, counted by the dry run over the ranks' rows.
#[test]
fn the_planner_cuts_nfps_column_slices_as_its_loader_does() {
    let test = "the_planner_cuts_nfps_column_slices_as_its_loader_does";
    if !have_mpirun() {
        return;
    }
    let Some(npz) = common::dataset("planetoid/cora.npz", test) else {
        return;
    };
    let dir = common::tempdir();
    let data = common::prepare(&npz, dir.path(), "cora");
    let (_cal_dir, cal, _) = calibrated(2);
    let head = ["--data", data.to_str().unwrap(), "--model", "gcn"];
    let cal_args = ["--calibration", cal.to_str().unwrap()];
    let (_, planned) = mpirun_ok(2, &with(&["plan"], &[&head[..], &cal_args[..]].concat()));
    let run = [
        &head[..],
        &["--strategy", "nfp", "--max-steps", "1", "--eval-every", "0"],
    ]
    .concat();
    let (_, trained) = mpirun_ok(2, &with(&["train"], &run));
    let loaded = logged_bounds(&trained, "feature columns sliced by non-zeros");
    assert_ne!(loaded, "[0, 716, 1433]", "{trained}");
    assert_eq!(
        logged_bounds(&planned, "planner: nfp's column slices"),
        loaded,
        "{planned}"
    );
}

/// A copy of the calibration `cal` whose world alltoallv (every strategy's row exchange but
/// NFP's, which allgathers blocks and sends partial sums) takes `factor` times as long.
fn with_slow_row_exchanges(cal: &Path, factor: f64, out: &Path) {
    let mut v = common::read_json(cal);
    let op = &mut v["operators"]["alltoallv_world"];
    for key in ["latency_s", "per_unit_s", "per_row_s"] {
        if let Some(x) = op[key].as_f64() {
            op[key] = serde_json::json!(x * factor);
        }
    }
    for point in op["points"].as_array_mut().unwrap() {
        let t = point[1].as_f64().unwrap();
        point[1] = serde_json::json!(t * factor);
    }
    std::fs::write(out, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn auto_picks_nfp_where_it_is_cheapest_and_then_trains_what_nfp_trains() {
    if !have_mpirun() {
        return;
    }
    let (dir, cal, _) = calibrated(2);
    let slow = dir.path().join("slow-rows.json");
    // A million times: the calibration is measured while other tests run on the same cores,
    // and a collective timed then can come out 100× its quiet time (NFP's allgather once
    // priced its build at 15 ms against 0.2 ms quiet, above GDP's id exchanges slowed a
    // thousandfold): the slowed exchanges must outweigh any such noise.
    with_slow_row_exchanges(&cal, 1e6, &slow);
    let slow_s = slow.to_str().unwrap();

    let (stdout, _) = mpirun_ok(2, &with(&["plan"], &["--calibration", slow_s]));
    assert!(stdout.contains("choice: nfp"), "{stdout}");

    // `auto` plans over rows, picks NFP, loads the column slices and trains exactly what
    // `--strategy nfp` trains.
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (auto_ck, nfp_ck) = (path("auto.h5"), path("nfp.h5"));
    let (summary, nfp_summary) = (path("auto.json"), path("nfp.json"));
    let mut args = train_args("auto", "3", slow_s, &summary);
    args.extend(["--checkpoint", &auto_ck]);
    let (_, stderr) = mpirun_ok(2, &args);
    let mut picked = choices(&stderr);
    picked.sort();
    let nfp = |r: &str| (r.to_string(), "nfp".to_string());
    assert_eq!(picked, [nfp("r0"), nfp("r1")], "{stderr}");
    assert!(
        stderr.contains("nfp's ranks hold column slices: data loaded again as slices"),
        "{stderr}"
    );
    let v = common::read_json(Path::new(&summary));
    assert_eq!(v["strategy"], "nfp", "{v}");
    assert_eq!(v["prediction"]["strategy"], "nfp", "{v}");

    let mut args = train_args("nfp", "3", slow_s, &nfp_summary);
    args.extend(["--checkpoint", &nfp_ck]);
    mpirun_ok(2, &args);
    assert_eq!(
        common::bits(&common::read_f32s(Path::new(&auto_ck), "params")),
        common::bits(&common::read_f32s(Path::new(&nfp_ck), "params")),
        "auto's nfp and --strategy nfp trained different parameters"
    );
}
