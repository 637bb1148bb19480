//! Owner-computes sampling (ARCHITECTURE invariant 2): a rank holds the adjacency of its own
//! vertices only. For every hop, the frontier is routed to the owners (alltoallv of ids), each
//! owner draws the neighbours of the vertices it was sent with the counter-based sampler, and
//! the answers come back (alltoallv of counts and ids). Because the draw is a pure function of
//! (seed, epoch, batch, hop, original id), the blocks equal those one rank would build.

use crate::comm::Group;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::sample::{sample_blocks_with, sample_neighbors, Adjacency, BatchKey, Block, Sampled};

/// Sample the blocks of `seeds` (any owners) over a partitioned graph. Collective over
/// `group`: every rank calls it for every mini-batch, also with no seeds, and makes the same
/// number of exchanges (three per hop), so uneven shares never deadlock.
pub fn sample_blocks_distributed(
    group: &Group,
    graph: &impl Adjacency,
    offsets: &[u64],
    seeds: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
) -> Vec<Block> {
    let result: Result<Vec<Block>, std::convert::Infallible> =
        sample_blocks_with(seeds, fanouts, key, |frontier, fanout, lkey| {
            Ok(exchange_hop(group, offsets, frontier, |ids| {
                sample_neighbors(graph, ids, fanout, lkey)
            }))
        });
    match result {
        Ok(blocks) => blocks,
        Err(never) => match never {},
    }
}

/// Route `frontier` to its owners, let each owner answer with `draw`, and reassemble the
/// answers in frontier order.
fn exchange_hop(
    group: &Group,
    offsets: &[u64],
    frontier: &[NodeId],
    draw: impl Fn(&[NodeId]) -> Sampled,
) -> Sampled {
    let ranks = group.size();
    let mut positions: Vec<Vec<usize>> = vec![Vec::new(); ranks];
    for (i, &v) in frontier.iter().enumerate() {
        positions[owner_of(offsets, v as u64)].push(i);
    }
    let counts: Vec<usize> = positions.iter().map(Vec::len).collect();
    let request: Vec<NodeId> = positions.iter().flatten().map(|&i| frontier[i]).collect();
    let (asked, asked_counts) = group.alltoallv("sample_ids", &request, &counts);

    // Answer every requester at once: the sampler is parallel over the queries.
    let answer = draw(&asked);
    let lens: Vec<u32> = (0..answer.len())
        .map(|i| (answer.offsets[i + 1] - answer.offsets[i]) as u32)
        .collect();
    let mut nbr_counts = Vec::with_capacity(ranks);
    let mut q = 0;
    for &c in &asked_counts {
        nbr_counts.push(answer.offsets[q + c] - answer.offsets[q]);
        q += c;
    }
    // One length back per id asked of each owner, then as many neighbours as those say:
    // both sides know the counts, so none are exchanged.
    let got_lens = group.alltoallv_known("sample_counts", &lens, &asked_counts, &counts);
    let mut got_nbr_counts = Vec::with_capacity(ranks);
    let mut at = 0;
    for &c in &counts {
        got_nbr_counts.push(got_lens[at..at + c].iter().map(|&l| l as usize).sum());
        at += c;
    }
    let got_nbrs = group.alltoallv_known(
        "sample_nbrs",
        &answer.neighbors,
        &nbr_counts,
        &got_nbr_counts,
    );

    // The answers arrive grouped by owner, in the order the queries were sent.
    let mut offsets_out = Vec::with_capacity(got_lens.len() + 1);
    offsets_out.push(0usize);
    for &l in &got_lens {
        offsets_out.push(offsets_out.last().unwrap() + l as usize);
    }
    let merged_in_request_order = Sampled {
        offsets: offsets_out,
        neighbors: got_nbrs,
    };
    let order: Vec<usize> = positions.into_iter().flatten().collect();
    Sampled::merge_by_position(frontier.len(), &[(&order, &merged_in_request_order)])
}
