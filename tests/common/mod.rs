//! Helpers shared by the integration tests that run the `gnnpar` binary: where the binary and
//! the real datasets are, running a command under a timeout, temporary directories, loud
//! `SKIPPED` lines, and reading training outputs (summary JSON, checkpoint parameters).
//!
//! Each test file includes this module with `mod common;` and uses only some of it.
#![allow(dead_code)]

pub use gnnpar::util::skip::{skipped, SkipKind};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The `gnnpar` binary Cargo built for these tests.
pub const GNNPAR: &str = env!("CARGO_BIN_EXE_gnnpar");

/// The directory of the real datasets: `GNNPAR_DATA`, or `../shared/datasets` next to the crate.
pub fn data_dir() -> PathBuf {
    std::env::var_os("GNNPAR_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/datasets"))
        })
}

/// `rel` inside the datasets directory, or `None` after a loud `SKIPPED` line naming `test`.
pub fn dataset(rel: &str, test: &str) -> Option<PathBuf> {
    let path = data_dir().join(rel);
    if path.is_file() {
        Some(path)
    } else {
        skipped(
            SkipKind::RealData,
            test,
            &format!(
                "`{}` not found (set GNNPAR_DATA to the datasets directory)",
                path.display()
            ),
        );
        None
    }
}

/// Whether `mpirun` is on `PATH`; prints a loud `SKIPPED` line naming `test` when it is not.
pub fn have_mpirun(test: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join("mpirun").is_file()))
        .unwrap_or(false);
    if !found {
        skipped(SkipKind::Mpi, test, "`mpirun` is not on PATH");
    }
    found
}

/// `mpirun -np <np> gnnpar <args>` as the MPI tests run it: oversubscribed and unbound (ranks
/// may outnumber this machine's cores), allowed as root, logging at `info`, and without the
/// caller's `GNNPAR_CUDA_EMULATOR` (a test that wants the emulator sets it). Add environment or
/// arguments, then run it with [`run_with_timeout`].
pub fn mpirun_command(np: usize, args: &[&str]) -> Command {
    let mut cmd = mpirun();
    cmd.args([
        "-np",
        &np.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .arg(GNNPAR)
    .args(args)
    .env("RUST_LOG", "info")
    .env_remove("GNNPAR_CUDA_EMULATOR");
    cmd
}

/// A bare `mpirun` command, allowed as root, with an Open MPI session directory of its own.
pub fn mpirun() -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    own_mpi_session(&mut cmd);
    cmd
}

/// Gives `cmd` (an `mpirun`, or `gnnpar` starting as an MPI singleton) a session directory
/// base of its own.
///
/// Open MPI 4 keeps every job's session files under one `/tmp/ompi.<host>.<uid>`, created by
/// each job and removed by the last to leave; with tests running side by side, one job's
/// `mkdir` can lose that race to another's and fail in `orte_init` (`mkdir …: File exists`).
/// A base per command (under Cargo's target `tmp`; [`run_with_timeout`] removes it when the
/// command ends) takes the tests out of the race. `PRTE_MCA_prte_tmpdir_base` is Open MPI 5's
/// name for it. Returns the base (the one `cmd` has, where it has one).
pub fn own_mpi_session(cmd: &mut Command) -> PathBuf {
    if let Some(base) = mpi_session_of(cmd) {
        return base;
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SESSIONS: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "ompi-{}-{}",
        std::process::id(),
        SESSIONS.fetch_add(1, Ordering::Relaxed)
    );
    // Cargo's target `tmp` is baked in at build time; test binaries staged to another host
    // (the GPU machine) fall back to the system's temporary directory.
    let base = [
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &std::env::temp_dir(),
    ]
    .iter()
    .map(|dir| dir.join(&name))
    .find(|base| std::fs::create_dir_all(base).is_ok())
    .unwrap_or_else(|| panic!("cannot create a session directory {name} for Open MPI"));
    cmd.env(MPI_SESSION_BASE, &base)
        .env("PRTE_MCA_prte_tmpdir_base", &base);
    base
}

/// Open MPI 4's setting for where a job keeps its session directory.
const MPI_SESSION_BASE: &str = "OMPI_MCA_orte_tmpdir_base";

/// The session directory base [`own_mpi_session`] gave `cmd`, if it did.
fn mpi_session_of(cmd: &Command) -> Option<PathBuf> {
    cmd.get_envs()
        .find(|(key, _)| *key == MPI_SESSION_BASE)
        .and_then(|(_, value)| value.map(PathBuf::from))
}

/// A fresh temporary directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("cannot create a temporary directory")
}

/// What a finished command produced.
#[derive(Debug)]
pub struct Outcome {
    pub success: bool,
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub seconds: f64,
}

