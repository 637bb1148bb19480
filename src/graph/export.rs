//! Exporting a dataset's graph for other tools. For now one format: METIS' text graph, what
//! `gpmetis` and `ndmetis` read, so that gnnpar's partitioner can be compared with the METIS
//! command-line tools on the very same graph (`benchmarks/partition_vs_gpmetis.sh`).
//!
//! The METIS graph format (METIS manual, section 4.1.1): a header line `n m` with `n` vertices
//! and `m` *undirected* edges, then one line per vertex `v = 1..n` listing its neighbours as
//! 1-based ids separated by spaces (an isolated vertex has an empty line). METIS requires the
//! adjacency to be symmetric, without self-loops and without repeated neighbours.
//!
//! The undirected adjacency is built by [`crate::partition::symmetric::symmetrize`], the same
//! function that feeds gnnpar's own METIS call: the exported file is exactly the graph gnnpar
//! partitions, so the two partitioners' edge cuts are comparable.

use super::Csr;
use crate::partition::symmetric::{symmetrize, SymmetricGraph};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;

/// Rows formatted per parallel task: large enough to amortise the task, small enough that a
/// batch of them (below) keeps the text held in memory bounded.
const ROWS_PER_TASK: usize = 16_384;
/// Tasks formatted in parallel before their text is written out.
const TASKS_PER_BATCH: usize = 64;

/// What an export wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MetisExport {
    /// Vertices (`n` of the header).
    pub vertices: u64,
    /// Undirected edges once loops and repeats are dropped (`m` of the header).
    pub edges: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// The undirected, loop-free adjacency of a whole graph, as METIS needs it.
///
/// `directed` is the dataset's flag. A directed graph is refused unless `symmetrize` is set:
/// silently adding reverse edges would hand the other tool a different graph than the user
/// may think. `source` names the file in error messages.
pub fn metis_adjacency(
    graph: &Csr,
    directed: bool,
    symmetrize_directed: bool,
    source: &str,
) -> Result<SymmetricGraph> {
    if directed && !symmetrize_directed {
        bail!(
            "`{source}` holds a directed graph (attribute `directed` is true), but the METIS \
             graph format is undirected; pass --symmetrize to add the reverse of every edge"
        );
    }
    symmetrize(graph, None).with_context(|| format!("exporting `{source}` to the METIS format"))
}

/// Write `sym` in the METIS text format to `out`.
pub fn write_metis_text(sym: &SymmetricGraph, out: &mut impl Write) -> std::io::Result<u64> {
    let n = sym.num_nodes();
    let m = sym.adjncy.len() / 2;
    let header = format!("{n} {m}\n");
    out.write_all(header.as_bytes())?;
    let mut bytes = header.len() as u64;
    let batch_rows = ROWS_PER_TASK * TASKS_PER_BATCH;
    let mut first = 0usize;
    while first < n {
        let last = (first + batch_rows).min(n);
        let pieces: Vec<Vec<u8>> = (first..last)
            .step_by(ROWS_PER_TASK)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|from| format_rows(sym, from, (from + ROWS_PER_TASK).min(last)))
            .collect();
        for piece in &pieces {
            out.write_all(piece)?;
            bytes += piece.len() as u64;
        }
        first = last;
    }
    Ok(bytes)
}

/// The lines of vertices `from..to` (0-based), neighbours written 1-based.
fn format_rows(sym: &SymmetricGraph, from: usize, to: usize) -> Vec<u8> {
    let entries = (sym.xadj[to] - sym.xadj[from]) as usize;
    // About 8 bytes per neighbour (7 digits and a space) and a newline per row.
    let mut text = Vec::with_capacity(entries * 8 + (to - from));
    for v in from..to {
        let row = &sym.adjncy[sym.xadj[v] as usize..sym.xadj[v + 1] as usize];
        for (i, &u) in row.iter().enumerate() {
            if i > 0 {
                text.push(b' ');
            }
            push_decimal(&mut text, u as u64 + 1);
        }
        text.push(b'\n');
    }
    text
}

/// Append the decimal digits of `x` (no allocation: digits go through a stack buffer).
fn push_decimal(text: &mut Vec<u8>, mut x: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    text.extend_from_slice(&digits[i..]);
}

/// Export `graph` to `path` in the METIS format, atomically (a temporary file renamed into
/// place, so a failure leaves nothing behind).
pub fn export_metis(
    graph: &Csr,
    directed: bool,
    symmetrize_directed: bool,
    source: &str,
    path: &Path,
) -> Result<MetisExport> {
    let sym = metis_adjacency(graph, directed, symmetrize_directed, source)?;
    let output = crate::util::atomic::AtomicOutput::new(path)?;
    let file = std::fs::File::create(output.tmp_path())
        .with_context(|| format!("cannot create `{}`", output.tmp_path().display()))?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
    let bytes = write_metis_text(&sym, &mut writer)
        .and_then(|b| writer.flush().map(|_| b))
        .with_context(|| format!("writing `{}`", output.tmp_path().display()))?;
    output.commit()?;
    Ok(MetisExport {
        vertices: sym.num_nodes() as u64,
        edges: (sym.adjncy.len() / 2) as u64,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(graph: &Csr, directed: bool, symmetrize: bool) -> Result<String> {
        let sym = metis_adjacency(graph, directed, symmetrize, "test.h5")?;
        let mut out = Vec::new();
        write_metis_text(&sym, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn undirected_graph_in_metis_format() {
        // Triangle 0-1-2 stored both ways, a pendant 3 on 2, isolated 4, a self-loop on 1 and
        // a repeated edge 0-1: loops and repeats must not reach the file.
        let src = [0, 1, 1, 2, 0, 2, 2, 3, 1, 0, 1];
        let dst = [1, 0, 2, 1, 2, 0, 3, 2, 1, 1, 0];
        let graph = Csr::from_edges(5, &src, &dst);
        let text = text_of(&graph, false, false).unwrap();
        assert_eq!(text, "5 4\n2 3\n1 3\n1 2 4\n3\n\n");
    }

    #[test]
    fn directed_graph_needs_symmetrize() {
        let graph = Csr::from_edges(3, &[0, 1], &[1, 2]);
        let err = text_of(&graph, true, false).unwrap_err().to_string();
        assert!(
            err.contains("test.h5") && err.contains("--symmetrize"),
            "{err}"
        );
        let text = text_of(&graph, true, true).unwrap();
        assert_eq!(text, "3 2\n2\n1 3\n2\n");
    }

    #[test]
    fn decimal_digits() {
        let mut t = Vec::new();
        for x in [0u64, 7, 10, 1_000_000, u32::MAX as u64 + 1] {
            push_decimal(&mut t, x);
            t.push(b',');
        }
        assert_eq!(t, b"0,7,10,1000000,4294967296,");
    }

    #[test]
    fn rows_split_across_tasks_and_batches() {
        // A path longer than one batch: every vertex's line must come out once, in order.
        let n = ROWS_PER_TASK * TASKS_PER_BATCH + 3 * ROWS_PER_TASK + 5;
        let src: Vec<u32> = (0..n as u32 - 1).collect();
        let dst: Vec<u32> = (1..n as u32).collect();
        let graph = Csr::from_edges(n, &src, &dst);
        let text = text_of(&graph, true, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), n + 1);
        assert_eq!(lines[0], format!("{n} {}", n - 1));
        assert_eq!(lines[1], "2");
        for v in 1..n - 1 {
            assert_eq!(lines[v + 1], format!("{} {}", v, v + 2), "vertex {v}");
        }
        assert_eq!(lines[n], format!("{}", n - 1));
    }
}
