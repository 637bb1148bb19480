//! `gnnpar export <dataset.h5> --format metis -o graph.metis [--symmetrize]`: write a
//! dataset's graph in another tool's format (METIS' text graph for `gpmetis`). The last line
//! on stdout is a JSON object `{"export": {…}}` for benchmarks.

use crate::graph::{export, format};
use crate::util::rss::peak_rss_mb;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// METIS text graph (`n m` header, one line of 1-based neighbour ids per vertex), as read
    /// by `gpmetis`: undirected, no self-loops, no repeated neighbours.
    Metis,
}

/// Arguments of `gnnpar export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The dataset to export (a whole `dataset.h5`, not one part of a partition).
    pub input: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "metis")]
    pub format: ExportFormat,
    /// Add the reverse of every edge of a directed graph (METIS' format is undirected).
    #[arg(long)]
    pub symmetrize: bool,
    /// Output file.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: PathBuf,
}

/// Run `gnnpar export`.
pub fn run(args: ExportArgs) -> Result<()> {
    let started = Instant::now();
    let ds = format::read_dataset(&args.input)?;
    if !ds.is_whole() {
        bail!(
            "`{}` is one part of a partition (vertices {}..{} of {}); export the whole \
             dataset.h5 instead",
            args.input.display(),
            ds.first_node,
            ds.first_node + ds.local_nodes() as u64,
            ds.num_nodes
        );
    }
    let source = args.input.display().to_string();
    let written = match args.format {
        ExportFormat::Metis => export::export_metis(
            &ds.graph,
            ds.directed,
            args.symmetrize,
            &source,
            &args.output,
        )?,
    };
    println!(
        "wrote `{}`: METIS graph, {} vertices, {} undirected edges, {} bytes",
        args.output.display(),
        written.vertices,
        written.edges,
        written.bytes
    );
    println!(
        "{}",
        json!({"export": {
            "input": source,
            "output": args.output.display().to_string(),
            "format": "metis",
            "vertices": written.vertices,
            "edges": written.edges,
            "bytes": written.bytes,
            "seconds": started.elapsed().as_secs_f64(),
            "peak_rss_mb": peak_rss_mb(),
        }})
    );
    Ok(())
}
