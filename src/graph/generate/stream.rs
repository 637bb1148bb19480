//! Streaming construction of a symmetric CSR from randomly drawn vertex pairs, without ever
//! holding an edge list.
//!
//! A [`PairSource`] draws its pairs in fixed-size chunks, each from its own seeded generator, so
//! a chunk can be drawn twice and gives the same pairs. [`build_symmetric_csr`] then:
//!
//! 1. draws every chunk (in parallel) and counts the degree of both endpoints into atomics;
//! 2. turns the counts into `indptr`, draws every chunk again and scatters both directions of
//!    each pair into `indices` through atomic per-row cursors (the order inside a row depends on
//!    thread timing, which step 3 erases);
//! 3. sorts each row, drops duplicate neighbours and compacts the rows to the front.
//!
//! Self-loops are skipped as they are drawn. Memory: `indices` (4 bytes per stored edge) plus two
//! arrays of 8 bytes per vertex, whatever the number of threads.

use crate::graph::{Csr, NodeId};
use crate::util::progress::Progress;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Pairs per chunk: large enough that scheduling costs nothing, small enough for many chunks
/// per thread. Fixed, so the pairs drawn never depend on the thread count.
pub const PAIRS_PER_CHUNK: u64 = 1 << 16;

/// Chunks handed to rayon between two progress updates.
const CHUNKS_PER_STEP: u64 = 256;

/// Rows sorted and deduplicated by one rayon task.
const ROWS_PER_BLOCK: usize = 4096;

/// A source of undirected vertex pairs, drawn chunk by chunk.
pub trait PairSource: Sync {
    /// Total number of pairs to draw.
    fn num_pairs(&self) -> u64;

    /// Draw the pairs `[chunk · PAIRS_PER_CHUNK, …)` of chunk `chunk`, calling `emit(u, v)` for
    /// each. Must depend only on the chunk index (never on a shared generator).
    fn draw_chunk<F: FnMut(NodeId, NodeId)>(&self, chunk: u64, emit: F);
}

/// The pair range `[start, end)` of `chunk` among `num_pairs` pairs.
pub fn chunk_range(chunk: u64, num_pairs: u64) -> std::ops::Range<u64> {
    let start = chunk * PAIRS_PER_CHUNK;
    start..(start + PAIRS_PER_CHUNK).min(num_pairs)
}

/// What happened to the drawn pairs on the way into the CSR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EdgeStats {
    /// Undirected pairs drawn.
    pub pairs_drawn: u64,
    /// Pairs dropped because both ends were the same vertex.
    pub self_loops_dropped: u64,
    /// Stored (directed) edges dropped because the same pair was drawn before.
    pub duplicates_dropped: u64,
}

