//! `gnnpar prepare` round trips: source → `dataset.h5` → `format::read_dataset` equals the
//! source read independently, for the real npz datasets, the GitHub MUSAE edge list, an OGB raw
//! directory and small npz / edge-list files built here (stored and deflated zip members).
//!
//! Tests on real data read `GNNPAR_DATA` (default `../shared/datasets` next to the crate) and
//! print `SKIPPED: …` when the files are absent.

use gnnpar::graph::import::npy;
use gnnpar::graph::import::npz::Npz;
use gnnpar::graph::{format, Dataset, Labels, NodeId};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

/// A real dataset file, or `None` after a loud `SKIPPED` line.
fn dataset(rel: &str) -> Option<PathBuf> {
    common::dataset(rel, "prepare")
}

/// Run `gnnpar prepare` with `args`; panic with its stderr when it fails.
fn prepare(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .arg("prepare")
        .args(args)
        .output()
        .expect("run gnnpar");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "gnnpar prepare {args:?} failed:\n{stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Neighbour lists expected from undirected `pairs` in source order: `(u, v)` appends `v` to
/// `u`'s list and `u` to `v`'s (a self-loop once).
fn undirected_lists(n: usize, pairs: &[(NodeId, NodeId)]) -> Vec<Vec<NodeId>> {
    let mut lists = vec![Vec::new(); n];
    for &(u, v) in pairs {
        lists[u as usize].push(v);
        if u != v {
            lists[v as usize].push(u);
        }
    }
    lists
}

fn lists_of(ds: &Dataset) -> Vec<Vec<NodeId>> {
    (0..ds.local_nodes())
        .map(|r| ds.graph.neighbors(r).to_vec())
        .collect()
}

fn mask_row(npz: &mut Npz, key: &str, k: usize, n: usize) -> Vec<NodeId> {
    let all = npz.array(key).unwrap().to_bool().unwrap();
    all[k * n..(k + 1) * n]
        .iter()
        .enumerate()
        .filter(|(_, &m)| m)
        .map(|(i, _)| i as NodeId)
        .collect()
}

/// Expected counts from the datasets README: N, undirected E, F, C.
struct Expect {
    rel: &'static str,
    nodes: usize,
    undirected_edges: usize,
    features: usize,
    classes: usize,
    split: usize,
}

fn check_npz_round_trip(e: Expect) {
    let Some(src) = dataset(e.rel) else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ds.h5");
    let k = e.split.to_string();
    let line = prepare(&[s(&src), "-o", s(&out), "--split", &k]);
    let ds = format::read_dataset(&out).unwrap();

    // The source, read independently of the importer.
    let mut npz = Npz::open(&src).unwrap();
    let feats = npz.array("node_features").unwrap();
    let labels = npz.array("node_labels").unwrap().to_i64().unwrap();
    let edges = npz.array("edges").unwrap();
    let flat = edges.to_i64().unwrap();
    let pairs: Vec<(NodeId, NodeId)> = flat
        .chunks_exact(2)
        .map(|p| (p[0] as NodeId, p[1] as NodeId))
        .collect();

    // README counts.
    assert_eq!(ds.num_nodes as usize, e.nodes, "{}", e.rel);
    assert_eq!(pairs.len(), e.undirected_edges, "{}", e.rel);
    assert_eq!(
        ds.local_edges() as usize,
        2 * e.undirected_edges,
        "{}",
        e.rel
    );
    assert_eq!(ds.feature_dim(), e.features, "{}", e.rel);
    assert_eq!(ds.num_classes, e.classes, "{}", e.rel);
    assert!(!ds.directed);
    assert!(line.contains(&format!("{} nodes", e.nodes)), "{line}");

    // Features, labels.
    assert_eq!(feats.shape, vec![e.nodes, e.features]);
    let f = ds.features.as_ref().unwrap();
    assert_eq!(f.as_slice().unwrap(), feats.to_f32().unwrap().as_slice());
    assert_eq!(ds.labels, Some(Labels::Class(labels)));

    // Every undirected edge both ways, nothing else, in source order.
    assert_eq!(
        lists_of(&ds),
        undirected_lists(e.nodes, &pairs),
        "{}",
        e.rel
    );
    let stored: HashSet<(NodeId, NodeId)> = (0..ds.local_nodes())
        .flat_map(|u| ds.graph.neighbors(u).iter().map(move |&v| (u as NodeId, v)))
        .collect();
    assert_eq!(stored.len(), 2 * e.undirected_edges, "duplicates stored");
    for &(u, v) in &pairs {
        assert!(stored.contains(&(u, v)) && stored.contains(&(v, u)));
    }

    // The chosen split.
    assert_eq!(
        ds.splits.train,
        mask_row(&mut npz, "train_masks", e.split, e.nodes)
    );
    assert_eq!(
        ds.splits.val,
        mask_row(&mut npz, "val_masks", e.split, e.nodes)
    );
    assert_eq!(
        ds.splits.test,
        mask_row(&mut npz, "test_masks", e.split, e.nodes)
    );
    assert!(!ds.splits.train.is_empty());
}

#[test]
fn cora_round_trip() {
    check_npz_round_trip(Expect {
        rel: "planetoid/cora.npz",
        nodes: 2708,
        undirected_edges: 5278,
        features: 1433,
        classes: 7,
        split: 0,
    });
    // The standard split of Kipf & Welling.
    if let Some(src) = dataset("planetoid/cora.npz") {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("cora.h5");
        prepare(&[s(&src), "-o", s(&out)]);
        let ds = format::read_dataset(&out).unwrap();
        let sizes = (
            ds.splits.train.len(),
            ds.splits.val.len(),
            ds.splits.test.len(),
        );
        assert_eq!(sizes, (140, 500, 1000));
        assert_eq!(ds.name, "cora");
    }
}

#[test]
fn minesweeper_round_trip() {
    check_npz_round_trip(Expect {
        rel: "heterophilous/minesweeper.npz",
        nodes: 10_000,
        undirected_edges: 39_402,
        features: 7,
        classes: 2,
        split: 3,
    });
}

#[test]
fn tolokers_round_trip() {
    check_npz_round_trip(Expect {
        rel: "heterophilous/tolokers.npz",
        nodes: 11_758,
        undirected_edges: 519_000,
        features: 10,
        classes: 2,
        split: 9,
    });
}

#[test]
fn facebook_round_trip() {
    check_npz_round_trip(Expect {
        rel: "facebook_page_page/facebook.npz",
        nodes: 22_470,
        undirected_edges: 170_823,
        features: 4714,
        classes: 4,
        split: 1,
    });
}

/// Read a two-integer-column CSV with a header, independently of gnnpar's reader.
fn read_csv_pairs(path: &Path, cols: (usize, usize)) -> Vec<(u32, i64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[cols.0].parse().unwrap(), f[cols.1].parse().unwrap())
        })
        .collect()
}

