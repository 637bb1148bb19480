//! Synthetic generators: determinism (seed, thread count), structure (symmetric, sorted, no
//! self-loops or duplicates), edge counts, SBM homophily and class signal, R-MAT heavy tails,
//! HDF5 round trip, and the `gnnpar generate` command with bad options.

use gnnpar::graph::format::{read_dataset, read_dataset_columns, write_dataset};
use gnnpar::graph::generate::{self, rmat, sbm, CommonParams, Generated, RmatParams, SbmParams};
use gnnpar::graph::{Dataset, Labels};
use ndarray::Array2;
use std::path::Path;
use std::process::Command;

fn common(nodes: u64, edges: u64, seed: u64) -> CommonParams {
    CommonParams::new("test", nodes, edges, seed)
}

fn sbm_params(nodes: u64, edges: u64, seed: u64) -> SbmParams {
    SbmParams::new(common(nodes, edges, seed))
}

fn rmat_params(nodes: u64, edges: u64, seed: u64) -> RmatParams {
    RmatParams::new(common(nodes, edges, seed))
}

fn class_labels(ds: &Dataset) -> &[i64] {
    match ds.labels.as_ref().expect("generated graphs are labelled") {
        Labels::Class(l) => l,
        Labels::Multi(_) => panic!("generated graphs have one class per vertex"),
    }
}

/// Symmetric, rows sorted strictly (so no duplicates), no self-loops, valid ids.
fn assert_simple_undirected(ds: &Dataset) {
    assert!(!ds.directed);
    ds.graph.validate(ds.num_nodes, "generated").unwrap();
    let g = &ds.graph;
    for v in 0..g.num_rows() {
        let row = g.neighbors(v);
        assert!(
            row.windows(2).all(|w| w[0] < w[1]),
            "row {v} is not strictly increasing: {row:?}"
        );
        for &u in row {
            assert_ne!(u as usize, v, "self-loop at {v}");
            assert!(
                g.neighbors(u as usize).binary_search(&(v as u32)).is_ok(),
                "edge {v}→{u} has no reverse"
            );
        }
    }
}

#[test]
fn same_seed_same_graph_other_seed_other_graph() {
    let a = sbm(&sbm_params(3000, 40_000, 7)).unwrap();
    let b = sbm(&sbm_params(3000, 40_000, 7)).unwrap();
    let c = sbm(&sbm_params(3000, 40_000, 8)).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.graph, c.graph);
    assert_ne!(a.labels, c.labels);
    assert_ne!(a.features, c.features);
    assert_ne!(a.splits, c.splits);

    let a = rmat(&rmat_params(4096, 40_000, 7)).unwrap();
    let b = rmat(&rmat_params(4096, 40_000, 7)).unwrap();
    let c = rmat(&rmat_params(4096, 40_000, 8)).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.graph, c.graph);
}

#[test]
fn output_does_not_depend_on_the_thread_count() {
    let run = |threads: usize| -> (Generated, Generated) {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            // More than one chunk of pairs and more than one block of rows.
            (
                generate::sbm::generate(&sbm_params(9000, 300_000, 3)).unwrap(),
                generate::rmat::generate(&rmat_params(9000, 300_000, 3)).unwrap(),
            )
        })
    };
    let one = run(1);
    let three = run(3);
    assert_eq!(one.0, three.0);
    assert_eq!(one.1, three.1);
}

#[test]
fn graphs_are_simple_symmetric_and_sorted() {
    assert_simple_undirected(&sbm(&sbm_params(2000, 60_000, 1)).unwrap());
    assert_simple_undirected(&rmat(&rmat_params(3000, 60_000, 1)).unwrap());
    // A dense SBM where many pairs repeat.
    assert_simple_undirected(&sbm(&sbm_params(60, 3000, 1)).unwrap());
}

#[test]
fn sbm_edge_count_close_to_requested_and_stats_add_up() {
    let g = generate::sbm::generate(&sbm_params(10_000, 200_000, 2)).unwrap();
    let m = g.dataset.local_edges();
    assert!(m <= 200_000);
    assert!(m as f64 >= 0.98 * 200_000.0, "only {m} of 200000 edges");
    let s = g.stats;
    assert_eq!(s.pairs_drawn, 100_000);
    assert_eq!(
        m + s.duplicates_dropped,
        2 * (s.pairs_drawn - s.self_loops_dropped)
    );
    // An odd request draws (M − 1) / 2 pairs.
    let g = generate::sbm::generate(&sbm_params(1000, 2001, 2)).unwrap();
    assert_eq!(g.stats.pairs_drawn, 1000);
}

