//! `gnnpar train` end to end: bitwise-exact resume (mini-batch and full-batch, at an epoch
//! boundary and mid-epoch), determinism for a seed and across thread counts, the per-epoch
//! JSON lines and the summary, every bad-input case of issue 3, and 2 MPI ranks training the
//! same model as 1.

mod common;

use common::{bits, gnnpar, max_rel_diff, read_f32s, read_u64_attr, s, Outcome};
use gnnpar::graph::{format, Csr, Dataset, Labels, NodeId, Splits};
use ndarray::Array2;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longest a single small training run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest an `mpirun` of the synthetic default may take.
const MPI_TIMEOUT: Duration = Duration::from_secs(300);

/// A small SBM (2,000 vertices, 20,000 edges, 16 features, 4 classes, 50/25/25 split) written
/// by `gnnpar generate` into `dir`.
fn small_sbm(dir: &Path) -> PathBuf {
    let sbm = common::Sbm {
        nodes: 2000,
        edges: 20000,
        features: 16,
        classes: 4,
        seed: 7,
    };
    common::generate_sbm(dir, "sbm.h5", sbm)
}

/// Mini-batch GraphSAGE with dropout on the small SBM: 1,000 training vertices in batches of
/// 256 make 4 steps per epoch.
const MINIBATCH: &str = r#"
model = "sage"
layers = 2
hidden = 16
fanouts = [5, 5]
batch_size = 256
dropout = 0.5
lr = 0.01
seed = 3
"#;

/// Full-batch GCN with dropout and weight decay: one step per epoch.
const FULLBATCH: &str = r#"
model = "gcn"
layers = 2
hidden = 16
full_batch = true
dropout = 0.5
lr = 0.01
weight_decay = 0.0005
seed = 3
"#;

/// A run configuration written to `dir/<tag>.toml` (options given on the command line override
/// it; clap refuses an option given twice, so the shared settings live in the file).
fn config_file(dir: &Path, tag: &str, toml: &str) -> PathBuf {
    let path = dir.join(format!("{tag}.toml"));
    std::fs::write(&path, toml).unwrap();
    path
}

/// `gnnpar train --data <data> --config <config> <extra>`; panics unless it succeeds.
fn train(data: &Path, config: &Path, extra: &[&str]) -> Outcome {
    let mut args = vec!["train", "--data", s(data), "--config", s(config)];
    args.extend_from_slice(extra);
    gnnpar(&args, RUN_TIMEOUT).expect_ok(&format!("gnnpar {}", args.join(" ")))
}

/// Parameters, Adam moments and step count of a checkpoint, for exact comparison.
fn state(ck: &Path) -> (Vec<u32>, Vec<u32>, Vec<u32>, u64, u64) {
    (
        bits(&read_f32s(ck, "params")),
        bits(&read_f32s(ck, "adam_m")),
        bits(&read_f32s(ck, "adam_v")),
        read_u64_attr(ck, "adam_t"),
        read_u64_attr(ck, "step"),
    )
}

/// Train `epochs` epochs straight through, then again interrupted by `first` (extra options of
/// the first leg: `--epochs k` or `--max-steps s`) and resumed to `epochs`; the two final
/// checkpoints must agree bit for bit.
fn check_resume(toml: &str, epochs: usize, first: &[&str], expected_steps: u64) {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let config = &config_file(tmp.path(), "run", toml);
    let (a, b) = (tmp.path().join("a.h5"), tmp.path().join("b.h5"));
    let n = epochs.to_string();
    train(&data, config, &["--epochs", &n, "--checkpoint", s(&a)]);

    // The first leg stops early: `first` is `--epochs k` or `--max-steps s` (then with
    // `--epochs N`, so it stops mid-way through the same schedule).
    let mut leg1 = vec!["--checkpoint", s(&b)];
    if !first.contains(&"--epochs") {
        leg1.extend_from_slice(&["--epochs", n.as_str()]);
    }
    leg1.extend_from_slice(first);
    train(&data, config, &leg1);
    let interrupted = state(&b);
    let resumed_out = train(
        &data,
        config,
        &["--epochs", &n, "--checkpoint", s(&b), "--resume"],
    );
    assert!(
        resumed_out.stderr.contains("resumed from"),
        "the second leg did not say it resumed:\n{}",
        resumed_out.stderr
    );

    let (straight, resumed) = (state(&a), state(&b));
    assert_eq!(
        straight.4, expected_steps,
        "uninterrupted run took the wrong step count"
    );
    assert!(
        interrupted.4 > 0 && interrupted.4 < expected_steps,
        "the first leg ({first:?}) stopped at step {} of {expected_steps}",
        interrupted.4
    );
    assert_ne!(
        interrupted.0, straight.0,
        "the interrupted checkpoint already equals the final one; the test proves nothing"
    );
    assert_eq!(resumed.4, straight.4, "step counts differ");
    assert_eq!(resumed.3, straight.3, "Adam step counters differ");
    assert!(
        resumed.0 == straight.0,
        "`params` differ after resume ({first:?})"
    );
    assert!(
        resumed.1 == straight.1,
        "`adam_m` differs after resume ({first:?})"
    );
    assert!(
        resumed.2 == straight.2,
        "`adam_v` differs after resume ({first:?})"
    );
}

#[test]
fn minibatch_resume_at_an_epoch_boundary_is_bitwise_exact() {
    // 3 epochs × 4 steps; the first leg stops after epoch 1.
    check_resume(MINIBATCH, 3, &["--epochs", "1"], 12);
}

#[test]
fn minibatch_resume_mid_epoch_is_bitwise_exact() {
    // `--max-steps 6` stops halfway through the second epoch.
    check_resume(MINIBATCH, 3, &["--max-steps", "6"], 12);
}

#[test]
fn fullbatch_resume_is_bitwise_exact() {
    check_resume(FULLBATCH, 6, &["--epochs", "2"], 6);
    check_resume(FULLBATCH, 6, &["--max-steps", "5"], 6);
}