#[test]
fn github_musae_edge_list_round_trip() {
    let (Some(edges), Some(targets)) = (
        dataset("github_musae/git_edges.csv"),
        dataset("github_musae/git_target.csv"),
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("git.h5");
    prepare(&[
        s(&edges),
        "-o",
        s(&out),
        "--symmetrize",
        "--labels",
        s(&targets),
        "--name",
        "github",
    ]);
    let ds = format::read_dataset(&out).unwrap();
    assert_eq!(ds.name, "github");
    assert_eq!(ds.num_nodes, 37_700);
    assert_eq!(ds.local_edges(), 578_006);
    assert_eq!(ds.num_classes, 2);
    assert!(!ds.directed);
    assert_eq!(ds.feature_dim(), 0);

    let pairs: Vec<(NodeId, NodeId)> = read_csv_pairs(&edges, (0, 1))
        .into_iter()
        .map(|(u, v)| (u, v as NodeId))
        .collect();
    assert_eq!(pairs.len(), 289_003);
    assert_eq!(lists_of(&ds), undirected_lists(37_700, &pairs));

    let mut labels = vec![-1i64; 37_700];
    for (id, label) in read_csv_pairs(&targets, (0, 2)) {
        labels[id as usize] = label;
    }
    assert_eq!(ds.labels, Some(Labels::Class(labels)));
    // A seeded 50/25/25 random split covering every vertex once.
    let mut all: Vec<NodeId> = [&ds.splits.train, &ds.splits.val, &ds.splits.test]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    assert_eq!(ds.splits.train.len(), 18_850);
    all.sort_unstable();
    assert_eq!(all, (0..37_700).collect::<Vec<_>>());

    // Without --symmetrize the edges are directed as written, and the label column can be
    // named; the same seed gives the same split.
    let out2 = tmp.path().join("git-directed.h5");
    prepare(&[
        s(&edges),
        "-o",
        s(&out2),
        "--labels",
        s(&targets),
        "--label-column",
        "ml_target",
    ]);
    let directed = format::read_dataset(&out2).unwrap();
    assert!(directed.directed);
    assert_eq!(directed.local_edges(), 289_003);
    assert_eq!(directed.splits, ds.splits);
    assert_eq!(directed.labels, ds.labels);
}

fn write_gz(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap();
}

/// A small OGB-style raw directory: 6 vertices (vertex 5 isolated, known only from
/// `num-node-list`), directed edges with a repeat, 2 features, 3 classes, one split.
fn ogb_dir(root: &Path) -> PathBuf {
    let dir = root.join("ogbn-tiny");
    let raw = dir.join("raw");
    write_gz(&raw.join("edge.csv.gz"), "0,3\n2,0\n0,1\n4,2\n0,1\n3,4\n");
    write_gz(&raw.join("num-node-list.csv.gz"), "6\n");
    write_gz(
        &raw.join("node-feat.csv.gz"),
        "0.5,1\n-1.25,2\n3,3e-2\n0,0\n1,1\n7,-7\n",
    );
    write_gz(&raw.join("node-label.csv.gz"), "0\n2\n1\n1\n0\n2\n");
    let split = raw.join("split").join("time");
    write_gz(&split.join("train.csv.gz"), "3\n0\n1\n");
    write_gz(&split.join("valid.csv.gz"), "4\n");
    write_gz(&split.join("test.csv.gz"), "5\n2\n");
    dir
}

#[test]
fn ogb_directory_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = ogb_dir(tmp.path());
    let out = tmp.path().join("tiny.h5");
    let line = prepare(&[s(&dir), "-o", s(&out)]);
    assert!(line.contains("6 nodes"), "{line}");
    let ds = format::read_dataset(&out).unwrap();
    assert_eq!(ds.name, "ogbn-tiny");
    assert_eq!(ds.num_nodes, 6);
    assert!(ds.directed);
    // Directed, file order, the repeated edge kept (no --symmetrize).
    assert_eq!(
        lists_of(&ds),
        vec![vec![3, 1, 1], vec![], vec![0], vec![4], vec![2], vec![]]
    );
    let f = ds.features.as_ref().unwrap();
    assert_eq!(f.dim(), (6, 2));
    assert_eq!(f.row(1).to_vec(), vec![-1.25, 2.0]);
    assert_eq!(f.row(2).to_vec(), vec![3.0, 0.03]);
    assert_eq!(ds.labels, Some(Labels::Class(vec![0, 2, 1, 1, 0, 2])));
    assert_eq!(ds.num_classes, 3);
    assert_eq!(ds.splits.train, vec![0, 1, 3]);
    assert_eq!(ds.splits.val, vec![4]);
    assert_eq!(ds.splits.test, vec![2, 5]);

    // --symmetrize: both directions, duplicates gone, first occurrence order; the raw
    // directory itself is accepted too, and --self-loops add gives every vertex one loop.
    let out2 = tmp.path().join("tiny-sym.h5");
    prepare(&[
        s(&dir.join("raw")),
        "-o",
        s(&out2),
        "--format",
        "ogb",
        "--symmetrize",
        "--self-loops",
        "add",
        "--name",
        "sym",
    ]);
    let sym = format::read_dataset(&out2).unwrap();
    assert!(!sym.directed);
    assert_eq!(sym.name, "sym");
    assert_eq!(
        lists_of(&sym),
        vec![
            vec![3, 2, 1, 0],
            vec![0, 1],
            vec![0, 4, 2],
            vec![0, 4, 3],
            vec![2, 3, 4],
            vec![5]
        ]
    );
}

