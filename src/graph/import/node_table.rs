//! Per-vertex tables in text form: labels keyed by vertex id (`id,…,label`), features keyed by
//! vertex id (`id,f1,f2,…`) or by line order (OGB `node-feat.csv.gz`), and OGB label rows.
//!
//! Tables keyed by id may list vertices in any order; every vertex of the graph must appear
//! exactly once, so a missing or repeated id is an error naming the file (and the line).

use super::text::{self, At, Delim, TextFile};
use crate::graph::NodeId;
use anyhow::{bail, Result};
use ndarray::Array2;
use std::path::Path;

/// Marks a vertex without a row yet.
const UNSET: i64 = -1;

/// Labels read from a CSV keyed by vertex id, indexed by id (`-1`: no row for that id).
pub struct LabelTable {
    pub file: String,
    pub labels: Vec<i64>,
    /// `lines[v]`: the line of the label of `v`.
    lines: Vec<usize>,
}

impl LabelTable {
    /// Read `path`: the id is the first column, the label the column named `column` (needs a
    /// header) or else the last column.
    pub fn read(path: &Path, column: Option<&str>) -> Result<Self> {
        let mut tf = TextFile::open(path)?;
        let file = tf.name.clone();
        let mut labels: Vec<i64> = Vec::new();
        let mut first_line: Vec<usize> = Vec::new();
        let mut layout: Option<(Delim, usize)> = None;
        while tf.next_line()? {
            let (delim, label_col) = match layout {
                Some(l) => l,
                None => {
                    let line = tf.line();
                    let delim = Delim::sniff(line);
                    let names = text::fields(line, delim);
                    let header = !names
                        .first()
                        .is_some_and(|f| text::is_numeric(f.as_bytes()));
                    let label_col = match (column, header) {
                        (Some(want), true) => {
                            1 + names.iter().position(|n| n == want).ok_or_else(|| {
                                anyhow::anyhow!(
                                    "`{file}`: no column `{want}` in the header (columns: {})",
                                    names.join(", ")
                                )
                            })?
                        }
                        (Some(want), false) => bail!(
                            "`{file}` has no header line, so --label-column `{want}` cannot be found"
                        ),
                        (None, _) => names.len(),
                    };
                    if label_col < 2 {
                        bail!(
                            "`{file}` line {}: expected a vertex id column then a label column, found {} column(s)",
                            tf.line_no,
                            names.len()
                        );
                    }
                    layout = Some((delim, label_col));
                    if header {
                        continue;
                    }
                    (delim, label_col)
                }
            };
            let (mut id, mut label, mut seen) = (None, None, 0);
            text::for_each_field(tf.line(), delim, |col, field| {
                seen = col;
                if col == 1 {
                    id = Some(parse_id(field, tf.at(col))?);
                } else if col == label_col {
                    label = Some(text::parse_label(field, tf.at(col))?);
                }
                Ok(())
            })?;
            let (Some(id), Some(label)) = (id, label) else {
                bail!(
                    "`{file}` line {}: {seen} field(s), expected at least {label_col} (id … label)",
                    tf.line_no
                );
            };
            let v = id as usize;
            if v >= labels.len() {
                // A label and its line.
                check_growth(labels.len(), v, 16, || {
                    format!("`{file}` line {}", tf.line_no)
                })?;
                labels.resize(v + 1, UNSET);
                first_line.resize(v + 1, 0);
            }
            if labels[v] != UNSET {
                bail!(
                    "`{file}` line {}: vertex {v} already has a label (line {})",
                    tf.line_no,
                    first_line[v]
                );
            }
            labels[v] = label;
            first_line[v] = tf.line_no;
        }
        tf.finish();
        Ok(LabelTable {
            file,
            labels,
            lines: first_line,
        })
    }

    /// The labels of vertices `0..num_nodes` (every one must have a row) and the class count
    /// (largest label + 1, at most `num_nodes`).
    pub fn into_labels(mut self, num_nodes: usize) -> Result<(Vec<i64>, usize)> {
        self.labels.resize(num_nodes.max(self.labels.len()), UNSET);
        if let Some(v) = self.labels.iter().position(|&l| l == UNSET) {
            bail!(
                "`{}`: no label for vertex {v} (every vertex of the graph needs one; the graph has {num_nodes})",
                self.file
            );
        }
        let (file, lines) = (&self.file, &self.lines);
        let classes = super::class_count(&self.labels, num_nodes, |v| {
            format!("`{file}` line {} (vertex {v})", lines[v])
        })?;
        Ok((self.labels, classes))
    }
}

/// Feature rows read from a text table, row-major, with the vertex each row belongs to.
pub struct FeatureTable {
    pub file: String,
    pub dim: usize,
    /// `values[v * dim..(v + 1) * dim]` is the row of vertex `v`.
    pub values: Vec<f32>,
    /// `filled[v]`: line of the row of `v` (0: none yet).
    filled: Vec<usize>,
}

