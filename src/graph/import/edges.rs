//! From a list of edges in source order to the CSR the dataset stores: reverse edges,
//! self-loop policy, duplicate removal.
//!
//! Neighbour order is defined by the source file: the neighbours of `v` appear in the order in
//! which the edges naming `v` appear in the source (with `--symmetrize`, edge `(u, v)` on line
//! `i` puts `v` into `u`'s list and `u` into `v`'s list, both at position "line i"). When
//! duplicates are removed, the first occurrence stays. The sampler relies on this: list order is
//! a property of the source, not of any later relabelling.

use crate::graph::{Csr, NodeId};
use clap::ValueEnum;

/// What to do with self-loops `(v, v)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum SelfLoops {
    /// Keep them as the source has them.
    #[default]
    Keep,
    /// Remove every self-loop.
    Drop,
    /// Give every vertex exactly one self-loop (appended at the end of its list when absent).
    Add,
}

/// Edges in source order (`src[i] -> dst[i]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeList {
    pub src: Vec<NodeId>,
    pub dst: Vec<NodeId>,
}

impl EdgeList {
    /// An empty list with room for `n` edges.
    pub fn with_capacity(n: usize) -> Self {
        EdgeList {
            src: Vec::with_capacity(n),
            dst: Vec::with_capacity(n),
        }
    }

    /// Append one edge.
    #[inline]
    pub fn push(&mut self, s: NodeId, d: NodeId) {
        self.src.push(s);
        self.dst.push(d);
    }

    /// Number of edges.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// True when there is no edge.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }

    /// Largest vertex id named by an edge, if any.
    pub fn max_id(&self) -> Option<NodeId> {
        self.src.iter().chain(&self.dst).copied().max()
    }
}

/// How to turn an [`EdgeList`] into the stored adjacency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EdgeOptions {
    /// Add `(v, u)` for every `(u, v)` and remove duplicate edges.
    pub symmetrize: bool,
    pub self_loops: SelfLoops,
}

/// Build the CSR over `num_nodes` vertices (every id in `edges` must be below it).
///
/// With `symmetrize`, duplicates are removed (keeping the first occurrence), so the result
/// holds every undirected edge exactly once in each direction.
pub fn build_csr(num_nodes: usize, edges: EdgeList, opts: EdgeOptions) -> Csr {
    let EdgeList { mut src, mut dst } = edges;
    if opts.self_loops == SelfLoops::Drop {
        retain_pairs(&mut src, &mut dst, |s, d| s != d);
    }
    let mut csr = if opts.symmetrize {
        // Interleave each edge with its reverse so both land at the edge's source position.
        let mut s2 = Vec::with_capacity(src.len() * 2);
        let mut d2 = Vec::with_capacity(src.len() * 2);
        for (&s, &d) in src.iter().zip(&dst) {
            s2.push(s);
            d2.push(d);
            if s != d {
                // A self-loop is its own reverse.
                s2.push(d);
                d2.push(s);
            }
        }
        drop((src, dst));
        let mut csr = Csr::from_edges(num_nodes, &s2, &d2);
        drop((s2, d2));
        let before = csr.num_edges();
        dedup_rows(&mut csr, num_nodes);
        if csr.num_edges() != before {
            log::info!(
                "--symmetrize: removed {} duplicate edges",
                before - csr.num_edges()
            );
        }
        csr
    } else {
        Csr::from_edges(num_nodes, &src, &dst)
    };
    if opts.self_loops == SelfLoops::Add {
        add_missing_self_loops(&mut csr);
    }
    csr
}

/// Keep the pairs for which `keep(src, dst)` holds, in order, without allocating.
fn retain_pairs(
    src: &mut Vec<NodeId>,
    dst: &mut Vec<NodeId>,
    keep: impl Fn(NodeId, NodeId) -> bool,
) {
    let mut w = 0;
    for r in 0..src.len() {
        if keep(src[r], dst[r]) {
            src[w] = src[r];
            dst[w] = dst[r];
            w += 1;
        }
    }
    src.truncate(w);
    dst.truncate(w);
}