/// Run `gnnpar prepare` with `args`, expecting a clean failure; returns its stderr.
fn prepare_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .arg("prepare")
        .args(args)
        .output()
        .expect("run gnnpar");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "prepare {args:?} should fail");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// An OGB download has `split/` beside `raw/`, not inside it: the split there is read (given
/// the dataset directory or its `raw/`), and a bad split file there is refused.
#[test]
fn ogb_split_beside_raw_as_downloaded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = ogb_dir(tmp.path());
    std::fs::rename(dir.join("raw").join("split"), dir.join("split")).unwrap();
    for (i, input) in [dir.clone(), dir.join("raw")].iter().enumerate() {
        let out = tmp.path().join(format!("sib{i}.h5"));
        prepare(&[s(input), "-o", s(&out), "--format", "ogb"]);
        let ds = format::read_dataset(&out).unwrap();
        assert_eq!(ds.splits.train, vec![0, 1, 3], "{input:?}");
        assert_eq!(ds.splits.val, vec![4], "{input:?}");
        assert_eq!(ds.splits.test, vec![2, 5], "{input:?}");
    }

    let out = tmp.path().join("bad.h5");
    let err = prepare_fails(&[s(&dir), "-o", s(&out), "--split-name", "nope"]);
    assert!(err.contains("nope"), "{err}");
    assert!(err.contains(s(&dir.join("split"))), "{err}");

    write_gz(
        &dir.join("split").join("time").join("valid.csv.gz"),
        "4
6
",
    );
    let err = prepare_fails(&[s(&dir.join("raw")), "-o", s(&out)]);
    assert!(err.contains("valid.csv.gz"), "{err}");
    assert!(err.contains("vertex id 6 is out of range"), "{err}");
    assert!(!out.exists());
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Write an npz of `(key, npy bytes)` members, stored or deflated.
fn write_npz(path: &Path, members: &[(&str, Vec<u8>)], deflate: bool) {
    let file = std::fs::File::create(path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (key, bytes) in members {
        zip.start_file(format!("{key}.npy"), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn small_npz_stored_and_deflated_with_self_loop_policies() {
    let tmp = tempfile::tempdir().unwrap();
    // 4 vertices; a self-loop on 2; u8 features; single-split masks of shape N.
    let members = vec![
        (
            "node_features",
            npy::encode("|u1", &[4, 2], &[1, 0, 0, 1, 1, 1, 0, 0]),
        ),
        (
            "node_labels",
            npy::encode("<i8", &[4], &i64_bytes(&[1, 0, 2, 1])),
        ),
        (
            "edges",
            npy::encode("<i8", &[4, 2], &i64_bytes(&[0, 1, 2, 2, 1, 3, 2, 0])),
        ),
        ("train_masks", npy::encode("|b1", &[4], &[1, 1, 0, 0])),
        ("val_masks", npy::encode("|b1", &[4], &[0, 0, 1, 0])),
        ("test_masks", npy::encode("|b1", &[4], &[0, 0, 0, 1])),
    ];
    for deflate in [false, true] {
        let src = tmp.path().join(format!("t{deflate}.npz"));
        write_npz(&src, &members, deflate);
        let out = tmp.path().join(format!("t{deflate}.h5"));
        prepare(&[s(&src), "-o", s(&out)]);
        let ds = format::read_dataset(&out).unwrap();
        assert_eq!(
            lists_of(&ds),
            vec![vec![1, 2], vec![0, 3], vec![2, 0], vec![1]],
            "deflate={deflate}"
        );
        let f = ds.features.as_ref().unwrap();
        assert_eq!(f.as_slice().unwrap(), &[1., 0., 0., 1., 1., 1., 0., 0.]);
        assert_eq!(ds.num_classes, 3);
        assert_eq!(ds.splits.train, vec![0, 1]);
        assert_eq!(ds.splits.val, vec![2]);
        assert_eq!(ds.splits.test, vec![3]);
    }
    let src = tmp.path().join("ttrue.npz");
    let drop = tmp.path().join("drop.h5");
    prepare(&[s(&src), "-o", s(&drop), "--self-loops", "drop"]);
    let ds = format::read_dataset(&drop).unwrap();
    assert_eq!(
        lists_of(&ds),
        vec![vec![1, 2], vec![0, 3], vec![0], vec![1]]
    );

    // f64 features are converted to f32.
    let f64_members: Vec<(&str, Vec<u8>)> = members
        .iter()
        .map(|(k, v)| {
            if *k == "node_features" {
                let vals: Vec<u8> = [0.5f64, -2.0, 1e-3, 4.0, 0.0, 1.0, 2.0, 3.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                (*k, npy::encode("<f8", &[4, 2], &vals))
            } else {
                (*k, v.clone())
            }
        })
        .collect();
    let src = tmp.path().join("f64.npz");
    write_npz(&src, &f64_members, true);
    let out = tmp.path().join("f64.h5");
    prepare(&[s(&src), "-o", s(&out)]);
    let ds = format::read_dataset(&out).unwrap();
    assert_eq!(
        ds.features.unwrap().as_slice().unwrap(),
        &[0.5, -2.0, 1e-3, 4.0, 0.0, 1.0, 2.0, 3.0]
    );
}

#[test]
fn tsv_edge_list_with_comments_features_and_random_split() {
    let tmp = tempfile::tempdir().unwrap();
    let edges = tmp.path().join("g.tsv");
    std::fs::write(
        &edges,
        "# a comment\nsrc\tdst\tweight\n% another\n3\t1\t0.5\n0\t2\t1\n\n1\t0\t2\n",
    )
    .unwrap();
    let labels = tmp.path().join("labels.csv");
    std::fs::write(&labels, "node,class,extra\n2,1,x\n0,0,y\n1,1,z\n3,0,w\n").unwrap();
    let feats = tmp.path().join("feats.csv");
    // Rows out of id order, one with a header.
    std::fs::write(&feats, "id,a,b\n3,0.3,3\n1,0.1,1\n0,0,0\n2,0.2,2\n").unwrap();
    let out = tmp.path().join("g.h5");
    prepare(&[
        s(&edges),
        "-o",
        s(&out),
        "--labels",
        s(&labels),
        "--label-column",
        "class",
        "--features",
        s(&feats),
        "--train-frac",
        "0.5",
        "--val-frac",
        "0.25",
        "--seed",
        "3",
    ]);
    let ds = format::read_dataset(&out).unwrap();
    assert!(ds.directed);
    assert_eq!(lists_of(&ds), vec![vec![2], vec![0], vec![], vec![1]]);
    assert_eq!(ds.labels, Some(Labels::Class(vec![0, 1, 1, 0])));
    let f = ds.features.unwrap();
    for v in 0..4 {
        assert_eq!(f[[v, 0]], v as f32 / 10.0);
        assert_eq!(f[[v, 1]], v as f32);
    }
    assert_eq!(
        (
            ds.splits.train.len(),
            ds.splits.val.len(),
            ds.splits.test.len()
        ),
        (2, 1, 1)
    );

    // Blank-separated, no header; no labels → no split.
    let plain = tmp.path().join("plain.txt");
    std::fs::write(&plain, "0 1\n1  2\n2 0 \n").unwrap();
    let out = tmp.path().join("plain.h5");
    prepare(&[s(&plain), "-o", s(&out), "--symmetrize"]);
    let ds = format::read_dataset(&out).unwrap();
    assert_eq!(lists_of(&ds), vec![vec![1, 2], vec![0, 2], vec![1, 0]]);
    assert!(ds.labels.is_none() && ds.splits.train.is_empty());
}

/// The big-endian image of little-endian elements of `size` bytes.
fn big_endian(le: &[u8], size: usize) -> Vec<u8> {
    le.chunks_exact(size)
        .flat_map(|c| c.iter().rev().copied())
        .collect()
}

/// The Fortran-order (column-major) image of a C-order `rows` × `cols` matrix of `size`-byte
/// elements.
fn fortran_2d(c: &[u8], size: usize, rows: usize, cols: usize) -> Vec<u8> {
    assert_eq!(c.len(), rows * cols * size);
    let mut out = Vec::with_capacity(c.len());
    for j in 0..cols {
        for i in 0..rows {
            let at = (i * cols + j) * size;
            out.extend_from_slice(&c[at..at + size]);
        }
    }
    out
}

#[test]
fn npz_of_any_dtype_byte_order_and_memory_order_imports_the_same() {
    // 70 vertices (more than one 64-row tile of the Fortran reordering), 5 features whose
    // values f16, f32 and f64 all hold exactly, 4 classes, 150 edges, 2 splits.
    let (n, f, e, splits) = (70usize, 5usize, 150usize, 2usize);
    let feats: Vec<f32> = (0..n * f)
        .map(|i| ((i * 7 + i / f * 3) % 17) as f32 * 0.5 - 2.0)
        .collect();
    let labels: Vec<i64> = (0..n as i64).map(|v| (v * 5 + 1) % 4).collect();
    // Distinct undirected pairs (v, v + 1), (v, v + 4), (v, v + 7) modulo n.
    let edges: Vec<i64> = (0..e as i64)
        .flat_map(|k| {
            let u = k % n as i64;
            [u, (u + 1 + 3 * (k / n as i64)) % n as i64]
        })
        .collect();
    // Split s: train v % 3 == s, val v % 3 == 2, test the rest.
    let mask = |pick: &dyn Fn(usize, usize) -> bool| -> Vec<u8> {
        (0..splits)
            .flat_map(|s| (0..n).map(move |v| (s, v)))
            .map(|(s, v)| u8::from(pick(s, v)))
            .collect()
    };
    let train = mask(&|s, v| v % 3 == s);
    let val = mask(&|_, v| v % 3 == 2);
    let test = mask(&|s, v| v % 3 != s && v % 3 != 2);
    let le =
        |v: &[i64], f: fn(i64) -> Vec<u8>| -> Vec<u8> { v.iter().flat_map(|&x| f(x)).collect() };

    let plain = vec![
        (
            "node_features",
            npy::encode(
                "<f4",
                &[n, f],
                &feats
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<_>>(),
            ),
        ),
        ("node_labels", npy::encode("<i8", &[n], &i64_bytes(&labels))),
        ("edges", npy::encode("<i8", &[e, 2], &i64_bytes(&edges))),
        ("train_masks", npy::encode("|b1", &[splits, n], &train)),
        ("val_masks", npy::encode("|b1", &[splits, n], &val)),
        ("test_masks", npy::encode("|b1", &[splits, n], &test)),
    ];
    let f64_le: Vec<u8> = feats
        .iter()
        .flat_map(|&x| f64::from(x).to_le_bytes())
        .collect();
    // Big-endian float64 features and uint16 edges in Fortran order, int32 labels, uint8
    // masks (one of them Fortran order too).
    let variant_a = vec![
        (
            "node_features",
            npy::encode_with(
                ">f8",
                true,
                &[n, f],
                &fortran_2d(&big_endian(&f64_le, 8), 8, n, f),
            ),
        ),
        (
            "node_labels",
            npy::encode(
                "<i4",
                &[n],
                &le(&labels, |x| (x as i32).to_le_bytes().to_vec()),
            ),
        ),
        (
            "edges",
            npy::encode_with(
                ">u2",
                true,
                &[e, 2],
                &fortran_2d(&le(&edges, |x| (x as u16).to_be_bytes().to_vec()), 2, e, 2),
            ),
        ),
        ("train_masks", npy::encode("|u1", &[splits, n], &train)),
        ("val_masks", npy::encode("|u1", &[splits, n], &val)),
        (
            "test_masks",
            npy::encode_with("|u1", true, &[splits, n], &fortran_2d(&test, 1, splits, n)),
        ),
    ];
    // Half-precision features, uint8 labels, int32 Fortran-order edges, masks in native
    // order spelled `=`.
    let f16_le: Vec<u8> = feats
        .iter()
        .flat_map(|&x| f16_bits(x).to_le_bytes())
        .collect();
    let variant_b = vec![
        ("node_features", npy::encode("<f2", &[n, f], &f16_le)),
        (
            "node_labels",
            npy::encode("|u1", &[n], &le(&labels, |x| vec![x as u8])),
        ),
        (
            "edges",
            npy::encode_with(
                "<i4",
                true,
                &[e, 2],
                &fortran_2d(&le(&edges, |x| (x as i32).to_le_bytes().to_vec()), 4, e, 2),
            ),
        ),
        ("train_masks", npy::encode("=u1", &[splits, n], &train)),
        ("val_masks", npy::encode("=u1", &[splits, n], &val)),
        ("test_masks", npy::encode("=u1", &[splits, n], &test)),
    ];

    let tmp = tempfile::tempdir().unwrap();
    let import = |tag: &str, members: &[(&str, Vec<u8>)]| {
        let src = tmp.path().join(format!("{tag}.npz"));
        write_npz(&src, members, true);
        let out = tmp.path().join(format!("{tag}.h5"));
        prepare(&[s(&src), "-o", s(&out), "--split", "1", "--name", "same"]);
        format::read_dataset(&out).unwrap()
    };
    let want = import("plain", &plain);
    // The plain import is the data above, so that the comparisons below mean something.
    assert_eq!(
        want.features.as_ref().unwrap().as_slice().unwrap(),
        &feats[..]
    );
    assert_eq!(want.labels, Some(Labels::Class(labels.clone())));
    let pairs: Vec<(NodeId, NodeId)> = edges
        .chunks_exact(2)
        .map(|p| (p[0] as NodeId, p[1] as NodeId))
        .collect();
    assert_eq!(lists_of(&want), undirected_lists(n, &pairs));
    let ids = |m: &[u8]| -> Vec<NodeId> {
        (0..n)
            .filter(|&v| m[n + v] != 0)
            .map(|v| v as NodeId)
            .collect()
    };
    assert_eq!(want.splits.train, ids(&train));
    assert_eq!(want.splits.val, ids(&val));
    assert_eq!(want.splits.test, ids(&test));
    assert_eq!(want.num_classes, 4);

    for (tag, members) in [("a", variant_a), ("b", variant_b)] {
        let got = import(tag, &members);
        assert_eq!(got.features, want.features, "variant {tag}: features");
        assert_eq!(got.labels, want.labels, "variant {tag}: labels");
        assert_eq!(lists_of(&got), lists_of(&want), "variant {tag}: edges");
        assert_eq!(got.splits, want.splits, "variant {tag}: splits");
        assert_eq!(got, want, "variant {tag}");
    }
}

/// The half-precision bits of `x`, which must be a normal f16 value with at most 10 mantissa
/// bits (or zero).
fn f16_bits(x: f32) -> u16 {
    if x == 0.0 {
        return if x.is_sign_negative() { 0x8000 } else { 0 };
    }
    let b = x.to_bits();
    let sign = (b >> 16) & 0x8000;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    assert!(
        (1..31).contains(&exp) && b & 0x1fff == 0,
        "{x} is not an f16"
    );
    (sign | (exp as u32) << 10 | (b >> 13) & 0x3ff) as u16
}
