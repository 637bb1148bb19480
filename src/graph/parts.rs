//! Partitioned datasets on disk: `parts/meta.h5` plus one `parts/part-%05d.h5` per part.
//!
//! After partitioning, part `p` owns the contiguous global ids `[offsets[p], offsets[p+1])`
//! (ARCHITECTURE invariant 1), so `owner(v)` is a binary search over `offsets`. `orig_id[v]`
//! maps a relabelled vertex back to its id in the source dataset.

use super::{format, Dataset};
use crate::util::h5;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Name of the metadata file inside a partition directory.
pub const META_FILE: &str = "meta.h5";

/// Path of part `p` inside `dir`.
pub fn part_path(dir: &Path, p: usize) -> PathBuf {
    dir.join(format!("part-{p:05}.h5"))
}

/// Is `path` a partition directory (holds `meta.h5`)?
pub fn is_parts_dir(path: &Path) -> bool {
    path.is_dir() && path.join(META_FILE).is_file()
}

/// What `parts/meta.h5` records.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionMeta {
    pub name: String,
    pub num_parts: usize,
    /// `offsets[p]..offsets[p+1]` are the global ids owned by part `p`.
    pub offsets: Vec<u64>,
    /// `orig_id[new_id]` = id of the vertex in the source dataset.
    pub orig_id: Vec<u64>,
    /// `metis`, `random` or `hash`.
    pub method: String,
    /// Description of the weights used (`none` or the weights file).
    pub weights: String,
    /// Edges whose endpoints lie in different parts (each direction counts).
    pub edge_cut: u64,
    pub num_edges: u64,
    /// Seconds spent partitioning.
    pub seconds: f64,
}

impl PartitionMeta {
    /// Part that owns global id `v`.
    pub fn owner(&self, v: u64) -> usize {
        owner_of(&self.offsets, v)
    }

    /// Number of vertices in the whole graph.
    pub fn num_nodes(&self) -> u64 {
        *self.offsets.last().unwrap_or(&0)
    }
}

/// Part owning `v` given contiguous `offsets` (length parts + 1).
#[inline]
pub fn owner_of(offsets: &[u64], v: u64) -> usize {
    offsets.partition_point(|&o| o <= v) - 1
}

/// Write `meta` into `dir/meta.h5` (the caller makes the directory atomic).
pub fn write_meta(meta: &PartitionMeta, dir: &Path) -> Result<()> {
    let path = dir.join(META_FILE);
    let file = h5::create(&path)?;
    h5::write_attr(&file, "format_version", format::FORMAT_VERSION)?;
    h5::write_attr(&file, "num_parts", meta.num_parts as u64)?;
    h5::write_attr(&file, "num_nodes", meta.num_nodes())?;
    h5::write_attr(&file, "num_edges", meta.num_edges)?;
    h5::write_attr(&file, "edge_cut", meta.edge_cut)?;
    h5::write_attr(&file, "seconds", meta.seconds)?;
    h5::write_str_attr(&file, "name", &meta.name)?;
    h5::write_str_attr(&file, "method", &meta.method)?;
    h5::write_str_attr(&file, "weights", &meta.weights)?;
    h5::write_vec(&file, "offsets", &meta.offsets)?;
    h5::write_vec(&file, "orig_id", &meta.orig_id)?;
    Ok(())
}

/// What ties a partition directory together: the content id of the dataset it was made from
/// (what a checkpoint and the ranks compare, the same as training on that file) and the content
/// id of every part file (what `read_part` checks a part against). Both are absent from
/// partitions of older builds, which are then not checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Identity {
    pub source_id: Option<u64>,
    pub part_ids: Option<Vec<u64>>,
}

/// Add `id` to `dir/meta.h5` (written by [`write_meta`]).
pub fn write_identity(dir: &Path, id: &Identity) -> Result<()> {
    let path = dir.join(META_FILE);
    let file =
        hdf5::File::append(&path).with_context(|| format!("cannot reopen `{}`", path.display()))?;
    if let Some(s) = id.source_id {
        h5::write_attr(&file, "source_id", s)?;
    }
    if let Some(p) = &id.part_ids {
        h5::write_vec(&file, "part_ids", p)?;
    }
    Ok(())
}

/// Read the [`Identity`] of `dir` (attributes and one small dataset of `meta.h5`: cheap).
pub fn read_identity(dir: &Path) -> Result<Identity> {
    let path = dir.join(META_FILE);
    let file = h5::open(&path)?;
    (|| -> Result<Identity> {
        Ok(Identity {
            source_id: match h5::has_attr(&file, "source_id") {
                true => Some(h5::read_attr(&file, "source_id")?),
                false => None,
            },
            part_ids: match h5::has(&file, "part_ids") {
                true => Some(h5::read_vec(&file, "part_ids")?),
                false => None,
            },
        })
    })()
    .with_context(|| format!("reading `{}`", path.display()))
}

