//! The `gnnpar` binary: parse the command line, run the command, turn errors into one clear
//! message and a non-zero exit code.

use clap::Parser;

fn main() {
    gnnpar::util::logging::init();
    let cli = gnnpar::commands::Cli::parse();
    match gnnpar::commands::run(cli) {
        Ok(()) => gnnpar::comm::finalize(),
        // Under MPI the message names the rank and the whole job is aborted, so a failure on
        // one rank never leaves the others waiting in a collective.
        Err(err) => gnnpar::comm::fail_job(&err),
    }
}
