//! OGB node-property-prediction raw directories (`<dir>/raw/` or `<dir>` itself):
//!
//! * `edge.csv.gz`: `src,dst` per line, no header (required);
//! * `num-node-list.csv.gz`: the vertex count (optional; else taken from the features, the
//!   labels, or the largest edge id);
//! * `node-feat.csv.gz`: one row of features per vertex, in id order (optional);
//! * `node-label.csv.gz`: one label per vertex (one column: a class; several: 0/1 multi-label);
//! * `split/<name>/{train,valid,test}.csv.gz`: one vertex id per line (optional), beside `raw/`
//!   as OGB downloads have it (`<dir>/split/`), or else inside the raw directory.
//!
//! OGB graphs such as ogbn-arxiv are directed: edges are kept as written unless `--symmetrize`.

use super::edges::{build_csr, EdgeList};
use super::node_table::{parse_id, FeatureTable};
use super::text::{self, Delim, TextFile};
use super::{check_node_count, ImportOptions};
use crate::graph::{Dataset, Labels, NodeId, Splits};
use anyhow::{bail, Context, Result};
use ndarray::Array2;
use std::path::{Path, PathBuf};

/// The directory holding `edge.csv.gz`: `dir/raw` or `dir`.
pub fn raw_dir(dir: &Path) -> Result<PathBuf> {
    for candidate in [dir.join("raw"), dir.to_path_buf()] {
        if candidate.join("edge.csv.gz").is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "`{}` is not an OGB raw directory: no `edge.csv.gz` in it or in its `raw/`",
        dir.display()
    )
}

/// Import an OGB raw directory.
pub fn import(dir: &Path, opts: &ImportOptions) -> Result<Dataset> {
    let raw = raw_dir(dir)?;
    let optional = |name: &str| Some(raw.join(name)).filter(|p| p.is_file());

    let declared = match optional("num-node-list.csv.gz") {
        Some(p) => Some(read_node_count(&p)?),
        None => None,
    };
    let features = match optional("node-feat.csv.gz") {
        Some(p) => Some(FeatureTable::read(&p, false)?),
        None => None,
    };
    let labels = match optional("node-label.csv.gz") {
        Some(p) => Some(read_labels(&p)?),
        None => None,
    };
    let known = declared
        .or(features.as_ref().map(|f| f.rows() as u64))
        .or(labels.as_ref().map(|l| l.rows() as u64));
    let edge_path = raw.join("edge.csv.gz");
    let edges = read_edges(&edge_path, known)?;
    let num_nodes = known.unwrap_or_else(|| edges.max_id().map_or(0, |m| m as u64 + 1));
    check_node_count(num_nodes, &format!("`{}`", raw.display()))?;
    if known.is_none() {
        // The vertex count comes from the largest edge id: refuse a stray huge one before
        // allocating the per-vertex arrays (row pointers and cursors, split: about 20 bytes).
        crate::util::rss::check_available(num_nodes.saturating_mul(20), || {
            format!(
                "`{}`: the largest vertex id is {} and no `num-node-list.csv.gz` gives the \
                 vertex count, so the graph gets {num_nodes} vertices; importing it",
                edge_path.display(),
                num_nodes - 1
            )
        })?;
    }
    let num_nodes = num_nodes as usize;

    let features = match features {
        Some(t) => Some(t.into_matrix(num_nodes)?),
        None => None,
    };
    let (labels, num_classes) = match labels {
        Some(rows) => {
            let (labels, classes) = labels_to_dataset(rows, num_nodes)?;
            (Some(labels), classes)
        }
        None => (None, 0),
    };
    let splits = read_splits(&raw, num_nodes, opts)?;
    let graph = build_csr(num_nodes, edges, opts.edges);
    Ok(Dataset {
        name: opts.dataset_name(dir),
        num_nodes: num_nodes as u64,
        first_node: 0,
        graph,
        features,
        labels,
        num_classes,
        splits,
        directed: !opts.edges.symmetrize,
    })
}

fn read_node_count(path: &Path) -> Result<u64> {
    let mut tf = TextFile::open(path)?;
    if !tf.next_line()? {
        bail!("`{}` is empty, expected the number of vertices", tf.name);
    }
    let mut count = 0;
    text::for_each_field(tf.line(), Delim::Comma, |col, field| {
        if col == 1 {
            count = text::parse_u64(field, tf.at(col), "vertex count")?;
        }
        Ok(())
    })?;
    if tf.next_line()? {
        bail!(
            "`{}` line {}: more than one graph listed; gnnpar imports single-graph datasets",
            tf.name,
            tf.line_no
        );
    }
    Ok(count)
}

fn read_edges(path: &Path, num_nodes: Option<u64>) -> Result<EdgeList> {
    let mut tf = TextFile::open(path)?;
    let mut edges = EdgeList::default();
    while tf.next_line()? {
        let (mut s, mut t, mut fields) = (0 as NodeId, 0 as NodeId, 0);
        text::for_each_field(tf.line(), Delim::Comma, |col, field| {
            fields = col;
            if col <= 2 {
                let v = parse_id(field, tf.at(col))?;
                if let Some(n) = num_nodes {
                    if v as u64 >= n {
                        bail!(
                            "{}: vertex id {v} is out of range (the graph has {n} vertices)",
                            tf.at(col)
                        );
                    }
                }
                if col == 1 {
                    s = v
                } else {
                    t = v
                }
            }
            Ok(())
        })?;
        if fields != 2 {
            bail!(
                "`{}` line {}: {fields} field(s), expected `src,dst`",
                tf.name,
                tf.line_no
            );
        }
        edges.push(s, t);
    }
    tf.finish();
    Ok(edges)
}

