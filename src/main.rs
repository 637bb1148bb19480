//! The `gnnpar` binary: parse the command line, run the command, turn errors into one clear
//! message and a non-zero exit code.

use clap::Parser;

fn main() {
    gnnpar::util::logging::init();
    let cli = gnnpar::commands::Cli::parse();
    if let Err(err) = gnnpar::commands::run(cli) {
        // Under MPI the message names the rank and the whole job is aborted, so a failure on
        // one rank never leaves the others waiting in a collective.
        gnnpar::comm::fail_job(&err);
    }
}
