//! The undirected, loop-free, duplicate-free adjacency that METIS needs, built from a
//! dataset's (possibly directed) CSR.
//!
//! Every stored edge `u → v` with `u ≠ v` contributes `v` to `u`'s list and `u` to `v`'s list;
//! self-loops are dropped; both directions of an undirected edge, and repeated edges, merge
//! into one entry. With edge weights, the merged entry's weight is the sum of the weights of
//! the stored edges it stands for (so `{u, v}` weighs `w(u→v) + w(v→u)`, the same seen from
//! either end, as METIS requires).
//!
//! Vendored METIS uses 32-bit signed indices, hence the limits below: a graph past them is
//! refused with a message saying what to do instead, before the big allocations.

use crate::graph::{Csr, NodeId};
use anyhow::{bail, Result};
use metis::Idx;
use rayon::prelude::*;

/// Largest vertex count and adjacency size METIS' `idx_t` can take: counts must stay below
/// `Idx::MAX` (2^31 - 1 for the vendored, 32-bit METIS) because `xadj` holds `n + 1` entries
/// and METIS allocates `nedges + 1` per coarse level.
pub const METIS_LIMIT: u64 = Idx::MAX as u64;

/// Test hook: `GNNPAR_TEST_METIS_LIMIT=N` lowers the limit of [`check_metis_limit`] and
/// [`check_adjacency_limit`] to N (never raises it), so that the integration tests reach the
/// adjacency refusal through `gnnpar partition` on a small graph: a graph past the real limit
/// has over a billion edges to read.
pub const TEST_LIMIT_ENV: &str = "GNNPAR_TEST_METIS_LIMIT";

/// [`METIS_LIMIT`], or the lower limit of the test hook [`TEST_LIMIT_ENV`].
fn metis_limit() -> Result<u64> {
    let Some(value) = std::env::var_os(TEST_LIMIT_ENV).filter(|v| !v.is_empty()) else {
        return Ok(METIS_LIMIT);
    };
    let Some(limit) = value.to_str().and_then(|v| v.trim().parse::<u64>().ok()) else {
        bail!("{TEST_LIMIT_ENV}={value:?} is not a count (a test hook: unset it)");
    };
    let limit = limit.min(METIS_LIMIT);
    log::warn!("{TEST_LIMIT_ENV} lowers METIS' index limit to {limit} (a test hook)");
    Ok(limit)
}

/// Refuse `count` `what`s (vertices, adjacency entries) at or past METIS' index range
/// ([`METIS_LIMIT`]). The message names the limit and the two ways out.
pub fn check_metis_limit(count: u64, what: &str) -> Result<()> {
    check_limit(count, what, metis_limit()?)
}

fn check_limit(count: u64, what: &str, limit: u64) -> Result<()> {
    if count >= limit {
        bail!("{}", limit_message(&format!("{count} {what}"), limit))
    }
    Ok(())
}

/// "The graph has `has`; METIS … handles fewer than `limit` …": the refusal text.
fn limit_message(has: &str, limit: u64) -> String {
    let limit = if limit == METIS_LIMIT {
        format!("2^{} - 1 = {limit}", Idx::BITS - 1)
    } else {
        limit.to_string()
    };
    format!(
        "the graph has {has}; the METIS built into gnnpar uses {bits}-bit indices and handles \
         fewer than {limit}. Partition it with --method random|hash (no such limit), or build \
         gnnpar against a METIS with 64-bit indices (IDXTYPEWIDTH=64, through the `metis` \
         crate's `use-system` feature)",
        bits = Idx::BITS,
    )
}

/// Upper bound on the symmetrised adjacency of a graph with `num_edges` stored edges, known
/// from the header alone: every non-loop stored edge contributes one entry at each endpoint
/// before duplicates merge. It is also the exact length of [`symmetrize`]'s scratch array.
pub fn adjacency_bound(num_edges: u64) -> u64 {
    num_edges.saturating_mul(2)
}

/// Refuse a graph whose symmetrised adjacency METIS cannot index, before [`symmetrize`]
/// allocates it; returns the adjacency size known (the bound, or the exact count).
///
/// The bound `2m` decides alone when it is below the limit. When it is not, the exact count
/// decides: a graph stored in both directions (every undirected dataset) has about `m`
/// entries, so refusing on the bound would turn away graphs of up to 2^32 stored edges that
/// 32-bit METIS partitions fine. Counting costs a sorted copy of `indices` (4 bytes per
/// edge), half of [`symmetrize`]'s own scratch (8 bytes per entry of the bound), and only
/// happens for graphs past a billion edges.
pub fn check_adjacency_limit(graph: &Csr) -> Result<u64> {
    check_adjacency_within(graph, metis_limit()?)
}