#[test]
fn same_seed_same_parameters_other_seed_other_parameters() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let ck = |name: &str| tmp.path().join(name);
    for (toml, tag) in [(MINIBATCH, "mb"), (FULLBATCH, "fb")] {
        let config = &config_file(tmp.path(), tag, toml);
        let (a, b, c) = (
            ck(&format!("{tag}-a.h5")),
            ck(&format!("{tag}-b.h5")),
            ck(&format!("{tag}-c.h5")),
        );
        train(&data, config, &["--epochs", "2", "--checkpoint", s(&a)]);
        train(&data, config, &["--epochs", "2", "--checkpoint", s(&b)]);
        // `--seed` overrides the one in the config file.
        train(
            &data,
            config,
            &["--epochs", "2", "--checkpoint", s(&c), "--seed", "4"],
        );
        let (pa, pb, pc) = (
            read_f32s(&a, "params"),
            read_f32s(&b, "params"),
            read_f32s(&c, "params"),
        );
        assert!(bits(&pa) == bits(&pb), "{tag}: two identical runs differ");
        assert_ne!(
            bits(&pa),
            bits(&pc),
            "{tag}: --seed 4 gave the parameters of --seed 3"
        );
    }
}

#[test]
fn one_and_two_threads_train_identical_parameters() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    for (toml, tag) in [(MINIBATCH, "mb"), (FULLBATCH, "fb")] {
        let config = &config_file(tmp.path(), tag, toml);
        let one = tmp.path().join(format!("{tag}-t1.h5"));
        let two = tmp.path().join(format!("{tag}-t2.h5"));
        train(
            &data,
            config,
            &["--epochs", "2", "--threads", "1", "--checkpoint", s(&one)],
        );
        let out = train(
            &data,
            config,
            &["--epochs", "2", "--threads", "2", "--checkpoint", s(&two)],
        );
        assert_eq!(
            out.last_json()["threads"],
            2,
            "--threads 2 was not honoured"
        );
        assert!(
            bits(&read_f32s(&one, "params")) == bits(&read_f32s(&two, "params")),
            "{tag}: --threads 1 and --threads 2 trained different parameters"
        );
    }
}

/// Mini-batch GCN (self-loops added to every block) with dropout.
const MINIBATCH_GCN: &str = r#"
model = "gcn"
layers = 2
hidden = 16
fanouts = [4, 6]
batch_size = 300
dropout = 0.5
lr = 0.01
seed = 5
"#;

/// `check(config, tag, stop)` for mini-batch SAGE and GCN (`tag`, their `config` file in
/// `dir`), each over two whole epochs and over a run that `--max-steps` stops inside an epoch
/// (`stop`: 4 steps an epoch, 6 steps).
fn each_minibatch_model_and_stop(dir: &Path, mut check: impl FnMut(&Path, &str, &[&str])) {
    for (toml, tag) in [(MINIBATCH, "sage"), (MINIBATCH_GCN, "gcn")] {
        let config = config_file(dir, tag, toml);
        for stop in [
            &["--epochs", "2"][..],
            &["--epochs", "3", "--max-steps", "6"],
        ] {
            check(&config, tag, stop);
        }
    }
}

#[test]
fn prefetching_changes_no_parameter_at_one_or_two_threads() {
    // `--prefetch on` samples and gathers every batch on a second thread, whose parallel work
    // shares rayon's pool with training (at one thread, the training thread runs it while it
    // waits). Whatever the thread count, the parameters must be those of `--prefetch off`,
    // also when `--max-steps` stops inside an epoch (4 steps per epoch, 6 steps). `auto` is
    // off on the CPU backend (named: `--device auto` would pick a GPU where one answers).
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    each_minibatch_model_and_stop(tmp.path(), |config, tag, stop| {
        let mut reference: Option<Vec<u32>> = None;
        for (threads, prefetch) in [("1", "off"), ("1", "on"), ("2", "on"), ("2", "auto")] {
            let ck = tmp
                .path()
                .join(format!("{tag}-{}-t{threads}-{prefetch}.h5", stop.len()));
            let mut args = vec!["--device", "cpu", "--threads", threads];
            args.extend_from_slice(&["--prefetch", prefetch]);
            args.extend_from_slice(&["--checkpoint", s(&ck)]);
            args.extend_from_slice(stop);
            let out = train(&data, config, &args);
            let summary = out.last_json();
            assert_eq!(summary["steps"], if stop.len() == 2 { 8 } else { 6 });
            let waited = summary["seconds"]["prefetch_wait"].as_f64().unwrap();
            assert_eq!(
                prefetch == "on",
                waited > 0.0,
                "{tag}: prefetch_wait {waited} with --prefetch {prefetch}"
            );
            let params = bits(&read_f32s(&ck, "params"));
            match &reference {
                None => reference = Some(params),
                Some(want) => assert!(
                    *want == params,
                    "{tag} {stop:?}: --threads {threads} --prefetch {prefetch} trained \
                         other parameters than --threads 1 --prefetch off"
                ),
            }
        }
    });
}

