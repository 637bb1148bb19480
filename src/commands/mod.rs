//! The `gnnpar` command line: one sub-command per file, each with its own argument struct.

pub mod export;
pub mod generate;
pub mod info;
pub mod partition;
pub mod prepare;
pub mod presample;
pub mod train;

use anyhow::Result;
use clap::{Parser, Subcommand};

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
    /// Pre-sample training mini-batches into partition weights; measure a partition's split statistics.
    Presample(presample::PresampleArgs),
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Info(args) => info::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Partition(args) => partition::run(args).map(|_| ()),
        Command::Train(args) => train::run(*args),
        Command::Presample(args) => presample::run(args).map(|_| ()),
        Command::Export(args) => export::run(args),
    }
}