impl Outcome {
    /// Panic with the command's output unless it succeeded.
    pub fn expect_ok(self, what: &str) -> Outcome {
        assert!(
            self.success,
            "{what} failed (exit {:?}):\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// The last non-empty stdout line parsed as JSON (`gnnpar train` prints its summary there).
    pub fn last_json(&self) -> serde_json::Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| panic!("no stdout; stderr:\n{}", self.stderr));
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {line}"))
    }
}

/// Run `cmd` to completion, or kill it after `timeout` and panic. Both pipes are drained on
/// their own threads so a chatty child never blocks on a full pipe. The command runs with an
/// Open MPI session directory of its own ([`own_mpi_session`]), removed when it ends.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Outcome {
    let session = own_mpi_session(&mut cmd);
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let status = loop {
        if let Some(status) = child.try_wait().expect("cannot wait for child") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.join().unwrap_or_default();
            panic!(
                "{cmd:?} did not finish within {} s and was killed; stderr:\n{stderr}",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_dir_all(&session);
    Outcome {
        success: status.success(),
        code: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// `gnnpar <args>` with a timeout; `RUST_LOG` is pinned to `info` so stderr is predictable.
pub fn gnnpar<S: AsRef<std::ffi::OsStr>>(args: &[S], timeout: Duration) -> Outcome {
    let mut cmd = Command::new(GNNPAR);
    cmd.args(args).env("RUST_LOG", "info");
    run_with_timeout(cmd, timeout)
}

/// A path as `&str` (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The shape of a small stochastic block model for a test.
#[derive(Clone, Copy, Debug)]
pub struct Sbm {
    pub nodes: u64,
    pub edges: u64,
    pub features: usize,
    pub classes: usize,
    pub seed: u64,
}

impl Sbm {
    /// The graph of the device checks (800 vertices, 8,000 edges, 12 features, 3 classes):
    /// small enough for the CPU emulator of the device, large enough for several batches.
    pub const DEVICE_CHECKS: Sbm = Sbm {
        nodes: 800,
        edges: 8000,
        features: 12,
        classes: 3,
        seed: 5,
    };
}

/// `gnnpar generate sbm` of `sbm` into `<dir>/<name>`; returns the dataset path. Fails the
/// test when generation fails.
pub fn generate_sbm(dir: &Path, name: &str, sbm: Sbm) -> PathBuf {
    let out = dir.join(name);
    let n = |v: u64| v.to_string();
    let args = [
        "generate".to_string(),
        "sbm".into(),
        "--nodes".into(),
        n(sbm.nodes),
        "--edges".into(),
        n(sbm.edges),
        "--features".into(),
        n(sbm.features as u64),
        "--classes".into(),
        n(sbm.classes as u64),
        "--seed".into(),
        n(sbm.seed),
        "-o".into(),
        s(&out).to_string(),
    ];
    gnnpar(&args, Duration::from_secs(300)).expect_ok("gnnpar generate sbm");
    out
}

/// `gnnpar prepare <input> -o <dir>/<name>.h5`; returns the dataset path.
pub fn prepare(input: &Path, dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(format!("{name}.h5"));
    gnnpar(
        &["prepare", s(input), "-o", s(&out)],
        Duration::from_secs(300),
    )
    .expect_ok(&format!("gnnpar prepare {}", input.display()));
    out
}

/// A JSON file a run wrote (a summary, a calibration), parsed.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A float dataset of a checkpoint (`params`, `adam_m`, `adam_v`), read with the `hdf5` crate.
pub fn read_f32s(checkpoint: &Path, name: &str) -> Vec<f32> {
    let file = hdf5::File::open(checkpoint)
        .unwrap_or_else(|e| panic!("cannot open `{}`: {e}", checkpoint.display()));
    file.dataset(name)
        .and_then(|d| d.read_raw::<f32>())
        .unwrap_or_else(|e| panic!("cannot read `{name}` of `{}`: {e}", checkpoint.display()))
}

/// An integer attribute of a checkpoint (`epoch`, `step`, `batch`, `adam_t`).
pub fn read_u64_attr(checkpoint: &Path, name: &str) -> u64 {
    let file = hdf5::File::open(checkpoint)
        .unwrap_or_else(|e| panic!("cannot open `{}`: {e}", checkpoint.display()));
    file.attr(name)
        .and_then(|a| a.read_scalar::<u64>())
        .unwrap_or_else(|e| {
            panic!(
                "cannot read attribute `{name}` of `{}`: {e}",
                checkpoint.display()
            )
        })
}

/// Bit patterns of a float slice, so equality is exact (and NaN equals the same NaN).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Largest |a - b| / max(|a|, |b|, floor) over two equally long slices.
pub fn max_rel_diff(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x - y).abs() / x.abs().max(y.abs()).max(floor))
        .fold(0.0, f32::max)
}
