//! Logging setup: `RUST_LOG` controls the level (default `info`); under MPI every line is
//! prefixed with the rank so interleaved Slurm logs stay readable.

use std::io::Write;

/// Initialise `env_logger` once. Safe to call more than once (later calls do nothing).
pub fn init() {
    let rank = crate::comm::rank_from_env();
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format(move |buf, record| match rank {
            Some(r) => writeln!(buf, "[{} r{}] {}", record.level(), r, record.args()),
            None => writeln!(buf, "[{}] {}", record.level(), record.args()),
        })
        .try_init();
}
