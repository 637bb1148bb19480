//! Skipped test cases, made visible. A test that cannot run here (no real datasets, no
//! `mpirun`, no Slurm, no GPU, a CPU without some instruction set) calls [`skipped`]: it prints
//! a `SKIPPED` line and, when `GNNPAR_SKIP_LOG` names a file, appends one tab-separated record
//! (`kind`, test, reason) to it. `scripts/test.sh` sets that file and ends the suite with a
//! count per kind, so a green run that skipped real-data or GPU cases does not look complete
//! (cargo captures a passing test's stderr, which would hide the line).

use std::io::Write;

/// Why a case was skipped, as counted at the end of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipKind {
    /// The real datasets (`GNNPAR_DATA`) are absent.
    RealData,
    /// `mpirun` is not installed.
    Mpi,
    /// A Slurm cluster could not be started.
    Slurm,
    /// No CUDA driver or GPU.
    Gpu,
    /// Anything else (a CPU feature, an optional peer tool).
    Other,
}

impl SkipKind {
    /// The name used in the log and the suite's count.
    pub fn name(self) -> &'static str {
        match self {
            SkipKind::RealData => "real-data",
            SkipKind::Mpi => "mpi",
            SkipKind::Slurm => "slurm",
            SkipKind::Gpu => "gpu",
            SkipKind::Other => "other",
        }
    }
}

/// Report that `test` was skipped for `reason`: a `SKIPPED` line on stderr, and a record in
/// `GNNPAR_SKIP_LOG` when set. Never fails (a test's skip must not become its failure).
pub fn skipped(kind: SkipKind, test: &str, reason: &str) {
    eprintln!("SKIPPED [{}]: {test}: {reason}", kind.name());
    let Some(path) = std::env::var_os("GNNPAR_SKIP_LOG") else {
        return;
    };
    let line = format!(
        "{}\t{test}\t{}\n",
        kind.name(),
        reason.replace(['\t', '\n'], " ")
    );
    // One write of one short line with O_APPEND: records of parallel tests do not interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}
