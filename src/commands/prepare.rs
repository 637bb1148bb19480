//! `gnnpar prepare <INPUT> -o <dataset.h5>`: import a dataset (npz, OGB raw directory, or
//! CSV/TSV edge list) into the HDF5 format, print its summary.

use crate::graph::import::{self, EdgeOptions, Format, ImportOptions, SelfLoops};
use crate::graph::{format, summary::Summary};
use crate::util::atomic::refuse_overwriting_inputs;
use anyhow::{bail, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `gnnpar prepare`.
#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// The source: an `.npz` file, an OGB directory, or an edge list (CSV/TSV/blank-separated).
    pub input: PathBuf,
    /// The dataset file to write (written under a temporary name, then renamed).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Source format; `auto`: `.npz` → npz, a directory → ogb, anything else → edgelist.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// npz: which predefined split (row of the `*_masks` arrays) to take; default 0.
    #[arg(long)]
    pub split: Option<usize>,
    /// OGB: the subdirectory of `split/` to read (default: the only one).
    #[arg(long)]
    pub split_name: Option<String>,
    /// Add the reverse of every edge and remove duplicate edges (npz sources always store both
    /// directions).
    #[arg(long)]
    pub symmetrize: bool,
    /// Self-loops: keep them as in the source, drop them, or add one to every vertex.
    #[arg(long, value_enum, default_value_t = SelfLoops::Keep)]
    pub self_loops: SelfLoops,
    /// Dataset name stored in the file (default: the input's file stem).
    #[arg(long)]
    pub name: Option<String>,
    /// Edge list: CSV of vertex id and label (e.g. MUSAE `git_target.csv`).
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Edge list: the label column of `--labels` by header name (default: the last column).
    #[arg(long)]
    pub label_column: Option<String>,
    /// Edge list: CSV of vertex id then feature values.
    #[arg(long)]
    pub features: Option<PathBuf>,
    /// Random split for sources without one: fraction of vertices for training (default 0.5).
    #[arg(long)]
    pub train_frac: Option<f64>,
    /// Random split: fraction for validation (default 0.25; the test set gets the rest).
    #[arg(long)]
    pub val_frac: Option<f64>,
    /// Seed of the random split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

impl PrepareArgs {
    /// The importer options these arguments describe.
    pub fn import_options(&self) -> ImportOptions {
        ImportOptions {
            format: self.format,
            split: self.split,
            split_name: self.split_name.clone(),
            edges: EdgeOptions {
                symmetrize: self.symmetrize,
                self_loops: self.self_loops,
            },
            name: self.name.clone(),
            labels: self.labels.clone(),
            label_column: self.label_column.clone(),
            features: self.features.clone(),
            train_frac: self.train_frac,
            val_frac: self.val_frac,
            seed: self.seed,
        }
    }
}

/// Run `gnnpar prepare`.
pub fn run(args: PrepareArgs) -> Result<()> {
    check_output_dir(&args.output)?;
    refuse_overwriting_inputs(
        &args.output,
        "-o",
        &[
            ("the input", Some(args.input.as_path())),
            ("--labels", args.labels.as_deref()),
            ("--features", args.features.as_deref()),
        ],
    )?;
    let started = Instant::now();
    let ds = import::import(&args.input, &args.import_options())?;
    let imported = started.elapsed().as_secs_f64();
    format::write_dataset(&ds, &args.output)?;
    log::info!(
        "prepared `{}` in {:.2} s (import {imported:.2} s, write {:.2} s)",
        args.output.display(),
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64() - imported
    );
    let summary = Summary::of(&ds);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("{}", summary.line());
    }
    Ok(())
}

/// Fail before a long import, not after it, when the output cannot be written there.
fn check_output_dir(output: &Path) -> Result<()> {
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        bail!(
            "cannot write `{}`: directory `{}` does not exist",
            output.display(),
            parent.display()
        );
    }
    if output.is_dir() {
        bail!("cannot write `{}`: it is a directory", output.display());
    }
    Ok(())
}
