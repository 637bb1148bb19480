//! `gnnpar partition`: invariants of the written parts, METIS quality against random, weighted
//! balancing, and bad input.

use gnnpar::graph::parts::{self, PartitionMeta};
use gnnpar::graph::{format, Csr, Dataset, Labels, NodeId, Splits};
use gnnpar::partition::weights::{write_weights, VertexEdgeWeights};
use gnnpar::partition::{partition_dataset, Method, PartitionOptions};
use ndarray::Array2;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// The tests of this file run one at a time. HDF5 holds an `flock` on every file it has open,
/// on a descriptor without close-on-exec: a `gnnpar` child spawned by one test inherits the
/// descriptor of a file another test is writing and keeps it locked, so the writer's own
/// reopen fails with EWOULDBLOCK.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// SplitMix64: a tiny deterministic generator for building test graphs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A whole dataset from edges, with features encoding the vertex id, labels, and disjoint
/// sorted splits.
fn dataset_from_edges(name: &str, n: usize, src: &[NodeId], dst: &[NodeId], seed: u64) -> Dataset {
    let mut rng = Rng(seed);
    let graph = Csr::from_edges(n, src, dst);
    let d = 3;
    let features = Array2::from_shape_fn((n, d), |(v, j)| v as f32 * 10.0 + j as f32 + 0.5);
    let classes = 5;
    let labels: Vec<i64> = (0..n).map(|_| rng.below(classes) as i64).collect();
    let mut splits = Splits::default();
    for v in 0..n as NodeId {
        match rng.below(10) {
            0..=5 => splits.train.push(v),
            6 => splits.val.push(v),
            7 | 8 => splits.test.push(v),
            _ => {}
        }
    }
    Dataset {
        name: name.into(),
        num_nodes: n as u64,
        first_node: 0,
        graph,
        features: Some(features),
        labels: Some(Labels::Class(labels)),
        num_classes: classes as usize,
        splits,
        directed: true,
    }
}

/// A random directed multigraph with self-loops and duplicate edges (METIS must cope).
fn random_dataset(n: usize, m: usize, seed: u64) -> Dataset {
    let mut rng = Rng(seed);
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for _ in 0..m {
        src.push(rng.below(n as u64) as NodeId);
        dst.push(rng.below(n as u64) as NodeId);
    }
    // A few self-loops and repeated edges.
    for v in 0..(n as NodeId).min(5) {
        src.extend([v, v, v]);
        dst.extend([v, (v + 1) % n as NodeId, (v + 1) % n as NodeId]);
    }
    dataset_from_edges("random", n, &src, &dst, seed ^ 1)
}

/// A planted partition (SBM-like): `blocks` blocks, edge probability `p_in` inside a block and
/// `p_out` across, stored in both directions. Vertex ids are shuffled so blocks are not
/// contiguous ranges.
fn planted_dataset(n: usize, blocks: usize, p_in: f64, p_out: f64, seed: u64) -> Dataset {
    let mut rng = Rng(seed);
    let block: Vec<usize> = (0..n).map(|_| rng.below(blocks as u64) as usize).collect();
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for u in 0..n {
        for v in u + 1..n {
            let p = if block[u] == block[v] { p_in } else { p_out };
            if rng.unit() < p {
                src.extend([u as NodeId, v as NodeId]);
                dst.extend([v as NodeId, u as NodeId]);
            }
        }
    }
    let mut ds = dataset_from_edges("planted", n, &src, &dst, seed ^ 2);
    ds.directed = false;
    ds
}

fn write(ds: &Dataset, dir: &Path) -> PathBuf {
    let path = dir.join(format!("{}.h5", ds.name));
    format::write_dataset(ds, &path).unwrap();
    path
}

fn options(input: &Path, output: &Path, parts: usize, method: Method) -> PartitionOptions {
    PartitionOptions {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        parts,
        method,
        weights: None,
        balance: None,
        seed: 1,
        ufactor: None,
    }
}