/// Build the CSR over `n` vertices holding both directions of every pair of `source`, rows
/// sorted by neighbour id, without self-loops or duplicate edges.
pub fn build_symmetric_csr<S: PairSource>(n: usize, source: &S) -> (Csr, EdgeStats) {
    let num_chunks = source.num_pairs().div_ceil(PAIRS_PER_CHUNK);
    let started = std::time::Instant::now();
    let mut progress = Progress::new("drawing edges", 2 * num_chunks);

    // Pass 1: degrees. `slots[v]` holds the degree of v, then its scatter cursor, then its
    // degree after deduplication: one array of n atomics serves all three.
    let slots: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let self_loops = AtomicU64::new(0);
    for_each_chunk(num_chunks, &mut progress, |chunk| {
        let mut loops = 0u64;
        source.draw_chunk(chunk, |u, v| {
            if u == v {
                loops += 1;
            } else {
                slots[u as usize].fetch_add(1, Relaxed);
                slots[v as usize].fetch_add(1, Relaxed);
            }
        });
        self_loops.fetch_add(loops, Relaxed);
    });

    let mut indptr = vec![0u64; n + 1];
    for v in 0..n {
        let degree = slots[v].load(Relaxed);
        slots[v].store(indptr[v], Relaxed);
        indptr[v + 1] = indptr[v] + degree;
    }
    let drawn_edges = indptr[n];
    log::debug!(
        "edges: counted degrees in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // Pass 2: scatter both directions through the cursors.
    let mut indices = vec![0 as NodeId; drawn_edges as usize];
    {
        let cells = as_atomic(&mut indices);
        for_each_chunk(num_chunks, &mut progress, |chunk| {
            source.draw_chunk(chunk, |u, v| {
                if u != v {
                    let at = slots[u as usize].fetch_add(1, Relaxed);
                    cells[at as usize].store(v, Relaxed);
                    let at = slots[v as usize].fetch_add(1, Relaxed);
                    cells[at as usize].store(u, Relaxed);
                }
            });
        });
    }
    progress.finish();
    log::debug!(
        "edges: scattered in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    // Pass 3: sort and deduplicate each row in place, then close the gaps.
    let kept_per_block = sort_and_dedup_rows(&indptr, &mut indices, &slots);
    let mut write = 0usize;
    for (b, &kept) in kept_per_block.iter().enumerate() {
        let start = indptr[b * ROWS_PER_BLOCK] as usize;
        indices.copy_within(start..start + kept, write);
        write += kept;
    }
    indices.truncate(write);
    indices.shrink_to_fit();
    for v in 0..n {
        indptr[v + 1] = indptr[v] + slots[v].load(Relaxed);
    }

    log::debug!(
        "edges: sorted and deduplicated in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let stats = EdgeStats {
        pairs_drawn: source.num_pairs(),
        self_loops_dropped: self_loops.into_inner(),
        duplicates_dropped: drawn_edges - write as u64,
    };
    (Csr { indptr, indices }, stats)
}

/// Run `draw(chunk)` for every chunk, in parallel, advancing `progress` between steps.
fn for_each_chunk(num_chunks: u64, progress: &mut Progress, draw: impl Fn(u64) + Sync) {
    let mut first = 0;
    while first < num_chunks {
        let last = (first + CHUNKS_PER_STEP).min(num_chunks);
        (first..last).into_par_iter().for_each(&draw);
        progress.inc(last - first);
        first = last;
    }
}

/// View a slice of ids as atomics so threads can fill disjoint slots of it.
fn as_atomic(ids: &mut [NodeId]) -> &[AtomicU32] {
    // SAFETY: `AtomicU32` has the same size, alignment and bit validity as `u32`
    // (documented guarantee), and the exclusive borrow of `ids` outlives the returned view, so
    // nothing else reads or writes the memory non-atomically meanwhile.
    unsafe { std::slice::from_raw_parts(ids.as_mut_ptr().cast::<AtomicU32>(), ids.len()) }
}

/// Sort every row, keep one copy of each neighbour at the front of its block of rows and store
/// the new degree of each row in `degrees`. Returns the number of ids kept per block.
fn sort_and_dedup_rows(
    indptr: &[u64],
    indices: &mut [NodeId],
    degrees: &[AtomicU64],
) -> Vec<usize> {
    let n = indptr.len() - 1;
    let mut blocks: Vec<(usize, &mut [NodeId])> = Vec::with_capacity(n.div_ceil(ROWS_PER_BLOCK));
    let mut rest = indices;
    for lo in (0..n).step_by(ROWS_PER_BLOCK) {
        let hi = (lo + ROWS_PER_BLOCK).min(n);
        let (head, tail) = rest.split_at_mut((indptr[hi] - indptr[lo]) as usize);
        blocks.push((lo, head));
        rest = tail;
    }
    blocks
        .into_par_iter()
        .map(|(lo, block)| {
            let hi = (lo + ROWS_PER_BLOCK).min(n);
            let base = indptr[lo];
            let mut write = 0usize;
            for v in lo..hi {
                let (s, e) = ((indptr[v] - base) as usize, (indptr[v + 1] - base) as usize);
                block[s..e].sort_unstable();
                let row_start = write;
                for i in s..e {
                    // `write <= i`, so this never overwrites an id not yet read.
                    let id = block[i];
                    if write == row_start || block[write - 1] != id {
                        block[write] = id;
                        write += 1;
                    }
                }
                degrees[v].store((write - row_start) as u64, Relaxed);
            }
            write
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs given explicitly, split into chunks of `PAIRS_PER_CHUNK`.
    struct Fixed(Vec<(NodeId, NodeId)>);

    impl PairSource for Fixed {
        fn num_pairs(&self) -> u64 {
            self.0.len() as u64
        }
        fn draw_chunk<F: FnMut(NodeId, NodeId)>(&self, chunk: u64, mut emit: F) {
            for i in chunk_range(chunk, self.num_pairs()) {
                let (u, v) = self.0[i as usize];
                emit(u, v);
            }
        }
    }

    #[test]
    fn symmetric_sorted_without_loops_or_duplicates() {
        let pairs = vec![(0, 1), (2, 0), (1, 0), (3, 3), (2, 3), (0, 2), (4, 1)];
        let (csr, stats) = build_symmetric_csr(5, &Fixed(pairs));
        assert_eq!(csr.indptr, vec![0, 2, 4, 6, 7, 8]);
        assert_eq!(csr.indices, vec![1, 2, 0, 4, 0, 3, 2, 1]);
        assert_eq!(
            stats,
            EdgeStats {
                pairs_drawn: 7,
                self_loops_dropped: 1,
                duplicates_dropped: 4
            }
        );
        csr.validate(5, "test").unwrap();
    }

    #[test]
    fn many_chunks_and_row_blocks() {
        // More pairs than one chunk and more rows than one block, so the compaction of blocks
        // and the chunk boundaries are both exercised.
        let n = 3 * ROWS_PER_BLOCK as u32 + 17;
        let spread = |i: u64, k: u64| ((i * k + 3) % n as u64) as NodeId;
        let pairs: Vec<(NodeId, NodeId)> = (0..2 * PAIRS_PER_CHUNK + 5)
            .map(|i| (spread(i, 7919), spread(i, 104_729)))
            .collect();
        let (csr, stats) = build_symmetric_csr(n as usize, &Fixed(pairs.clone()));
        csr.validate(n as u64, "test").unwrap();
        let mut expected: Vec<(NodeId, NodeId)> = pairs
            .iter()
            .filter(|(u, v)| u != v)
            .flat_map(|&(u, v)| [(u, v), (v, u)])
            .collect();
        expected.sort_unstable();
        expected.dedup();
        let got: Vec<(NodeId, NodeId)> = (0..n as usize)
            .flat_map(|r| csr.neighbors(r).iter().map(move |&c| (r as NodeId, c)))
            .collect();
        assert_eq!(got, expected);
        assert_eq!(
            stats.duplicates_dropped + got.len() as u64,
            2 * (stats.pairs_drawn - stats.self_loops_dropped)
        );
    }
}