#[test]
fn sampling_batches_ahead_in_windows_changes_no_parameter() {
    // Without prefetch, one GDP rank samples the next batches side by side, each on a thread
    // of its own (`--sample-ahead`; by default from 4 rank threads on). Windows that cross
    // the epoch's end (4 steps an epoch, windows of 3), a run that `--max-steps` stops inside
    // an epoch, a window wider than the threads, the default window of 4 threads, and the
    // step's own sampling must all train the same parameters, bit for bit; so must a run
    // stopped inside an epoch and resumed, in windows.
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    each_minibatch_model_and_stop(tmp.path(), |config, tag, stop| {
        let mut reference: Option<Vec<u32>> = None;
        // (threads, --sample-ahead, --prefetch, the window expected): with prefetch
        // workers they prepare the batches, and no window is sampled.
        for (threads, ahead, prefetch, window) in [
            ("2", Some("1"), "off", 1),
            ("2", None, "off", 1),
            ("2", Some("2"), "off", 2),
            ("2", Some("3"), "off", 3),
            ("1", Some("4"), "off", 4),
            ("4", None, "off", 4),
            ("2", Some("3"), "on", 1),
        ] {
            let what = format!(
                "{tag} {stop:?} --threads {threads} --sample-ahead {ahead:?} --prefetch \
                     {prefetch}"
            );
            let ck = tmp.path().join(format!(
                "ahead-{tag}-{}-t{threads}-{}-{prefetch}.h5",
                stop.len(),
                ahead.unwrap_or("default")
            ));
            let mut args = vec!["--device", "cpu", "--threads", threads];
            args.extend_from_slice(&["--prefetch", prefetch, "--checkpoint", s(&ck)]);
            if let Some(n) = ahead {
                args.extend_from_slice(&["--sample-ahead", n]);
            }
            args.extend_from_slice(stop);
            let out = train(&data, config, &args);
            let summary = out.last_json();
            assert_eq!(summary["steps"], if stop.len() == 2 { 8 } else { 6 });
            assert_eq!(summary["sample_window"], window, "{what}");
            let said = format!("sampling ahead: {window} batches at once");
            assert_eq!(
                out.stderr.contains("sampling ahead:"),
                window > 1,
                "{what}: {}",
                out.stderr
            );
            assert!(
                window == 1 || out.stderr.contains(&said),
                "{what}: {}",
                out.stderr
            );
            let params = bits(&read_f32s(&ck, "params"));
            match &reference {
                None => reference = Some(params),
                Some(want) => assert!(
                    *want == params,
                    "{what} trained other parameters than each batch sampled in its step"
                ),
            }
        }
    });
    for (toml, tag) in [(MINIBATCH, "sage"), (MINIBATCH_GCN, "gcn")] {
        let config = &config_file(tmp.path(), tag, toml);
        // 3 epochs straight through in the steps, and in windows of 3 stopped after 6 steps
        // (inside epoch 2) and resumed.
        let whole = tmp.path().join(format!("ahead-{tag}-whole.h5"));
        let base = ["--device", "cpu", "--prefetch", "off", "--epochs", "3"];
        let mut args = base.to_vec();
        args.extend_from_slice(&["--sample-ahead", "1", "--checkpoint", s(&whole)]);
        train(&data, config, &args);
        let legs = tmp.path().join(format!("ahead-{tag}-legs.h5"));
        let mut first = base.to_vec();
        first.extend_from_slice(&["--sample-ahead", "3", "--checkpoint", s(&legs)]);
        let mut second = first.clone();
        first.extend_from_slice(&["--max-steps", "6"]);
        second.push("--resume");
        train(&data, config, &first);
        train(&data, config, &second);
        assert!(
            state(&whole) == state(&legs),
            "{tag}: resumed in windows, the run ended elsewhere than straight through"
        );
    }
}

#[test]
fn prefetching_on_a_device_changes_no_parameter() {
    // With the model on a device (here the CUDA backend on its CPU emulator), `auto` turns the
    // prefetch thread on, and the input rows are gathered on the device from its resident
    // copy of the features: the thread only samples. Bitwise the parameters of `off`, with
    // one worker and with three preparing batches at once (taken in order from each in turn).
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let config = &config_file(tmp.path(), "gcn", MINIBATCH_GCN);
    let run = |prefetch: &str| {
        let (prefetch, workers) = prefetch.split_once(':').unwrap_or((prefetch, "1"));
        let ck = tmp.path().join(format!("device-{prefetch}-{workers}.h5"));
        let mut cmd = Command::new(common::GNNPAR);
        cmd.args(["train", "--data", s(&data), "--config", s(config)])
            .args(["--device", "cuda", "--threads", "2", "--epochs", "2"])
            .args(["--prefetch", prefetch, "--checkpoint", s(&ck)])
            .args(["--prefetch-workers", workers])
            .env("GNNPAR_CUDA_EMULATOR", "1")
            .env("RUST_LOG", "info");
        let out = common::run_with_timeout(cmd, RUN_TIMEOUT).expect_ok("emulated --device cuda");
        let summary = out.last_json();
        assert!(
            summary["device"].as_str().unwrap().starts_with("CUDA"),
            "{summary}"
        );
        let waited = summary["seconds"]["prefetch_wait"].as_f64().unwrap();
        (bits(&read_f32s(&ck, "params")), waited)
    };
    let (off, waited_off) = run("off");
    let (auto, waited_auto) = run("auto");
    let (three, waited_three) = run("on:3");
    assert!(waited_three > 0.0, "--prefetch on did not prefetch");
    assert!(
        off == three,
        "three prefetch workers trained other parameters than --prefetch off"
    );
    assert_eq!(
        waited_off, 0.0,
        "--prefetch off waited for a prefetch thread"
    );
    assert!(
        waited_auto > 0.0,
        "--prefetch auto did not prefetch on a device"
    );
    assert!(
        off == auto,
        "--prefetch auto and off trained other parameters on a device"
    );
}