/// Check every invariant of `dir` against the source dataset `src`; returns the meta.
fn check_partition(src: &Dataset, dir: &Path, parts_wanted: usize) -> PartitionMeta {
    let meta = parts::read_meta(dir).unwrap();
    let n = src.num_nodes as usize;
    assert_eq!(meta.num_parts, parts_wanted);
    // Offsets contiguous and covering every vertex.
    assert_eq!(meta.offsets[0], 0);
    assert_eq!(*meta.offsets.last().unwrap(), n as u64);
    assert!(
        meta.offsets.windows(2).all(|w| w[0] <= w[1]),
        "{:?}",
        meta.offsets
    );
    // Relabelling is a bijection: every original vertex appears exactly once, hence lies in
    // exactly one part.
    let mut seen = vec![0u32; n];
    for &o in &meta.orig_id {
        seen[o as usize] += 1;
    }
    assert!(seen.iter().all(|&c| c == 1), "orig_id is not a permutation");
    // Within a part, new ids follow original ids.
    for p in 0..meta.num_parts {
        let ids = &meta.orig_id[meta.offsets[p] as usize..meta.offsets[p + 1] as usize];
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "part {p} not ordered by original id"
        );
    }

    let src_labels = match &src.labels {
        Some(Labels::Class(l)) => l.clone(),
        _ => unreachable!("test datasets have class labels"),
    };
    let src_features = src.features.as_ref().unwrap();
    let mut edges_seen = 0u64;
    let mut cut = 0u64;
    let mut splits_back = Splits::default();
    for p in 0..meta.num_parts {
        let part = parts::read_part(dir, &meta, p).unwrap();
        assert_eq!(part.first_node, meta.offsets[p]);
        assert_eq!(part.num_classes, src.num_classes);
        assert_eq!(part.name, src.name);
        assert_eq!(part.directed, src.directed);
        let labels = match &part.labels {
            Some(Labels::Class(l)) => l,
            _ => panic!("part {p} lost its labels"),
        };
        let features = part.features.as_ref().expect("part lost its features");
        assert_eq!(labels.len(), part.local_nodes());
        for (r, &label) in labels.iter().enumerate() {
            let new = part.first_node as usize + r;
            let old = meta.orig_id[new] as usize;
            // Neighbour list: same vertices, in the original order.
            let back: Vec<NodeId> = part
                .graph
                .neighbors(r)
                .iter()
                .map(|&u| meta.orig_id[u as usize] as NodeId)
                .collect();
            let orig = src.graph.neighbors(old);
            let (mut a, mut b) = (back.clone(), orig.to_vec());
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "edge multiset of original vertex {old} changed");
            assert_eq!(
                back, orig,
                "neighbour order of original vertex {old} changed"
            );
            edges_seen += back.len() as u64;
            cut += part
                .graph
                .neighbors(r)
                .iter()
                .filter(|&&u| meta.owner(u as u64) != p)
                .count() as u64;
            assert_eq!(
                features.row(r),
                src_features.row(old),
                "features of {old} moved wrong"
            );
            assert_eq!(label, src_labels[old], "label of {old} moved wrong");
        }
        for (got, back) in [
            (&part.splits.train, &mut splits_back.train),
            (&part.splits.val, &mut splits_back.val),
            (&part.splits.test, &mut splits_back.test),
        ] {
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "split ids of part {p} unsorted"
            );
            back.extend(got.iter().map(|&v| meta.orig_id[v as usize] as NodeId));
        }
    }
    assert_eq!(edges_seen, src.local_edges(), "edges lost or added");
    assert_eq!(meta.num_edges, src.local_edges());
    assert_eq!(
        meta.edge_cut, cut,
        "meta.h5 edge cut disagrees with the parts"
    );
    for (back, orig) in [
        (&mut splits_back.train, &src.splits.train),
        (&mut splits_back.val, &src.splits.val),
        (&mut splits_back.test, &src.splits.test),
    ] {
        back.sort_unstable();
        assert_eq!(back, orig, "split membership changed");
    }
    meta
}

