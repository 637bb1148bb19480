//! NumPy `.npz` datasets in the layout of `../shared/datasets/README.md`: a zip archive (stored
//! or deflated members) of `node_features` (N × F, stored as f32), `node_labels` (N integers),
//! `edges` (E × 2 integers, each undirected pair once) and `train_masks` / `val_masks` /
//! `test_masks` (S × N, or N for a single split).
//!
//! Each member may be of any dtype, byte order and memory order [`npy`] reads (features of any
//! numeric type or bool; labels and edges of any integer type, bool, or floats holding whole
//! numbers; masks of any type, non-zero meaning true). The vertex count N is the number of
//! rows of `node_features`; every other array is checked against it.

use super::edges::{build_csr, EdgeList, EdgeOptions};
use super::npy::{self, NpyArray};
use super::{split, ImportOptions};
use crate::graph::{Dataset, Labels, NodeId, Splits};
use anyhow::{bail, Context, Result};
use ndarray::Array2;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use zip::ZipArchive;

/// An open `.npz` archive whose members are read on demand.
pub struct Npz {
    name: String,
    archive: ZipArchive<File>,
}

impl Npz {
    /// Open `path` as a zip archive.
    pub fn open(path: &Path) -> Result<Self> {
        let name = path.display().to_string();
        if path.is_dir() {
            bail!("`{name}` is a directory, expected an .npz file");
        }
        let file = File::open(path).with_context(|| format!("cannot open `{name}`"))?;
        let archive = ZipArchive::new(file).with_context(|| {
            format!("`{name}` is not a valid .npz file (not a zip archive, or truncated)")
        })?;
        Ok(Npz { name, archive })
    }

    /// The array names in the archive (member names without `.npy`), in archive order.
    pub fn keys(&self) -> Vec<String> {
        self.archive
            .file_names()
            .map(|n| n.strip_suffix(".npy").unwrap_or(n).to_string())
            .collect()
    }

    /// Does the archive hold array `key`?
    pub fn has(&self, key: &str) -> bool {
        self.archive.index_for_name(&format!("{key}.npy")).is_some()
    }

    /// Read and parse array `key`.
    pub fn array(&mut self, key: &str) -> Result<NpyArray> {
        let member = format!("{key}.npy");
        let what = format!("`{}`: array `{key}`", self.name);
        let Some(index) = self.archive.index_for_name(&member) else {
            bail!(
                "`{}`: missing array `{key}` (the archive holds: {})",
                self.name,
                self.keys().join(", ")
            );
        };
        let mut entry = self
            .archive
            .by_index(index)
            .with_context(|| format!("{what}: cannot open the zip member"))?;
        // The declared size is only a hint: a corrupt header must not trigger a huge allocation.
        let mut bytes = Vec::with_capacity(entry.size().min(1 << 30) as usize);
        entry
            .read_to_end(&mut bytes)
            .with_context(|| format!("{what}: cannot decompress the zip member (corrupt?)"))?;
        npy::parse(bytes, &what)
    }

    /// The path as given, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }
}

const REQUIRED: [&str; 3] = ["node_features", "node_labels", "edges"];
const MASKS: [&str; 3] = ["train_masks", "val_masks", "test_masks"];

/// Import an npz dataset: every edge is added in both directions (`directed = false`).
pub fn import(path: &Path, opts: &ImportOptions) -> Result<Dataset> {
    let mut npz = Npz::open(path)?;
    let fname = npz.name().to_string();
    for key in REQUIRED {
        if !npz.has(key) {
            bail!(
                "`{fname}`: missing array `{key}` (expected {}, and {}; the archive holds: {})",
                REQUIRED.join(", "),
                MASKS.join(", "),
                npz.keys().join(", ")
            );
        }
    }
    for key in npz.keys() {
        if !REQUIRED.contains(&key.as_str()) && !MASKS.contains(&key.as_str()) {
            log::warn!("`{fname}`: ignoring array `{key}`");
        }
    }

    let features = read_features(&mut npz, &fname)?;
    let num_nodes = features.nrows();
    let labels = read_labels(&mut npz, num_nodes)?;
    let edges = read_edges(&mut npz, num_nodes)?;
    let splits = read_splits(&mut npz, num_nodes, opts)?;

    let graph = build_csr(
        num_nodes,
        edges,
        EdgeOptions {
            symmetrize: true,
            self_loops: opts.edges.self_loops,
        },
    );
    let num_classes = super::class_count(&labels, num_nodes, |i| {
        format!("`{fname}`: array `node_labels` entry {i}")
    })?;
    Ok(Dataset {
        name: opts.dataset_name(path),
        num_nodes: num_nodes as u64,
        first_node: 0,
        graph,
        features: Some(features),
        labels: Some(Labels::Class(labels)),
        num_classes,
        splits,
        directed: false,
    })
}