#[test]
fn metrics_lines_and_summary_report_the_best_validation_epoch() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let metrics = tmp.path().join("metrics.jsonl");
    let summary_path = tmp.path().join("summary.json");
    let epochs = 5;
    let out = train(
        &data,
        &config_file(tmp.path(), "mb", MINIBATCH),
        &[
            "--epochs",
            &epochs.to_string(),
            "--eval-every",
            "1",
            "--metrics",
            s(&metrics),
            "--summary",
            s(&summary_path),
        ],
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), epochs, "one line per epoch expected");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["epoch"], i, "epochs out of order: {line}");
        assert!(line["loss"].as_f64().is_some_and(f64::is_finite), "{line}");
        for key in ["train", "val", "test"] {
            let v = line[key]
                .as_f64()
                .unwrap_or_else(|| panic!("no `{key}` in {line}"));
            assert!((0.0..=1.0).contains(&v), "`{key}` = {v} out of [0, 1]");
        }
        for phase in [
            "sample",
            "gather",
            "forward",
            "backward",
            "allreduce",
            "optimizer",
            "eval",
        ] {
            let secs = line["seconds"][phase]
                .as_f64()
                .unwrap_or_else(|| panic!("no `seconds.{phase}` in {line}"));
            assert!(secs >= 0.0, "negative seconds.{phase} in {line}");
        }
        // Two layers over 4 batches: at least the 1,000 seeds and some edges every epoch.
        assert!(line["nodes"].as_u64().is_some_and(|n| n >= 1000), "{line}");
        assert!(line["edges"].as_u64().is_some_and(|n| n > 0), "{line}");
        assert_eq!(line["steps"], 4 * (i + 1), "{line}");
    }
    // The best validation epoch (the first one on ties) and its test metric.
    let best = lines
        .iter()
        .fold(None::<&serde_json::Value>, |best, l| match best {
            Some(b) if b["val"].as_f64() >= l["val"].as_f64() => Some(b),
            _ => Some(l),
        })
        .unwrap();
    let printed = out.last_json();
    let written = common::read_json(&summary_path);
    for summary in [&printed, &written] {
        assert_eq!(summary["best_epoch"], best["epoch"], "{summary}");
        assert_eq!(summary["val"], best["val"], "{summary}");
        assert_eq!(summary["test"], best["test"], "{summary}");
        assert_eq!(summary["epochs_run"], epochs);
        assert_eq!(summary["metric"], "accuracy");
        // Which pages the large per-step buffers got, as the log's `host memory` line says.
        let pages = summary["host_memory"].as_str().unwrap_or_default();
        assert!(pages.contains("pages"), "{summary}");
        assert!(
            out.stderr.contains(&format!("host memory: {pages}")),
            "{}",
            out.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input

/// Run `gnnpar train <args>` expecting a clean failure whose stderr mentions every one of
/// `needles`; returns stderr.
fn expect_failure(args: &[&str], needles: &[&str]) -> String {
    let out = gnnpar(args, RUN_TIMEOUT);
    assert!(
        !out.success,
        "`gnnpar {}` succeeded but should have failed:\n{}",
        args.join(" "),
        out.stderr
    );
    assert_eq!(
        out.code,
        Some(1),
        "`gnnpar {}` should exit 1:\n{}",
        args.join(" "),
        out.stderr
    );
    let err = out.stderr.to_lowercase();
    assert!(
        !err.contains("panicked") && !err.contains("rust_backtrace"),
        "`gnnpar {}` panicked:\n{}",
        args.join(" "),
        out.stderr
    );
    for needle in needles {
        assert!(
            out.stderr.contains(needle),
            "`gnnpar {}`: the error does not mention `{needle}`:\n{}",
            args.join(" "),
            out.stderr
        );
    }
    out.stderr
}

#[test]
fn inconsistent_options_are_refused_by_name() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let d = s(&data);
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--layers", "3", "--fanouts", "10,5"],
            &["fanouts", "layers"],
        ),
        (&["--hidden", "0"], &["hidden"]),
        (&["--lr", "0"], &["lr"]),
        (&["--lr=-0.01"], &["lr"]),
        // A negative value after a space parses (exit 1 from validation, not 2 from clap).
        (&["--lr", "-0.01"], &["`lr` = -0.01"]),
        (&["--weight-decay", "-1"], &["`weight_decay` = -1"]),
        (&["--threads", "100000"], &["`threads`", "per core"]),
        // A model too large for the host is refused before any allocation aborts the run.
        (
            &["--hidden", "100000000000"],
            &["hidden", "parameters", "MiB"],
        ),
    ];
    for (extra, needles) in cases {
        let mut args = vec!["train", "--data", d, "--epochs", "1"];
        args.extend_from_slice(extra);
        expect_failure(&args, needles);
    }
    // Names from a fixed list are checked by the parser (usage error, exit 2), which lists
    // the valid ones.
    for (option, value, valid) in [
        ("--model", "transformer", "sage, gcn, gat, mlp"),
        (
            "--strategy",
            "magic",
            "gdp, split, dnp, snp, nfp, hybrid, slicegcn, auto",
        ),
    ] {
        let out = gnnpar(
            &["train", "--data", d, "--epochs", "1", option, value],
            RUN_TIMEOUT,
        );
        assert_eq!(out.code, Some(2), "{option} {value}:\n{}", out.stderr);
        assert!(
            out.stderr.contains(value) && out.stderr.contains(valid),
            "{option} {value}:\n{}",
            out.stderr
        );
    }
}

#[test]
fn bad_config_files_are_refused_by_name() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let bad = tmp.path().join("typo.toml");
    std::fs::write(&bad, "model = \"sage\"\nhiden = 64\n").unwrap();
    expect_failure(
        &["train", "--data", s(&data), "--config", s(&bad)],
        &["hiden", "typo.toml"],
    );
    let missing = tmp.path().join("missing.toml");
    expect_failure(
        &["train", "--data", s(&data), "--config", s(&missing)],
        &["missing.toml"],
    );
}

/// A 40-vertex ring; `features`, `labels` and the split are chosen by the caller.
fn ring(features: bool, labels: bool, train: Vec<NodeId>) -> Dataset {
    let n = 40;
    let src: Vec<NodeId> = (0..n as NodeId).collect();
    let dst: Vec<NodeId> = (0..n as NodeId).map(|v| (v + 1) % n as NodeId).collect();
    Dataset {
        name: "ring".into(),
        num_nodes: n as u64,
        first_node: 0,
        graph: Csr::from_edges(n, &src, &dst),
        features: features.then(|| Array2::from_shape_fn((n, 3), |(v, j)| (v * 3 + j) as f32)),
        labels: labels.then(|| Labels::Class((0..n as i64).map(|v| v % 2).collect())),
        num_classes: if labels { 2 } else { 0 },
        splits: Splits {
            train,
            val: (20..30).collect(),
            test: (30..40).collect(),
        },
        directed: true,
    }
}