/// Read and check `dir/meta.h5`.
pub fn read_meta(dir: &Path) -> Result<PartitionMeta> {
    let path = dir.join(META_FILE);
    let file = h5::open(&path)?;
    let fname = path.display().to_string();
    (|| -> Result<PartitionMeta> {
        let version: u32 = h5::read_attr(&file, "format_version")?;
        if version != format::FORMAT_VERSION {
            bail!(
                "unknown `format_version` {version} (this gnnpar reads version {})",
                format::FORMAT_VERSION
            );
        }
        let num_parts = h5::read_attr::<u64>(&file, "num_parts")? as usize;
        let offsets = h5::read_vec::<u64>(&file, "offsets")?;
        if num_parts == 0 || offsets.len() != num_parts + 1 {
            bail!(
                "`offsets` has {} entries, expected `num_parts` + 1 = {}",
                offsets.len(),
                num_parts + 1
            );
        }
        if offsets[0] != 0 || offsets.windows(2).any(|w| w[1] < w[0]) {
            bail!("`offsets` must start at 0 and never decrease: {offsets:?}");
        }
        let orig_id = h5::read_vec::<u64>(&file, "orig_id")?;
        if orig_id.len() as u64 != offsets[num_parts] {
            bail!(
                "`orig_id` has {} entries, expected one per vertex ({})",
                orig_id.len(),
                offsets[num_parts]
            );
        }
        // A permutation of the dataset's ids: sampling keys on them (the same draws whatever
        // the partition) and `export` maps rows back through them.
        let mut seen = vec![false; orig_id.len()];
        for (new, &old) in orig_id.iter().enumerate() {
            match seen.get_mut(old as usize) {
                None => bail!(
                    "`orig_id[{new}]` = {old} is not a vertex id (the graph has {} vertices)",
                    orig_id.len()
                ),
                Some(s) if *s => {
                    let first = orig_id.iter().position(|&o| o == old).expect("seen before");
                    bail!(
                        "`orig_id[{new}]` = {old} is listed twice (also `orig_id[{first}]`); \
                         `orig_id` must name every vertex once"
                    )
                }
                Some(s) => *s = true,
            }
        }
        Ok(PartitionMeta {
            name: h5::read_str_attr_or(&file, "name", "")?,
            num_parts,
            offsets,
            orig_id,
            method: h5::read_str_attr(&file, "method")?,
            weights: h5::read_str_attr_or(&file, "weights", "none")?,
            edge_cut: h5::read_attr(&file, "edge_cut")?,
            num_edges: h5::read_attr(&file, "num_edges")?,
            seconds: h5::read_attr_or(&file, "seconds", 0.0)?,
        })
    })()
    .with_context(|| format!("reading `{fname}`"))
}

/// Read part `p` of `dir` and check that it holds exactly the ids `meta` gives it.
pub fn read_part(dir: &Path, meta: &PartitionMeta, p: usize) -> Result<Dataset> {
    if p >= meta.num_parts {
        bail!(
            "part {p} requested but `{}` has {} parts",
            dir.display(),
            meta.num_parts
        );
    }
    let path = part_path(dir, p);
    // A part copied in from another partitioning (another seed or method, another graph) can
    // cover the same vertex range: only the content ids tell it apart.
    if let Some(expected) = read_identity(dir)?.part_ids {
        let Some(&want) = expected.get(p) else {
            bail!(
                "`{}`: `part_ids` has {} entries, expected one per part ({})",
                dir.join(META_FILE).display(),
                expected.len(),
                meta.num_parts
            );
        };
        let found = format::read_header(&path)?.content_id;
        if found != Some(want) {
            bail!(
                "`{}` is not part {p} of the partition in `{}`: its content id is {}, `meta.h5` \
                 expects {want:016x}. Was it copied from another partitioning (another seed, \
                 method or dataset)? Copy the whole directory, or partition again",
                path.display(),
                dir.display(),
                found.map_or("absent".to_string(), |f| format!("{f:016x}"))
            );
        }
    }
    let ds = format::read_dataset(&path)?;
    let (lo, hi) = (meta.offsets[p], meta.offsets[p + 1]);
    if ds.first_node != lo || ds.first_node + ds.local_nodes() as u64 != hi {
        bail!(
            "`{}` holds vertices {}..{} but `meta.h5` assigns {lo}..{hi} to part {p}",
            path.display(),
            ds.first_node,
            ds.first_node + ds.local_nodes() as u64
        );
    }
    if ds.num_nodes != meta.num_nodes() {
        bail!(
            "`{}`: `num_nodes` = {} but `meta.h5` has {}",
            path.display(),
            ds.num_nodes,
            meta.num_nodes()
        );
    }
    Ok(ds)
}
