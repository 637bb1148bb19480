//! The `gnnpar` binary: parse the command line, run the command, turn errors into one clear
//! message and a non-zero exit code.

/// The system allocator, with huge pages on large per-step buffers (`util::huge_pages`).
#[global_allocator]
static ALLOCATOR: gnnpar::util::huge_pages::HugePageAlloc = gnnpar::util::huge_pages::HugePageAlloc;

fn main() {
    gnnpar::util::huge_pages::mark_installed();
    gnnpar::util::logging::init();
    // A file-size limit (`ulimit -f`, a batch system's quota) kills a process that writes past
    // it with SIGXFSZ, before it can say why. Ignored, the write fails with EFBIG instead and
    // the error names the file (a checkpoint's temporary name is then removed, leaving the
    // previous checkpoint as it was).
    // SAFETY: setting a signal's disposition to SIG_IGN at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let cli = gnnpar::commands::parse_args();
    match gnnpar::commands::run(cli) {
        Ok(()) => gnnpar::comm::finalize(),
        // Under MPI the message names the rank and the whole job is aborted, so a failure on
        // one rank never leaves the others waiting in a collective.
        Err(err) => gnnpar::comm::fail_job(&err),
    }
}