#[test]
fn datasets_missing_what_training_needs_are_refused() {
    let tmp = common::tempdir();
    let dir = tmp.path();
    // Edge lists through `gnnpar prepare`: one with features but no labels, one with labels
    // but no features.
    let edges = dir.join("edges.csv");
    std::fs::write(&edges, "src,dst\n0,1\n1,2\n2,3\n3,0\n").unwrap();
    let feats = dir.join("feats.csv");
    std::fs::write(&feats, "0,1.0,0.0\n1,0.0,1.0\n2,1.0,1.0\n3,0.5,0.5\n").unwrap();
    let labels = dir.join("labels.csv");
    std::fs::write(&labels, "id,target\n0,0\n1,1\n2,0\n3,1\n").unwrap();
    let unlabelled = dir.join("unlabelled.h5");
    let featureless = dir.join("featureless.h5");
    for (out, table) in [
        (&unlabelled, ["--features", s(&feats)]),
        (&featureless, ["--labels", s(&labels)]),
    ] {
        let mut args = vec!["prepare", s(&edges), "--format", "edgelist", "-o", s(out)];
        args.extend_from_slice(&table);
        gnnpar(&args, RUN_TIMEOUT).expect_ok("gnnpar prepare of an edge list");
    }
    expect_failure(
        &["train", "--data", s(&unlabelled), "--full-batch"],
        &["labels"],
    );
    expect_failure(
        &["train", "--data", s(&featureless), "--full-batch"],
        &["features"],
    );

    let no_train = dir.join("no-train.h5");
    format::write_dataset(&ring(true, true, Vec::new()), &no_train).unwrap();
    expect_failure(
        &["train", "--data", s(&no_train), "--full-batch"],
        &["train_idx"],
    );

    let missing = dir.join("nowhere.h5");
    expect_failure(
        &["train", "--data", s(&missing), "--full-batch"],
        &["nowhere.h5"],
    );
}

/// One part file of a partition directory is not a dataset to train on: every strategy and
/// `plan` refuse it up front, naming the file and what to pass (they used to index its rows by
/// global id and panic deep inside sampling or the gather).
#[test]
fn a_part_file_is_refused_with_what_to_pass() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let parts = tmp.path().join("parts");
    gnnpar(
        &[
            "partition",
            s(&data),
            "--parts",
            "2",
            "--method",
            "random",
            "-o",
            s(&parts),
        ],
        RUN_TIMEOUT,
    )
    .expect_ok("gnnpar partition");
    let part = parts.join("part-00001.h5");
    let p = s(&part);
    for extra in [
        &["--max-steps", "1"][..],
        &["--full-batch"],
        &["--strategy", "nfp", "--max-steps", "1"],
        &["--strategy", "slicegcn", "--model", "gcn"],
    ] {
        let mut args = vec!["train", "--data", p, "--epochs", "1"];
        args.extend_from_slice(extra);
        expect_failure(&args, &["part-00001.h5", "one part of a partition"]);
    }
    expect_failure(
        &["plan", "--data", p],
        &["part-00001.h5", "partition directory"],
    );
}

/// An output option naming one of the command's inputs is refused before anything is written:
/// the finished output would be renamed over the input (`--checkpoint data.h5` replaced the
/// dataset with a checkpoint). The inputs come out unchanged.
#[test]
fn an_output_that_names_an_input_is_refused_and_the_input_kept() {
    let tmp = common::tempdir();
    let dir = tmp.path();
    let data = small_sbm(dir);
    let config = dir.join("run.toml");
    std::fs::write(&config, "epochs = 1\n").unwrap();
    let edges = dir.join("edges.csv");
    std::fs::write(&edges, "0,1\n1,2\n2,0\n").unwrap();
    let link = dir.join("link.h5");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let before = |p: &Path| std::fs::read(p).unwrap();
    let (data_bytes, config_bytes, edge_bytes) = (before(&data), before(&config), before(&edges));
    let (d, c) = (s(&data), s(&config));
    for (args, needles) in [
        (
            vec!["train", "--data", d, "--checkpoint", d],
            ["--checkpoint", "--data"],
        ),
        (
            vec!["train", "--data", d, "--checkpoint", s(&link)],
            ["--checkpoint", "--data"],
        ),
        (
            vec!["train", "--data", d, "--config", c, "--summary", c],
            ["--summary", "--config"],
        ),
        (
            vec!["train", "--data", d, "--metrics", d],
            ["--metrics", "--data"],
        ),
        (
            vec!["plan", "--data", d, "--calibration", d],
            ["--calibration", "--data"],
        ),
        (
            vec!["prepare", s(&edges), "-o", s(&edges)],
            ["-o", "the input"],
        ),
        (
            vec!["export", d, "--format", "npz", "-o", d],
            ["-o", "the input"],
        ),
        (
            vec!["presample", d, "--epochs", "1", "-o", d],
            ["-o", "the input"],
        ),
    ] {
        expect_failure(&args, &needles);
        expect_failure(&args, &["same file", "choose another path"]);
    }
    assert_eq!(before(&data), data_bytes);
    assert_eq!(before(&config), config_bytes);
    assert_eq!(before(&edges), edge_bytes);
}