#[test]
fn invariants_hold_for_every_method_and_part_count() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(300, 1500, 42);
    let input = write(&ds, tmp.path());
    for method in [Method::Metis, Method::Random, Method::Hash] {
        for p in 1..=4 {
            let out = tmp.path().join(format!("parts-{}-{p}", method.name()));
            let stats = partition_dataset(&options(&input, &out, p, method)).unwrap();
            let meta = check_partition(&ds, &out, p);
            assert_eq!(meta.method, method.name());
            assert_eq!(stats.edge_cut, meta.edge_cut);
            assert_eq!(stats.part_vertices.iter().sum::<u64>(), 300);
            assert_eq!(stats.part_edges.iter().sum::<u64>(), ds.local_edges());
            assert_eq!(
                stats.part_train.iter().sum::<u64>(),
                ds.splits.train.len() as u64
            );
            for q in 0..p {
                let owned = meta.offsets[q + 1] - meta.offsets[q];
                assert_eq!(stats.part_vertices[q], owned);
                assert!(owned > 0, "{} left part {q} of {p} empty", method.name());
            }
            if p == 1 {
                assert_eq!(stats.edge_cut, 0);
                assert!(meta.orig_id.iter().enumerate().all(|(i, &o)| i as u64 == o));
            }
            if method == Method::Random {
                let (min, max) = (
                    stats.part_vertices.iter().min().unwrap(),
                    stats.part_vertices.iter().max().unwrap(),
                );
                assert!(
                    max - min <= 1,
                    "random parts unbalanced: {:?}",
                    stats.part_vertices
                );
            }
        }
    }
}

#[test]
fn partitions_are_deterministic_for_a_seed() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(400, 2000, 7);
    let input = write(&ds, tmp.path());
    for method in [Method::Metis, Method::Random] {
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        partition_dataset(&options(&input, &a, 3, method)).unwrap();
        partition_dataset(&options(&input, &b, 3, method)).unwrap();
        let (ma, mb) = (parts::read_meta(&a).unwrap(), parts::read_meta(&b).unwrap());
        assert_eq!(
            ma.orig_id,
            mb.orig_id,
            "{} not deterministic",
            method.name()
        );
        assert_eq!(ma.offsets, mb.offsets);
        // Re-partitioning over an existing partition directory replaces it.
        partition_dataset(&options(&input, &a, 2, method)).unwrap();
        assert_eq!(parts::read_meta(&a).unwrap().num_parts, 2);
        assert!(
            !parts::part_path(&a, 2).exists(),
            "stale part file left behind"
        );
    }
}

/// Partition `dataset` into `parts` parts with METIS and with the random baseline (inside
/// `workdir`); print and return `(metis cut, random cut)`. Reusable on real datasets.
fn metis_and_random_cut(dataset: &Path, parts: usize, workdir: &Path) -> (u64, u64) {
    let mut cuts = [0u64; 2];
    for (slot, method) in [Method::Metis, Method::Random].into_iter().enumerate() {
        let out = workdir.join(format!("cut-{}-{parts}", method.name()));
        cuts[slot] = partition_dataset(&options(dataset, &out, parts, method))
            .unwrap()
            .edge_cut;
    }
    eprintln!(
        "{}: {parts} parts, edge cut METIS {} vs random {} (ratio {:.3})",
        dataset.display(),
        cuts[0],
        cuts[1],
        cuts[0] as f64 / cuts[1].max(1) as f64
    );
    (cuts[0], cuts[1])
}

#[test]
fn metis_cuts_far_fewer_edges_than_random_on_a_planted_partition() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = planted_dataset(1600, 8, 0.05, 0.001, 3);
    let input = write(&ds, tmp.path());
    let (metis, random) = metis_and_random_cut(&input, 8, tmp.path());
    assert!(random > 0);
    assert!(
        (metis as f64) < 0.5 * random as f64,
        "METIS cut {metis} is not far below random {random}"
    );
}

