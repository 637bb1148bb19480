//! The versioned HDF5 dataset format (v1), shared by `dataset.h5` and `parts/part-*.h5`.
//!
//! Attributes: `format_version` (u32), `num_nodes` (u64, whole graph), `first_node` (u64),
//! `num_edges` (u64, edges stored in this file), `num_classes` (u64), `directed` (u8), `name`.
//! Datasets: `indptr` (u64, local rows + 1), `indices` (u32, global ids), optional `features`
//! (f32, rows × d, chunked by rows) and `labels` (i64, rows, or rows × c for multi-label),
//! `train_idx` / `val_idx` / `test_idx` (u64, global ids). See `docs/format.md`.

use super::{Csr, Dataset, Labels, NodeId, Splits};
use crate::util::{atomic::AtomicOutput, h5};
use anyhow::{bail, Context, Result};
use ndarray::Array2;
use std::ops::Range;
use std::path::Path;

/// The format version this build writes and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Write `ds` to `path` atomically (temporary name, then rename).
pub fn write_dataset(ds: &Dataset, path: &Path) -> Result<()> {
    let out = AtomicOutput::new(path)?;
    write_dataset_to(ds, out.tmp_path())
        .with_context(|| format!("writing `{}`", path.display()))?;
    out.commit()
}

/// Write `ds` to `path` directly (callers handle atomicity, e.g. inside a temporary directory).
/// Returns the content id it recorded ([`crate::graph::identity::content_id`]).
pub fn write_dataset_to(ds: &Dataset, path: &Path) -> Result<u64> {
    let content_id = crate::graph::identity::content_id(ds);
    let file = h5::create(path)?;
    h5::write_attr(&file, "content_id", content_id)?;
    h5::write_attr(&file, "format_version", FORMAT_VERSION)?;
    h5::write_attr(&file, "num_nodes", ds.num_nodes)?;
    h5::write_attr(&file, "first_node", ds.first_node)?;
    h5::write_attr(&file, "num_edges", ds.local_edges())?;
    h5::write_attr(&file, "num_classes", ds.num_classes as u64)?;
    h5::write_attr(&file, "directed", ds.directed as u8)?;
    h5::write_str_attr(&file, "name", &ds.name)?;
    h5::write_vec(&file, "indptr", &ds.graph.indptr)?;
    h5::write_vec(&file, "indices", &ds.graph.indices)?;
    if let Some(f) = &ds.features {
        h5::write_matrix(&file, "features", f.view())?;
    }
    match &ds.labels {
        Some(Labels::Class(l)) => h5::write_vec(&file, "labels", l)?,
        Some(Labels::Multi(m)) => h5::write_matrix(&file, "labels", m.view())?,
        None => {}
    }
    for (name, ids) in split_fields(&ds.splits) {
        let wide: Vec<u64> = ids.iter().map(|&v| v as u64).collect();
        h5::write_vec(&file, name, &wide)?;
    }
    file.flush().context("flushing HDF5 file")?;
    Ok(content_id)
}

fn split_fields(s: &Splits) -> [(&'static str, &Vec<NodeId>); 3] {
    [
        ("train_idx", &s.train),
        ("val_idx", &s.val),
        ("test_idx", &s.test),
    ]
}

/// Header of a dataset file: what `info` prints without reading the arrays.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub name: String,
    pub num_nodes: u64,
    pub first_node: u64,
    pub local_nodes: u64,
    pub num_edges: u64,
    pub num_classes: usize,
    pub feature_dim: usize,
    pub directed: bool,
    /// The content id written with the file (absent from files of older builds).
    pub content_id: Option<u64>,
}

impl Header {
    /// Refuse a part file (`path`, read into this header) where a command needs the whole
    /// graph: its rows are a range of the vertices, and code that indexes rows by vertex id
    /// would fail deep inside. `instead` says what to pass.
    pub fn require_whole(&self, path: &Path, instead: &str) -> Result<()> {
        if self.first_node != 0 || self.local_nodes != self.num_nodes {
            bail!(
                "`{}` holds vertices {}..{} of {}: it is one part of a partition directory; \
                 {instead}",
                path.display(),
                self.first_node,
                self.first_node + self.local_nodes,
                self.num_nodes
            );
        }
        Ok(())
    }
}

/// `result`, its error prefixed with "reading `path`" unless it already names the file (most
/// do, with the field: saying the path twice only makes the line longer).
fn naming_file<T>(result: Result<T>, path: &Path) -> Result<T> {
    result.map_err(|e| {
        let shown = path.display().to_string();
        if format!("{e:#}").contains(&format!("`{shown}`")) {
            e
        } else {
            e.context(format!("reading `{shown}`"))
        }
    })
}