#[test]
fn rmat_edge_count_within_a_tenth_of_requested() {
    // R-MAT's hubs attract repeated pairs: a few percent to ~10% are duplicates.
    let g = generate::rmat::generate(&rmat_params(1 << 14, 200_000, 4)).unwrap();
    let m = g.dataset.local_edges();
    assert!(
        m as f64 >= 0.88 * 200_000.0,
        "only {m} of 200000 edges: {:?}",
        g.stats
    );
}

/// Fraction of stored edges whose ends share a label.
fn edge_homophily(ds: &Dataset) -> f64 {
    let labels = class_labels(ds);
    let mut same = 0u64;
    for v in 0..ds.local_nodes() {
        same += ds
            .graph
            .neighbors(v)
            .iter()
            .filter(|&&u| labels[u as usize] == labels[v])
            .count() as u64;
    }
    same as f64 / ds.local_edges() as f64
}

#[test]
fn sbm_homophily_matches_the_option() {
    for h in [0.8, 0.3, 1.0] {
        let mut p = sbm_params(8000, 160_000, 5);
        p.homophily = h;
        let got = edge_homophily(&sbm(&p).unwrap());
        assert!((got - h).abs() < 0.02, "homophily {h}: measured {got}");
    }
}

#[test]
fn labels_balanced_and_splits_exact() {
    let ds = sbm(&sbm_params(1003, 10_000, 6)).unwrap();
    let mut sizes = [0usize; 8];
    for &l in class_labels(&ds) {
        sizes[l as usize] += 1;
    }
    assert!(
        sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
        "{sizes:?}"
    );
    let s = &ds.splits;
    assert_eq!((s.train.len(), s.val.len(), s.test.len()), (502, 251, 250));
    let mut all: Vec<u32> = s
        .train
        .iter()
        .chain(&s.val)
        .chain(&s.test)
        .copied()
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..1003).collect::<Vec<u32>>());
}

#[test]
fn rmat_degrees_are_heavy_tailed_and_ids_scrambled() {
    let n = 1u64 << 16;
    let ds = rmat(&rmat_params(n, 16 * n, 9)).unwrap();
    let g = &ds.graph;
    let degrees: Vec<usize> = (0..g.num_rows()).map(|v| g.degree(v)).collect();
    let mean = ds.local_edges() as f64 / n as f64;
    let max = *degrees.iter().max().unwrap();
    assert!(max as f64 > 20.0 * mean, "max degree {max}, mean {mean:.1}");
    // The SBM of the same size has no such tail.
    let flat = sbm(&sbm_params(n, 16 * n, 9)).unwrap();
    let flat_max = (0..flat.local_nodes())
        .map(|v| flat.graph.degree(v))
        .max()
        .unwrap();
    assert!((flat_max as f64) < 3.0 * mean, "SBM max degree {flat_max}");
    // Without scrambling, R-MAT's hubs are the smallest ids; with it, the 100 largest degrees
    // are spread over the id range.
    let mut by_degree: Vec<usize> = (0..n as usize).collect();
    by_degree.sort_by_key(|&v| std::cmp::Reverse(degrees[v]));
    let upper_half = by_degree[..100]
        .iter()
        .filter(|&&v| v as u64 >= n / 2)
        .count();
    assert!(
        (25..=75).contains(&upper_half),
        "{upper_half} of the top 100 in the upper half"
    );
}

/// Accuracy on the test split of a nearest-centroid classifier whose class means come from the
/// training split (a linear model in disguise).
fn nearest_centroid_accuracy(x: &Array2<f32>, ds: &Dataset) -> f64 {
    let labels = class_labels(ds);
    let (c, d) = (ds.num_classes, x.ncols());
    let mut means = Array2::<f64>::zeros((c, d));
    let mut counts = vec![0f64; c];
    for &v in &ds.splits.train {
        let k = labels[v as usize] as usize;
        counts[k] += 1.0;
        for j in 0..d {
            means[[k, j]] += x[[v as usize, j]] as f64;
        }
    }
    for k in 0..c {
        for j in 0..d {
            means[[k, j]] /= counts[k];
        }
    }
    let correct = ds
        .splits
        .test
        .iter()
        .filter(|&&v| {
            let row = x.row(v as usize);
            let best = (0..c)
                .min_by(|&a, &b| {
                    let dist = |k: usize| -> f64 {
                        row.iter()
                            .zip(means.row(k))
                            .map(|(&x, &m)| (x as f64 - m).powi(2))
                            .sum()
                    };
                    dist(a).total_cmp(&dist(b))
                })
                .unwrap();
            best as i64 == labels[v as usize]
        })
        .count();
    correct as f64 / ds.splits.test.len() as f64
}