/// A `rows × cols` grid (4-neighbour, both directions), ids row-major: low ids are close.
fn grid_dataset(rows: usize, cols: usize) -> Dataset {
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    let id = |r: usize, c: usize| (r * cols + c) as NodeId;
    for r in 0..rows {
        for c in 0..cols {
            if c + 1 < cols {
                src.extend([id(r, c), id(r, c + 1)]);
                dst.extend([id(r, c + 1), id(r, c)]);
            }
            if r + 1 < rows {
                src.extend([id(r, c), id(r + 1, c)]);
                dst.extend([id(r + 1, c), id(r, c)]);
            }
        }
    }
    let mut ds = dataset_from_edges("grid", rows * cols, &src, &dst, 5);
    ds.directed = false;
    ds
}

/// max / mean over parts of the summed weight `w[orig]` of each part's vertices.
fn weighted_imbalance(meta: &PartitionMeta, w: &[i64]) -> f64 {
    let loads: Vec<f64> = (0..meta.num_parts)
        .map(|p| {
            meta.orig_id[meta.offsets[p] as usize..meta.offsets[p + 1] as usize]
                .iter()
                .map(|&o| w[o as usize] as f64)
                .sum()
        })
        .collect();
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    loads.iter().cloned().fold(0.0, f64::max) / mean
}

#[test]
fn pre_sampling_weights_balance_the_weighted_load() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = grid_dataset(40, 50);
    let n = ds.local_nodes();
    let input = write(&ds, tmp.path());
    // The first 4 grid rows are 1000× heavier (two layers: same skew, different scale).
    let heavy: Vec<i64> = (0..n).map(|v| if v < 200 { 1000 } else { 1 }).collect();
    let vertex_weights = Array2::from_shape_fn((n, 2), |(v, c)| heavy[v] * (c as i64 + 1));
    let weights = VertexEdgeWeights {
        vertex_weights,
        edge_weights: vec![1; ds.local_edges() as usize],
        epochs: 10,
    };
    let wpath = tmp.path().join("weights.h5");
    write_weights(&weights, &wpath).unwrap();

    let plain = tmp.path().join("plain");
    partition_dataset(&options(&input, &plain, 4, Method::Metis)).unwrap();
    let weighted = tmp.path().join("weighted");
    let mut opts = options(&input, &weighted, 4, Method::Metis);
    opts.weights = Some(wpath.clone());
    let stats = partition_dataset(&opts).unwrap();
    check_partition(&ds, &weighted, 4);

    let before = weighted_imbalance(&parts::read_meta(&plain).unwrap(), &heavy);
    let after = weighted_imbalance(&parts::read_meta(&weighted).unwrap(), &heavy);
    eprintln!("weighted load max/mean: unweighted METIS {before:.3}, with weights {after:.3}");
    assert!(
        after < before,
        "weights did not improve the weighted balance"
    );
    assert!(
        after < 1.2,
        "weighted METIS left the weighted load at {after:.3}"
    );
    assert_eq!(stats.constraints, ["layer0", "layer1"]);
    assert_eq!(stats.weights, wpath.display().to_string());
    assert!(stats.constraint_imbalance.iter().all(|&i| i < 1.2));
}

