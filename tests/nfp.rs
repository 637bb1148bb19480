//! Node-feature parallelism (`--strategy nfp`): on 2, 3 and 4 ranks, SAGE and GCN, with a
//! feature width that the rank count does not divide, and on emulated CUDA ranks, it trains the
//! model of 1 GDP rank (5 steps, parameters within 1e-4 relative, floor 1e-3, input dropout
//! on so every rank draws masks over its columns) and evaluates it alike — on bag-of-words
//! features (Cora) too, whose slices are cut by non-zeros and multiplied as CSR, on CPU and
//! emulated CUDA ranks; its checkpoint
//! resumes exactly, on any rank count; each rank holds only its rows of the input layer's
//! weights (the summary's per-rank parameter counts); and what does not decompose by feature columns is refused with the reason.
//! Every `mpirun` has a timeout, so a deadlock fails instead of hanging.

mod common;

use common::{gnnpar, max_rel_diff, read_f32s, s};
use std::path::{Path, PathBuf};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(240);

/// An SBM of 3,000 vertices with `features` feature columns.
fn sbm(dir: &Path, features: usize) -> PathBuf {
    let sbm = common::Sbm {
        nodes: 3000,
        edges: 60000,
        features,
        classes: 4,
        seed: 3,
    };
    common::generate_sbm(dir, &format!("sbm{features}.h5"), sbm)
}

/// `mpirun -np <np> gnnpar <args>` with extra environment.
fn mpirun(np: usize, args: &[&str], env: &[(&str, &str)]) -> common::Outcome {
    let mut cmd = common::mpirun_command(np, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    common::run_with_timeout(cmd, TIMEOUT)
}

/// 5 steps of 256 seeds (or of `extra`'s `--batch-size`, for a small training split),
/// dropout 0.3 on the input too, evaluation at the end.
fn train_args<'a>(data: &'a Path, model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let batch = extra.iter().position(|&a| a == "--batch-size");
    let batch_size = batch.map_or("256", |i| extra[i + 1]);
    let mut args = vec![
        "train",
        "--data",
        s(data),
        "--model",
        model,
        "--layers",
        "2",
        "--hidden",
        "16",
        "--fanouts",
        "5,3",
        "--batch-size",
        batch_size,
        "--max-steps",
        "5",
        "--epochs",
        "2",
        "--eval-every",
        "0",
        "--dropout",
        "0.3",
        "--lr",
        "0.01",
        "--threads",
        "1",
    ];
    match batch {
        Some(i) => {
            args.extend_from_slice(&extra[..i]);
            args.extend_from_slice(&extra[i + 2..]);
        }
        None => args.extend_from_slice(extra),
    }
    args
}

/// Train `model` on `np` ranks with `strategy` and return the checkpoint's parameters and the
/// run's summary.
fn train(
    dir: &Path,
    data: &Path,
    model: &str,
    strategy: &str,
    np: usize,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Vec<f32>, serde_json::Value, PathBuf) {
    let tag = data.file_stem().unwrap().to_str().unwrap();
    let ck = dir.join(format!("{tag}-{model}-{strategy}-{np}-{}.h5", extra.len()));
    let metrics = ck.with_extension("jsonl");
    let mut more = vec!["--strategy", strategy, "--checkpoint", s(&ck)];
    more.extend_from_slice(&["--metrics", s(&metrics)]);
    more.extend_from_slice(extra);
    let args = train_args(data, model, &more);
    let what = format!("{strategy} {model} on {np} ranks ({tag})");
    let out = mpirun(np, &args, env).expect_ok(&what);
    let summary = out.last_json();
    assert_eq!(summary["strategy"], strategy, "{what}: {summary}");
    assert_eq!(summary["steps"], 5, "{what}: {summary}");
    (read_f32s(&ck, "params"), summary, metrics)
}

/// Bytes every rank sent under `kind` over the run's epochs (a rank may send none: on Cora
/// every training vertex is in rank 0's range, so only the others send it partial rows).
fn bytes_sent(metrics: &Path, kind: &str) -> u64 {
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ranks = v["ranks"]["ranks"].as_array().unwrap().clone();
            ranks
                .iter()
                .map(|r| r["comm"][kind]["bytes_sent"].as_u64().unwrap_or(0))
                .sum::<u64>()
        })
        .sum()
}

