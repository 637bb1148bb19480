//! `gnnpar presample`: weights are stable across epoch counts, deterministic, refuse bad
//! options, and the weighted METIS partition of an R-MAT graph cuts fewer sampled edges than
//! a random one and balances every layer better than unweighted METIS.

use gnnpar::partition::weights::{read_weights, VertexEdgeWeights};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn gnnpar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .args(args)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .output()
        .expect("run gnnpar")
}

/// Run gnnpar, assert success, return the last stdout line parsed as JSON.
fn ok_json(args: &[&str]) -> Value {
    let out = gnnpar(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gnnpar {args:?} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("JSON summary")
}

/// Run gnnpar, assert failure, return stderr.
fn err_of(args: &[&str]) -> String {
    let out = gnnpar(args);
    assert!(!out.status.success(), "gnnpar {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn rmat(dir: &Path, name: &str, nodes: u64, edges: u64, seed: u64) -> PathBuf {
    let path = dir.join(name);
    ok_json(&[
        "generate",
        "rmat",
        "--nodes",
        &nodes.to_string(),
        "--edges",
        &edges.to_string(),
        "--seed",
        &seed.to_string(),
        "-o",
        s(&path),
    ]);
    path
}

fn presample(data: &Path, epochs: u64, seed: u64, batch: u64, out: &Path) -> Value {
    ok_json(&[
        "presample",
        s(data),
        "--epochs",
        &epochs.to_string(),
        "--fanouts",
        "15,10,5",
        "--batch-size",
        &batch.to_string(),
        "--seed",
        &seed.to_string(),
        "-o",
        s(out),
    ])
}

/// Relative L1 difference of column `c` of two weight sets, each column normalised to sum 1
/// (weights are relative: the scale factor depends on the largest count).
fn column_rel_l1(a: &VertexEdgeWeights, b: &VertexEdgeWeights, c: usize) -> f64 {
    let ca = a.vertex_weights.column(c);
    let cb = b.vertex_weights.column(c);
    let (ta, tb) = (ca.iter().sum::<i64>() as f64, cb.iter().sum::<i64>() as f64);
    ca.iter()
        .zip(cb.iter())
        .map(|(&x, &y)| (x as f64 / ta - y as f64 / tb).abs())
        .sum()
}

#[test]
fn weights_are_stable_between_10_and_20_epochs() {
    let dir = tempfile::tempdir().unwrap();
    // 4,096 vertices, ~53k stored edges, half of them training seeds; batches of 64 make
    // enough mini-batches that every layer's counts are averages over many draws.
    let data = rmat(dir.path(), "g.h5", 4096, 65_536, 1);
    let (w10, w20) = (dir.path().join("w10.h5"), dir.path().join("w20.h5"));
    let j = presample(&data, 10, 0, 64, &w10);
    assert_eq!(j["presample"]["batches"], 320);
    presample(&data, 20, 0, 64, &w20);
    let (a, b) = (read_weights(&w10).unwrap(), read_weights(&w20).unwrap());
    assert_eq!((a.epochs, b.epochs), (10, 20));
    assert_eq!(a.num_constraints(), 4, "3 hops + input rows");
    for c in 0..4 {
        let d = column_rel_l1(&a, &b, c);
        eprintln!("column {c}: relative L1 difference K=10 vs K=20 = {:.4}", d);
        assert!(d < 0.05, "column {c}: {d}");
    }
    // Every training seed is in every epoch exactly once: column 0 is the same to rounding.
    assert!(column_rel_l1(&a, &b, 0) < 1e-6);
    let (ea, eb) = (&a.edge_weights, &b.edge_weights);
    let (ta, tb) = (ea.iter().sum::<i64>() as f64, eb.iter().sum::<i64>() as f64);
    let de: f64 = ea
        .iter()
        .zip(eb)
        .map(|(&x, &y)| (x as f64 / ta - y as f64 / tb).abs())
        .sum();
    eprintln!("edges: relative L1 difference K=10 vs K=20 = {de:.4}");
    assert!(de < 0.15, "edge weights differ by {de}");
}

#[test]
fn weights_are_deterministic_and_independent_of_threads() {
    let dir = tempfile::tempdir().unwrap();
    let data = rmat(dir.path(), "g.h5", 2048, 32_768, 2);
    let mut files = Vec::new();
    // One thread (one batch at a time), two (windows of two batches side by side, twice),
    // and windows of five on two threads: the same weights.
    for (threads, ahead) in [("1", "1"), ("2", "2"), ("2", "2"), ("2", "5")] {
        let out = dir.path().join(format!("w{}.h5", files.len()));
        let o = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
            .args([
                "presample",
                s(&data),
                "--epochs",
                "3",
                "--fanouts",
                "10,5",
                "--batch-size",
                "100",
                "--seed",
                "7",
                "--sample-ahead",
                ahead,
                "-o",
                s(&out),
            ])
            .env("RAYON_NUM_THREADS", threads)
            .env("HDF5_USE_FILE_LOCKING", "FALSE")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        files.push(read_weights(&out).unwrap());
    }
    assert_eq!(files[0], files[1]);
    assert_eq!(files[1], files[2]);
    assert_eq!(files[2], files[3]);
    // A different seed samples differently.
    let other = dir.path().join("other.h5");
    presample(&data, 3, 8, 100, &other);
    assert_ne!(
        read_weights(&other).unwrap().edge_weights,
        files[0].edge_weights
    );
    // --no-edge-weights: the same vertex weights, every edge weight 0.
    let nodes_only = dir.path().join("nodes-only.h5");
    let j = ok_json(&[
        "presample",
        s(&data),
        "--epochs",
        "3",
        "--fanouts",
        "10,5",
        "--batch-size",
        "100",
        "--seed",
        "7",
        "--no-edge-weights",
        "-o",
        s(&nodes_only),
    ]);
    assert_eq!(j["presample"]["edge_weights"], false);
    let n = read_weights(&nodes_only).unwrap();
    assert_eq!(n.vertex_weights, files[0].vertex_weights);
    assert!(n.edge_weights.iter().all(|&w| w == 0));
    // Edge weights are aligned with the stored edges; some edges are never sampled.
    assert!(files[0].edge_weights.contains(&0));
    assert!(files[0].edge_weights.iter().any(|&w| w > 0));
}

#[test]
fn bad_options_are_refused_clearly_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = rmat(dir.path(), "g.h5", 512, 4096, 3);
    let out = dir.path().join("w.h5");
    let d = s(&data);
    let o = s(&out);
    let base = ["presample", d, "-o", o];
    let with = |extra: &[&str]| -> String {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        err_of(&args)
    };
    let e = with(&["--epochs", "0"]);
    assert!(e.contains("--epochs"), "{e}");
    let e = with(&["--epochs", "2", "--fanouts", "10,0"]);
    assert!(e.contains("--fanouts"), "{e}");
    let e = with(&["--epochs", "2", "--fanouts", "10,-3"]);
    assert!(e.contains("--fanouts"), "{e}");
    let e = with(&["--epochs", "2", "--batch-size", "0"]);
    assert!(e.contains("--batch-size"), "{e}");
    let e = with(&["--epochs", "2", "--config", "/nonexistent/x.toml"]);
    assert!(e.contains("x.toml"), "{e}");
    // The whole config is checked, not only its sampler keys: it is the one `train` reads.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "dropout = 2.0\n").unwrap();
    let e = with(&["--epochs", "2", "--config", s(&bad)]);
    assert!(e.contains("bad.toml") && e.contains("`dropout` = 2"), "{e}");
    let e = err_of(&["presample", d, "--epochs", "2"]);
    assert!(e.contains("-o") && e.contains("--evaluate"), "{e}");
    let e = err_of(&["presample", "/nonexistent/g.h5", "--epochs", "2", "-o", o]);
    assert!(e.contains("/nonexistent/g.h5"), "{e}");
    let e = with(&["--epochs", "2", "--evaluate", s(dir.path())]);
    assert!(e.contains("--evaluate") && e.contains("meta.h5"), "{e}");
    // A partition of another graph is refused before sampling.
    let other = rmat(dir.path(), "other.h5", 600, 4096, 4);
    let parts = dir.path().join("parts");
    ok_json(&[
        "partition",
        s(&other),
        "-p",
        "2",
        "--method",
        "random",
        "-o",
        s(&parts),
        "--json",
    ]);
    let e = with(&["--epochs", "2", "--evaluate", s(&parts)]);
    assert!(e.contains("600") && e.contains("512"), "{e}");
    // A part file is not a whole dataset.
    let e = err_of(&[
        "presample",
        s(&parts.join("part-00000.h5")),
        "--epochs",
        "2",
        "-o",
        o,
    ]);
    assert!(e.contains("part"), "{e}");
    assert!(!out.exists(), "a failed run left `{}`", out.display());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("w.h5") || n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Split statistics of `parts` over 5 epochs sampled with seed 2 (the weights were made with
/// seed 1, so the partition is measured on mini-batches it never saw).
fn split_stats(data: &Path, parts: &Path) -> Value {
    let j = ok_json(&[
        "presample",
        s(data),
        "--epochs",
        "5",
        "--fanouts",
        "15,10,5",
        "--batch-size",
        "1024",
        "--seed",
        "2",
        "--evaluate",
        s(parts),
    ]);
    j["presample"]["split_stats"].clone()
}

fn per_hop(stats: &Value, field: &str) -> Vec<f64> {
    stats["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[field].as_f64().unwrap())
        .collect()
}

#[test]
fn weighted_partition_beats_random_on_cuts_and_unweighted_metis_on_balance() {
    let dir = tempfile::tempdir().unwrap();
    let data = rmat(dir.path(), "rmat.h5", 1 << 15, 1 << 19, 3);
    let weights = dir.path().join("w.h5");
    presample(&data, 10, 1, 1024, &weights);
    let partition = |name: &str, extra: &[&str]| -> PathBuf {
        let out = dir.path().join(name);
        let mut args = vec!["partition", s(&data), "-p", "4", "-o", s(&out), "--json"];
        args.extend_from_slice(extra);
        ok_json(&args);
        out
    };
    let weighted = split_stats(&data, &partition("weighted", &["--weights", s(&weights)]));
    let random = split_stats(&data, &partition("random", &["--method", "random"]));
    let vertices = split_stats(&data, &partition("vertices", &["--balance", "vertices"]));
    for (name, st) in [
        ("weighted", &weighted),
        ("random", &random),
        ("metis --balance vertices", &vertices),
    ] {
        eprintln!(
            "{name:>26}: cross-split % per hop {:.2?}, vertex imbalance per hop {:.3?}, \
             edge imbalance per hop {:.3?}",
            per_hop(st, "cross_edge_percent"),
            per_hop(st, "vertex_imbalance"),
            per_hop(st, "edge_imbalance"),
        );
    }
    let (wc, rc) = (
        per_hop(&weighted, "cross_edge_percent"),
        per_hop(&random, "cross_edge_percent"),
    );
    for h in 0..3 {
        assert!(
            wc[h] < rc[h],
            "hop {h}: weighted {} vs random {}",
            wc[h],
            rc[h]
        );
    }
    let max = |v: Vec<f64>| v.into_iter().fold(0.0f64, f64::max);
    let wi = max(per_hop(&weighted, "vertex_imbalance"));
    let vi = max(per_hop(&vertices, "vertex_imbalance"));
    assert!(
        wi < vi,
        "worst per-layer load imbalance: weighted {wi} vs unweighted {vi}"
    );
    let we = max(per_hop(&weighted, "edge_imbalance"));
    let ve = max(per_hop(&vertices, "edge_imbalance"));
    assert!(
        we < ve,
        "worst per-layer edge imbalance: weighted {we} vs unweighted {ve}"
    );
}