/// Mean of each vertex's own row and its neighbours' rows (one mean-aggregation step).
fn neighbour_mean(x: &Array2<f32>, ds: &Dataset) -> Array2<f32> {
    let mut out = x.clone();
    for v in 0..ds.local_nodes() {
        let nbrs = ds.graph.neighbors(v);
        let mut row = x.row(v).to_owned();
        for &u in nbrs {
            row += &x.row(u as usize);
        }
        row /= (nbrs.len() + 1) as f32;
        out.row_mut(v).assign(&row);
    }
    out
}

#[test]
fn sbm_features_need_the_graph() {
    let mut p = sbm_params(10_000, 200_000, 11);
    p.common.features = 16;
    p.common.classes = 8;
    let ds = sbm(&p).unwrap();
    let x = ds.features.as_ref().unwrap();
    let raw = nearest_centroid_accuracy(x, &ds);
    let one_hop = nearest_centroid_accuracy(&neighbour_mean(x, &ds), &ds);
    eprintln!("nearest centroid: raw features {raw:.3}, neighbour-averaged {one_hop:.3}");
    assert!((0.40..=0.75).contains(&raw), "raw accuracy {raw}");
    assert!(one_hop >= 0.85, "neighbour-averaged accuracy {one_hop}");
    assert!(one_hop >= raw + 0.15, "raw {raw}, averaged {one_hop}");
}

#[test]
fn synthetic_default_has_the_documented_shape() {
    let ds = generate::synthetic_default(0);
    assert_eq!(ds.num_nodes, 20_000);
    assert!(
        (396_000..=400_000).contains(&ds.local_edges()),
        "{}",
        ds.local_edges()
    );
    assert_eq!(ds.feature_dim(), 32);
    assert_eq!(ds.num_classes, 8);
    assert_eq!(ds.splits.train.len(), 10_000);
    assert_eq!(ds, generate::synthetic_default(0));
    assert_ne!(ds.graph, generate::synthetic_default(1).graph);
}

#[test]
fn round_trip_through_hdf5() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ds) in [
        ("sbm.h5", sbm(&sbm_params(1500, 20_000, 12)).unwrap()),
        ("rmat.h5", rmat(&rmat_params(1500, 20_000, 12)).unwrap()),
    ] {
        let path = dir.path().join(name);
        write_dataset(&ds, &path).unwrap();
        assert_eq!(read_dataset(&path).unwrap(), ds, "{name}");
    }
}

#[test]
fn a_column_slice_reads_the_columns_and_everything_else() {
    let dir = tempfile::tempdir().unwrap();
    let ds = sbm(&sbm_params(600, 6000, 21)).unwrap();
    let path = dir.path().join("sbm.h5");
    write_dataset(&ds, &path).unwrap();
    let full = ds.features.as_ref().unwrap();
    let dim = full.ncols();
    for cols in [0..dim, 0..3, 3..dim, dim / 2..dim / 2 + 1, 5..5] {
        let part = read_dataset_columns(&path, cols.clone()).unwrap();
        let f = part.features.as_ref().unwrap();
        assert_eq!(f.dim(), (full.nrows(), cols.len()), "{cols:?}");
        assert_eq!(
            f.view(),
            full.slice(ndarray::s![.., cols.clone()]),
            "{cols:?}"
        );
        let mut rest = part.clone();
        rest.features = ds.features.clone();
        assert_eq!(rest, ds, "{cols:?}: the rest of the dataset");
    }
    let err = read_dataset_columns(&path, 2..dim + 1).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("sbm.h5") && msg.contains("`features`"),
        "{msg}"
    );
}