impl FeatureTable {
    /// Read `path`. With `keyed`, the first column is the vertex id; otherwise row `i` (counting
    /// data lines from 0) belongs to vertex `i`. A non-numeric first line is a header.
    pub fn read(path: &Path, keyed: bool) -> Result<Self> {
        let mut tf = TextFile::open(path)?;
        let file = tf.name.clone();
        let mut table = FeatureTable {
            file: file.clone(),
            dim: 0,
            values: Vec::new(),
            filled: Vec::new(),
        };
        let mut delim = None;
        let mut next_row: usize = 0;
        let mut row: Vec<f32> = Vec::new();
        let first_value_col = if keyed { 2 } else { 1 };
        while tf.next_line()? {
            let d = match delim {
                Some(d) => d,
                None => {
                    let line = tf.line();
                    let d = Delim::sniff(line);
                    delim = Some(d);
                    let names = text::fields(line, d);
                    table.dim = names.len().saturating_sub(first_value_col - 1);
                    if table.dim == 0 {
                        bail!(
                            "`{file}` line {}: expected a vertex id then feature columns",
                            tf.line_no
                        );
                    }
                    if !names.iter().all(|f| text::is_numeric(f.as_bytes())) {
                        continue; // a header
                    }
                    d
                }
            };
            let mut vertex = next_row;
            let mut fields = 0;
            row.clear();
            text::for_each_field(tf.line(), d, |col, field| {
                fields = col;
                if keyed && col == 1 {
                    vertex = parse_id(field, tf.at(col))? as usize;
                } else if col - first_value_col < table.dim {
                    row.push(text::parse_feature(field, tf.at(col))?);
                }
                Ok(())
            })?;
            let expected = table.dim + first_value_col - 1;
            if fields != expected {
                bail!(
                    "`{file}` line {}: {fields} field(s), expected {expected} ({})",
                    tf.line_no,
                    if keyed {
                        "vertex id then the features"
                    } else {
                        "one per feature"
                    }
                );
            }
            if vertex >= table.filled.len() {
                // The row and its line.
                let row_bytes = table.dim as u64 * 4 + 8;
                check_growth(table.filled.len(), vertex, row_bytes, || {
                    format!("`{file}` line {}", tf.line_no)
                })?;
            }
            table.place(&row, vertex, tf.line_no)?;
            next_row += 1;
        }
        tf.finish();
        Ok(table)
    }

    /// Store `row` as the features of `vertex`, read on line `line`.
    fn place(&mut self, row: &[f32], vertex: usize, line: usize) -> Result<()> {
        if vertex >= self.filled.len() {
            self.filled.resize(vertex + 1, 0);
            self.values.resize((vertex + 1) * self.dim, 0.0);
        }
        if self.filled[vertex] != 0 {
            bail!(
                "`{}` line {line}: vertex {vertex} already has a feature row (line {})",
                self.file,
                self.filled[vertex]
            );
        }
        self.filled[vertex] = line;
        self.values[vertex * self.dim..(vertex + 1) * self.dim].copy_from_slice(row);
        Ok(())
    }

    /// Number of rows read (one past the largest vertex id with a row).
    pub fn rows(&self) -> usize {
        self.filled.len()
    }

    /// The `num_nodes × dim` matrix; every vertex must have a row.
    pub fn into_matrix(self, num_nodes: usize) -> Result<Array2<f32>> {
        if let Some(v) = (0..num_nodes).find(|&v| self.filled.get(v).is_none_or(|&l| l == 0)) {
            bail!(
                "`{}`: no feature row for vertex {v} (every vertex of the graph needs one; the graph has {num_nodes})",
                self.file
            );
        }
        if self.filled.len() > num_nodes {
            bail!(
                "`{}`: feature row for vertex {} but the graph has {num_nodes} vertices",
                self.file,
                self.filled.len() - 1
            );
        }
        Array2::from_shape_vec((num_nodes, self.dim), self.values)
            .map_err(|e| anyhow::anyhow!("`{}`: cannot shape the features: {e}", self.file))
    }
}

/// Refuse growing a table of `rows` rows to hold vertex `v` (`row_bytes` a row) when that much
/// memory is not available: one stray huge id (a typo, a hash used as an id) would make the
/// table huge and abort the process in the allocation. Tables that grow a row at a time, as a
/// sorted file makes them, are not checked: their size follows the file's.
fn check_growth(rows: usize, v: usize, row_bytes: u64, at: impl FnOnce() -> String) -> Result<()> {
    let want = v as u64 + 1;
    if want > 2 * rows as u64 + (1 << 20) {
        crate::util::rss::check_available(want.saturating_mul(row_bytes), || {
            format!(
                "{}: vertex id {v} makes the table {want} rows (vertex ids must be dense: one row \
                 per id up to the largest); reading it",
                at()
            )
        })?;
    }
    Ok(())
}

/// Parse a vertex id that must fit a [`NodeId`].
pub fn parse_id(field: &[u8], at: At) -> Result<NodeId> {
    let v = text::parse_u64(field, at, "vertex id")?;
    if v >= NodeId::MAX as u64 {
        bail!("{at}: vertex id {v} is too large (gnnpar supports ids below 2^32 - 1)");
    }
    Ok(v as NodeId)
}