/// NFP on each rank count of `ranks` against 1 GDP rank (on `data` with `features` feature
/// columns, both runs with `extra`); returns the largest difference and, per rank count, the
/// feature columns each rank held.
fn matches_gdp(
    dir: &Path,
    data: &Path,
    features: u64,
    model: &str,
    ranks: &[usize],
    extra: &[&str],
) -> (f32, Vec<Vec<u64>>) {
    let (reference, ref_summary, _) = train(dir, data, model, "gdp", 1, extra, &[]);
    let mut worst = 0.0f32;
    let mut columns = Vec::new();
    for &np in ranks {
        let (params, summary, metrics) = train(dir, data, model, "nfp", np, extra, &[]);
        let d = max_rel_diff(&reference, &params, 1e-3);
        eprintln!(
            "nfp {model} on {np} ranks ({}): max relative difference to 1 GDP rank {d:.2e}",
            data.display()
        );
        assert!(d <= 1e-4, "nfp {model} on {np} ranks differs by {d:.2e}");
        worst = worst.max(d);
        // The evaluation slices the input layer too: it sees the same model.
        for key in ["val", "test", "final_loss"] {
            let (a, b) = (ref_summary[key].as_f64(), summary[key].as_f64());
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!((a - b).abs() <= 1e-3, "{key}: gdp {a} vs nfp {b} on {np}");
        }
        // The partial rows and their gradients cross ranks and are counted by kind; no
        // feature row is fetched.
        for kind in [
            "nfp_blocks",
            "nfp_partials",
            "nfp_grads",
            "nfp_eval_partials",
        ] {
            assert!(bytes_sent(&metrics, kind) > 0, "no {kind} bytes on {np}");
        }
        assert_eq!(bytes_sent(&metrics, "store_rows"), 0);
        // Each rank holds only its rows of the input layer's weights (SAGE: two matrices of
        // hidden width 16): what it holds less than GDP's whole model is the other ranks'
        // rows, and the rows held add up to the feature width.
        let whole = ref_summary["memory"]["params"][0].as_u64().unwrap();
        let per_row = 16 * if model == "sage" { 2 } else { 1 };
        let held: Vec<u64> = summary["memory"]["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let missing = whole - p.as_u64().unwrap();
                assert_eq!(missing % per_row, 0, "{summary}");
                features - missing / per_row
            })
            .collect();
        assert_eq!(held.len(), np, "{summary}");
        assert!(held.iter().all(|&w| w > 0), "rows held {held:?}");
        assert_eq!(held.iter().sum::<u64>(), features, "rows held {held:?}");
        columns.push(held);
    }
    (worst, columns)
}

#[test]
fn nfp_with_sage_and_gcn_on_2_3_and_4_ranks_trains_the_model_of_1_gdp_rank() {
    let test = "nfp_with_sage_and_gcn_on_2_3_and_4_ranks_trains_the_model_of_1_gdp_rank";
    if !common::have_mpirun(test) {
        return;
    }
    let dir = common::tempdir();
    let data = sbm(dir.path(), 16);
    for model in ["sage", "gcn"] {
        matches_gdp(dir.path(), &data, 16, model, &[2, 3, 4], &[]);
    }
}

#[test]
fn nfp_sampling_batches_ahead_in_windows_changes_no_parameter() {
    // NFP's ranks sample their seeds locally, so each samples its next batches side by side
    // (`--sample-ahead`): windows of 3 over 5 steps of 2 epochs (one window crosses the
    // epoch's end, one is cut by `--max-steps`) train the parameters of the step's own
    // sampling, bit for bit.
    let test = "nfp_sampling_batches_ahead_in_windows_changes_no_parameter";
    if !common::have_mpirun(test) {
        return;
    }
    let dir = common::tempdir();
    let data = sbm(dir.path(), 16);
    let (in_step, _, _) = train(
        dir.path(),
        &data,
        "sage",
        "nfp",
        2,
        &["--sample-ahead", "1"],
        &[],
    );
    let (ahead, _, _) = train(
        dir.path(),
        &data,
        "sage",
        "nfp",
        2,
        &["--sample-ahead", "3"],
        &[],
    );
    assert_eq!(in_step.len(), ahead.len());
    assert!(
        in_step
            .iter()
            .zip(&ahead)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "nfp with batches sampled ahead trained other parameters"
    );
}

#[test]
fn nfp_with_10_features_on_3_and_4_ranks_slices_unevenly_and_still_matches() {
    let test = "nfp_with_10_features_on_3_and_4_ranks_slices_unevenly_and_still_matches";
    if !common::have_mpirun(test) {
        return;
    }
    let dir = common::tempdir();
    let data = sbm(dir.path(), 10);
    matches_gdp(dir.path(), &data, 10, "sage", &[3, 4], &[]);
    matches_gdp(dir.path(), &data, 10, "gcn", &[4], &[]);
}

