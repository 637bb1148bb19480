//! `gnnpar export --format metis`: the exact text of a tiny graph, the refusal of a directed
//! graph without `--symmetrize` (leaving no file), and `gpmetis` reading what we write.

use gnnpar::graph::{format, Csr, Dataset, Labels, NodeId, Splits};
use ndarray::Array2;
use std::path::Path;
use std::process::{Command, Output};

/// A labelled dataset over `n` vertices with the given stored edges.
fn dataset(n: usize, src: &[NodeId], dst: &[NodeId], directed: bool) -> Dataset {
    Dataset {
        name: "tiny".into(),
        num_nodes: n as u64,
        first_node: 0,
        graph: Csr::from_edges(n, src, dst),
        features: Some(Array2::from_shape_fn((n, 2), |(v, j)| (v + j) as f32)),
        labels: Some(Labels::Class((0..n as i64).map(|v| v % 2).collect())),
        num_classes: 2,
        splits: Splits {
            train: (0..n as NodeId).collect(),
            ..Splits::default()
        },
        directed,
    }
}

fn gnnpar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gnnpar"))
        .args(args)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .output()
        .expect("run gnnpar")
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Triangle 0-1-2 stored both ways, pendant 3 on 2, isolated 4, plus a self-loop on 1 and a
/// repeated 0→1: METIS' format allows neither, so both must vanish from the file.
fn tiny_undirected() -> Dataset {
    let src = [0, 1, 1, 2, 0, 2, 2, 3, 1, 0];
    let dst = [1, 0, 2, 1, 2, 0, 3, 2, 1, 1];
    dataset(5, &src, &dst, false)
}

#[test]
fn tiny_graph_in_metis_text_format() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tiny.h5");
    let output = dir.path().join("tiny.metis");
    format::write_dataset(&tiny_undirected(), &input).unwrap();
    let out = gnnpar(&[
        "export",
        path_str(&input),
        "--format",
        "metis",
        "-o",
        path_str(&output),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&output).unwrap();
    assert_eq!(text, "5 4\n2 3\n1 3\n1 2 4\n3\n\n");
    // The last stdout line is the machine-readable report.
    let stdout = String::from_utf8(out.stdout).unwrap();
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["export"]["vertices"], 5);
    assert_eq!(report["export"]["edges"], 4);
    assert_eq!(report["export"]["bytes"], text.len() as u64);
}

#[test]
fn directed_graph_needs_symmetrize_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("directed.h5");
    let output = dir.path().join("directed.metis");
    format::write_dataset(&dataset(3, &[0, 1], &[1, 2], true), &input).unwrap();
    let out = gnnpar(&["export", path_str(&input), "-o", path_str(&output)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("directed.h5") && err.contains("--symmetrize"),
        "{err}"
    );
    assert!(!output.exists());
    // Nothing else (no temporary) is left in the directory either.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("directed.h5")]);

    let out = gnnpar(&[
        "export",
        path_str(&input),
        "--symmetrize",
        "-o",
        path_str(&output),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&output).unwrap(),
        "3 2\n2\n1 3\n2\n"
    );
}

#[test]
fn missing_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("x.metis");
    let missing = dir.path().join("missing.h5");
    let out = gnnpar(&["export", path_str(&missing), "-o", path_str(&output)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.h5"));
    assert!(!output.exists());
}

/// `gpmetis` (Debian package `metis`) must read the file and partition it; skipped loudly
/// where it is not installed.
#[test]
fn gpmetis_reads_the_export() {
    if Command::new("gpmetis").arg("-help").output().is_err() {
        gnnpar::util::skip::skipped(
            gnnpar::util::skip::SkipKind::Other,
            "gpmetis_reads_the_export",
            "gpmetis not installed (Debian package `metis`)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ring.h5");
    let output = dir.path().join("ring.metis");
    // Two rings of 50 joined by one edge: 2 parts should cut only that edge.
    let n = 100u32;
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    let mut both = |a: u32, b: u32| {
        src.extend([a, b]);
        dst.extend([b, a]);
    };
    for v in 0..50 {
        both(v, (v + 1) % 50);
        both(50 + v, 50 + (v + 1) % 50);
    }
    both(0, 50);
    format::write_dataset(&dataset(n as usize, &src, &dst, false), &input).unwrap();
    let out = gnnpar(&["export", path_str(&input), "-o", path_str(&output)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new("gpmetis")
        .arg("-seed=0")
        .arg(&output)
        .arg("2")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "gpmetis failed: {text}");
    assert!(text.contains("#Vertices: 100, #Edges: 101"), "{text}");
    assert!(text.contains("Edgecut: 1,"), "{text}");
    let parts = std::fs::read_to_string(dir.path().join("ring.metis.part.2")).unwrap();
    assert_eq!(parts.lines().count(), 100);
}

/// An npz export that fails part way (here a file-size limit, as a full disk would) says so
/// once, in gnnpar's error line, leaves no file, and does not add the zip writer's own raw
/// error from its `Drop`.
#[test]
fn a_failed_npz_write_is_one_clear_error_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("g.h5");
    let n = 20_000;
    let src: Vec<NodeId> = (0..n as NodeId).collect();
    let dst: Vec<NodeId> = (0..n as NodeId).map(|v| (v + 1) % n as NodeId).collect();
    format::write_dataset(&dataset(n, &src, &dst, true), &input).unwrap();
    let output = dir.path().join("g.npz");
    // 64 KiB: the archive (about 0.6 MB) cannot fit.
    let out = Command::new("bash")
        .arg("-c")
        .arg("ulimit -f 64 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_gnnpar"))
        .args(["export", path_str(&input), "--format", "npz", "-o"])
        .arg(&output)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("File too large"), "{stderr}");
    assert!(!stderr.contains("ZipWriter"), "{stderr}");
    assert_eq!(stderr.matches("File too large").count(), 1, "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "g.h5")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