#[test]
fn bad_parameters_name_the_option() {
    let check = |err: anyhow::Error, option: &str| {
        let msg = format!("{err:#}");
        assert!(msg.contains(option), "`{msg}` does not name {option}");
    };
    let with = |f: &dyn Fn(&mut CommonParams)| {
        let mut p = sbm_params(100, 1000, 0);
        f(&mut p.common);
        sbm(&p).unwrap_err()
    };
    check(with(&|c| c.nodes = 0), "--nodes");
    check(with(&|c| c.nodes = 1 << 32), "--nodes");
    check(with(&|c| c.edges = 100 * 99 + 2), "--edges");
    check(with(&|c| c.features = 0), "--features");
    check(with(&|c| c.classes = 0), "--classes");
    check(with(&|c| c.classes = 101), "--classes");
    check(with(&|c| c.noise = f64::NAN), "--noise");
    check(with(&|c| c.train_frac = 0.0), "--train-frac");
    check(with(&|c| c.val_frac = 0.6), "--val-frac");
    check(with(&|c| c.train_frac = 0.001), "--train-frac");

    let mut p = sbm_params(100, 1000, 0);
    p.homophily = 1.5;
    check(sbm(&p).unwrap_err(), "--homophily");
    let mut p = rmat_params(100, 1000, 0);
    p.abcd = [0.5, 0.2, 0.2, 0.2];
    check(rmat(&p).unwrap_err(), "--abcd");
    p.abcd = [0.1, 0.3, 0.3, 0.3];
    check(rmat(&p).unwrap_err(), "--abcd");
    p.abcd = [1.2, -0.2, 0.0, 0.0];
    check(rmat(&p).unwrap_err(), "--abcd");
}

fn gnnpar(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("gnnpar runs")
}

fn generate_file(model: &str, seed: &str, path: &Path) -> serde_json::Value {
    let out = gnnpar(&[
        "generate",
        model,
        "--nodes",
        "3000",
        "--edges",
        "30000",
        "--features",
        "8",
        "--classes",
        "4",
        "--seed",
        seed,
        "--name",
        "same",
        "-o",
        path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("a JSON summary line");
    serde_json::from_str(last).expect("the last line is JSON")
}

#[test]
fn command_writes_identical_files_for_a_seed_and_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    for model in ["sbm", "rmat"] {
        let (a, b, c) = (
            dir.path().join(format!("{model}-a.h5")),
            dir.path().join(format!("{model}-b.h5")),
            dir.path().join(format!("{model}-c.h5")),
        );
        let report = generate_file(model, "5", &a);
        generate_file(model, "5", &b);
        generate_file(model, "6", &c);
        let bytes = |p: &Path| std::fs::read(p).unwrap();
        assert!(
            bytes(&a) == bytes(&b),
            "{model}: same seed, different files"
        );
        assert!(
            bytes(&a) != bytes(&c),
            "{model}: different seeds, same file"
        );

        let r = &report["generate"];
        assert_eq!(r["model"], model);
        assert_eq!(r["edges_requested"], 30_000);
        let ds = read_dataset(&a).unwrap();
        assert_eq!(r["summary"]["edges"], ds.local_edges());
        assert_eq!(ds.num_nodes, 3000);
        assert!(r["seconds"].as_f64().unwrap() >= 0.0);
        assert!(r["peak_rss_mb"].as_f64().unwrap() > 0.0);
        // Only the final file is left: no temporaries.
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(names.is_empty(), "temporaries left: {names:?}");
}

#[test]
fn command_rejects_bad_options_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("bad.h5");
    let out = out_path.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["sbm", "--nodes", "0"], "--nodes"),
        (&["sbm", "--nodes", "-3"], "--nodes"),
        (&["sbm", "--nodes", "4294967296"], "--nodes"),
        (&["sbm", "--edges", "-10"], "--edges"),
        (&["sbm", "--features", "0"], "--features"),
        (
            &["rmat", "--nodes", "4000000000", "--features", "512"],
            "memory",
        ),
        (&["sbm", "--classes", "0"], "--classes"),
        (
            &["sbm", "--nodes", "5", "--classes", "6", "--edges", "10"],
            "--classes",
        ),
        (&["sbm", "--homophily", "-0.1"], "--homophily"),
        (&["sbm", "--noise", "-1"], "--noise"),
        (
            &["sbm", "--train-frac", "0.8", "--val-frac", "0.3"],
            "--train-frac",
        ),
        (&["rmat", "--abcd", "0.5,0.3,0.3,0.1"], "--abcd"),
        (&["rmat", "--abcd", "0.5,0.5"], "--abcd"),
        (&["rmat", "--abcd", "0.5,0.2,zero,0.3"], "--abcd"),
    ];
    for (args, option) in cases {
        let mut full = vec!["generate"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", out]);
        let o = gnnpar(&full);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            stderr.contains(option),
            "{args:?}: `{stderr}` does not name {option}"
        );
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        assert!(!out_path.exists(), "{args:?} left an output file");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let o = gnnpar(&["generate", "sbm", "-o", "/nonexistent-dir/x.h5"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent-dir"));
}