#[test]
fn nfp_on_bag_of_words_features_slices_by_non_zeros_multiplies_csr_and_still_matches() {
    let test = "nfp_on_bag_of_words_features_slices_by_non_zeros_multiplies_csr_and_still_matches";
    if !common::have_mpirun(test) {
        return;
    }
    // Cora: 1,433 binary word columns, about 1.3 % set, far from evenly over the columns.
    let Some(npz) = common::dataset("planetoid/cora.npz", test) else {
        return;
    };
    let dir = common::tempdir();
    let data = common::prepare(&npz, dir.path(), "cora");
    // 140 training vertices: batches of 32 give 5 steps over the 2 epochs.
    let extra = ["--batch-size", "32"];
    for model in ["sage", "gcn"] {
        let (_, columns) = matches_gdp(dir.path(), &data, 1433, model, &[2, 3], &extra);
        // The slices follow the non-zeros, not the width (1433 / 2 = 716 columns, 1433 / 3 =
        // 477 or 478): each rank multiplies its slice's entries as CSR, and with input
        // dropout on, every stored entry still gets GDP's mask bit for its global column.
        for held in &columns {
            let np = held.len() as u64;
            let even: Vec<u64> = (0..np)
                .map(|r| 1433 * (r + 1) / np - 1433 * r / np)
                .collect();
            assert_ne!(
                held, &even,
                "{model}: columns held {held:?} are the even split"
            );
        }
    }
    // The same CSR slices on 2 emulated CUDA ranks (uploaded as CSR, multiplied by the
    // device's sparse kernels): still the CPU's GDP model.
    let (reference, _, _) = train(dir.path(), &data, "gcn", "gdp", 1, &extra, &[]);
    let mut cuda = extra.to_vec();
    cuda.extend(["--device", "cuda"]);
    let env = [("GNNPAR_CUDA_EMULATOR", "2")];
    let (params, summary, _) = train(dir.path(), &data, "gcn", "nfp", 2, &cuda, &env);
    assert!(
        summary["device"].as_str().unwrap().contains("CUDA"),
        "{summary}"
    );
    let d = max_rel_diff(&reference, &params, 1e-3);
    eprintln!("nfp gcn on Cora, 2 emulated CUDA ranks: max relative difference {d:.2e}");
    assert!(
        d <= 1e-4,
        "nfp gcn on Cora on CUDA ranks differs by {d:.2e}"
    );
}

#[test]
fn nfp_on_2_emulated_cuda_ranks_trains_the_model_of_1_cpu_rank() {
    let test = "nfp_on_2_emulated_cuda_ranks_trains_the_model_of_1_cpu_rank";
    if !common::have_mpirun(test) {
        return;
    }
    let dir = common::tempdir();
    let data = sbm(dir.path(), 16);
    for model in ["sage", "gcn"] {
        let (reference, _, _) = train(dir.path(), &data, model, "gdp", 1, &[], &[]);
        let cuda = ["--device", "cuda"];
        let env = [("GNNPAR_CUDA_EMULATOR", "2")];
        let (params, summary, _) = train(dir.path(), &data, model, "nfp", 2, &cuda, &env);
        assert!(
            summary["device"].as_str().unwrap().contains("CUDA"),
            "{summary}"
        );
        let d = max_rel_diff(&reference, &params, 1e-3);
        eprintln!("nfp {model} on 2 emulated CUDA ranks: max relative difference {d:.2e}");
        assert!(d <= 1e-4, "nfp {model} on CUDA ranks differs by {d:.2e}");
    }
}