/// The error line of a run whose loss diverged, `gnnpar: error: … loss is X at epoch E step S
/// …`, as (X, E, S); panics unless stderr has exactly one error line and it matches
/// `loss is (NaN|inf|-inf) at epoch <E> step <S>`. (INFO lines name losses, epochs and steps
/// too: only the error line counts.)
fn divergence(stderr: &str) -> (String, u64, u64) {
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("gnnpar: error"))
        .collect();
    assert_eq!(errors.len(), 1, "expected one error line:\n{stderr}");
    let line = errors[0];
    let parsed = (|| {
        let (_, rest) = line.split_once("loss is ")?;
        let mut words = rest.split(' ');
        let value = words.next()?;
        if !["NaN", "inf", "-inf"].contains(&value) {
            return None;
        }
        (words.next()? == "at" && words.next()? == "epoch").then_some(())?;
        let epoch = words.next()?.parse().ok()?;
        (words.next()? == "step").then_some(())?;
        let step = words.next()?.parse().ok()?;
        Some((value.to_string(), epoch, step))
    })();
    parsed.unwrap_or_else(|| {
        panic!("the error line does not read `loss is (NaN|inf|-inf) at epoch E step S`: {line}")
    })
}

#[test]
fn a_diverging_loss_stops_naming_epoch_and_step() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let ck = tmp.path().join("ck.h5");
    let err = expect_failure(
        &[
            "train",
            "--data",
            s(&data),
            "--full-batch",
            "--model",
            "gcn",
            "--dropout",
            "0",
            "--epochs",
            "20",
            "--lr",
            "1e30",
            "--checkpoint",
            s(&ck),
        ],
        &[],
    );
    let (_, epoch, step) = divergence(&err);
    // Full batch: one step per epoch, so the steps taken before it equal the epoch; the
    // epochs before it trained (their log lines are there).
    assert_eq!(step, epoch, "{err}");
    for e in 0..epoch {
        assert!(err.contains(&format!("epoch {e}: loss")), "{err}");
    }
    assert!(!ck.exists(), "a diverged run left a checkpoint behind");
}

#[test]
fn a_diverging_slicegcn_loss_stops_naming_epoch_and_step() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let ck = tmp.path().join("ck.h5");
    // Adam moves every weight by about `lr` in its first step: at 3e38 the next forward pass
    // overflows.
    let err = expect_failure(
        &[
            "train",
            "--data",
            s(&data),
            "--strategy",
            "slicegcn",
            "--full-batch",
            "--model",
            "gcn",
            "--dropout",
            "0",
            "--epochs",
            "20",
            "--lr",
            "3e38",
            "--checkpoint",
            s(&ck),
        ],
        &["slicegcn"],
    );
    let (_, epoch, step) = divergence(&err);
    // SliceGCN trains one full-batch step per epoch, named like the other engine's.
    assert_eq!(step, epoch, "{err}");
    assert!(
        err.contains(&format!("at epoch {epoch} step {step} (batch 0")),
        "{err}"
    );
    assert!(!ck.exists(), "a diverged run left a checkpoint behind");
}

#[test]
fn an_unwritable_checkpoint_is_refused_before_training() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    // A path below a regular file cannot be created, even by root.
    let blocker = tmp.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").unwrap();
    let ck = blocker.join("ck.h5");
    let err = expect_failure(
        &[
            "train",
            "--data",
            s(&data),
            "--epochs",
            "1",
            "--checkpoint",
            s(&ck),
        ],
        &["checkpoint", "not-a-dir"],
    );
    assert!(
        !err.contains("epoch 0"),
        "training started before the checkpoint path was checked:\n{err}"
    );
}

#[test]
fn resume_refuses_a_different_model_and_needs_a_checkpoint() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let ck = tmp.path().join("sage.h5");
    let config = config_file(tmp.path(), "mb", MINIBATCH);
    train(&data, &config, &["--epochs", "1", "--checkpoint", s(&ck)]);
    let before = read_f32s(&ck, "params");
    let mut gcn: Vec<&str> = vec!["train", "--data", s(&data), "--config", s(&config)];
    gcn.extend_from_slice(&[
        "--model",
        "gcn",
        "--epochs",
        "2",
        "--checkpoint",
        s(&ck),
        "--resume",
    ]);
    // The settings that differ are named, with both values (GCN turns self-loops on).
    expect_failure(
        &gcn,
        &[
            "sage.h5",
            "different model",
            "`model`: checkpoint \"sage\", this run \"gcn\"",
            "`self_loops`: checkpoint false, this run true",
        ],
    );
    assert!(
        bits(&before) == bits(&read_f32s(&ck, "params")),
        "a refused resume changed the checkpoint"
    );
    // f32 settings are shown as written, not widened to f64 (0.009999999776482582).
    let mut lr: Vec<&str> = vec!["train", "--data", s(&data), "--config", s(&config)];
    lr.extend_from_slice(&[
        "--lr",
        "0.003",
        "--epochs",
        "2",
        "--checkpoint",
        s(&ck),
        "--resume",
    ]);
    let err = expect_failure(
        &lr,
        &["settings that differ: `lr`: checkpoint 0.01, this run 0.003)"],
    );
    assert!(
        !err.contains("0.00999") && !err.contains("0.00300000"),
        "a setting printed widened to f64:\n{err}"
    );
    expect_failure(
        &["train", "--data", s(&data), "--epochs", "1", "--resume"],
        &["--resume", "--checkpoint"],
    );
    // A period with nowhere to write is refused, not ignored.
    expect_failure(
        &[
            "train",
            "--data",
            s(&data),
            "--epochs",
            "1",
            "--checkpoint-every",
            "1",
        ],
        &["checkpoint_every", "--checkpoint"],
    );
    // A damaged checkpoint (a NaN among the parameters) is refused, naming the entry.
    {
        let file = hdf5::File::open_rw(&ck).unwrap();
        let params = file.dataset("params").unwrap();
        let mut values: Vec<f32> = params.read_raw().unwrap();
        values[5] = f32::NAN;
        params.write_raw(&values).unwrap();
    }
    let mut resume: Vec<&str> = vec!["train", "--data", s(&data), "--config", s(&config)];
    resume.extend_from_slice(&["--epochs", "2", "--checkpoint", s(&ck), "--resume"]);
    expect_failure(&resume, &["sage.h5", "`params`[5] is NaN", "damaged"]);
}

