//! The `gnnpar` command line: one sub-command per file, each with its own argument struct.

pub mod calibrate;
pub mod export;
pub mod generate;
pub mod info;
pub mod partition;
pub mod plan;
pub mod prepare;
pub mod presample;
pub mod train;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// gnnpar: distributed GNN training on HPC clusters.
#[derive(Parser, Debug)]
#[command(name = "gnnpar", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The sub-commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Describe a dataset file or a partition directory (under mpirun: each rank its own part).
    Info(info::InfoArgs),
    /// Generate a synthetic graph (stochastic block model or R-MAT) into a dataset file.
    Generate(generate::GenerateArgs),
    /// Import a dataset (npz, OGB raw directory, CSV/TSV edge list) into the HDF5 format.
    Prepare(prepare::PrepareArgs),
    /// Partition a dataset into parts with contiguous vertex ids (METIS, random or hash).
    Partition(partition::PartitionArgs),
    /// Export a dataset's graph for another tool (METIS text graph for `gpmetis`).
    Export(export::ExportArgs),
    /// Train a GNN (GraphSAGE, GCN, GAT) on a dataset, a partition, or the synthetic default.
    Train(Box<train::TrainArgs>),
    /// Measure this machine's operators for the planner and write its calibration file.
    Calibrate(Box<train::TrainArgs>),
    /// Print the calibrated planner's prediction per strategy and its choice, without training.
    Plan(Box<train::TrainArgs>),
    /// Pre-sample training mini-batches into partition weights; measure a partition's split statistics.
    Presample(presample::PresampleArgs),
}

/// Parse the process's command line. Negative numbers are accepted as option values in every
/// sub-command (`--lr -0.01`, not only `--lr=-0.01`): a value that looks like a number is never
/// taken for an option, and no gnnpar option is spelled like one.
pub fn parse_args() -> Cli {
    let parsed = command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches));
    parsed.unwrap_or_else(|e| exit_on_parse_error(e))
}

/// Print a command-line error and exit as clap does, but naming the rank when a launcher
/// started several (every rank prints its own; the user should see which ones did).
fn exit_on_parse_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    let is_error = !matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    match crate::comm::launcher::env_rank_and_size() {
        Some((rank, size)) if size > 1 && is_error => {
            let text = e.render().to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            // One write, so that the ranks' messages do not interleave.
            let line =
                format!("gnnpar: error on rank {rank} of {size} (before MPI started): {text}");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            std::process::exit(e.exit_code());
        }
        _ => e.exit(),
    }
}

/// Parse `args` (the program name first) as [`parse_args`] does.
pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::from_arg_matches(&command().try_get_matches_from(args)?)
}

/// The clap command with negative numbers allowed at every level.
fn command() -> clap::Command {
    fn allow_negatives(cmd: clap::Command) -> clap::Command {
        cmd.allow_negative_numbers(true)
            .mut_subcommands(allow_negatives)
    }
    allow_negatives(Cli::command())
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let one_process = match &cli.command {
        Command::Generate(_) => Some("generate"),
        Command::Prepare(_) => Some("prepare"),
        Command::Partition(_) => Some("partition"),
        Command::Presample(_) => Some("presample"),
        Command::Export(_) => Some("export"),
        Command::Info(_) | Command::Train(_) | Command::Calibrate(_) | Command::Plan(_) => None,
    };
    if let Some(command) = one_process {
        crate::comm::launcher::refuse_many_processes(command)?;
    }
    match cli.command {
        Command::Info(args) => info::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Partition(args) => partition::run(args).map(|_| ()),
        Command::Train(args) => train::run(*args),
        Command::Calibrate(args) => calibrate::run(*args),
        Command::Plan(args) => plan::run(*args),
        Command::Presample(args) => presample::run(args).map(|_| ()),
        Command::Export(args) => export::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_numbers_are_option_values_everywhere() {
        let Command::Train(args) = try_parse_from(["gnnpar", "train", "--lr", "-0.01"])
            .unwrap()
            .command
        else {
            panic!("not train")
        };
        assert_eq!(args.lr, Some(-0.01));
        // ...and the configuration check then names the field.
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("`lr`"), "{err}");
        let Command::Train(args) = try_parse_from(["gnnpar", "train", "--fanouts", "-1,5"])
            .unwrap()
            .command
        else {
            panic!("not train")
        };
        assert_eq!(args.fanouts, Some(vec![-1, 5]));
        // Nested sub-commands too.
        let parsed = try_parse_from([
            "gnnpar",
            "generate",
            "sbm",
            "--nodes",
            "10",
            "--edges",
            "20",
            "--features",
            "2",
            "--classes",
            "2",
            "--homophily",
            "-0.5",
            "-o",
            "x.h5",
        ]);
        assert!(parsed.is_ok(), "{:?}", parsed.err());
        // Options are still options.
        assert!(try_parse_from(["gnnpar", "train", "--lr", "--epochs", "1"]).is_err());
    }
}
