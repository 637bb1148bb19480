//! One hop of a mini-batch's sampling on this rank: draw every frontier vertex's neighbours,
//! then number them into a block. On a few threads the numbering (the serial block build) is
//! a serial tail after the parallel draws, so there the two overlap: the frontier goes in
//! parts, threads take parts in order and draw them, and the calling thread numbers each part
//! as soon as it is drawn (drawing the next untaken one while its turn has not come, and
//! numbering what is left once all are taken), so that the id table stays in one core's
//! cache. (With the numbering taken by whichever thread finished the next part, the table's
//! lines moved between the cores and two threads were slower than drawing everything first.)
//!
//! The block is bitwise the one [`sample_neighbors`] and [`build_block`] give: a vertex's
//! draw depends on its id and key only, and the numbering is the serial build's loop run over
//! the parts in frontier order ([`Numbering`]).

use super::build::{with_thread_table, Numbering, PAR_MIN_THREADS};
use super::neighbor::{sample_neighbors, Adjacency, LayerKey, Sampled};
use super::{build_block, Block};
use crate::graph::NodeId;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

/// Frontier vertices per part of a pipelined hop: small enough that the numbering starts soon
/// after the draws begin and ends soon after they end, large enough that each part's draw is
/// still a parallel loop worth its tasks. On the 200k SBM at two threads (1,024 seeds, fanouts
/// 15/10/5) parts of 1,024, 2,048 and 4,096 vertices took a batch's sampling about as far
/// below drawing everything first (5-10 %), 4,096 the least.
const PART: usize = 2048;

/// The block of one hop from `frontier` (the destinations) with `fanout` draws each: the
/// draws and the numbering overlapped on 2 to 7 threads when the frontier has several parts;
/// otherwise all draws, then [`build_block`] (which numbers large blocks on all threads from
/// [`PAR_MIN_THREADS`]).
pub fn sample_hop(adj: &impl Adjacency, frontier: &[NodeId], fanout: i32, key: LayerKey) -> Block {
    let threads = rayon::current_num_threads();
    if (2..PAR_MIN_THREADS).contains(&threads) && frontier.len() >= 2 * PART {
        sample_hop_pipelined(adj, frontier, fanout, key)
    } else {
        build_block(frontier, &sample_neighbors(adj, frontier, fanout, key))
    }
}

/// [`sample_hop`] with the draws and the numbering overlapped (any thread count, for tests).
pub fn sample_hop_pipelined(
    adj: &impl Adjacency,
    frontier: &[NodeId],
    fanout: i32,
    key: LayerKey,
) -> Block {
    let parts: Vec<&[NodeId]> = frontier.chunks(PART).collect();
    let drawn: Vec<OnceLock<Sampled>> = parts.iter().map(|_| OnceLock::new()).collect();
    let next_part = AtomicUsize::new(0);
    let draw = |k: usize| {
        // The set cannot fail: part `k` is taken once.
        let _ = drawn[k].set(sample_neighbors(adj, parts[k], fanout, key));
    };
    let take = || Some(next_part.fetch_add(1, Relaxed)).filter(|&k| k < parts.len());
    let (src_nodes, indices) = with_thread_table(|ids| {
        let mut numbering = Numbering::start(ids, frontier, 0);
        let (numbered, ()) = rayon::join(
            // This thread numbers every part as soon as it is drawn, in order, and draws the
            // next untaken part when its turn has not come: the id table stays in its cache.
            // It never waits for a part another thread is drawing (a thread waiting inside a
            // rayon task could be waiting on work stacked under itself): once every part is
            // taken, the rest are numbered after the join.
            || {
                let mut numbered = 0;
                while numbered < parts.len() {
                    if let Some(sampled) = drawn[numbered].get() {
                        numbering.add_edges(&sampled.neighbors);
                        numbered += 1;
                    } else if let Some(k) = take() {
                        draw(k);
                    } else {
                        break;
                    }
                }
                numbered
            },
            // The other threads only draw.
            || {
                (1..rayon::current_num_threads())
                    .into_par_iter()
                    .with_max_len(1)
                    .for_each(|_| {
                        while let Some(k) = take() {
                            draw(k);
                        }
                    })
            },
        );
        for part in &drawn[numbered..] {
            let sampled = part
                .get()
                .expect("every part is drawn once the join returns");
            numbering.add_edges(&sampled.neighbors);
        }
        numbering.finish()
    });
    assert!(
        drawn.iter().all(|d| d.get().is_some()),
        "every part of the hop is drawn"
    );
    // Each part's offsets start at 0: shift them by the edges before the part.
    let mut indptr = Vec::with_capacity(frontier.len() + 1);
    indptr.push(0);
    for part in drawn.iter().filter_map(OnceLock::get) {
        let base = *indptr.last().expect("starts with 0");
        indptr.extend(part.offsets[1..].iter().map(|&o| base + o));
    }
    Block {
        num_dst: frontier.len(),
        src_nodes,
        indptr,
        indices,
    }
}