/// The labels, one per vertex: `num_nodes` of them.
fn read_labels(npz: &mut Npz, num_nodes: usize) -> Result<Vec<i64>> {
    let arr = npz.array("node_labels")?;
    if arr.shape.len() != 1 {
        bail!(
            "{}: shape {:?}, expected one label per vertex (N = {num_nodes}, the rows of \
             `node_features`)",
            arr.what,
            arr.shape
        );
    }
    if arr.shape[0] != num_nodes {
        bail!(
            "{} has {} entries but `node_features` has {num_nodes} rows (one label per vertex)",
            arr.what,
            arr.shape[0]
        );
    }
    let labels = arr.to_i64()?;
    if let Some((i, v)) = labels.iter().enumerate().find(|(_, &v)| v < 0) {
        bail!(
            "{}: entry {i} is {v}; labels must be class ids in [0, C)",
            arr.what
        );
    }
    Ok(labels)
}

/// The features, N × F: their rows define the vertex count N.
fn read_features(npz: &mut Npz, fname: &str) -> Result<Array2<f32>> {
    let arr = npz.array("node_features")?;
    let [num_nodes, cols] = arr.shape[..] else {
        bail!(
            "{}: shape {:?}, expected N × F (one row of F features per vertex)",
            arr.what,
            arr.shape
        );
    };
    super::check_node_count(num_nodes as u64, &format!("`{fname}`"))?;
    let values = arr.to_f32()?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        bail!(
            "{}: row {} column {} is {} (features must be finite)",
            arr.what,
            i / cols,
            i % cols,
            values[i]
        );
    }
    Array2::from_shape_vec((num_nodes, cols), values)
        .with_context(|| format!("{}: cannot shape the features", arr.what))
}

fn read_edges(npz: &mut Npz, num_nodes: usize) -> Result<EdgeList> {
    let arr = npz.array("edges")?;
    if arr.shape.len() != 2 || arr.shape[1] != 2 {
        bail!(
            "{}: shape {:?}, expected E × 2 (one undirected pair per row)",
            arr.what,
            arr.shape
        );
    }
    let flat = arr.to_i64()?;
    let mut edges = EdgeList::with_capacity(arr.shape[0]);
    for (row, pair) in flat.chunks_exact(2).enumerate() {
        let (s, d) = (pair[0], pair[1]);
        if s < 0 || d < 0 || s as u64 >= num_nodes as u64 || d as u64 >= num_nodes as u64 {
            bail!(
                "{}: row {row} is ({s}, {d}); vertex ids must be in [0, {num_nodes}) \
                 (`node_features` has {num_nodes} rows)",
                arr.what
            );
        }
        edges.push(s as NodeId, d as NodeId);
    }
    Ok(edges)
}

fn read_splits(npz: &mut Npz, num_nodes: usize, opts: &ImportOptions) -> Result<Splits> {
    let fname = npz.name().to_string();
    let present: Vec<&str> = MASKS.into_iter().filter(|k| npz.has(k)).collect();
    if present.is_empty() {
        if opts.split.is_some() {
            bail!("--split was given but `{fname}` has no `train_masks`");
        }
        log::info!("`{fname}` has no split masks: drawing a random split");
        return opts.random_split(num_nodes);
    }
    if let Some(missing) = MASKS.iter().find(|k| !present.contains(k)) {
        bail!(
            "`{fname}`: has `{}` but is missing array `{missing}`",
            present.join("`, `")
        );
    }
    opts.refuse_fractions(&fname)?;
    let k = opts.split.unwrap_or(0);
    let mut rows = Vec::with_capacity(3);
    for key in MASKS {
        let arr = npz.array(key)?;
        let (count, width) = match arr.shape[..] {
            [n] => (1, n),
            [s, n] => (s, n),
            _ => bail!(
                "{}: shape {:?}, expected S × N (S splits) or N",
                arr.what,
                arr.shape
            ),
        };
        if width != num_nodes {
            bail!(
                "{}: shape {:?}, expected S × N with N = {num_nodes} (the rows of `node_features`)",
                arr.what,
                arr.shape
            );
        }
        if k >= count {
            bail!(
                "--split {k} is out of range: {} holds S = {count} split(s), numbered from 0",
                arr.what
            );
        }
        let all = arr.to_bool()?;
        rows.push(split::ids_of(&all[k * num_nodes..(k + 1) * num_nodes]));
    }
    let test = rows.pop().expect("three masks");
    let val = rows.pop().expect("three masks");
    let train = rows.pop().expect("three masks");
    if train.is_empty() {
        bail!("`{fname}`: array `train_masks` row {k} has no true entry (empty training split)");
    }
    if val.is_empty() || test.is_empty() {
        log::warn!("`{fname}`: split {k} has an empty validation or test set");
    }
    Ok(Splits { train, val, test })
}