/// Read and check the header of `path`.
pub fn read_header(path: &Path) -> Result<Header> {
    let file = h5::open(path)?;
    naming_file(header_of(&file), path)
}

fn header_of(file: &hdf5::File) -> Result<Header> {
    let version: u32 = h5::read_attr(file, "format_version")?;
    if version != FORMAT_VERSION {
        bail!(
            "`{}`: unknown `format_version` {version} (this gnnpar reads version {FORMAT_VERSION})",
            file.filename()
        );
    }
    let indptr_shape = h5::shape(file, "indptr")?;
    let local_nodes = indptr_shape.first().copied().unwrap_or(0).saturating_sub(1) as u64;
    let feature_dim = if h5::has(file, "features") {
        let s = h5::shape(file, "features")?;
        if s.len() != 2 {
            bail!(
                "`{}`: dataset `features` has shape {s:?}, expected rows × dims",
                file.filename()
            );
        }
        s[1]
    } else {
        0
    };
    Ok(Header {
        name: h5::read_str_attr_or(file, "name", "")?,
        num_nodes: h5::read_attr(file, "num_nodes")?,
        first_node: h5::read_attr_or(file, "first_node", 0)?,
        local_nodes,
        num_edges: h5::read_attr(file, "num_edges")?,
        num_classes: h5::read_attr::<u64>(file, "num_classes")? as usize,
        feature_dim,
        directed: match h5::read_attr_or::<u8>(file, "directed", 1)? {
            0 => false,
            1 => true,
            v => bail!(
                "`{}`: attribute `directed` is {v}, expected 0 (undirected: both directions \
                 stored) or 1 (directed)",
                file.filename()
            ),
        },
        content_id: match h5::has_attr(file, "content_id") {
            true => Some(h5::read_attr(file, "content_id")?),
            false => None,
        },
    })
}

/// Read `path` and validate every field; errors name the file and the field.
pub fn read_dataset(path: &Path) -> Result<Dataset> {
    let file = h5::open(path)?;
    naming_file(read_from(&file, None), path)
}

/// Read `path` like [`read_dataset`], but only columns `cols` of `features`: what a rank of a
/// feature-sliced strategy (NFP, SliceGCN) holds. The slice is an HDF5 hyperslab of the one
/// `features` dataset, so the file needs no per-slice layout and any slicing of any file works;
/// the rows' chunks are still read from disk whole (chunked by rows), but only the slice is
/// kept, so a rank's memory falls with the slice width (`docs/format.md`, "Column slices").
/// An empty range is allowed (a rank whose slice is empty holds a rows × 0 matrix).
pub fn read_dataset_columns(path: &Path, cols: Range<usize>) -> Result<Dataset> {
    let file = h5::open(path)?;
    naming_file(read_from(&file, Some(cols)), path)
}

/// Only columns `cols` of a whole dataset file's `features` (checked as
/// [`read_dataset_columns`] checks them), for a rank that already holds the rest of the file.
pub fn read_feature_columns(path: &Path, cols: Range<usize>) -> Result<Array2<f32>> {
    let file = h5::open(path)?;
    let read = || {
        let header = header_of(&file)?;
        if !h5::has(&file, "features") {
            bail!("`{}`: no `features`", file.filename());
        }
        read_features(&file, &header, header.num_nodes as usize, Some(&cols))
    };
    naming_file(read(), path)
}

/// `features` of `file` (columns `cols` only, when given), checked: one row per vertex of the
/// file (`rows`), every value finite, the columns within `feature_dim`.
fn read_features(
    file: &hdf5::File,
    header: &Header,
    rows: usize,
    cols: Option<&Range<usize>>,
) -> Result<Array2<f32>> {
    let fname = file.filename();
    let f = match cols {
        None => h5::read_matrix::<f32>(file, "features")?,
        Some(c) => {
            let dim = header.feature_dim;
            if c.start > c.end || c.end > dim {
                bail!(
                    "`{fname}`: columns {}..{} of `features` requested, but it has {dim}",
                    c.start,
                    c.end
                );
            }
            h5::read_matrix_columns::<f32>(file, "features", c.clone())?
        }
    };
    let first_col = cols.map_or(0, |c| c.start);
    if f.nrows() != rows {
        bail!(
            "`{fname}`: `features` has {} rows, expected {rows} (one per vertex)",
            f.nrows()
        );
    }
    if let Some((i, v)) = f.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        bail!(
            "`{fname}`: `features` row {} column {} is {v} (features must be finite)",
            i / f.ncols().max(1),
            first_col + i % f.ncols().max(1)
        );
    }
    Ok(f)
}

