//! Edge lists in text: one edge per line, `src dst` separated by a comma, a tab or blanks, an
//! optional header line, `#` / `%` comments. Columns past the second (weights, timestamps) are
//! ignored. Optional label and feature tables keyed by vertex id complete the dataset.

use super::edges::{build_csr, EdgeList};
use super::node_table::{parse_id, FeatureTable, LabelTable};
use super::text::{self, Delim, TextFile};
use super::{check_node_count, ImportOptions};
use crate::graph::{Dataset, Labels, NodeId, Splits};
use crate::util::rss;
use anyhow::{bail, Result};
use std::path::Path;

/// Read the edges of `path` in file order.
pub fn read_edges(path: &Path) -> Result<EdgeList> {
    Ok(read_edges_and_max(path)?.0)
}

/// The largest vertex id of an edge list and the line that names it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxId {
    pub id: NodeId,
    pub line: usize,
}

/// [`read_edges`], with the largest id and its line (for messages about the vertex count).
fn read_edges_and_max(path: &Path) -> Result<(EdgeList, Option<MaxId>)> {
    let mut tf = TextFile::open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    // About 12 bytes per line in typical files; a guess that saves most re-allocations.
    let mut edges = EdgeList::with_capacity((size / 12) as usize);
    let mut delim: Option<Delim> = None;
    let mut max: Option<MaxId> = None;
    while tf.next_line()? {
        let d = match delim {
            Some(d) => d,
            None => {
                let line = tf.line();
                let d = Delim::sniff(line);
                delim = Some(d);
                let first = text::fields(line, d);
                if !first
                    .first()
                    .is_some_and(|f| text::is_numeric(f.as_bytes()))
                {
                    log::info!("`{}`: header line {:?}", tf.name, first);
                    continue;
                }
                d
            }
        };
        let (mut s, mut t, mut fields) = (0, 0, 0);
        text::for_each_field(tf.line(), d, |col, field| {
            fields = col;
            match col {
                1 => s = parse_id(field, tf.at(col))?,
                2 => t = parse_id(field, tf.at(col))?,
                _ => {}
            }
            Ok(())
        })?;
        if fields < 2 {
            bail!(
                "`{}` line {}: {fields} field(s), expected two vertex ids (source, target)",
                tf.name,
                tf.line_no
            );
        }
        if max.is_none_or(|m| s.max(t) > m.id) {
            max = Some(MaxId {
                id: s.max(t),
                line: tf.line_no,
            });
        }
        edges.push(s, t);
    }
    let secs = tf.finish();
    log::info!(
        "`{}`: {} edges read in {secs:.2} s",
        path.display(),
        edges.len()
    );
    Ok((edges, max))
}

/// Bytes per vertex that importing an edge list allocates (CSR row pointers and their fill
/// cursors, 8 + 8; with `--symmetrize` the duplicate stamps, 4; with `--labels` the labels and
/// their lines, 8 + 8; the random split, 4), not counting the edges already read nor features.
fn bytes_per_vertex(opts: &ImportOptions) -> u64 {
    16 + if opts.edges.symmetrize { 4 } else { 0 } + if opts.labels.is_some() { 16 } else { 0 } + 4
}

/// Import an edge list (with `--labels` / `--features` tables when given).
///
/// The vertex count is one past the largest id named by the edges, the labels or the features.
/// Without `--symmetrize` the edges are directed as written.
pub fn import(path: &Path, opts: &ImportOptions) -> Result<Dataset> {
    let (edges, max) = read_edges_and_max(path)?;
    // The vertex count is the largest id + 1: one stray huge id (a typo, a hash used as an id)
    // makes every per-vertex array huge. Refuse it before allocating any of them.
    if let Some(m) = max {
        let n = m.id as u64 + 1;
        rss::check_available(n.saturating_mul(bytes_per_vertex(opts)), || {
            format!(
                "`{}` line {}: the largest vertex id is {} (vertex ids must be dense: the graph \
                 gets one vertex per id up to it, {n} vertices); importing it",
                path.display(),
                m.line,
                m.id
            )
        })?;
    }
    let labels = match &opts.labels {
        Some(p) => Some(LabelTable::read(p, opts.label_column.as_deref())?),
        None => None,
    };
    let features = match &opts.features {
        Some(p) => Some(FeatureTable::read(p, true)?),
        None => None,
    };
    let num_nodes = [
        edges.max_id().map_or(0, |m| m as u64 + 1),
        labels.as_ref().map_or(0, |l| l.labels.len() as u64),
        features.as_ref().map_or(0, |f| f.rows() as u64),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    check_node_count(num_nodes, &format!("`{}`", path.display()))?;
    // The tables may name a larger id than the edges did (they checked their own arrays).
    if edges.max_id().map_or(0, |m| m as u64 + 1) < num_nodes {
        rss::check_available(num_nodes.saturating_mul(bytes_per_vertex(opts)), || {
            format!(
                "the vertex tables name ids up to {} ({num_nodes} vertices, more than the edges \
                 of `{}` do); importing them",
                num_nodes - 1,
                path.display()
            )
        })?;
    }
    let num_nodes = num_nodes as usize;
    if num_nodes == 0 {
        bail!("`{}` holds no edge", path.display());
    }

    let (labels, num_classes) = match labels {
        Some(t) => {
            let (labels, classes) = t.into_labels(num_nodes)?;
            (Some(labels), classes)
        }
        None => (None, 0),
    };
    let features = match features {
        Some(t) => Some(t.into_matrix(num_nodes)?),
        None => None,
    };
    let splits = if labels.is_some() || opts.train_frac.is_some() || opts.val_frac.is_some() {
        opts.random_split(num_nodes)?
    } else {
        log::info!("no labels: no train/val/test split is written");
        Splits::default()
    };
    let graph = build_csr(num_nodes, edges, opts.edges);
    Ok(Dataset {
        name: opts.dataset_name(path),
        num_nodes: num_nodes as u64,
        first_node: 0,
        graph,
        features,
        labels: labels.map(Labels::Class),
        num_classes,
        splits,
        directed: !opts.edges.symmetrize,
    })
}