/// Run the binary; returns (success, stderr).
fn gnnpar(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn bad_input_fails_clearly_and_leaves_nothing() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(50, 200, 9);
    let input = write(&ds, tmp.path());
    let wrong = VertexEdgeWeights {
        vertex_weights: Array2::ones((49, 2)),
        edge_weights: vec![1; ds.local_edges() as usize],
        epochs: 1,
    };
    let wrong_path = tmp.path().join("wrong.h5");
    write_weights(&wrong, &wrong_path).unwrap();
    let before = listing(tmp.path());
    let out = tmp.path().join("parts");
    let (input_s, out_s, wrong_s) = (
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        wrong_path.to_str().unwrap(),
    );
    let missing = tmp.path().join("missing.h5");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec![missing.to_str().unwrap(), "--parts", "2", "-o", out_s],
            vec!["missing.h5", "does not exist"],
        ),
        (vec![input_s, "--parts", "0", "-o", out_s], vec!["--parts"]),
        (
            vec![input_s, "--parts", "2", "--ufactor", "0", "-o", out_s],
            vec!["--ufactor", "at least 1"],
        ),
        (
            vec![input_s, "--parts", "51", "-o", out_s],
            vec!["--parts 51", "50 vertices"],
        ),
        (
            vec![input_s, "--parts", "2", "--method", "kmeans", "-o", out_s],
            vec!["kmeans", "metis"],
        ),
        (
            vec![input_s, "--parts", "2", "--weights", wrong_s, "-o", out_s],
            vec!["wrong.h5", "vertex_weights", "49", "50"],
        ),
        (
            vec![
                input_s,
                "--parts",
                "2",
                "--method",
                "hash",
                "--weights",
                wrong_s,
                "-o",
                out_s,
            ],
            vec!["--weights applies to --method metis"],
        ),
    ];
    for (args, expected) in cases {
        let (ok, stderr) = gnnpar(&[&["partition"], args.as_slice()].concat());
        assert!(!ok, "{args:?} succeeded");
        for e in expected {
            assert!(
                stderr.contains(e),
                "{args:?}: stderr lacks `{e}`:\n{stderr}"
            );
        }
        assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
        assert!(!out.exists(), "{args:?} left `parts/` behind");
        assert_eq!(
            listing(tmp.path()),
            before,
            "{args:?} left a temporary behind"
        );
    }
    // An existing file that is not a partition directory is never replaced.
    std::fs::write(&out, b"precious").unwrap();
    let (ok, stderr) = gnnpar(&["partition", input_s, "--parts", "2", "-o", out_s]);
    assert!(
        !ok && stderr.contains("not a partition directory"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
}

#[test]
fn command_line_reports_json_stats() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(120, 600, 11);
    let input = write(&ds, tmp.path());
    let out = tmp.path().join("parts");
    let output = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .args([
            "partition",
            input.to_str().unwrap(),
            "--parts",
            "3",
            "--json",
        ])
        .args(["--balance", "vertices,edges", "--seed", "5", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["num_parts"], 3);
    assert_eq!(json["method"], "metis");
    assert_eq!(
        json["constraints"],
        serde_json::json!(["vertices", "edges"])
    );
    let meta = check_partition(&ds, &out, 3);
    assert_eq!(json["edge_cut"], meta.edge_cut);
}

#[test]
fn metis_cuts_far_fewer_edges_than_random_on_tolokers() {
    let _serial = serial();
    let data = std::env::var_os("GNNPAR_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/datasets"))
        });
    let npz = data.join("heterophilous/tolokers.npz");
    if !npz.is_file() {
        gnnpar::util::skip::skipped(
            gnnpar::util::skip::SkipKind::RealData,
            "metis_cuts_far_fewer_edges_than_random_on_tolokers",
            &format!(
                "`{}` not found (set GNNPAR_DATA to the datasets directory)",
                npz.display()
            ),
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("tolokers.h5");
    let output = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .arg("prepare")
        .arg(&npz)
        .arg("-o")
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "gnnpar prepare tolokers.npz failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (metis, random) = metis_and_random_cut(&input, 4, tmp.path());
    assert!(random > 0);
    assert!(
        (metis as f64) < 0.6 * random as f64,
        "Tolokers: METIS cut {metis} is not below 0.6 × random {random}"
    );
}

/// Run the binary with `RUST_LOG=info`; returns (success, stdout, stderr).
fn gnnpar_info_log(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Vertices of every part, from `meta.h5`'s offsets.
fn part_sizes(meta: &PartitionMeta) -> Vec<u64> {
    meta.offsets.windows(2).map(|w| w[1] - w[0]).collect()
}

#[test]
fn as_many_parts_as_vertices_leaves_no_part_empty() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(50, 200, 9);
    let input = write(&ds, tmp.path());
    for method in [Method::Metis, Method::Random, Method::Hash] {
        let out = tmp.path().join(format!("parts-{}", method.name()));
        let (ok, _, stderr) = gnnpar_info_log(&[
            "partition",
            input.to_str().unwrap(),
            "--parts",
            "50",
            "--method",
            method.name(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(
            ok,
            "--parts 50 --method {} failed:\n{stderr}",
            method.name()
        );
        let meta = check_partition(&ds, &out, 50);
        assert_eq!(
            part_sizes(&meta),
            vec![1; 50],
            "--method {}: 50 parts of 50 vertices must hold one each",
            method.name()
        );
        if method == Method::Hash {
            // 50 ids hashed into 50 parts collide: the repair ran and said so.
            assert!(
                stderr.contains("hash left") && stderr.contains("of 50 parts empty"),
                "no warning about the emptied parts:\n{stderr}"
            );
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn metis_with_parts_close_to_the_vertex_count_fills_every_part() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    // A grid (every vertex connected) and a sparse random graph (isolated vertices likely).
    for ds in [grid_dataset(6, 7), random_dataset(40, 30, 13)] {
        let n = ds.local_nodes();
        let input = write(&ds, tmp.path());
        for parts in [n / 2, n - 10, n - 3, n - 1, n] {
            let out = tmp.path().join(format!("{}-{parts}", ds.name));
            let stats = partition_dataset(&options(&input, &out, parts, Method::Metis))
                .unwrap_or_else(|e| panic!("{}: --parts {parts}: {e:#}", ds.name));
            let meta = check_partition(&ds, &out, parts);
            let sizes = part_sizes(&meta);
            assert!(
                sizes.iter().all(|&s| s > 0),
                "{}: --parts {parts} left a part empty: {sizes:?}",
                ds.name
            );
            assert_eq!(stats.part_vertices, sizes);
            assert_eq!(sizes.iter().sum::<u64>(), n as u64);
        }
    }
}

#[test]
fn partition_logs_its_memory_estimate_before_reading() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(120, 600, 11);
    let input = write(&ds, tmp.path());
    // The dataset in memory, by hand: indptr 8 (n + 1), indices 4 m, features 4 n d (d = 3),
    // class labels 8 n, split ids 4 each.
    let (n, m) = (ds.local_nodes() as u64, ds.local_edges());
    let splits = (ds.splits.train.len() + ds.splits.val.len() + ds.splits.test.len()) as u64;
    let dataset = 8 * (n + 1) + 4 * m + 4 * n * 3 + 8 * n + 4 * splits;
    let dataset = format!("dataset {}", gnnpar::partition::memory::human(dataset));
    for method in ["metis", "random"] {
        let out = tmp.path().join(format!("parts-{method}"));
        let (ok, _, stderr) = gnnpar_info_log(&[
            "partition",
            input.to_str().unwrap(),
            "--parts",
            "3",
            "--method",
            method,
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains("memory estimate: about"))
            .unwrap_or_else(|| panic!("--method {method}: no memory estimate line:\n{stderr}"));
        assert!(line.starts_with("[INFO]"), "{line}");
        assert!(line.contains(&dataset), "expected `{dataset}` in: {line}");
        assert!(
            line.contains(" available") || line.contains("memory unknown"),
            "{line}"
        );
        let read_at = stderr.find("read `").expect("the read line");
        assert!(
            stderr.find("memory estimate").unwrap() < read_at,
            "the estimate comes after reading:\n{stderr}"
        );
        if method == "metis" {
            assert!(
                line.contains(&format!("adjncy for at most {} entries", 2 * m))
                    && line.contains("METIS working ~"),
                "{line}"
            );
        } else {
            assert!(!line.contains("METIS"), "{line}");
        }
    }
}

/// METIS' limit with the vendored 32-bit METIS: 2^31 - 1.
const METIS_LIMIT: u64 = (1 << 31) - 1;

/// A dataset header of `num_nodes` vertices and no edges whose `indptr` (num_nodes + 1
/// entries) is a chunked dataset never written: a few KB on disk whatever its length. Reading
/// it would take 8 bytes per vertex; only the header may be read before the refusal.
fn huge_header_only_dataset(path: &Path, num_nodes: u64) {
    let file = hdf5::File::create(path).unwrap();
    let attr = |name: &str, v: u64| {
        file.new_attr::<u64>()
            .create(name)
            .and_then(|a| a.write_scalar(&v))
            .unwrap()
    };
    file.new_attr::<u32>()
        .create("format_version")
        .and_then(|a| a.write_scalar(&format::FORMAT_VERSION))
        .unwrap();
    attr("num_nodes", num_nodes);
    attr("num_edges", 0);
    attr("num_classes", 0);
    file.new_attr::<u8>()
        .create("directed")
        .and_then(|a| a.write_scalar(&0u8))
        .unwrap();
    file.new_dataset::<u64>()
        .chunk(1 << 16)
        .shape(num_nodes as usize + 1)
        .create("indptr")
        .unwrap();
    file.new_dataset::<u32>()
        .shape(0)
        .create("indices")
        .unwrap();
    file.flush().unwrap();
}

#[test]
fn metis_refuses_a_graph_past_its_vertex_limit_before_reading_it() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("huge.h5");
    huge_header_only_dataset(&input, METIS_LIMIT);
    assert!(
        std::fs::metadata(&input).unwrap().len() < 1 << 20,
        "the test file should stay small"
    );
    let out = tmp.path().join("parts");
    let started = std::time::Instant::now();
    // Logging at info (the memory estimate is an INFO line), and under a 4 GiB address-space
    // limit: were the check gone, reading the 16 GiB indptr fails at once instead of filling
    // this machine's memory.
    let output = Command::new("bash")
        .arg("-c")
        .arg("ulimit -v 4194304 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_gnnpar"))
        .args(["partition", input.to_str().unwrap(), "--parts", "2", "-o"])
        .arg(&out)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let (ok, stderr) = (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        !ok,
        "partitioning {METIS_LIMIT} vertices with METIS succeeded"
    );
    for want in [
        format!("the graph has {METIS_LIMIT} vertices"),
        "2^31 - 1 = 2147483647".to_string(),
        "--method random|hash".to_string(),
        "IDXTYPEWIDTH=64".to_string(),
        "huge.h5".to_string(),
    ] {
        assert!(stderr.contains(&want), "lacks `{want}`:\n{stderr}");
    }
    // Refused from the header: before the memory estimate, before reading any array (16 GiB
    // of indptr), so within seconds.
    assert!(
        !stderr.contains("memory estimate") && !stderr.contains("read `"),
        "refused only after reading:\n{stderr}"
    );
    assert!(seconds < 30.0, "took {seconds:.1} s to refuse");
    assert!(!out.exists(), "left `parts/` behind");
}

#[test]
fn metis_refuses_an_adjacency_past_its_limit_before_symmetrising() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(50, 200, 9);
    let input = write(&ds, tmp.path());
    let input_s = input.to_str().unwrap();
    // A graph past 2^31 - 1 adjacency entries has over a billion edges to read: the test hook
    // lowers METIS' limit instead, to this graph's exact symmetrised size.
    let exact = gnnpar::partition::symmetric::count_symmetric_entries(&ds.graph);
    assert!(
        exact > ds.local_nodes() as u64 && 2 * ds.local_edges() > exact,
        "the test needs vertices < exact count < bound: 50, {exact}, {}",
        2 * ds.local_edges()
    );
    let run = |limit: u64, method: &str, out: &str| {
        let out = tmp.path().join(out);
        let output = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
            .args(["partition", input_s, "--parts", "2", "--method", method])
            .arg("-o")
            .arg(&out)
            .env("GNNPAR_TEST_METIS_LIMIT", limit.to_string())
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.success(), stderr, out)
    };
    // At the limit: refused by the check before symmetrising (the vertex count passed): its
    // bound 2m is over the limit, so it counts exactly and refuses, naming the count.
    // (`symmetrize` refuses too, as a backstop after allocating: the INFO line of the early
    // check tells them apart.)
    let (ok, stderr, out) = run(exact, "metis", "at-limit");
    assert!(
        !ok,
        "METIS ran on {exact} entries at a limit of {exact}:\n{stderr}"
    );
    for want in [
        format!(
            "the symmetrised adjacency has at most 2 × {} = {} entries, at or past METIS' \
             limit of {exact}; counting it exactly",
            ds.local_edges(),
            2 * ds.local_edges()
        ),
        format!("the graph has {exact} adjacency entries once symmetrised"),
        format!("fewer than {exact}"),
        "--method random|hash".to_string(),
        "GNNPAR_TEST_METIS_LIMIT lowers".to_string(),
    ] {
        assert!(stderr.contains(&want), "lacks `{want}`:\n{stderr}");
    }
    assert!(
        !stderr.contains("symmetrised adjacency:") && !stderr.contains("METIS k-way"),
        "refused only after symmetrising:\n{stderr}"
    );
    assert!(!out.exists(), "left `at-limit/` behind");
    // One above: METIS partitions it.
    let (ok, stderr, out) = run(exact + 1, "metis", "below-limit");
    assert!(ok, "{stderr}");
    check_partition(&ds, &out, 2);
    // The refusal's advice holds: random and hash have no such limit.
    for method in ["random", "hash"] {
        let (ok, stderr, out) = run(exact, method, method);
        assert!(ok, "--method {method}: {stderr}");
        check_partition(&ds, &out, 2);
    }
}

/// `orig_id` in `meta.h5` must name every vertex once: sampling keys its draws on it and
/// `export` maps rows back through it, so an id out of range or repeated is refused by name.
#[test]
fn a_meta_file_whose_orig_id_is_no_permutation_is_refused() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(40, 120, 3);
    let input = write(&ds, tmp.path());
    let out = tmp.path().join("parts");
    partition_dataset(&options(&input, &out, 2, Method::Random)).unwrap();
    let good = parts::read_meta(&out).unwrap();
    let rewrite = |orig_id: &[u64]| {
        let file = hdf5::File::open_rw(out.join("meta.h5")).unwrap();
        file.unlink("orig_id").unwrap();
        file.new_dataset_builder()
            .with_data(orig_id)
            .create("orig_id")
            .unwrap();
    };
    let mut repeated = good.orig_id.clone();
    repeated[7] = repeated[2];
    rewrite(&repeated);
    let e = format!("{:#}", parts::read_meta(&out).unwrap_err());
    assert!(e.contains("meta.h5"), "{e}");
    assert!(
        e.contains(&format!(
            "`orig_id[7]` = {} is listed twice (also `orig_id[2]`)",
            repeated[2]
        )),
        "{e}"
    );
    let mut outside = good.orig_id.clone();
    outside[5] = 40;
    rewrite(&outside);
    let (ok, stderr) = gnnpar(&["info", out.to_str().unwrap()]);
    assert!(!ok && !stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("`orig_id[5]` = 40 is not a vertex id (the graph has 40 vertices)"),
        "{stderr}"
    );
    rewrite(&good.orig_id);
    assert_eq!(parts::read_meta(&out).unwrap().orig_id, good.orig_id);
}

/// Every part file records its content id and `meta.h5` the ids of its parts and of the
/// source: a part copied in from another partitioning (same vertex range) is refused, and the
/// partition's source id is the content id of the file it was made from.
#[test]
fn a_part_from_another_partitioning_is_refused_by_its_content_id() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let ds = random_dataset(60, 240, 5);
    let input = write(&ds, tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    partition_dataset(&options(&input, &a, 2, Method::Random)).unwrap();
    let mut other = options(&input, &b, 2, Method::Random);
    other.seed = 9;
    partition_dataset(&other).unwrap();
    let identity = parts::read_identity(&a).unwrap();
    assert_eq!(
        identity.source_id,
        format::read_header(&input).unwrap().content_id
    );
    assert_eq!(identity.part_ids.as_ref().map(Vec::len), Some(2));
    let meta = parts::read_meta(&a).unwrap();
    assert!(parts::read_part(&a, &meta, 1).is_ok());
    std::fs::copy(parts::part_path(&b, 1), parts::part_path(&a, 1)).unwrap();
    let e = format!("{:#}", parts::read_part(&a, &meta, 1).unwrap_err());
    assert!(
        e.contains("is not part 1 of the partition") && e.contains("another partitioning"),
        "{e}"
    );
    assert!(parts::read_part(&a, &meta, 0).is_ok());
}