fn check_adjacency_within(graph: &Csr, limit: u64) -> Result<u64> {
    let bound = adjacency_bound(graph.num_edges());
    if bound < limit {
        return Ok(bound);
    }
    log::info!(
        "the symmetrised adjacency has at most 2 × {} = {bound} entries, at or past METIS' \
         limit of {limit}; counting it exactly",
        graph.num_edges()
    );
    let exact = count_symmetric_entries(graph);
    check_limit(
        exact,
        "adjacency entries once symmetrised (both directions)",
        limit,
    )?;
    Ok(exact)
}

/// The exact number of entries of the symmetrised adjacency of `graph` (what [`symmetrize`]
/// gives METIS), without building it: twice the number of distinct unordered pairs `{u, v}`,
/// `u ≠ v`, with an edge stored either way. With `D` the distinct non-loop stored edges and
/// `R` the pairs stored in both directions, that is `2 (D - R)`. Needs a copy of `indices`
/// with every row sorted (membership by binary search).
pub fn count_symmetric_entries(graph: &Csr) -> u64 {
    let n = graph.num_rows();
    let mut sorted = graph.indices.clone();
    let mut rows: Vec<&mut [NodeId]> = Vec::with_capacity(n);
    let mut rest: &mut [NodeId] = &mut sorted;
    for u in 0..n {
        let (head, tail) = rest.split_at_mut(graph.degree(u));
        rows.push(head);
        rest = tail;
    }
    rows.into_par_iter().for_each(|row| row.sort_unstable());
    let row = |u: usize| &sorted[graph.indptr[u] as usize..graph.indptr[u + 1] as usize];
    let (distinct, both_ways) = (0..n)
        .into_par_iter()
        .map(|u| {
            let (mut d, mut r) = (0u64, 0u64);
            let neighbours = row(u);
            for (i, &v) in neighbours.iter().enumerate() {
                if v as usize == u || (i > 0 && neighbours[i - 1] == v) {
                    continue;
                }
                d += 1;
                if v as usize > u && row(v as usize).binary_search(&(u as NodeId)).is_ok() {
                    r += 1;
                }
            }
            (d, r)
        })
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    2 * (distinct - both_ways)
}

/// A symmetrised graph in METIS' CSR arrays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymmetricGraph {
    /// `adjncy[xadj[v]..xadj[v+1]]` are the neighbours of `v`, sorted, distinct, never `v`.
    pub xadj: Vec<Idx>,
    pub adjncy: Vec<Idx>,
    /// Weight of each `adjncy` entry (≥ 1), when edge weights were given.
    pub adjwgt: Option<Vec<Idx>>,
}

impl SymmetricGraph {
    /// Number of vertices.
    pub fn num_nodes(&self) -> usize {
        self.xadj.len() - 1
    }
}

/// Symmetrise `graph` (a whole graph: rows are vertices `0..n`). `edge_weights`, when given,
/// is aligned with `graph.indices`. Negative weights count as 0; merged weights are clamped
/// to at least 1 (METIS refuses zero edge weights) and scaled down when their total would
/// overflow METIS' 32-bit sums.
pub fn symmetrize(graph: &Csr, edge_weights: Option<&[i64]>) -> Result<SymmetricGraph> {
    let n = graph.num_rows();
    check_metis_limit(n as u64, "vertices")?;
    if let Some(w) = edge_weights {
        assert_eq!(
            w.len(),
            graph.indices.len(),
            "edge weights checked by the caller"
        );
    }
    let start = symmetric_row_starts(graph);
    match edge_weights {
        None => {
            let mut adj = vec![0 as Idx; start[n] as usize];
            scatter_both_directions(graph, &start, &mut adj, |_, u| u as Idx);
            let lens = sort_dedup_rows(&mut adj, &start, |a, b| a == b, |_, _| {});
            let xadj = compact_rows(&mut adj, &start, &lens)?;
            Ok(SymmetricGraph {
                xadj,
                adjncy: adj,
                adjwgt: None,
            })
        }
        Some(weights) => {
            // Pack (neighbour, weight) into one u64 so a plain sort orders by neighbour and a
            // row needs no separate weight permutation.
            let mut packed = vec![0u64; start[n] as usize];
            scatter_both_directions(graph, &start, &mut packed, |e, u| {
                let w = weights[e].clamp(0, u32::MAX as i64) as u64;
                ((u as u64) << 32) | w
            });
            let lens = sort_dedup_rows(
                &mut packed,
                &start,
                |a, b| a >> 32 == b >> 32,
                |kept, dup| {
                    let sum = (*kept & 0xffff_ffff) + (dup & 0xffff_ffff);
                    *kept = (*kept & !0xffff_ffff) | sum.min(u32::MAX as u64);
                },
            );
            let xadj = compact_rows(&mut packed, &start, &lens)?;
            let adjncy: Vec<Idx> = packed.par_iter().map(|&p| (p >> 32) as Idx).collect();
            let adjwgt = scaled_edge_weights(&packed);
            Ok(SymmetricGraph {
                xadj,
                adjncy,
                adjwgt: Some(adjwgt),
            })
        }
    }
}

