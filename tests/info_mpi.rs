//! `mpirun -np P gnnpar info parts/`: every rank opens only its own part and reports it; a rank
//! count different from the number of parts is a clear error, and so is a single dataset file
//! under a launcher (naming the launcher in use).

use gnnpar::graph::parts;
use gnnpar::graph::{format, Csr, Dataset, NodeId, Splits};
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

mod common;

/// Longest an `mpirun` may take before it is killed and the test fails.
const MPI_TIMEOUT: Duration = Duration::from_secs(60);

/// One test at a time: HDF5 keeps `flock`s on descriptors without close-on-exec, so a child
/// spawned by one test could inherit (and keep locked) a file another test is writing.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A ring with chords over `n` vertices, every tenth vertex a training vertex.
fn small_dataset(n: usize) -> Dataset {
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    for v in 0..n as NodeId {
        for step in [1, 7] {
            src.push(v);
            dst.push((v + step) % n as NodeId);
        }
    }
    Dataset {
        name: "ring".into(),
        num_nodes: n as u64,
        first_node: 0,
        graph: Csr::from_edges(n, &src, &dst),
        features: None,
        labels: None,
        num_classes: 0,
        splits: Splits {
            train: (0..n as NodeId).step_by(10).collect(),
            ..Default::default()
        },
        directed: true,
    }
}

/// `cmd`'s success, stdout and stderr (through the shared runner, which kills it after
/// `timeout`).
fn run_with_timeout(cmd: Command, timeout: Duration) -> (bool, String, String) {
    let out = common::run_with_timeout(cmd, timeout);
    (out.success, out.stdout, out.stderr)
}

fn mpirun_info(ranks: usize, dir: &Path) -> (bool, String, String) {
    let mut cmd = common::mpirun();
    cmd.args(["--oversubscribe", "-np", &ranks.to_string()])
        .arg(env!("CARGO_BIN_EXE_gnnpar"))
        .args(["info", "--json"])
        .arg(dir);
    run_with_timeout(cmd, MPI_TIMEOUT)
}

fn partition(input: &Path, parts: usize, out: &Path) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gnnpar"));
    cmd.arg("partition")
        .arg(input)
        .args(["--parts", &parts.to_string(), "-o"])
        .arg(out);
    let (ok, _, stderr) = run_with_timeout(cmd, MPI_TIMEOUT);
    assert!(ok, "partition into {parts} failed:\n{stderr}");
}

#[test]
fn every_rank_reports_its_own_part() {
    let _serial = serial();
    if !common::have_mpirun("tests/info_mpi.rs") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ds = small_dataset(200);
    let input = tmp.path().join("ring.h5");
    format::write_dataset(&ds, &input).unwrap();
    for p in [2, 4] {
        let dir = tmp.path().join(format!("parts{p}"));
        partition(&input, p, &dir);
        let meta = parts::read_meta(&dir).unwrap();
        let (ok, stdout, stderr) = mpirun_info(p, &dir);
        assert!(ok, "mpirun -np {p} info failed:\n{stdout}\n{stderr}");
        let lines: Vec<serde_json::Value> = stdout
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .map(|l| serde_json::from_str(l).expect("info --json printed a bad line"))
            .collect();
        assert_eq!(lines.len(), p, "expected one line per part:\n{stdout}");
        let mut edges = 0;
        for q in 0..p {
            let line = lines
                .iter()
                .find(|l| l["part"] == q)
                .unwrap_or_else(|| panic!("no line for part {q}:\n{stdout}"));
            // Under mpirun, rank q opens part q and nothing else.
            assert_eq!(line["rank"], q, "{line}");
            assert_eq!(line["first_node"], meta.offsets[q], "{line}");
            assert_eq!(
                line["local_nodes"],
                meta.offsets[q + 1] - meta.offsets[q],
                "{line}"
            );
            assert_eq!(line["nodes"], 200, "{line}");
            edges += line["edges"].as_u64().unwrap();
        }
        assert_eq!(edges, ds.local_edges());
    }
}

#[test]
fn rank_count_must_match_part_count() {
    let _serial = serial();
    if !common::have_mpirun("tests/info_mpi.rs") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("ring.h5");
    format::write_dataset(&small_dataset(60), &input).unwrap();
    let dir = tmp.path().join("parts");
    partition(&input, 2, &dir);
    let (ok, stdout, stderr) = mpirun_info(3, &dir);
    assert!(!ok, "mpirun -np 3 on 2 parts succeeded:\n{stdout}");
    let all = format!("{stdout}\n{stderr}");
    assert!(
        all.contains("has 2 parts but the job has 3 ranks") && all.contains("-np 2"),
        "unclear error:\n{all}"
    );
}

#[test]
fn a_single_file_under_a_launcher_names_that_launcher() {
    let _serial = serial();
    if !common::have_mpirun("tests/info_mpi.rs") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("ring.h5");
    format::write_dataset(&small_dataset(60), &input).unwrap();
    let (ok, stdout, stderr) = mpirun_info(2, &input);
    assert!(!ok, "mpirun -np 2 info on one file succeeded:\n{stdout}");
    // Under mpirun the hint says mpirun (under srun it says srun: scripts/slurm-test.sh).
    assert!(
        stderr.contains(
            "is a single dataset file; run `gnnpar info` on it as one process, not under mpirun"
        ) && stderr.contains("--parts 2"),
        "unclear error:\n{stderr}"
    );
}