/// Remove repeated neighbours within every row, keeping first occurrences, in place.
///
/// One stamp per vertex (`seen[v] == row + 1` means `v` already appeared in this row) makes
/// this a single pass over the edges with no allocation per row.
pub fn dedup_rows(csr: &mut Csr, num_cols: usize) {
    let mut seen: Vec<u32> = vec![0; num_cols];
    let rows = csr.num_rows();
    let mut write = 0usize;
    let mut start = 0usize;
    for r in 0..rows {
        let end = csr.indptr[r + 1] as usize;
        // Importers refuse graphs of more than u32::MAX vertices, so row + 1 fits in u32 and
        // never equals the initial 0.
        let stamp = r as u32 + 1;
        for i in start..end {
            let v = csr.indices[i];
            if seen[v as usize] != stamp {
                seen[v as usize] = stamp;
                csr.indices[write] = v;
                write += 1;
            }
        }
        start = end;
        csr.indptr[r + 1] = write as u64;
    }
    csr.indices.truncate(write);
}

/// Append `(v, v)` to every row that lacks it.
fn add_missing_self_loops(csr: &mut Csr) {
    let rows = csr.num_rows();
    let missing: Vec<bool> = (0..rows)
        .map(|r| !csr.neighbors(r).contains(&(r as NodeId)))
        .collect();
    let extra = missing.iter().filter(|&&m| m).count();
    if extra == 0 {
        return;
    }
    let mut indptr = Vec::with_capacity(rows + 1);
    let mut indices = Vec::with_capacity(csr.indices.len() + extra);
    indptr.push(0u64);
    for (r, &add) in missing.iter().enumerate() {
        indices.extend_from_slice(csr.neighbors(r));
        if add {
            indices.push(r as NodeId);
        }
        indptr.push(indices.len() as u64);
    }
    *csr = Csr { indptr, indices };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(pairs: &[(u32, u32)]) -> EdgeList {
        let mut e = EdgeList::default();
        for &(s, d) in pairs {
            e.push(s, d);
        }
        e
    }

    #[test]
    fn directed_keeps_source_order() {
        let csr = build_csr(
            3,
            list(&[(0, 2), (1, 0), (0, 1), (0, 2)]),
            EdgeOptions::default(),
        );
        assert_eq!(csr.neighbors(0), &[2, 1, 2]);
        assert_eq!(csr.neighbors(1), &[0]);
        assert_eq!(csr.num_edges(), 4);
    }

    #[test]
    fn symmetrize_adds_reverses_in_source_order_and_drops_duplicates() {
        let opts = EdgeOptions {
            symmetrize: true,
            ..Default::default()
        };
        // (2,0) repeats (0,2) reversed; (0,1) appears twice.
        let csr = build_csr(3, list(&[(0, 2), (1, 0), (2, 0), (0, 1), (2, 1)]), opts);
        assert_eq!(csr.neighbors(0), &[2, 1]);
        assert_eq!(csr.neighbors(1), &[0, 2]);
        assert_eq!(csr.neighbors(2), &[0, 1]);
        assert_eq!(csr.num_edges(), 6);
        csr.validate(3, "t").unwrap();
    }

    #[test]
    fn self_loop_policies() {
        let edges = list(&[(0, 0), (0, 1), (1, 2)]);
        let drop = build_csr(
            3,
            edges.clone(),
            EdgeOptions {
                symmetrize: true,
                self_loops: SelfLoops::Drop,
            },
        );
        assert_eq!(drop.neighbors(0), &[1]);
        let keep = build_csr(
            3,
            edges.clone(),
            EdgeOptions {
                symmetrize: true,
                self_loops: SelfLoops::Keep,
            },
        );
        // The self-loop, reversed, is itself: it stays once.
        assert_eq!(keep.neighbors(0), &[0, 1]);
        let add = build_csr(
            3,
            edges,
            EdgeOptions {
                symmetrize: false,
                self_loops: SelfLoops::Add,
            },
        );
        assert_eq!(add.neighbors(0), &[0, 1]);
        assert_eq!(add.neighbors(1), &[2, 1]);
        assert_eq!(add.neighbors(2), &[2]);
    }
}