#[test]
fn the_checkpoint_records_the_resolved_run_config() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let ck = tmp.path().join("ck.h5");
    let config = config_file(tmp.path(), "mb", MINIBATCH);
    // The file's settings, one overridden on the command line.
    train(
        &data,
        &config,
        &["--hidden", "24", "--epochs", "1", "--checkpoint", s(&ck)],
    );
    let file = hdf5::File::open(&ck).unwrap();
    let text = file
        .attr("run_config")
        .and_then(|a| a.read_scalar::<hdf5::types::VarLenUnicode>())
        .unwrap_or_else(|e| panic!("no `run_config` attribute: {e}"));
    let json: serde_json::Value = serde_json::from_str(text.as_str())
        .unwrap_or_else(|e| panic!("`run_config` is not JSON ({e}): {}", text.as_str()));
    assert_eq!(json["model"], "sage", "{json}");
    assert_eq!(json["hidden"], 24, "{json}");
    assert_eq!(json["epochs"], 1, "{json}");
    assert_eq!(json["layers"], 2, "{json}");
    assert_eq!(json["fanouts"], serde_json::json!([5, 5]), "{json}");
    assert_eq!(json["batch_size"], 256, "{json}");
    assert_eq!(json["seed"], 3, "{json}");
    assert_eq!(json["strategy"], "gdp", "{json}");
    assert_eq!(json["lr"].as_f64().map(|x| x as f32), Some(0.01), "{json}");
    assert_eq!(
        json["dropout"].as_f64().map(|x| x as f32),
        Some(0.5),
        "{json}"
    );
    // The whole resolved configuration: it reads back as one, every field present.
    let cfg: gnnpar::config::TrainConfig = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("`run_config` is not a whole configuration ({e}): {json}"));
    assert_eq!(
        json.as_object().unwrap().len(),
        serde_json::to_value(&cfg)
            .unwrap()
            .as_object()
            .unwrap()
            .len(),
        "{json}"
    );
    assert_eq!(cfg.hidden, 24);
    assert_eq!(cfg.lr, 0.01);
}

// ---------------------------------------------------------------------------------------------
// MPI

#[test]
fn two_mpi_ranks_train_the_same_parameters_as_one() {
    if !common::have_mpirun("two_mpi_ranks_train_the_same_parameters_as_one") {
        return;
    }
    let tmp = common::tempdir();
    let one = tmp.path().join("np1.h5");
    let two = tmp.path().join("np2.h5");
    let steps = ["--max-steps", "5"];
    let mut single = vec!["train"];
    single.extend_from_slice(&steps);
    single.extend_from_slice(&["--checkpoint", s(&one)]);
    gnnpar(&single, MPI_TIMEOUT).expect_ok("gnnpar train on 1 rank");

    let mut cmd = common::mpirun();
    cmd.args(["--oversubscribe", "--bind-to", "none", "-np", "2"])
        .arg(common::GNNPAR)
        .arg("train")
        .args(steps)
        .args(["--threads", "1", "--checkpoint", s(&two)])
        .env("RUST_LOG", "info");
    let out = common::run_with_timeout(cmd, MPI_TIMEOUT).expect_ok("mpirun -np 2 gnnpar train");
    assert_eq!(
        out.last_json()["ranks"],
        2,
        "the job did not run on 2 ranks"
    );
    assert_eq!(read_u64_attr(&one, "step"), 5);
    assert_eq!(read_u64_attr(&two, "step"), 5);

    let (p1, p2) = (read_f32s(&one, "params"), read_f32s(&two, "params"));
    let init_differs = max_rel_diff(&p1, &p2, 1e-3);
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let diff: Vec<f32> = p1.iter().zip(&p2).map(|(a, b)| a - b).collect();
    let rel = norm(&diff) / norm(&p1);
    eprintln!(
        "1 vs 2 ranks after 5 steps: relative L2 difference {rel:.3e}, max element-wise {init_differs:.3e}"
    );
    assert!(
        rel <= 1e-4,
        "2 ranks trained different parameters (relative difference {rel:.3e})"
    );
    assert!(
        init_differs <= 1e-3,
        "an element differs by {init_differs:.3e} relative (floor 1e-3)"
    );
}

#[test]
fn a_run_that_fails_in_its_first_epoch_keeps_an_earlier_metrics_file() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let metrics = tmp.path().join("metrics.jsonl");
    let earlier = "{\"epoch\":0,\"loss\":1.0}\n{\"epoch\":1,\"loss\":0.5}\n";
    std::fs::write(&metrics, earlier).unwrap();
    // Batches of 16 at lr 1e30: Adam's first step overflows the weights, so the loss of an
    // early step of epoch 0 (of several) is not finite.
    let err = expect_failure(
        &[
            "train",
            "--data",
            s(&data),
            "--dropout",
            "0",
            "--epochs",
            "3",
            "--batch-size",
            "16",
            "--lr",
            "1e30",
            "--metrics",
            s(&metrics),
        ],
        &[],
    );
    let (_, epoch, _) = divergence(&err);
    assert_eq!(epoch, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&metrics).unwrap(), earlier);
}

