//! Owner-computes sampling (ARCHITECTURE invariant 2): a rank holds the adjacency of its own
//! vertices only. For every hop, the frontier is routed to the owners (alltoallv of ids), each
//! owner draws the neighbours of the vertices it was sent with the counter-based sampler, and
//! the answers come back (alltoallv of counts and ids). Because the draw is a pure function of
//! (seed, epoch, batch, hop, original id), the blocks equal those one rank would build. A
//! window of batches sampled ahead ([`distributed_window`]) routes each hop's frontiers of all
//! its batches in one exchange of each kind.

use crate::comm::Group;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::sample::{
    sample_blocks_with, sample_neighbors, Adjacency, BatchKey, Block, LayerKey, Sampled,
};
use anyhow::{anyhow, Result};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, PoisonError};

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

/// What a window's sampling thread tells the calling thread ([`distributed_window`]).
enum Asked {
    /// Batch `k`'s frontier of a hop, to be drawn with `fanout` under `key`.
    Hop {
        k: usize,
        frontier: Vec<NodeId>,
        fanout: i32,
        key: LayerKey,
    },
    /// Batch `k`'s thread panicked and will ask no more.
    Panicked { k: usize },
}

/// A window of batches sampled over a partitioned graph, as the per-batch work and the work
/// alongside of [`SampleAhead::take_window`](crate::sample::ahead::SampleAhead::take_window):
/// batch `i` of `batches` gets the blocks `sample_blocks_distributed(group, graph, offsets,
/// &seeds_of(i), fanouts, key_of(i))` would give, each batch's blocks built on a window thread
/// of its own, while the calling thread routes every hop's frontiers of all the window's
/// batches to their owners in one exchange of each kind ([`exchange_hops`]) and draws what
/// the other ranks ask of this one. Collective: every rank samples windows of as many
/// batches, with as many hops.
///
/// Why: a batch's sampling over several ranks is three exchanges a hop with a little work
/// between them, which idles a rank's threads as much as one rank's own sampling does (and
/// waits on the slowest rank three times a hop); a window builds its batches side by side and
/// pays each exchange's latency once for all of them.
#[allow(clippy::type_complexity)]
pub fn distributed_window<'a, A: Adjacency>(
    group: &'a Group,
    graph: &'a A,
    offsets: &'a [u64],
    fanouts: &'a [i32],
    batches: Range<usize>,
    seeds_of: impl Fn(usize) -> Vec<NodeId>,
    key_of: impl Fn(usize) -> BatchKey,
) -> (
    impl Fn(usize) -> Option<Vec<Block>> + Sync + 'a,
    impl FnOnce() -> Result<()> + 'a,
) {
    let first = batches.start;
    let count = batches.len();
    let seeds: Vec<Vec<NodeId>> = batches.clone().map(seeds_of).collect();
    let keys: Vec<BatchKey> = batches.map(key_of).collect();
    let (ask, inbox) = channel::<Asked>();
    let (outboxes, answers): (Vec<Sender<Sampled>>, Vec<Mutex<Receiver<Sampled>>>) = (0..count)
        .map(|_| {
            let (tx, rx) = channel();
            (tx, Mutex::new(rx))
        })
        .unzip();

    let make = move |i: usize| {
        let k = i - first;
        let sampled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            sample_blocks_with(&seeds[k], fanouts, keys[k], |frontier, fanout, key| {
                let hop = Asked::Hop {
                    k,
                    frontier: frontier.to_vec(),
                    fanout,
                    key,
                };
                ask.send(hop).map_err(drop)?;
                let answer = answers[k].lock().unwrap_or_else(PoisonError::into_inner);
                answer.recv().map_err(drop)
            })
        }));
        match sampled {
            Ok(blocks) => blocks.ok(),
            Err(_) => {
                // The calling thread waits for this batch's next frontier: tell it instead.
                let _ = ask.send(Asked::Panicked { k });
                None
            }
        }
    };

    let alongside = move || -> Result<()> {
        for _hop in fanouts {
            let mut asked: Vec<Option<(Vec<NodeId>, i32, LayerKey)>> = vec![None; count];
            for _ in 0..count {
                match inbox.recv() {
                    Ok(Asked::Hop {
                        k,
                        frontier,
                        fanout,
                        key,
                    }) => asked[k] = Some((frontier, fanout, key)),
                    Ok(Asked::Panicked { k }) => {
                        return Err(anyhow!(
                            "sampling ahead: the thread sampling batch {} panicked",
                            first + k
                        ))
                    }
                    Err(_) => return Err(anyhow!("sampling ahead: the sampling threads stopped")),
                }
            }
            let asked: Vec<(Vec<NodeId>, i32, LayerKey)> = asked
                .into_iter()
                .map(|a| a.expect("every batch asks once a hop"))
                .collect();
            let frontiers: Vec<&[NodeId]> = asked.iter().map(|a| a.0.as_slice()).collect();
            let answers = exchange_hops(group, offsets, &frontiers, |k, ids| {
                sample_neighbors(graph, ids, asked[k].1, asked[k].2)
            });
            for (outbox, answer) in outboxes.iter().zip(answers) {
                outbox
                    .send(answer)
                    .map_err(|_| anyhow!("sampling ahead: a sampling thread stopped"))?;
            }
        }
        Ok(())
    };
    (make, alongside)
}