/// Labels in file order, row-major: `width` values per vertex (1: a class; more: 0/1
/// multi-label), and the file's name for later messages.
struct LabelRows {
    values: Vec<i64>,
    width: usize,
    file: String,
}

impl LabelRows {
    fn rows(&self) -> usize {
        self.values.len() / self.width.max(1)
    }
}

fn read_labels(path: &Path) -> Result<LabelRows> {
    let mut tf = TextFile::open(path)?;
    let mut values: Vec<i64> = Vec::new();
    let mut width = 0;
    while tf.next_line()? {
        let before = values.len();
        text::for_each_field(tf.line(), Delim::Comma, |col, field| {
            values.push(text::parse_label(field, tf.at(col))?);
            Ok(())
        })?;
        let got = values.len() - before;
        if width == 0 {
            width = got;
        } else if got != width {
            bail!(
                "`{}` line {}: {got} label column(s), expected {width} like the first line",
                tf.name,
                tf.line_no
            );
        }
    }
    let file = tf.name.clone();
    tf.finish();
    Ok(LabelRows {
        values,
        width,
        file,
    })
}

fn labels_to_dataset(rows: LabelRows, num_nodes: usize) -> Result<(Labels, usize)> {
    let LabelRows {
        values,
        width,
        file,
    } = rows;
    let count = values.len() / width.max(1);
    if count != num_nodes {
        bail!("`{file}` has {count} label rows, expected one per vertex ({num_nodes})");
    }
    if width <= 1 {
        let classes = super::class_count(&values, num_nodes, |i| format!("`{file}` row {i}"))?;
        return Ok((Labels::Class(values), classes));
    }
    if let Some(i) = values.iter().position(|&v| v > 1) {
        bail!(
            "`{file}` row {} column {}: multi-label rows must hold 0 or 1, found {}",
            i / width,
            i % width + 1,
            values[i]
        );
    }
    let m = Array2::from_shape_vec((num_nodes, width), values)
        .with_context(|| format!("`{file}`: cannot shape the labels"))?;
    Ok((Labels::Multi(m), width))
}

/// Where `split/` may be, first found first: beside `raw/` (an OGB download:
/// `<name>/raw/edge.csv.gz`, `<name>/split/<split>/…`), then inside the raw directory.
fn split_candidates(raw: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if raw.file_name().is_some_and(|n| n == "raw") {
        if let Some(root) = raw.parent() {
            out.push(root.join("split"));
        }
    }
    out.push(raw.join("split"));
    out
}

fn read_splits(raw: &Path, num_nodes: usize, opts: &ImportOptions) -> Result<Splits> {
    let candidates = split_candidates(raw);
    let Some(split_root) = candidates.iter().find(|p| p.is_dir()).cloned() else {
        let searched = candidates
            .iter()
            .map(|p| format!("`{}`", p.display()))
            .collect::<Vec<_>>()
            .join(" and ");
        if opts.split_name.is_some() {
            bail!("--split-name was given but there is no split directory (looked for {searched})");
        }
        log::info!("no split directory (looked for {searched}): drawing a random split");
        return opts.random_split(num_nodes);
    };
    log::info!("reading the split from `{}`", split_root.display());
    let mut names: Vec<String> = std::fs::read_dir(&split_root)
        .with_context(|| format!("cannot list `{}`", split_root.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let name = match (&opts.split_name, names.len()) {
        (Some(n), _) if names.contains(n) => n.clone(),
        (Some(n), _) => bail!(
            "--split-name `{n}`: no such directory in `{}` (found: {})",
            split_root.display(),
            names.join(", ")
        ),
        (None, 1) => names[0].clone(),
        (None, 0) => bail!("`{}` holds no split directory", split_root.display()),
        (None, _) => bail!(
            "`{}` holds several splits ({}); choose one with --split-name",
            split_root.display(),
            names.join(", ")
        ),
    };
    let dir = split_root.join(&name);
    opts.refuse_fractions(&dir.display().to_string())?;
    let read = |file: &str| read_id_list(&dir.join(file), num_nodes);
    let splits = Splits {
        train: read("train.csv.gz")?,
        val: read("valid.csv.gz")?,
        test: read("test.csv.gz")?,
    };
    if splits.train.is_empty() {
        bail!(
            "`{}` is empty (empty training split)",
            dir.join("train.csv.gz").display()
        );
    }
    Ok(splits)
}

/// A list of vertex ids, one per line, checked against `num_nodes`; returned sorted.
fn read_id_list(path: &Path, num_nodes: usize) -> Result<Vec<NodeId>> {
    if !path.is_file() {
        bail!("missing split file `{}`", path.display());
    }
    let mut tf = TextFile::open(path)?;
    let mut ids = Vec::new();
    while tf.next_line()? {
        let mut fields = 0;
        text::for_each_field(tf.line(), Delim::Comma, |col, field| {
            fields = col;
            if col == 1 {
                let v = parse_id(field, tf.at(col))?;
                if v as usize >= num_nodes {
                    bail!(
                        "{}: vertex id {v} is out of range (the graph has {num_nodes} vertices)",
                        tf.at(col)
                    );
                }
                ids.push(v);
            }
            Ok(())
        })?;
        if fields != 1 {
            bail!(
                "`{}` line {}: {fields} field(s), expected one vertex id",
                tf.name,
                tf.line_no
            );
        }
    }
    tf.finish();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    if ids.len() != before {
        log::warn!("`{}`: repeated vertex ids ignored", path.display());
    }
    Ok(ids)
}