/// A resume is refused when it would not continue the run the checkpoint is from: other data
/// (of the same shape), a cosine schedule over other epochs (its rates follow them), a
/// checkpoint that is missing or not a checkpoint at all. A resume with nothing left to train
/// says so and leaves the checkpoint as it was.
#[test]
fn a_resume_that_would_not_continue_the_run_is_refused_and_one_already_done_says_so() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let other = common::generate_sbm(
        tmp.path(),
        "other.h5",
        common::Sbm {
            nodes: 2000,
            edges: 20000,
            features: 16,
            classes: 4,
            seed: 8,
        },
    );
    let config = config_file(tmp.path(), "mb", MINIBATCH);
    let ck = tmp.path().join("ck.h5");
    train(&data, &config, &["--epochs", "1", "--checkpoint", s(&ck)]);
    let resume = |data: &Path, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--data",
            s(data),
            "--config",
            s(&config),
            "--resume",
        ];
        args.extend_from_slice(extra);
        args.iter().map(|a| a.to_string()).collect::<Vec<String>>()
    };
    let refused = |args: Vec<String>, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        expect_failure(&args, needles);
    };
    refused(
        resume(&other, &["--epochs", "2", "--checkpoint", s(&ck)]),
        &["ck.h5", "was trained on other data", "content id"],
    );
    refused(
        resume(
            &data,
            &[
                "--epochs",
                "2",
                "--checkpoint",
                s(&tmp.path().join("none.h5")),
            ],
        ),
        &["cannot resume", "none.h5", "does not exist"],
    );
    refused(
        resume(&data, &["--epochs", "2", "--checkpoint", s(&other)]),
        &["other.h5", "is not a gnnpar checkpoint"],
    );
    let cosine = tmp.path().join("cosine.h5");
    train(
        &data,
        &config,
        &[
            "--epochs",
            "2",
            "--max-steps",
            "3",
            "--lr-schedule",
            "cosine",
            "--checkpoint",
            s(&cosine),
        ],
    );
    refused(
        resume(
            &data,
            &[
                "--epochs",
                "4",
                "--lr-schedule",
                "cosine",
                "--checkpoint",
                s(&cosine),
            ],
        ),
        &["cosine.h5", "2 epochs", "this run has 4", "--epochs 2"],
    );
    // The same epochs resume.
    let args = resume(
        &data,
        &[
            "--epochs",
            "2",
            "--lr-schedule",
            "cosine",
            "--checkpoint",
            s(&cosine),
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    gnnpar(&args, RUN_TIMEOUT).expect_ok("a cosine resume with the same epochs");
    // Nothing left: a warning, the checkpoint untouched, no epoch time.
    let before = std::fs::read(&ck).unwrap();
    let args = resume(&data, &["--epochs", "1", "--checkpoint", s(&ck)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = gnnpar(&args, RUN_TIMEOUT).expect_ok("a resume with nothing left");
    assert!(out.stderr.contains("nothing to train"), "{}", out.stderr);
    assert!(out.stdout.contains("\"epochs_run\":0"), "{}", out.stdout);
    assert!(
        out.stdout.contains("\"epoch_time_mean\":null"),
        "{}",
        out.stdout
    );
    assert_eq!(std::fs::read(&ck).unwrap(), before);
}

/// `--checkpoint`, `--metrics` and `--summary` never replace a file that is not an earlier
/// output of their kind (a dataset named by mistake), and a summary path that cannot be
/// written fails before training, not after it.
#[test]
fn outputs_never_replace_a_foreign_file_and_a_bad_summary_path_fails_first() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let bystander = common::generate_sbm(
        tmp.path(),
        "bystander.h5",
        common::Sbm {
            nodes: 200,
            edges: 1000,
            features: 4,
            classes: 2,
            seed: 1,
        },
    );
    let keep = std::fs::read(&bystander).unwrap();
    for (option, what) in [
        ("--checkpoint", "a checkpoint"),
        ("--metrics", "metrics"),
        ("--summary", "a summary"),
    ] {
        expect_failure(
            &[
                "train",
                "--data",
                s(&data),
                "--epochs",
                "1",
                option,
                s(&bystander),
            ],
            &[&format!("refusing to write {what} to"), "bystander.h5"],
        );
        assert_eq!(std::fs::read(&bystander).unwrap(), keep, "{option}");
    }
    let err = expect_failure(
        &[
            "train",
            "--data",
            s(&data),
            "--epochs",
            "1",
            "--summary",
            "/nonexistent-dir/s.json",
        ],
        &["summary path", "/nonexistent-dir/s.json"],
    );
    assert!(
        !err.contains("epoch 0: loss"),
        "trained before failing:\n{err}"
    );
    // Earlier outputs of the same kind are replaced, as before.
    let (m, sm, ck) = (
        tmp.path().join("m.jsonl"),
        tmp.path().join("s.json"),
        tmp.path().join("ck.h5"),
    );
    for _ in 0..2 {
        gnnpar(
            &[
                "train",
                "--data",
                s(&data),
                "--epochs",
                "1",
                "--metrics",
                s(&m),
                "--summary",
                s(&sm),
                "--checkpoint",
                s(&ck),
            ],
            RUN_TIMEOUT,
        )
        .expect_ok("a run over its own earlier outputs");
    }
}

/// A run stopped mid-epoch marks that epoch's line `partial`; resumed, it writes the epoch
/// again with the loss of all of its batches, the uninterrupted run's to the bit.
#[test]
fn a_mid_epoch_resume_reports_the_whole_epochs_loss() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let config = config_file(tmp.path(), "mb", MINIBATCH);
    let lines = |path: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let whole = tmp.path().join("whole.jsonl");
    train(&data, &config, &["--epochs", "2", "--metrics", s(&whole)]);
    let (cut, ck) = (tmp.path().join("cut.jsonl"), tmp.path().join("ck.h5"));
    // 4 steps an epoch: step 6 stops epoch 1 after its second batch.
    let common_args = [
        "--epochs",
        "2",
        "--metrics",
        s(&cut),
        "--checkpoint",
        s(&ck),
    ];
    let mut first = common_args.to_vec();
    first.extend(["--max-steps", "6"]);
    train(&data, &config, &first);
    let mut second = common_args.to_vec();
    second.push("--resume");
    train(&data, &config, &second);
    let (whole, cut) = (lines(&whole), lines(&cut));
    assert_eq!(cut.len(), 3, "{cut:?}");
    assert_eq!(cut[1]["epoch"], 1);
    assert_eq!(cut[1]["partial"], true);
    assert!(whole.iter().all(|r| r.get("partial").is_none()));
    assert_eq!(cut[2]["epoch"], 1);
    assert!(cut[2].get("partial").is_none());
    assert_eq!(cut[2]["loss"], whole[1]["loss"]);
    assert_eq!(cut[0]["loss"], whole[0]["loss"]);
}