#[test]
fn an_nfp_checkpoint_is_the_whole_model_and_resumes_exactly() {
    let test = "an_nfp_checkpoint_is_the_whole_model_and_resumes_exactly";
    if !common::have_mpirun(test) {
        return;
    }
    let dir = common::tempdir();
    let data = sbm(dir.path(), 16);
    // 1,500 training vertices in batches of 256: 6 steps an epoch.
    let run = |ck: &Path, epochs: &str, resume: bool| {
        let mut args = vec!["train", "--data", s(&data), "--strategy", "nfp"];
        args.extend_from_slice(&["--batch-size", "256", "--hidden", "16", "--epochs", epochs]);
        args.extend_from_slice(&["--fanouts", "5,3", "--checkpoint", s(ck), "--threads", "1"]);
        args.extend_from_slice(&["--weight-decay", "0.001", "--eval-every", "1"]);
        if resume {
            args.push("--resume");
        }
        mpirun(3, &args, &[]).expect_ok("nfp run");
    };
    let whole = dir.path().join("whole.h5");
    run(&whole, "2", false);
    let part = dir.path().join("part.h5");
    run(&part, "1", false);
    run(&part, "2", true);
    for name in ["params", "adam_m", "adam_v"] {
        let (a, b) = (read_f32s(&whole, name), read_f32s(&part, name));
        assert_eq!(
            common::bits(&a),
            common::bits(&b),
            "`{name}` of the resumed run differs from the uninterrupted one"
        );
    }
    // The checkpoint is the whole model: 1 GDP rank resuming it trains what NFP trains.
    let (gdp, nfp) = (dir.path().join("gdp.h5"), dir.path().join("nfp.h5"));
    std::fs::copy(&whole, &gdp).unwrap();
    std::fs::copy(&whole, &nfp).unwrap();
    run(&nfp, "3", true);
    let mut args = vec!["train", "--data", s(&data), "--batch-size", "256"];
    args.extend_from_slice(&["--hidden", "16", "--epochs", "3", "--fanouts", "5,3"]);
    args.extend_from_slice(&["--checkpoint", s(&gdp), "--resume", "--threads", "1"]);
    args.extend_from_slice(&["--weight-decay", "0.001", "--eval-every", "1"]);
    mpirun(1, &args, &[]).expect_ok("gdp resumes the nfp checkpoint");
    let d = max_rel_diff(&read_f32s(&gdp, "params"), &read_f32s(&nfp, "params"), 1e-3);
    eprintln!("gdp and nfp resuming an nfp checkpoint: max relative difference {d:.2e}");
    assert!(
        d <= 1e-4,
        "gdp resuming an nfp checkpoint differs by {d:.2e}"
    );
    // And it is no rank count's: 2 NFP ranks cut the 3 ranks' checkpoint into other slices
    // and train the same model.
    let two = dir.path().join("two.h5");
    std::fs::copy(&whole, &two).unwrap();
    let mut args = vec!["train", "--data", s(&data), "--strategy", "nfp"];
    args.extend_from_slice(&["--batch-size", "256", "--hidden", "16", "--epochs", "3"]);
    args.extend_from_slice(&["--fanouts", "5,3", "--checkpoint", s(&two), "--resume"]);
    args.extend_from_slice(&[
        "--weight-decay",
        "0.001",
        "--eval-every",
        "1",
        "--threads",
        "1",
    ]);
    mpirun(2, &args, &[]).expect_ok("2 nfp ranks resume a 3-rank nfp checkpoint");
    let d = max_rel_diff(&read_f32s(&two, "params"), &read_f32s(&nfp, "params"), 1e-3);
    eprintln!("2 and 3 nfp ranks resuming an nfp checkpoint: max relative difference {d:.2e}");
    assert!(d <= 1e-4, "2 nfp ranks resuming differ by {d:.2e}");
}

#[test]
fn nfp_refuses_gat_an_input_projection_full_batch_a_partition_and_too_many_ranks() {
    let test = "nfp_refuses_gat_an_input_projection_full_batch_a_partition_and_too_many_ranks";
    if !common::have_mpirun(test) {
        return;
    }
    let dir = common::tempdir();
    let data = sbm(dir.path(), 3);
    let parts = dir.path().join("parts");
    gnnpar(
        &["partition", s(&data), "--parts", "2", "-o", s(&parts)],
        TIMEOUT,
    )
    .expect_ok("partition");
    let cases: Vec<(usize, &Path, Vec<&str>, &str)> = vec![
        (2, &data, vec!["--model", "gat"], "whole projected row"),
        (
            2,
            &data,
            vec![
                "--input-proj",
                "true",
                "--layers",
                "3",
                "--fanouts",
                "3,3,3",
            ],
            "input_proj",
        ),
        (2, &data, vec!["--full-batch"], "full_batch"),
        (2, &parts, vec![], "unpartitioned dataset file"),
        (4, &data, vec![], "3 feature columns for 4 ranks"),
    ];
    for (np, input, extra, reason) in cases {
        let mut args = vec!["train", "--data", s(input), "--strategy", "nfp"];
        args.extend_from_slice(&["--max-steps", "1"]);
        args.extend_from_slice(&extra);
        let out = mpirun(np, &args, &[]);
        assert!(!out.success, "nfp {extra:?} was accepted");
        assert!(
            out.stderr.contains(reason),
            "nfp {extra:?}: the error does not say `{reason}`:\n{}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
}
