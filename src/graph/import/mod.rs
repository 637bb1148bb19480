//! Importers: turn a dataset in a public format into a [`Dataset`] ready for
//! [`format::write_dataset`](crate::graph::format::write_dataset).
//!
//! * [`npz`]: NumPy archives in the heterophilous-benchmark layout (stored or deflated members);
//! * [`ogb`]: an OGB raw directory of gzipped CSV files;
//! * [`edgelist`]: a CSV/TSV/whitespace edge list with optional label and feature tables.
//!
//! Every importer validates what it reads and fails with a message naming the file, the field
//! (or line and column) and what was expected; none of them panics on bad input.

pub mod edgelist;
pub mod edges;
pub mod node_table;
pub mod npy;
pub mod npz;
pub mod ogb;
pub mod split;
pub mod text;

pub use edges::{EdgeOptions, SelfLoops};

use crate::graph::{Dataset, NodeId, Splits};
use anyhow::{bail, Result};
use clap::ValueEnum;
use std::path::{Path, PathBuf};

/// The source format of `gnnpar prepare`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `.npz` → npz, a directory → OGB, anything else → edge list.
    #[default]
    Auto,
    Npz,
    Ogb,
    Edgelist,
}

impl Format {
    /// The concrete format of `input` (resolving `Auto` by its name and kind).
    pub fn resolve(self, input: &Path) -> Format {
        match self {
            Format::Auto if input.is_dir() => Format::Ogb,
            Format::Auto
                if input
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("npz")) =>
            {
                Format::Npz
            }
            Format::Auto => Format::Edgelist,
            f => f,
        }
    }
}

/// Everything `prepare` can be told about the source.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    pub format: Format,
    /// Which predefined split to take (npz masks with S rows); default 0.
    pub split: Option<usize>,
    /// OGB: the subdirectory of `split/` to read (default: the only one).
    pub split_name: Option<String>,
    pub edges: EdgeOptions,
    /// Dataset name (default: the input's file stem).
    pub name: Option<String>,
    /// Edge list: a CSV of vertex id and label.
    pub labels: Option<PathBuf>,
    /// Edge list: the name of the label column in `labels` (default: the last column).
    pub label_column: Option<String>,
    /// Edge list: a CSV of vertex id then feature values.
    pub features: Option<PathBuf>,
    /// Random split fractions, for sources without a split.
    pub train_frac: Option<f64>,
    pub val_frac: Option<f64>,
    /// Seed of the random split.
    pub seed: u64,
}

impl ImportOptions {
    /// The dataset's name: `--name`, else the input's file stem (for an OGB `raw/` directory,
    /// the name of its parent).
    pub fn dataset_name(&self, input: &Path) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let mut p = input;
        if p.file_name().is_some_and(|n| n == "raw") {
            p = p.parent().unwrap_or(p);
        }
        let base = if p.is_dir() {
            p.file_name()
        } else {
            p.file_stem()
        };
        base.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "dataset".to_string())
    }

    /// The random split fractions (defaults 0.5 / 0.25, test gets the rest).
    pub fn fractions(&self) -> split::Fractions {
        let d = split::Fractions::default();
        split::Fractions {
            train: self.train_frac.unwrap_or(d.train),
            val: self.val_frac.unwrap_or(d.val),
        }
    }

    /// A random split of `num_nodes` vertices from the fractions and `seed`.
    pub fn random_split(&self, num_nodes: usize) -> Result<Splits> {
        split::random(num_nodes, self.fractions(), self.seed)
    }

    /// `--train-frac` / `--val-frac` make no sense when the source (`file`) has its own split.
    pub fn refuse_fractions(&self, file: &str) -> Result<()> {
        if self.train_frac.is_some() || self.val_frac.is_some() {
            bail!(
                "--train-frac / --val-frac apply to sources without a split, but `{file}` has one"
            );
        }
        Ok(())
    }

    /// Refuse options that the chosen format does not read, rather than ignoring them.
    fn check_applicable(&self, format: Format) -> Result<()> {
        let name = match format {
            Format::Npz => "npz",
            Format::Ogb => "OGB",
            _ => "edge-list",
        };
        if format != Format::Edgelist {
            for (given, opt) in [
                (self.labels.is_some(), "--labels"),
                (self.label_column.is_some(), "--label-column"),
                (self.features.is_some(), "--features"),
            ] {
                if given {
                    bail!("{opt} applies to edge lists only; this is an {name} source");
                }
            }
        }
        if format != Format::Npz && self.split.is_some() {
            bail!("--split picks one of several predefined npz splits; this is an {name} source");
        }
        if format != Format::Ogb && self.split_name.is_some() {
            bail!("--split-name applies to OGB directories only; this is an {name} source");
        }
        if format == Format::Npz && self.edges.symmetrize {
            log::info!(
                "npz edges are undirected: both directions are stored with or without --symmetrize"
            );
        }
        if self.label_column.is_some() && self.labels.is_none() {
            bail!("--label-column needs --labels FILE");
        }
        Ok(())
    }
}

/// Import `input` as `opts` say.
pub fn import(input: &Path, opts: &ImportOptions) -> Result<Dataset> {
    if !input.exists() {
        bail!("input `{}` does not exist", input.display());
    }
    let format = opts.format.resolve(input);
    opts.check_applicable(format)?;
    log::info!("reading `{}` as {format:?}", input.display());
    match format {
        Format::Npz => npz::import(input, opts),
        Format::Ogb => ogb::import(input, opts),
        Format::Edgelist | Format::Auto => edgelist::import(input, opts),
    }
}

/// Refuse vertex counts beyond what [`NodeId`] holds; `what` names the source.
pub(crate) fn check_node_count(num_nodes: u64, what: &str) -> Result<()> {
    if num_nodes > NodeId::MAX as u64 {
        bail!("{what}: {num_nodes} vertices exceed the 2^32 - 1 gnnpar supports");
    }
    Ok(())
}

/// The class count C = largest label + 1 of class-id `labels` (non-negative, checked by the
/// caller), refusing C above `num_nodes`: a class per vertex at the most. A stray huge label
/// would otherwise make C absurd and `train` abort allocating C-wide arrays. `entry(i)` names
/// entry `i` (file and position) in the error.
pub(crate) fn class_count(
    labels: &[i64],
    num_nodes: usize,
    entry: impl FnOnce(usize) -> String,
) -> Result<usize> {
    // The first occurrence of the largest label.
    let Some((i, max)) =
        labels
            .iter()
            .copied()
            .enumerate()
            .fold(None, |best: Option<(usize, i64)>, (i, v)| match best {
                Some((_, b)) if b >= v => best,
                _ => Some((i, v)),
            })
    else {
        return Ok(0);
    };
    let classes = max.max(-1) as i128 + 1;
    if classes > num_nodes as i128 {
        bail!(
            "{} is label {max}, which makes {classes} classes for {num_nodes} vertices; labels \
             are class ids in [0, C) and a graph has at most one class per vertex",
            entry(i)
        );
    }
    Ok(classes as usize)
}