/// Row starts of the symmetrised adjacency before merging duplicates: each non-loop edge
/// counts once at each endpoint.
fn symmetric_row_starts(graph: &Csr) -> Vec<u64> {
    let n = graph.num_rows();
    let mut start = vec![0u64; n + 1];
    for u in 0..n {
        for &v in graph.neighbors(u) {
            if v as usize != u {
                start[u + 1] += 1;
                start[v as usize + 1] += 1;
            }
        }
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    start
}

/// Write both directions of every non-loop edge into `out`. `make(e, neighbour)` builds the
/// entry stored in the other endpoint's list for edge `e` (an index into `indices`).
fn scatter_both_directions<T>(
    graph: &Csr,
    start: &[u64],
    out: &mut [T],
    make: impl Fn(usize, NodeId) -> T,
) {
    let mut next: Vec<u64> = start[..graph.num_rows()].to_vec();
    for u in 0..graph.num_rows() {
        let base = graph.indptr[u] as usize;
        for (k, &v) in graph.neighbors(u).iter().enumerate() {
            if v as usize == u {
                continue;
            }
            let e = base + k;
            out[next[u] as usize] = make(e, v);
            next[u] += 1;
            out[next[v as usize] as usize] = make(e, u as NodeId);
            next[v as usize] += 1;
        }
    }
}

/// Sort each row `entries[start[r]..start[r+1]]` and merge runs of equal entries (`same`)
/// into their first element (`merge(kept, duplicate)`), in parallel over rows. Returns the
/// merged length of each row; the merged entries sit at the front of each row.
fn sort_dedup_rows<T: Copy + Ord + Send>(
    entries: &mut [T],
    start: &[u64],
    same: impl Fn(&T, &T) -> bool + Sync,
    merge: impl Fn(&mut T, T) + Sync,
) -> Vec<u32> {
    let n = start.len() - 1;
    let mut rows: Vec<&mut [T]> = Vec::with_capacity(n);
    let mut rest = entries;
    for r in 0..n {
        let (head, tail) = rest.split_at_mut((start[r + 1] - start[r]) as usize);
        rows.push(head);
        rest = tail;
    }
    rows.into_par_iter()
        .map(|row| {
            row.sort_unstable();
            let mut kept = 0usize;
            for i in 0..row.len() {
                if kept > 0 && same(&row[kept - 1], &row[i]) {
                    let dup = row[i];
                    merge(&mut row[kept - 1], dup);
                } else {
                    row[kept] = row[i];
                    kept += 1;
                }
            }
            kept as u32
        })
        .collect()
}

/// Move the merged front of every row together, truncate `entries`, and return METIS' `xadj`.
fn compact_rows<T: Copy>(entries: &mut Vec<T>, start: &[u64], lens: &[u32]) -> Result<Vec<Idx>> {
    let total: u64 = lens.iter().map(|&l| l as u64).sum();
    check_metis_limit(
        total,
        "adjacency entries once symmetrised (both directions)",
    )?;
    let mut xadj = Vec::with_capacity(lens.len() + 1);
    xadj.push(0 as Idx);
    let mut write = 0usize;
    for (r, &len) in lens.iter().enumerate() {
        let from = start[r] as usize;
        entries.copy_within(from..from + len as usize, write);
        write += len as usize;
        xadj.push(write as Idx);
    }
    entries.truncate(write);
    entries.shrink_to_fit();
    Ok(xadj)
}

/// Weights of packed entries, clamped to ≥ 1 and divided by a common factor when needed so
/// that their total stays within METIS' 32-bit sums (it adds edge weights up in `idx_t`).
fn scaled_edge_weights(packed: &[u64]) -> Vec<Idx> {
    let total: u64 = packed.par_iter().map(|&p| (p & 0xffff_ffff).max(1)).sum();
    // After dividing by `scale` the total is at most `budget`; clamping to 1 adds at most one
    // per entry, so the final total stays within `budget + entries <= i32::MAX`.
    let entries = packed.len() as u64;
    let budget = ((i32::MAX as u64).saturating_sub(entries) / 2).max(1);
    let scale = total.div_ceil(budget).max(1);
    packed
        .par_iter()
        .map(|&p| ((p & 0xffff_ffff) / scale).clamp(1, i32::MAX as u64) as Idx)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(g: &SymmetricGraph) -> Vec<Vec<Idx>> {
        (0..g.num_nodes())
            .map(|v| g.adjncy[g.xadj[v] as usize..g.xadj[v + 1] as usize].to_vec())
            .collect()
    }

    #[test]
    fn drops_loops_merges_duplicates_and_adds_reverse_edges() {
        // 0→1, 0→0 (loop), 1→0 (reverse of 0→1), 1→2, 1→2 (duplicate), 3 isolated.
        let csr = Csr::from_edges(4, &[0, 0, 1, 1, 1], &[1, 0, 0, 2, 2]);
        let g = symmetrize(&csr, None).unwrap();
        assert_eq!(rows(&g), vec![vec![1], vec![0, 2], vec![1], vec![]]);
        assert!(g.adjwgt.is_none());
    }

    #[test]
    fn sums_weights_of_merged_edges_and_clamps_to_one() {
        let csr = Csr::from_edges(3, &[0, 1, 1, 2], &[1, 0, 2, 2]);
        // w(0→1) = 5, w(1→0) = 2, w(1→2) = 0, loop 2→2 ignored.
        let g = symmetrize(&csr, Some(&[5, 2, 0, 9])).unwrap();
        assert_eq!(rows(&g), vec![vec![1], vec![0, 2], vec![1]]);
        assert_eq!(g.adjwgt.unwrap(), vec![7, 7, 1, 1]);
    }

    #[test]
    fn limits_name_the_size_the_limit_and_the_ways_out() {
        assert_eq!(METIS_LIMIT, 2_147_483_647, "vendored METIS is 32-bit");
        check_metis_limit(METIS_LIMIT - 1, "vertices").unwrap();
        for count in [METIS_LIMIT, METIS_LIMIT + 1, 3_000_000_000] {
            let err = check_metis_limit(count, "vertices")
                .unwrap_err()
                .to_string();
            for want in [
                format!("{count} vertices"),
                "2^31 - 1 = 2147483647".into(),
                "32-bit".into(),
                "64-bit".into(),
                "IDXTYPEWIDTH=64".into(),
                "--method random|hash".into(),
            ] {
                assert!(err.contains(&want), "lacks `{want}`: {err}");
            }
        }
        check_metis_limit(METIS_LIMIT - 1, "adjacency entries").unwrap();
        assert!(check_metis_limit(METIS_LIMIT, "adjacency entries").is_err());
        assert_eq!(adjacency_bound(u64::MAX), u64::MAX);
    }

    /// A directed multigraph with loops, duplicates and some reciprocated edges.
    fn messy_graph(n: usize, m: usize, seed: u64) -> Csr {
        let mut x = seed;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as usize % n
        };
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for _ in 0..m {
            let (u, v) = (next(), next());
            src.push(u as NodeId);
            dst.push(v as NodeId);
            if u % 3 == 0 {
                // Reverse stored too (sometimes twice).
                src.push(v as NodeId);
                dst.push(u as NodeId);
            }
        }
        if n >= 2 {
            src.extend([0, 0, 1, 1]);
            dst.extend([0, 1, 1, 0]);
        }
        Csr::from_edges(n, &src, &dst)
    }

    #[test]
    fn exact_count_matches_the_symmetrised_graph() {
        for (n, m, seed) in [(1, 0, 1), (2, 3, 2), (30, 100, 3), (200, 3000, 4)] {
            let csr = messy_graph(n, m, seed);
            let exact = count_symmetric_entries(&csr);
            assert_eq!(exact, symmetrize(&csr, None).unwrap().adjncy.len() as u64);
            assert!(exact <= adjacency_bound(csr.num_edges()));
        }
    }

    #[test]
    fn adjacency_check_counts_exactly_only_when_the_bound_is_over() {
        // 0 ↔ 1, 1 ↔ 2, 2 ↔ 3 stored both ways: m = 6, bound 12, exact 6.
        let csr = Csr::from_edges(4, &[0, 1, 1, 2, 2, 3], &[1, 0, 2, 1, 3, 2]);
        assert_eq!(
            check_adjacency_within(&csr, 13).unwrap(),
            12,
            "bound suffices"
        );
        // Bound at or over the limit, exact count below it: accepted with the exact count.
        assert_eq!(check_adjacency_within(&csr, 12).unwrap(), 6);
        assert_eq!(check_adjacency_within(&csr, 7).unwrap(), 6);
        // Exact count at the limit: refused, naming the exact count.
        let err = check_adjacency_within(&csr, 6).unwrap_err().to_string();
        assert!(err.contains("6 adjacency entries"), "{err}");
        assert!(err.contains("--method random|hash"), "{err}");
    }

    #[test]
    fn huge_weights_are_scaled_into_32_bits() {
        let csr = Csr::from_edges(2, &[0, 1], &[1, 0]);
        let g = symmetrize(&csr, Some(&[i64::MAX, i64::MAX])).unwrap();
        let w = g.adjwgt.unwrap();
        assert_eq!(w[0], w[1]);
        assert!(w[0] >= 1 && (w[0] as u64 + w[1] as u64) <= i32::MAX as u64);
    }
}
