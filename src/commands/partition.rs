//! `gnnpar partition <dataset.h5> --parts P -o <parts/>`: split a dataset into parts with
//! contiguous vertex ids (METIS, random or hash) and print the edge cut and balance.

use crate::partition::{self, constraints::Balance, stats::PartitionStats, Method};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gnnpar partition`.
#[derive(Args, Debug)]
pub struct PartitionArgs {
    /// The dataset to partition (`dataset.h5`).
    pub input: PathBuf,
    /// Number of parts (one per MPI rank that will train on it): at most the number of
    /// vertices, and every part owns at least one.
    #[arg(long, short = 'p', value_name = "P")]
    pub parts: usize,
    /// How to assign vertices to parts.
    #[arg(long, value_enum, default_value = "metis")]
    pub method: Method,
    /// Pre-sampling weights (`gnnpar presample`): one vertex constraint per layer plus edge
    /// weights (METIS only).
    #[arg(long, value_name = "weights.h5")]
    pub weights: Option<PathBuf>,
    /// Constraints METIS balances without a weights file [default: vertices,edges,train].
    #[arg(long, value_enum, value_delimiter = ',', conflicts_with = "weights")]
    pub balance: Option<Vec<Balance>>,
    /// Seed of METIS and of the random baseline.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// METIS' allowed imbalance in thousandths (30 means 1.03) [default: METIS' own, 30].
    #[arg(long)]
    pub ufactor: Option<u32>,
    /// Output partition directory.
    #[arg(long, short = 'o', value_name = "parts/")]
    pub output: PathBuf,
    /// Print the statistics as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `gnnpar partition` and return its statistics.
pub fn run(args: PartitionArgs) -> Result<PartitionStats> {
    let opts = partition::PartitionOptions {
        input: args.input,
        output: args.output,
        parts: args.parts,
        method: args.method,
        weights: args.weights,
        balance: args.balance,
        seed: args.seed,
        ufactor: args.ufactor,
    };
    let stats = partition::partition_dataset(&opts)?;
    if args.json {
        println!("{}", serde_json::to_string(&stats)?);
    } else {
        print!("{}", stats.text());
        println!("wrote `{}`", opts.output.display());
    }
    Ok(stats)
}
