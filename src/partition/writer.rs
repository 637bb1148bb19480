//! Writing a partition directory atomically: every file is built in a temporary directory
//! next to the target, which is renamed into place only once complete.

use super::relabel::{extract_part, Relabeling};
use super::stats::PartitionStats;
use crate::graph::parts::{self, PartitionMeta};
use crate::graph::{format, Dataset};
use crate::util::{atomic::AtomicOutput, h5, progress::Progress};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Refuse to replace anything at `out` but an earlier partition directory, and prepare the
/// atomic output (which also checks that the parent directory exists). Call this before the
/// expensive work so a bad `-o` fails fast.
pub fn prepare_output(out: &Path) -> Result<AtomicOutput> {
    if out.exists() && !parts::is_parts_dir(out) {
        bail!(
            "refusing to write `{}`: it exists and is not a partition directory (no `{}`)",
            out.display(),
            parts::META_FILE
        );
    }
    AtomicOutput::new(out)
}

/// Write `meta.h5` and one `part-%05d.h5` per part into the temporary directory of `out`,
/// then move it into place.
pub fn write_parts(
    out: AtomicOutput,
    ds: &Dataset,
    relabel: &Relabeling,
    stats: &PartitionStats,
    seed: u64,
    source_id: u64,
) -> Result<()> {
    let dir = out.tmp_path().to_path_buf();
    std::fs::create_dir(&dir)
        .with_context(|| format!("cannot create directory `{}`", dir.display()))?;
    let final_name = out.final_path().display().to_string();
    let mut progress = Progress::new("writing parts", relabel.num_parts() as u64);
    let mut part_ids = Vec::with_capacity(relabel.num_parts());
    for p in 0..relabel.num_parts() {
        // One part in memory at a time: the whole dataset is already resident.
        let part = extract_part(ds, relabel, p);
        let path = parts::part_path(&dir, p);
        let id = format::write_dataset_to(&part, &path).with_context(|| {
            format!(
                "writing part {p} of `{final_name}` (at `{}`)",
                path.display()
            )
        })?;
        part_ids.push(id);
        progress.inc(1);
    }
    progress.finish();
    let meta = PartitionMeta {
        name: ds.name.clone(),
        num_parts: relabel.num_parts(),
        offsets: relabel.offsets.clone(),
        orig_id: relabel.orig_id.iter().map(|&v| v as u64).collect(),
        method: stats.method.clone(),
        weights: stats.weights.clone(),
        edge_cut: stats.edge_cut,
        num_edges: stats.num_edges,
        seconds: stats.partition_seconds,
    };
    parts::write_meta(&meta, &dir)
        .and_then(|()| write_balance_attrs(&dir, stats, seed))
        .and_then(|()| {
            parts::write_identity(
                &dir,
                &parts::Identity {
                    source_id: Some(source_id),
                    part_ids: Some(part_ids),
                },
            )
        })
        .with_context(|| format!("writing `{}` of `{final_name}`", parts::META_FILE))?;
    out.commit()
}

/// Record what the skeleton's `PartitionMeta` has no field for: the balanced constraints, the
/// seed and the imbalance of each count (ARCHITECTURE: meta.h5 records the balance).
fn write_balance_attrs(dir: &Path, stats: &PartitionStats, seed: u64) -> Result<()> {
    let path = dir.join(parts::META_FILE);
    let file =
        hdf5::File::append(&path).with_context(|| format!("cannot reopen `{}`", path.display()))?;
    h5::write_str_attr(&file, "balance", &stats.constraints.join(","))?;
    h5::write_attr(&file, "seed", seed)?;
    h5::write_attr(&file, "vertex_imbalance", stats.vertex_imbalance)?;
    h5::write_attr(&file, "edge_imbalance", stats.edge_imbalance)?;
    h5::write_attr(&file, "train_imbalance", stats.train_imbalance)?;
    file.flush().context("flushing HDF5 file")?;
    Ok(())
}
