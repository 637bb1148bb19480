//! `gnnpar export <dataset.h5> --format metis -o graph.metis [--symmetrize]`: write a
//! dataset's graph in another tool's format (METIS' text graph for `gpmetis`), or
//! `--format npz`: the whole dataset as numpy arrays, for tools without an HDF5 reader. The
//! last line on stdout is a JSON object `{"export": {…}}` for benchmarks.

use crate::graph::{export, export_npz, format};
use crate::util::atomic::refuse_overwriting_inputs;
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
    /// The whole dataset (CSR, features, labels, splits) as an uncompressed NumPy `.npz` of
    /// gnnpar's arrays, for tools with numpy but no HDF5 reader (docs/format.md).
    Npz,
}

/// Arguments of `gnnpar export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The dataset to export (a whole `dataset.h5`, not one part of a partition).
    pub input: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "metis")]
    pub format: ExportFormat,
    /// Add the reverse of every edge of a directed graph (METIS' format is undirected;
    /// `--format metis` only).
    #[arg(long)]
    pub symmetrize: bool,
    /// Output file.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: PathBuf,
}

/// Run `gnnpar export`.
pub fn run(args: ExportArgs) -> Result<()> {
    let started = Instant::now();
    refuse_overwriting_inputs(
        &args.output,
        "-o",
        &[("the input", Some(args.input.as_path()))],
    )?;
    format::read_header(&args.input)?
        .require_whole(&args.input, "export the whole dataset.h5 instead")?;
    let ds = format::read_dataset(&args.input)?;
    let source = args.input.display().to_string();
    let (what, detail) = match args.format {
        ExportFormat::Metis => {
            let written = export::export_metis(
                &ds.graph,
                ds.directed,
                args.symmetrize,
                &source,
                &args.output,
            )?;
            println!(
                "wrote `{}`: METIS graph, {} vertices, {} undirected edges, {} bytes",
                args.output.display(),
                written.vertices,
                written.edges,
                written.bytes
            );
            (
                "metis",
                json!({"vertices": written.vertices, "edges": written.edges,
                       "bytes": written.bytes}),
            )
        }
        ExportFormat::Npz => {
            if args.symmetrize {
                bail!(
                    "--symmetrize applies to --format metis only (npz keeps the graph as stored)"
                );
            }
            let written = export_npz::export_npz(&ds, &args.output)?;
            println!(
                "wrote `{}`: npz, {} arrays, {} vertices, {} edges, {} bytes",
                args.output.display(),
                written.arrays,
                ds.local_nodes(),
                ds.local_edges(),
                written.bytes
            );
            (
                "npz",
                json!({"vertices": ds.local_nodes(), "edges": ds.local_edges(),
                       "arrays": written.arrays, "bytes": written.bytes}),
            )
        }
    };
    let mut record = json!({
        "input": source,
        "output": args.output.display().to_string(),
        "format": what,
        "seconds": started.elapsed().as_secs_f64(),
        "peak_rss_mb": peak_rss_mb(),
    });
    if let (Some(record), Some(detail)) = (record.as_object_mut(), detail.as_object()) {
        record.extend(detail.clone());
    }
    println!("{}", json!({ "export": record }));
    Ok(())
}