/// Route `frontier` to its owners, let each owner answer with `draw`, and reassemble the
/// answers in frontier order.
fn exchange_hop(
    group: &Group,
    offsets: &[u64],
    frontier: &[NodeId],
    draw: impl Fn(&[NodeId]) -> Sampled,
) -> Sampled {
    let mut answers = exchange_hops(group, offsets, &[frontier], |_, ids| draw(ids));
    answers.pop().expect("one frontier, one answer")
}

/// [`exchange_hop`] for the frontiers of several batches at once, in one exchange of each
/// kind: `draw(k, ids)` answers the queries of batch `k` (the owners draw under that batch's
/// key); the answers come back in the order of `frontiers`. Collective: every rank passes as
/// many frontiers (a batch's may be empty).
///
/// With several batches, each rank's ids to an owner are prefixed by how many of them each
/// batch asks (one id's bytes per batch), so the owner knows whose key draws them; the
/// answers need no such header, as both sides know how many rows each batch asked.
pub fn exchange_hops(
    group: &Group,
    offsets: &[u64],
    frontiers: &[&[NodeId]],
    draw: impl Fn(usize, &[NodeId]) -> Sampled,
) -> Vec<Sampled> {
    let (ranks, batches) = (group.size(), frontiers.len());
    let header = batches > 1;
    // positions[k][r]: the positions in batch k's frontier that rank r owns.
    let positions: Vec<Vec<Vec<usize>>> = frontiers
        .iter()
        .map(|frontier| {
            let mut mine = vec![Vec::new(); ranks];
            for (i, &v) in frontier.iter().enumerate() {
                mine[owner_of(offsets, v as u64)].push(i);
            }
            mine
        })
        .collect();
    let mut request: Vec<NodeId> = Vec::new();
    let mut counts = Vec::with_capacity(ranks);
    let mut asking = vec![0usize; ranks];
    for r in 0..ranks {
        if header {
            request.extend(positions.iter().map(|p| p[r].len() as NodeId));
        }
        for (k, p) in positions.iter().enumerate() {
            request.extend(p[r].iter().map(|&i| frontiers[k][i]));
            asking[r] += p[r].len();
        }
        counts.push(asking[r] + if header { batches } else { 0 });
    }
    let (asked, asked_counts) = group.alltoallv("sample_ids", &request, &counts);

    // asked_by[s][k]: how many ids rank s asks for batch k; queries[k]: batch k's ids, by
    // asking rank.
    let mut asked_by = vec![vec![0usize; batches]; ranks];
    let mut queries: Vec<Vec<NodeId>> = vec![Vec::new(); batches];
    let mut at = 0;
    for (s, &c) in asked_counts.iter().enumerate() {
        let message = &asked[at..at + c];
        at += c;
        if !header {
            asked_by[s][0] = c;
            queries[0].extend_from_slice(message);
            continue;
        }
        let (sizes, mut ids) = message.split_at(batches);
        for (k, &n) in sizes.iter().enumerate() {
            let (these, rest) = ids.split_at(n as usize);
            asked_by[s][k] = n as usize;
            queries[k].extend_from_slice(these);
            ids = rest;
        }
    }
    // Each batch's queries at once: the sampler is parallel over them.
    let answers: Vec<Sampled> = queries
        .iter()
        .enumerate()
        .map(|(k, ids)| draw(k, ids))
        .collect();

    // Back to each asking rank: its rows' lengths, batch by batch, then as many neighbours
    // as those say (both sides know the counts, so none are exchanged).
    let mut lens: Vec<u32> = Vec::new();
    let mut nbrs: Vec<NodeId> = Vec::new();
    let (mut len_counts, mut nbr_counts) = (Vec::with_capacity(ranks), Vec::with_capacity(ranks));
    let mut first = vec![0usize; batches];
    for asked in &asked_by {
        let (lens_before, nbrs_before) = (lens.len(), nbrs.len());
        for (k, answer) in answers.iter().enumerate() {
            let (q0, q1) = (first[k], first[k] + asked[k]);
            first[k] = q1;
            lens.extend((q0..q1).map(|q| (answer.offsets[q + 1] - answer.offsets[q]) as u32));
            nbrs.extend_from_slice(&answer.neighbors[answer.offsets[q0]..answer.offsets[q1]]);
        }
        len_counts.push(lens.len() - lens_before);
        nbr_counts.push(nbrs.len() - nbrs_before);
    }
    let got_lens = group.alltoallv_known("sample_counts", &lens, &len_counts, &asking);
    let mut got_nbr_counts = Vec::with_capacity(ranks);
    let mut at = 0;
    for &c in &asking {
        got_nbr_counts.push(got_lens[at..at + c].iter().map(|&l| l as usize).sum());
        at += c;
    }
    let got_nbrs = group.alltoallv_known("sample_nbrs", &nbrs, &nbr_counts, &got_nbr_counts);

    // The answers arrive by owner, each owner's batch by batch in the order they were asked.
    // One batch's are its rows in request order as they arrived, moved as they are (every
    // hop of every step without a window); a window's are cut into each batch's segments.
    let merged: Vec<Sampled> = if batches == 1 {
        vec![Sampled::from_lengths(&got_lens, got_nbrs)]
    } else {
        let mut lens_of: Vec<Vec<u32>> = vec![Vec::new(); batches];
        let mut nbrs_of: Vec<Vec<NodeId>> = vec![Vec::new(); batches];
        let (mut len_at, mut nbr_at) = (0, 0);
        for r in 0..ranks {
            for ((lens, nbrs), mine) in lens_of.iter_mut().zip(&mut nbrs_of).zip(&positions) {
                let these = &got_lens[len_at..len_at + mine[r].len()];
                let n: usize = these.iter().map(|&l| l as usize).sum();
                lens.extend_from_slice(these);
                nbrs.extend_from_slice(&got_nbrs[nbr_at..nbr_at + n]);
                (len_at, nbr_at) = (len_at + these.len(), nbr_at + n);
            }
        }
        lens_of
            .iter()
            .zip(nbrs_of)
            .map(|(lens, nbrs)| Sampled::from_lengths(lens, nbrs))
            .collect()
    };
    merged
        .iter()
        .zip(positions)
        .zip(frontiers)
        .map(|((m, mine), frontier)| {
            let order: Vec<usize> = mine.into_iter().flatten().collect();
            Sampled::merge_by_position(frontier.len(), &[(&order, m)])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::World;
    use crate::sample::ahead::SampleAhead;
    use crate::sample::{sample_blocks, LocalGraph};

    fn key_of(i: usize) -> BatchKey {
        BatchKey {
            seed: 3,
            epoch: 2,
            batch: i as u64,
        }
    }

    #[test]
    fn a_window_sampled_together_gives_each_batch_the_blocks_of_its_own_sampling() {
        // One rank: every hop's frontiers of the window still go out as one message with a
        // count per batch, and each batch is drawn under its own key.
        let world = World::solo();
        let data = crate::graph::generate::synthetic_default(1);
        let graph = LocalGraph::new(&data, None);
        let n = data.num_nodes;
        let offsets = [0, n];
        // Batch 4 has no seed: its hops ask for nothing, and the others go on.
        let seeds_of = |i: usize| -> Vec<NodeId> {
            let count = if i == 4 { 0 } else { 40 + 7 * i };
            (0..count)
                .map(|j| ((i * 131 + j * 17) as u64 % n) as NodeId)
                .collect()
        };
        let fanouts = [4, 3, 2];
        let mut ahead = SampleAhead::new(3);
        let end = 8;
        let mut windows = 0;
        for b in 0..end {
            let (blocks, seconds) = ahead
                .take_window(b, end, |batches| {
                    distributed_window(
                        &world, &graph, &offsets, &fanouts, batches, seeds_of, key_of,
                    )
                })
                .unwrap();
            windows += usize::from(seconds > 0.0);
            let alone = sample_blocks(&graph, &seeds_of(b), &fanouts, key_of(b));
            assert_eq!(blocks, alone, "batch {b}");
        }
        assert_eq!(windows, 3, "batches 0-2, 3-5 and 6-7");
    }

    /// An adjacency that owns only the vertices below `owned`, so that drawing for any other
    /// panics (as a rank asked for a vertex it does not hold would).
    struct Below<'a> {
        graph: LocalGraph<'a>,
        owned: NodeId,
    }

    impl Adjacency for Below<'_> {
        fn owns(&self, v: NodeId) -> bool {
            v < self.owned
        }
        fn neighbors(&self, v: NodeId) -> &[NodeId] {
            self.graph.neighbors(v)
        }
        fn orig_id(&self, v: NodeId) -> u64 {
            self.graph.orig_id(v)
        }
    }

    #[test]
    fn a_draw_that_panics_fails_the_window_instead_of_hanging_its_threads() {
        let world = World::solo();
        let data = crate::graph::generate::synthetic_default(1);
        let graph = Below {
            graph: LocalGraph::new(&data, None),
            owned: 10,
        };
        let offsets = [0, data.num_nodes];
        let mut ahead: SampleAhead = SampleAhead::new(4);
        let failed = ahead.take_window(0, 4, |batches| {
            distributed_window(
                &world,
                &graph,
                &offsets,
                &[3, 3],
                batches,
                |i| vec![i as NodeId, 500 + i as NodeId],
                key_of,
            )
        });
        let err = failed
            .expect_err("a window with an unanswerable hop")
            .to_string();
        assert!(err.contains("panicked"), "{err}");
    }
}