fn read_from(file: &hdf5::File, cols: Option<Range<usize>>) -> Result<Dataset> {
    let fname = file.filename();
    let header = header_of(file)?;
    if header.num_nodes > u32::MAX as u64 {
        bail!(
            "`{fname}`: `num_nodes` = {} exceeds the 2^32 vertices gnnpar supports",
            header.num_nodes
        );
    }
    let graph = Csr {
        indptr: h5::read_vec::<u64>(file, "indptr")?,
        indices: h5::read_ids_u32(file, "indices")?,
    };
    let what = format!("`{fname}`");
    graph.validate(header.num_nodes, &what)?;
    if graph.num_edges() != header.num_edges {
        bail!(
            "`{fname}`: attribute `num_edges` is {} but `indices` has {} entries",
            header.num_edges,
            graph.num_edges()
        );
    }
    let rows = graph.num_rows();
    if header.first_node + rows as u64 > header.num_nodes {
        bail!(
            "`{fname}`: rows {}..{} exceed `num_nodes` = {}",
            header.first_node,
            header.first_node + rows as u64,
            header.num_nodes
        );
    }
    let features = if h5::has(file, "features") {
        Some(read_features(file, &header, rows, cols.as_ref())?)
    } else {
        None
    };
    // A class per vertex at the most (the file's `n × C` matrix bounds C for multi-label
    // labels): an absurd `num_classes` would make `train` abort allocating C-wide arrays.
    let multi_label = h5::has(file, "labels") && h5::shape(file, "labels")?.len() == 2;
    if !multi_label && header.num_classes as u64 > header.num_nodes {
        bail!(
            "`{fname}`: attribute `num_classes` is {}, more than the {} vertices (`num_nodes`); \
             a graph has at most one class per vertex",
            header.num_classes,
            header.num_nodes
        );
    }
    let labels = if h5::has(file, "labels") {
        Some(read_labels(file, rows, header.num_classes)?)
    } else {
        None
    };
    let mut splits = Splits::default();
    let owned = header.first_node..header.first_node + rows as u64;
    for (name, slot) in [
        ("train_idx", &mut splits.train),
        ("val_idx", &mut splits.val),
        ("test_idx", &mut splits.test),
    ] {
        if !h5::has(file, name) {
            continue;
        }
        let ids = h5::read_vec::<u64>(file, name)?;
        if let Some((i, v)) = ids.iter().enumerate().find(|(_, v)| !owned.contains(v)) {
            bail!(
                "`{fname}`: `{name}[{i}]` = {v} is outside the vertices held here ({}..{})",
                owned.start,
                owned.end
            );
        }
        // A vertex listed twice would seed twice an epoch and count twice in the metric.
        let mut seen = vec![false; rows];
        for (i, &v) in ids.iter().enumerate() {
            let at = (v - owned.start) as usize;
            if std::mem::replace(&mut seen[at], true) {
                let first = ids.iter().position(|&u| u == v).expect("seen before");
                bail!("`{fname}`: `{name}[{i}]` = {v} is listed twice (also `{name}[{first}]`)");
            }
        }
        *slot = ids.into_iter().map(|v| v as NodeId).collect();
    }
    Ok(Dataset {
        name: header.name,
        num_nodes: header.num_nodes,
        first_node: header.first_node,
        graph,
        features,
        labels,
        num_classes: header.num_classes,
        splits,
        directed: header.directed,
    })
}

fn read_labels(file: &hdf5::File, rows: usize, classes: usize) -> Result<Labels> {
    let fname = file.filename();
    let shape = h5::shape(file, "labels")?;
    let labels = match shape.len() {
        1 => Labels::Class(h5::read_vec::<i64>(file, "labels")?),
        2 => Labels::Multi(h5::read_matrix::<i64>(file, "labels")?),
        _ => bail!("`{fname}`: `labels` has shape {shape:?}, expected n or n × classes"),
    };
    if labels.len() != rows {
        bail!(
            "`{fname}`: `labels` has {} rows, expected {rows} (one per vertex)",
            labels.len()
        );
    }
    match &labels {
        Labels::Class(l) => {
            if let Some((i, v)) = l
                .iter()
                .enumerate()
                .find(|(_, &v)| v < 0 || v as usize >= classes)
            {
                bail!("`{fname}`: `labels[{i}]` = {v} is outside [0, {classes}) (`num_classes`)");
            }
        }
        Labels::Multi(m) => {
            if m.ncols() != classes {
                bail!(
                    "`{fname}`: multi-label `labels` has {} columns but `num_classes` is {classes}",
                    m.ncols()
                );
            }
            if let Some(v) = m.iter().find(|&&v| v != 0 && v != 1) {
                bail!("`{fname}`: multi-label `labels` holds {v}; expected 0 or 1");
            }
        }
    }
    Ok(labels)
}
