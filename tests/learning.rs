//! Learning quality of `gnnpar train`, through the built binary: on the SBM a GNN clearly beats
//! a graph-free MLP; on real data short runs of the configurations in `inputs/` reach the
//! published numbers (Cora GCN; Minesweeper and Tolokers SAGE and GCN within 3 ROC-AUC
//! points). The GCN configs use the published models' shape (residual connections, layer norm,
//! input projection, linear output; see `inputs/minesweeper-gcn.toml`); plain GCN stays 10
//! points below on these two sets.
//!
//! Real datasets come from `GNNPAR_DATA` (default `../shared/datasets`); a missing file is a
//! loud `SKIPPED` line, not a failure.

mod common;

use common::{gnnpar, s};
use std::path::Path;
use std::time::Duration;

/// Generous limit for one training run (they take seconds to a minute on 2 cores).
const TIMEOUT: Duration = Duration::from_secs(900);

/// The best-validation-epoch result of a run.
struct Learned {
    val: f64,
    test: f64,
    best_epoch: u64,
    seconds: f64,
}

/// `gnnpar train <args>`; returns the summary's val / test at the best validation epoch.
fn train(what: &str, args: &[&str]) -> Learned {
    let mut full = vec!["train"];
    full.extend_from_slice(args);
    let out = gnnpar(&full, TIMEOUT).expect_ok(what);
    let summary = out.last_json();
    let learned = Learned {
        val: summary["val"].as_f64().expect("summary has `val`"),
        test: summary["test"].as_f64().expect("summary has `test`"),
        best_epoch: summary["best_epoch"]
            .as_u64()
            .expect("summary has `best_epoch`"),
        seconds: out.seconds,
    };
    eprintln!(
        "{what}: {} val {:.4}, test {:.4} at best-val epoch {} ({:.1} s)",
        summary["metric"], learned.val, learned.test, learned.best_epoch, learned.seconds
    );
    learned
}

/// The config file `inputs/<name>` of this crate.
fn config(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("inputs")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// Prepare `rel` (an npz of the datasets directory) and train it with `inputs/<cfg>`;
/// `None` (after a loud SKIPPED) when the file is absent.
fn train_real(test: &str, rel: &str, cfg: &str) -> Option<Learned> {
    let npz = common::dataset(rel, test)?;
    let tmp = common::tempdir();
    let data = common::prepare(&npz, tmp.path(), "data");
    Some(train(
        &format!("{test} ({cfg})"),
        &["--data", s(&data), "--config", &config(cfg)],
    ))
}

#[test]
fn sage_beats_mlp_on_the_sbm_by_a_wide_margin() {
    // The synthetic default (20,000-vertex SBM, 8 classes, noisy class features, homophily
    // 0.8): the neighbourhood carries the class, the features alone only partly.
    let sage = train(
        "SAGE on the synthetic SBM",
        &["--config", &config("synthetic.toml"), "--epochs", "3"],
    );
    // The MLP gets many more steps than SAGE: it plateaus, it is not under-trained.
    let mlp = train(
        "MLP on the synthetic SBM",
        &[
            "--model",
            "mlp",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--full-batch",
            "--epochs",
            "100",
            "--lr",
            "0.01",
            "--eval-every",
            "5",
        ],
    );
    assert!(
        sage.test >= mlp.test + 0.15,
        "SAGE test accuracy {:.4} is not 15 points above the MLP's {:.4}",
        sage.test,
        mlp.test
    );
}

#[test]
fn cora_gcn_reaches_kipf_and_welling() {
    let Some(r) = train_real(
        "cora_gcn_reaches_kipf_and_welling",
        "planetoid/cora.npz",
        "cora.toml",
    ) else {
        return;
    };
    // Published 81.5%; the issue asks for at least 79% in a short run.
    assert!(
        r.test >= 0.79,
        "Cora GCN test accuracy {:.4} < 0.79",
        r.test
    );
}

/// Published ROC-AUC (Platonov et al. 2023) and how close a short run must come.
const WITHIN: f64 = 0.03;

#[test]
fn minesweeper_sage_is_within_3_points_of_published() {
    let Some(r) = train_real(
        "minesweeper_sage_is_within_3_points_of_published",
        "heterophilous/minesweeper.npz",
        "minesweeper.toml",
    ) else {
        return;
    };
    let published = 0.9351;
    assert!(
        r.test >= published - WITHIN,
        "Minesweeper SAGE ROC-AUC {:.4} is more than 3 points below the published {published}",
        r.test
    );
}

#[test]
fn tolokers_sage_is_within_3_points_of_published() {
    let Some(r) = train_real(
        "tolokers_sage_is_within_3_points_of_published",
        "heterophilous/tolokers.npz",
        "tolokers.toml",
    ) else {
        return;
    };
    let published = 0.8243;
    assert!(
        r.test >= published - WITHIN,
        "Tolokers SAGE ROC-AUC {:.4} is more than 3 points below the published {published}",
        r.test
    );
}

/// GCN on a heterophilous set (residual, layer norm, input projection, linear output: the
/// published model's shape) must come within 3 points of the published ROC-AUC.
fn gcn_check(test: &str, rel: &str, cfg: &str, published: f64) {
    let Some(r) = train_real(test, rel, cfg) else {
        return;
    };
    assert!(
        r.test >= published - WITHIN,
        "{test}: GCN ROC-AUC {:.4} is more than 3 points below the published {published}",
        r.test
    );
}

#[test]
fn minesweeper_gcn_is_within_3_points_of_published() {
    // Published 89.75; measured 0.908 (seed 0) with this config.
    gcn_check(
        "minesweeper_gcn_is_within_3_points_of_published",
        "heterophilous/minesweeper.npz",
        "minesweeper-gcn.toml",
        0.8975,
    );
}

#[test]
fn tolokers_gcn_is_within_3_points_of_published() {
    // Published 83.64; measured 0.833 (seed 0) with this config.
    gcn_check(
        "tolokers_gcn_is_within_3_points_of_published",
        "heterophilous/tolokers.npz",
        "tolokers-gcn.toml",
        0.8364,
    );
}
