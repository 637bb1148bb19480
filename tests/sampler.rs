//! Neighbour sampler: fanouts, determinism, independence from grouping, ranks and
//! partitioning (ARCHITECTURE invariants 2, 3 and 5), block invariants, epoch batches.

use gnnpar::graph::{Csr, Dataset, NodeId, Splits};
use gnnpar::sample::rng::hash_key;
use gnnpar::sample::{
    build_block, build_block_forced, epoch_batches, full_block, sample_blocks, sample_blocks_with,
    sample_hop, sample_hop_pipelined, sample_neighbors, Adjacency, BatchKey, Block, LayerKey,
    LocalGraph, Sampled,
};
use rayon::prelude::*;
use std::collections::{BTreeSet, HashMap, HashSet};

// ---------- helpers ----------

/// A random graph over `n` vertices: degrees in `[0, 2 * avg]`, some isolated vertices,
/// neighbours drawn with repetition (so lists may hold duplicates and self-loops).
fn random_csr(n: usize, avg: usize, salt: u64) -> Csr {
    let mut src = Vec::new();
    let mut dst = Vec::new();
    for v in 0..n {
        let deg = if v % 17 == 5 {
            0
        } else {
            (hash_key(&[salt, v as u64]) % (2 * avg as u64 + 1)) as usize
        };
        for i in 0..deg {
            src.push(v as NodeId);
            dst.push((hash_key(&[salt, v as u64, i as u64]) % n as u64) as NodeId);
        }
    }
    Csr::from_edges(n, &src, &dst)
}

/// A graph whose lists have no repeated entry: `v`'s neighbours are `v+1 ..= v+deg` mod n.
fn distinct_csr(n: usize, max_deg: usize) -> Csr {
    let mut src = Vec::new();
    let mut dst = Vec::new();
    for v in 0..n {
        let deg = (hash_key(&[9, v as u64]) % (max_deg as u64 + 1)) as usize;
        for i in 1..=deg.min(n - 1) {
            src.push(v as NodeId);
            dst.push(((v + i) % n) as NodeId);
        }
    }
    Csr::from_edges(n, &src, &dst)
}

fn dataset(graph: Csr, num_nodes: usize, first_node: usize, directed: bool) -> Dataset {
    Dataset {
        name: "test".into(),
        num_nodes: num_nodes as u64,
        first_node: first_node as u64,
        graph,
        features: None,
        labels: None,
        num_classes: 0,
        splits: Splits::default(),
        directed,
    }
}

fn whole(graph: Csr) -> Dataset {
    let n = graph.num_rows();
    dataset(graph, n, 0, true)
}

/// The part of `ds` (whole) holding the rows of `[a, b)`.
fn part(ds: &Dataset, a: usize, b: usize) -> Dataset {
    let lo = ds.graph.indptr[a];
    let graph = Csr {
        indptr: ds.graph.indptr[a..=b].iter().map(|&o| o - lo).collect(),
        indices: ds.graph.indices[lo as usize..ds.graph.indptr[b] as usize].to_vec(),
    };
    dataset(graph, ds.num_nodes as usize, a, ds.directed)
}

/// Relabel `g` by `new_of[old]`, keeping the order of every list (what the partitioner does).
/// Returns the relabelled graph and `orig[new] = old`.
fn relabel(g: &Csr, new_of: &[NodeId]) -> (Csr, Vec<u64>) {
    let n = g.num_rows();
    let mut orig = vec![0u64; n];
    for (old, &new) in new_of.iter().enumerate() {
        orig[new as usize] = old as u64;
    }
    let mut src = Vec::new();
    let mut dst = Vec::new();
    for (new, &old) in orig.iter().enumerate() {
        for &u in g.neighbors(old as usize) {
            src.push(new as NodeId);
            dst.push(new_of[u as usize]);
        }
    }
    (Csr::from_edges(n, &src, &dst), orig)
}

/// A pseudo-random permutation of `0..n`.
fn permutation(n: usize, salt: u64) -> Vec<NodeId> {
    let mut p: Vec<NodeId> = (0..n as NodeId).collect();
    p.sort_by_key(|&v| hash_key(&[salt, v as u64]));
    p
}

/// Edges of a block as (global destination, global source) pairs.
fn edge_pairs(b: &Block) -> Vec<(NodeId, NodeId)> {
    (0..b.num_dst)
        .flat_map(|i| {
            b.in_edges(i)
                .iter()
                .map(move |&s| (b.src_nodes[i], b.src_nodes[s as usize]))
        })
        .collect()
}

/// Is `sample` a sub-multiset of `list`?
fn sub_multiset(sample: &[NodeId], list: &[NodeId]) -> bool {
    let mut count: HashMap<NodeId, i64> = HashMap::new();
    for &u in list {
        *count.entry(u).or_default() += 1;
    }
    sample.iter().all(|u| {
        let c = count.entry(*u).or_default();
        *c -= 1;
        *c >= 0
    })
}

fn key(seed: u64, epoch: u64, batch: u64, layer: u32) -> LayerKey {
    LayerKey {
        seed,
        epoch,
        batch,
        layer,
    }
}

const BK: BatchKey = BatchKey {
    seed: 7,
    epoch: 2,
    batch: 5,
};

/// Check a mini-batch: each block consistent, destinations the prefix of the sources,
/// sources distinct, blocks chained (destinations of block l+1 = sources of block l), the
/// seeds the destinations of the last block, and every edge a real neighbour.
fn check_batch(adj: &impl Adjacency, seeds: &[NodeId], fanouts: &[i32], blocks: &[Block]) {
    assert_eq!(blocks.len(), fanouts.len());
    for b in blocks {
        b.check().unwrap();
        let distinct: HashSet<_> = b.src_nodes.iter().collect();
        assert_eq!(distinct.len(), b.num_src(), "sources must be distinct");
    }
    assert_eq!(blocks.last().unwrap().dst_nodes(), seeds);
    for l in 0..blocks.len() - 1 {
        assert_eq!(blocks[l].dst_nodes(), &blocks[l + 1].src_nodes[..]);
    }
    // blocks[L-1-hop] was sampled with fanouts[hop].
    for (hop, &f) in fanouts.iter().enumerate() {
        let b = &blocks[blocks.len() - 1 - hop];
        for i in 0..b.num_dst {
            let v = b.src_nodes[i];
            let list = adj.neighbors(v);
            let got: Vec<NodeId> = b
                .in_edges(i)
                .iter()
                .map(|&s| b.src_nodes[s as usize])
                .collect();
            let want = if f < 0 {
                list.len()
            } else {
                list.len().min(f as usize)
            };
            assert_eq!(got.len(), want, "vertex {v} hop {hop}");
            assert!(
                sub_multiset(&got, list),
                "vertex {v}: {got:?} not from {list:?}"
            );
        }
    }
}

// ---------- fanout and validity ----------

#[test]
fn fanout_is_respected_and_only_real_neighbours_are_sampled() {
    let ds = whole(random_csr(500, 12, 1));
    let adj = LocalGraph::new(&ds, None);
    let seeds: Vec<NodeId> = (0..500).step_by(7).collect();
    let fanouts = [5, 3, 2];
    let blocks = sample_blocks(&adj, &seeds, &fanouts, BK);
    check_batch(&adj, &seeds, &fanouts, &blocks);
    // Some destinations must have had more neighbours than the fanout, or nothing was tested.
    assert!(seeds.iter().any(|&v| adj.neighbors(v).len() > 5));
}

#[test]
fn sampled_positions_are_distinct_and_in_list_order() {
    // Lists without repeats: distinct positions = distinct neighbours, and list order is
    // increasing (mod wrap-around) so the order of the output is checkable.
    let n = 300;
    let ds = whole(distinct_csr(n, 60));
    let adj = LocalGraph::new(&ds, None);
    let all: Vec<NodeId> = (0..n as NodeId).collect();
    for fanout in [1, 3, 10, 33, 50] {
        let s = sample_neighbors(&adj, &all, fanout, key(1, 0, 0, 0));
        for (i, &v) in all.iter().enumerate() {
            let list = adj.neighbors(v);
            let row = s.row(i);
            assert_eq!(row.len(), list.len().min(fanout as usize));
            let pos: Vec<usize> = row
                .iter()
                .map(|u| list.iter().position(|x| x == u).expect("not a neighbour"))
                .collect();
            assert!(
                pos.windows(2).all(|w| w[0] < w[1]),
                "v {v}: positions {pos:?}"
            );
        }
    }
}

#[test]
fn fanout_minus_one_takes_every_neighbour_and_matches_the_full_block() {
    let ds = whole(random_csr(200, 8, 2));
    let adj = LocalGraph::new(&ds, None);
    let all: Vec<NodeId> = (0..200).collect();
    let s = sample_neighbors(&adj, &all, -1, key(3, 1, 1, 0));
    for (i, &v) in all.iter().enumerate() {
        assert_eq!(s.row(i), adj.neighbors(v));
    }
    // One hop from all vertices with fanout -1 is the full graph's block.
    let blocks = sample_blocks(&adj, &all, &[-1], BK);
    assert_eq!(blocks[0], full_block(&ds));
}

#[test]
fn fanout_zero_and_isolated_vertices_give_empty_rows() {
    let ds = whole(random_csr(100, 5, 3));
    let adj = LocalGraph::new(&ds, None);
    let seeds: Vec<NodeId> = vec![5, 22, 39, 40]; // 5, 22, 39 are isolated (v % 17 == 5)
    let blocks = sample_blocks(&adj, &seeds, &[0, 4], BK);
    check_batch(&adj, &seeds, &[0, 4], &blocks);
    assert_eq!(blocks[1].num_edges(), 0);
    assert_eq!(blocks[1].num_src(), 4);
    let s = sample_neighbors(&adj, &seeds, 4, key(1, 1, 1, 1));
    assert!(s.row(0).is_empty() && s.row(1).is_empty() && s.row(2).is_empty());
    assert!(!s.row(3).is_empty());
}

// ---------- determinism ----------

#[test]
fn sampling_is_deterministic_and_changes_with_every_key_field() {
    let ds = whole(random_csr(400, 20, 4));
    let adj = LocalGraph::new(&ds, None);
    let vs: Vec<NodeId> = (0..400).collect();
    let base = key(11, 3, 4, 1);
    let a = sample_neighbors(&adj, &vs, 4, base);
    assert_eq!(a, sample_neighbors(&adj, &vs, 4, base));
    let variants = [
        LayerKey { seed: 12, ..base },
        LayerKey { epoch: 4, ..base },
        LayerKey { batch: 5, ..base },
        LayerKey { layer: 2, ..base },
    ];
    for k in variants {
        let b = sample_neighbors(&adj, &vs, 4, k);
        let differing = (0..vs.len()).filter(|&i| a.row(i) != b.row(i)).count();
        assert!(
            differing > vs.len() / 2,
            "{k:?}: only {differing} rows differ"
        );
    }
    // Whole mini-batches too.
    let seeds: Vec<NodeId> = (0..400).step_by(9).collect();
    let x = sample_blocks(&adj, &seeds, &[6, 4], BK);
    assert_eq!(x, sample_blocks(&adj, &seeds, &[6, 4], BK));
    assert_ne!(
        x,
        sample_blocks(&adj, &seeds, &[6, 4], BatchKey { seed: 8, ..BK })
    );
}

#[test]
fn samples_do_not_depend_on_the_thread_count() {
    let ds = whole(random_csr(5000, 10, 5));
    let adj = LocalGraph::new(&ds, None);
    let seeds: Vec<NodeId> = (0..5000).step_by(3).collect();
    let run = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| sample_blocks(&adj, &seeds, &[10, 5], BK))
    };
    assert_eq!(run(1), run(3));
}

/// The block `build_block` must produce, written out the obvious way: destinations first,
/// then every other sampled vertex in order of first appearance, edges pointing at the first
/// copy of a vertex.
fn reference_block(dst: &[NodeId], sampled: &Sampled) -> Block {
    let mut index: HashMap<NodeId, u32> = HashMap::new();
    let mut src_nodes = Vec::new();
    for &v in dst {
        index.entry(v).or_insert(src_nodes.len() as u32);
        src_nodes.push(v);
    }
    let indices = sampled
        .neighbors
        .iter()
        .map(|&u| {
            *index.entry(u).or_insert_with(|| {
                src_nodes.push(u);
                (src_nodes.len() - 1) as u32
            })
        })
        .collect();
    Block {
        num_dst: dst.len(),
        src_nodes,
        indptr: sampled.offsets.clone(),
        indices,
    }
}

/// Destinations and sampled rows over `n` vertices with plenty of repeats: popular vertices
/// (ids below 64) appear in many rows, destinations also appear as sources, and with
/// `repeat_dst` one destination is listed twice.
fn random_rows(dsts: usize, n: u64, salt: u64, repeat_dst: bool) -> (Vec<NodeId>, Sampled) {
    let mut dst: Vec<NodeId> = (0..dsts as u64)
        .map(|i| (hash_key(&[salt, i]) % n) as NodeId)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if repeat_dst && dst.len() > 2 {
        let again = dst[1];
        dst.push(again);
    }
    let mut offsets = vec![0usize];
    let mut neighbors = Vec::new();
    for i in 0..dst.len() as u64 {
        let deg = hash_key(&[salt, i, 1]) % 24;
        for k in 0..deg {
            let h = hash_key(&[salt, i, 2, k]);
            let u = if h.is_multiple_of(4) {
                h / 4 % 64
            } else {
                h / 4 % n
            };
            neighbors.push(u as NodeId);
        }
        offsets.push(neighbors.len());
    }
    (dst, Sampled { offsets, neighbors })
}

#[test]
fn parallel_and_serial_block_builds_are_identical() {
    // Sizes from empty to several of the parallel build's 4,096-key chunks, with first
    // appearances straddling chunk borders, duplicate edges and a repeated destination; on
    // one thread (two owners of the id table), three and sixteen (32 owners, most with a few
    // keys of a chunk or none).
    for (dsts, n, salt) in [
        (0, 10, 1),
        (1, 5, 2),
        (40, 50, 3),
        (3000, 1 << 20, 4),
        (9000, 20_000, 5),
    ] {
        for repeat_dst in [false, true] {
            let (dst, sampled) = random_rows(dsts, n, salt, repeat_dst);
            let want = reference_block(&dst, &sampled);
            for threads in [1, 3, 16] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (serial, parallel, auto) = pool.install(|| {
                    (
                        build_block_forced(&dst, &sampled, false),
                        build_block_forced(&dst, &sampled, true),
                        build_block(&dst, &sampled),
                    )
                });
                let tag = format!(
                    "{} dsts, {} edges, {threads} threads",
                    dst.len(),
                    sampled.neighbors.len()
                );
                assert_eq!(serial, want, "serial build, {tag}");
                assert_eq!(parallel, want, "parallel build, {tag}");
                assert_eq!(auto, want, "build_block, {tag}");
            }
        }
    }
}

#[test]
fn blocks_built_in_parallel_are_those_of_one_thread() {
    // Large enough frontiers (tens of thousands of edges per hop) for the parallel build at
    // eight threads (its threshold), the pipelined hop (draws and numbering overlapped, a
    // frontier of 8,192+) at two and three, the serial one at one thread; the thread-local id
    // table is reused across hops and batches in all.
    let ds = whole(random_csr(30_000, 12, 9));
    let adj = LocalGraph::new(&ds, None);
    let seeds: Vec<NodeId> = (0..30_000).step_by(7).collect();
    let run = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| {
                (0..3)
                    .map(|batch| {
                        sample_blocks(&adj, &seeds, &[10, 10, 5], BatchKey { batch, ..BK })
                    })
                    .collect::<Vec<_>>()
            })
    };
    let one = run(1);
    assert!(
        one[0][0].num_edges() > 1 << 15,
        "the input block should be large enough for the parallel build"
    );
    assert!(
        one[0][1].num_dst >= 8192,
        "the last hop's frontier should be long enough to be pipelined"
    );
    assert_eq!(one, run(8));
    assert_eq!(one, run(2));
    assert_eq!(one, run(3));
    check_batch(&adj, &seeds, &[10, 10, 5], &one[0]);
}

#[test]
fn pipelined_hops_are_draws_then_build() {
    // Frontiers around the 4,096-vertex parts (one part, a part and one vertex, several with
    // a short last one), repeated frontier vertices (identical rows, edges to the first copy),
    // fanouts of some, all, and none, on one to five threads.
    let ds = whole(random_csr(50_000, 10, 21));
    let adj = LocalGraph::new(&ds, None);
    for (len, salt) in [
        (0, 1),
        (1, 2),
        (4096, 3),
        (4097, 4),
        (3 * 4096 + 5, 5),
        (20_000, 6),
    ] {
        let mut frontier: Vec<NodeId> = (0..len as u64)
            .map(|i| (hash_key(&[salt, i]) % 50_000) as NodeId)
            .collect();
        if len > 10 {
            frontier[len - 1] = frontier[3];
        }
        for fanout in [5, -1, 0] {
            let key = LayerKey {
                seed: 3,
                epoch: 1,
                batch: salt,
                layer: 1,
            };
            let want = build_block(&frontier, &sample_neighbors(&adj, &frontier, fanout, key));
            for threads in [1, 2, 5] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (pipelined, hop) = pool.install(|| {
                    (
                        sample_hop_pipelined(&adj, &frontier, fanout, key),
                        sample_hop(&adj, &frontier, fanout, key),
                    )
                });
                let tag = format!("frontier {len}, fanout {fanout}, {threads} threads");
                assert_eq!(pipelined, want, "pipelined hop, {tag}");
                assert_eq!(hop, want, "sample_hop, {tag}");
            }
        }
    }
}

#[test]
fn a_failed_draw_in_a_pipelined_hop_panics_instead_of_hanging() {
    // A vertex this part does not own, in the last of four parts: whichever thread draws that
    // part panics, and the panic must reach the caller (the numbering thread never waits for a
    // part another thread is drawing, so nothing is left spinning).
    let ds = whole(random_csr(20_000, 8, 22));
    let mine = part(&ds, 0, 10_000);
    let adj = LocalGraph::new(&mine, None);
    let mut frontier: Vec<NodeId> = (0..4 * 2048).map(|i| (i % 10_000) as NodeId).collect();
    frontier[4 * 2048 - 7] = 15_000;
    let key = LayerKey {
        seed: 1,
        epoch: 0,
        batch: 0,
        layer: 0,
    };
    for threads in [1, 2, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| sample_hop_pipelined(&adj, &frontier, 5, key))
        }));
        let message = outcome.expect_err("the hop should fail");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| message.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(text.contains("not owned"), "{threads} threads: {text}");
    }
}

#[test]
fn self_loops_are_appended_to_every_row() {
    let (dst, sampled) = random_rows(9000, 20_000, 6, false);
    let b = reference_block(&dst, &sampled);
    let looped = b.with_self_loops();
    looped.check().unwrap();
    assert_eq!(looped.src_nodes, b.src_nodes);
    for i in 0..b.num_dst {
        let mut want = b.in_edges(i).to_vec();
        want.push(i as u32);
        assert_eq!(looped.in_edges(i), &want[..], "row {i}");
    }
}

// ---------- grouping: what distributed strategies rely on ----------

#[test]
fn a_vertex_gets_the_same_sample_in_any_group_and_position() {
    let ds = whole(random_csr(300, 15, 6));
    let adj = LocalGraph::new(&ds, None);
    let k = key(5, 1, 2, 0);
    let all: Vec<NodeId> = (0..300).collect();
    let together = sample_neighbors(&adj, &all, 5, k);
    let reversed: Vec<NodeId> = all.iter().rev().copied().collect();
    let back = sample_neighbors(&adj, &reversed, 5, k);
    let odd: Vec<NodeId> = all.iter().copied().filter(|v| v % 2 == 1).collect();
    let part = sample_neighbors(&adj, &odd, 5, k);
    for (i, &v) in reversed.iter().enumerate() {
        assert_eq!(back.row(i), together.row(v as usize));
    }
    for (i, &v) in odd.iter().enumerate() {
        assert_eq!(part.row(i), together.row(v as usize));
    }
}

#[test]
fn seeds_split_into_groups_give_the_same_edges_per_layer() {
    let ds = whole(random_csr(2000, 12, 7));
    let adj = LocalGraph::new(&ds, None);
    let seeds: Vec<NodeId> = (0..2000).step_by(11).collect();
    let fanouts = [6, 4, 3];
    let together = sample_blocks(&adj, &seeds, &fanouts, BK);
    for groups in [2usize, 3] {
        let mut union: Vec<BTreeSet<(NodeId, NodeId)>> = vec![BTreeSet::new(); fanouts.len()];
        for g in 0..groups {
            let mine: Vec<NodeId> = seeds.iter().copied().skip(g).step_by(groups).collect();
            let blocks = sample_blocks(&adj, &mine, &fanouts, BK);
            check_batch(&adj, &mine, &fanouts, &blocks);
            for (l, b) in blocks.iter().enumerate() {
                union[l].extend(edge_pairs(b));
            }
        }
        for (l, b) in together.iter().enumerate() {
            let all: BTreeSet<_> = edge_pairs(b).into_iter().collect();
            assert_eq!(union[l], all, "{groups} groups, layer {l}");
        }
    }
}

// ---------- uniformity ----------

#[test]
fn each_of_ten_neighbours_is_chosen_about_thirty_percent_of_the_time() {
    // Vertex 0 has the 10 neighbours 1..=10.
    let src = vec![0 as NodeId; 10];
    let dst: Vec<NodeId> = (1..=10).collect();
    let ds = whole(Csr::from_edges(11, &src, &dst));
    let adj = LocalGraph::new(&ds, None);
    let trials = 20_000u64;
    let mut hits = [0u64; 11];
    for t in 0..trials {
        let k = key(t / 100, t % 10, t % 100 / 10, (t % 3) as u32);
        for &u in sample_neighbors(&adj, &[0], 3, k).row(0) {
            hits[u as usize] += 1;
        }
    }
    let expect = trials as f64 * 0.3;
    // Chi-square with 9 degrees of freedom; 40 is far beyond the 0.1% quantile (27.9).
    let chi2: f64 = hits[1..]
        .iter()
        .map(|&h| (h as f64 - expect).powi(2) / expect)
        .sum();
    assert!(chi2 < 40.0, "chi2 {chi2}, hits {hits:?}");
    for &h in &hits[1..] {
        let share = h as f64 / trials as f64;
        assert!((0.27..0.33).contains(&share), "share {share}");
    }
}

// ---------- partitioning ----------

#[test]
fn relabelled_graph_samples_the_same_original_edges() {
    let n = 1500;
    let g = random_csr(n, 10, 8);
    let ds = whole(g.clone());
    let new_of = permutation(n, 99);
    let (rg, orig) = relabel(&g, &new_of);
    let rds = whole(rg);
    let seeds: Vec<NodeId> = (0..n as NodeId).step_by(13).collect();
    let fanouts = [5, 5, 3];
    let plain = sample_blocks(&LocalGraph::new(&ds, None), &seeds, &fanouts, BK);
    let rseeds: Vec<NodeId> = seeds.iter().map(|&v| new_of[v as usize]).collect();
    let radj = LocalGraph::new(&rds, Some(&orig));
    let relabelled = sample_blocks(&radj, &rseeds, &fanouts, BK);
    for (a, b) in plain.iter().zip(&relabelled) {
        // Same sources in the same order, same CSR: the blocks are equal up to the labels.
        let mapped: Vec<NodeId> = b
            .src_nodes
            .iter()
            .map(|&v| orig[v as usize] as NodeId)
            .collect();
        assert_eq!(mapped, a.src_nodes);
        assert_eq!(
            (b.num_dst, &b.indptr, &b.indices),
            (a.num_dst, &a.indptr, &a.indices)
        );
    }
}

#[test]
fn owners_sampling_their_share_reproduce_single_rank_blocks() {
    // Relabel, cut into 3 contiguous parts, and sample each hop by sending every frontier
    // vertex to its owner (owner computes), then merging the answers by position.
    let n = 1200;
    let g = random_csr(n, 10, 9);
    let new_of = permutation(n, 5);
    let (rg, orig) = relabel(&g, &new_of);
    let rds = whole(rg);
    let offsets = [0usize, 350, 900, n];
    let parts: Vec<Dataset> = offsets.windows(2).map(|w| part(&rds, w[0], w[1])).collect();
    let views: Vec<LocalGraph> = parts
        .iter()
        .map(|p| LocalGraph::new(p, Some(&orig)))
        .collect();
    let seeds: Vec<NodeId> = (0..n as NodeId).step_by(7).collect();
    let fanouts = [4, 3, 3];
    let single = sample_blocks(&LocalGraph::new(&rds, Some(&orig)), &seeds, &fanouts, BK);
    let owner = |v: NodeId| offsets.partition_point(|&o| o <= v as usize) - 1;
    let distributed = sample_blocks_with(&seeds, &fanouts, BK, |frontier, fanout, k| {
        let mut positions = vec![Vec::new(); views.len()];
        let mut queries = vec![Vec::new(); views.len()];
        for (i, &v) in frontier.iter().enumerate() {
            positions[owner(v)].push(i);
            queries[owner(v)].push(v);
        }
        let answers: Vec<Sampled> = views
            .iter()
            .zip(&queries)
            .map(|(adj, q)| sample_neighbors(adj, q, fanout, k))
            .collect();
        let shares: Vec<(&[usize], &Sampled)> = positions
            .iter()
            .map(|p| p.as_slice())
            .zip(&answers)
            .collect();
        Ok::<_, String>(Sampled::merge_by_position(frontier.len(), &shares))
    })
    .unwrap();
    assert_eq!(distributed, single);
}

#[test]
#[should_panic(expected = "not owned")]
fn sampling_a_vertex_owned_elsewhere_is_refused() {
    let ds = whole(random_csr(100, 4, 10));
    let p = part(&ds, 0, 50);
    sample_neighbors(&LocalGraph::new(&p, None), &[10, 60], 2, key(0, 0, 0, 0));
}

// ---------- full-graph block ----------

#[test]
fn full_block_of_a_directed_graph_keeps_the_stored_lists() {
    // 0 -> 1, 0 -> 2, 2 -> 1: vertex 0 aggregates over {1, 2}, vertex 2 over {1}.
    let ds = whole(Csr::from_edges(3, &[0, 0, 2], &[1, 2, 1]));
    let b = full_block(&ds);
    b.check().unwrap();
    assert_eq!(b.src_nodes, vec![0, 1, 2]);
    assert_eq!(b.num_dst, 3);
    assert_eq!(edge_pairs(&b), vec![(0, 1), (0, 2), (2, 1)]);
}

#[test]
fn full_block_of_a_part_puts_owned_vertices_first() {
    let ds = whole(random_csr(60, 5, 11));
    let p = part(&ds, 20, 35);
    let b = full_block(&p);
    b.check().unwrap();
    assert_eq!(b.num_dst, 15);
    assert_eq!(b.dst_nodes(), (20..35).collect::<Vec<NodeId>>());
    let mut sorted = b.src_nodes.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..60).collect::<Vec<NodeId>>());
    let want: Vec<(NodeId, NodeId)> = (20..35u32)
        .flat_map(|v| ds.graph.neighbors(v as usize).iter().map(move |&u| (v, u)))
        .collect();
    assert_eq!(edge_pairs(&b), want);
}

// ---------- epoch batches ----------

#[test]
fn epoch_batches_are_a_deterministic_permutation_that_changes_per_epoch() {
    let train: Vec<NodeId> = (0..1000).filter(|v| v % 3 != 0).collect();
    let id = |v: NodeId| v as u64;
    let e0 = epoch_batches(&train, id, 42, 0, 64);
    assert_eq!(e0.len(), train.len().div_ceil(64));
    assert!(e0[..e0.len() - 1].iter().all(|b| b.len() == 64));
    let mut flat = e0.concat();
    flat.sort_unstable();
    assert_eq!(flat, train, "every training vertex exactly once");
    assert_eq!(e0, epoch_batches(&train, id, 42, 0, 64));
    assert_ne!(e0, epoch_batches(&train, id, 42, 1, 64));
    assert_ne!(e0, epoch_batches(&train, id, 43, 0, 64));
    // The order is shuffled, not the input order.
    assert_ne!(e0.concat(), train);
    // Input order does not matter.
    let rev: Vec<NodeId> = train.iter().rev().copied().collect();
    assert_eq!(e0, epoch_batches(&rev, id, 42, 0, 64));
}

#[test]
fn epoch_batches_are_defined_over_original_ids() {
    let n = 800;
    let new_of = permutation(n, 3);
    let mut orig = vec![0u64; n];
    for (old, &new) in new_of.iter().enumerate() {
        orig[new as usize] = old as u64;
    }
    let train: Vec<NodeId> = (0..n as NodeId).filter(|v| v % 4 != 1).collect();
    let plain = epoch_batches(&train, |v| v as u64, 9, 3, 50);
    let rtrain: Vec<NodeId> = train.iter().map(|&v| new_of[v as usize]).collect();
    let relabelled = epoch_batches(&rtrain, |v| orig[v as usize], 9, 3, 50);
    let mapped: Vec<Vec<NodeId>> = relabelled
        .iter()
        .map(|b| b.iter().map(|&v| orig[v as usize] as NodeId).collect())
        .collect();
    assert_eq!(mapped, plain);
}

// ---------- throughput (run by hand, release build) ----------

/// `cargo test --release --test sampler -- --ignored --nocapture throughput`
#[test]
#[ignore = "timing report, run by hand in a release build"]
fn throughput_of_sample_blocks() {
    let n = 200_000;
    let ds = whole(random_csr(n, 20, 12));
    let adj = LocalGraph::new(&ds, None);
    let train: Vec<NodeId> = (0..n as NodeId).collect();
    let batches = epoch_batches(&train, |v| v as u64, 1, 0, 1024);
    let fanouts = [15, 10, 5];
    let start = std::time::Instant::now();
    let cpu_start = process_cpu_seconds();
    let mut edges = 0usize;
    let count = 40;
    for (b, seeds) in batches.iter().take(count).enumerate() {
        let key = BatchKey {
            seed: 1,
            epoch: 0,
            batch: b as u64,
        };
        let blocks = sample_blocks(&adj, seeds, &fanouts, key);
        edges += blocks.iter().map(Block::num_edges).sum::<usize>();
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_start;
    // CPU time is reported too: on a shared machine wall time measures the neighbours' load.
    eprintln!(
        "sample_blocks: {n} nodes, {} edges, fanouts 15,10,5, batch 1024, {} threads: \
         {count} batches, {:.1} edges/batch, wall {secs:.3} s ({:.2e} sampled edges/s), \
         cpu {cpu:.3} s ({:.2e} sampled edges per cpu-second)",
        ds.local_edges(),
        rayon::current_num_threads(),
        edges as f64 / count as f64,
        edges as f64 / secs,
        edges as f64 / cpu
    );
}

/// `RAYON_NUM_THREADS=T cargo test --release --test sampler -- --ignored --nocapture host_phases`
///
/// The host phases of a GDP step in isolation, on a random 200k-vertex graph of ~20 neighbours
/// per vertex and 128 features (the shape of `benchmarks/threads.sh`'s SBM), fanouts 15,10,5,
/// batches of 1024: sampling (draws, then the serial and the parallel block build of each hop),
/// and the input-row gather, as the feature store does it now (parallel, into a recycled
/// buffer) and as it did before (one thread, into a zero-filled fresh matrix). Each figure is
/// the fastest of 8 batches (after one warm-up), so that a busy neighbour on a shared machine
/// shows less.
#[test]
#[ignore = "timing report, run by hand in a release build"]
fn host_phases_of_a_gdp_step() {
    use gnnpar::exchange::FeatureStore;
    use gnnpar::sample::build_block_forced;
    use std::time::Instant;
    // Under training's allocator policy (`Model::new` sets it): blocks and gathered rows
    // reuse freed memory instead of faulting fresh pages in at every batch.
    gnnpar::backend::cpu::memory::keep_freed_memory();
    let (n, d) = (200_000usize, 128usize);
    let ds = whole(random_csr(n, 20, 12));
    let adj = LocalGraph::new(&ds, None);
    let features = ndarray::Array2::from_shape_fn((n, d), |(r, c)| {
        (hash_key(&[r as u64, c as u64]) >> 40) as f32
    });
    let store = FeatureStore::new(vec![0, n as u64], 0, features.clone());
    let train: Vec<NodeId> = (0..n as NodeId).collect();
    let batches = epoch_batches(&train, |v| v as u64, 1, 0, 1024);
    let fanouts = [15, 10, 5];
    let mut best = [f64::MAX; 6];
    let mut rows = 0;
    for (b, seeds) in batches.iter().take(9).enumerate() {
        let key = BatchKey {
            seed: 1,
            epoch: 0,
            batch: b as u64,
        };
        let mut t = [0f64; 6];
        let mut frontier = seeds.clone();
        for (hop, &f) in fanouts.iter().enumerate() {
            let s0 = Instant::now();
            let sampled = sample_neighbors(&adj, &frontier, f, key.layer(hop as u32));
            t[0] += s0.elapsed().as_secs_f64();
            let s0 = Instant::now();
            let serial = build_block_forced(&frontier, &sampled, false);
            t[1] += s0.elapsed().as_secs_f64();
            let s0 = Instant::now();
            let parallel = build_block_forced(&frontier, &sampled, true);
            t[2] += s0.elapsed().as_secs_f64();
            assert_eq!(serial, parallel);
            frontier = parallel.src_nodes;
        }
        rows = frontier.len();
        let s0 = Instant::now();
        let (x, _) = store.gather_local(&frontier);
        t[3] += s0.elapsed().as_secs_f64();
        store.recycle(x);
        // The gather as it was: one thread, into a fresh zero-filled matrix.
        let s0 = Instant::now();
        let mut old = ndarray::Array2::<f32>::zeros((frontier.len(), d));
        let (src, out) = (features.as_slice().unwrap(), old.as_slice_mut().unwrap());
        for (i, &v) in frontier.iter().enumerate() {
            let v = v as usize;
            out[i * d..(i + 1) * d].copy_from_slice(&src[v * d..(v + 1) * d]);
        }
        t[4] += s0.elapsed().as_secs_f64();
        drop(old);
        // A parallel copy of the same bytes between buffers already mapped: the bound.
        let mut into = vec![2f32; frontier.len() * d];
        let from = vec![1f32; frontier.len() * d];
        let s0 = Instant::now();
        into.par_chunks_mut(1 << 16)
            .zip(from.par_chunks(1 << 16))
            .for_each(|(a, b)| a.copy_from_slice(b));
        t[5] += s0.elapsed().as_secs_f64();
        if b > 0 {
            for (bi, ti) in best.iter_mut().zip(t) {
                *bi = bi.min(ti);
            }
        }
    }
    let ms = |s: f64| s * 1e3;
    eprintln!(
        "host phases, {} threads, {rows} input rows ({:.0} MB): sampling draws {:.2} ms, \
         block builds serial {:.2} ms / parallel {:.2} ms; gather now {:.2} ms, as before \
         {:.2} ms, parallel memcpy of the same bytes {:.2} ms (fastest of 8 batches)",
        rayon::current_num_threads(),
        (rows * d * 4) as f64 / 1e6,
        ms(best[0]),
        ms(best[1]),
        ms(best[2]),
        ms(best[3]),
        ms(best[4]),
        ms(best[5]),
    );
}

/// User + system CPU seconds of this process so far.
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for clock_gettime to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The block builds at every thread count, as JSON lines on stdout (`benchmarks/block_build.sh`
/// runs it and writes the table): for each graph, the three blocks of a GDP batch (1,024
/// seeds, fanouts 15/10/5) built by the serial and by the parallel build in a rayon pool of
/// 1, 2, 4, … threads up to the machine's cores (`BUILD_THREADS`, a comma list, overrides),
/// and the batch's whole sampling (draws and builds) by each way of doing a hop and by
/// `sample_blocks`, and from two threads a window of as many batches side by side
/// (`sample::ahead`); each the fastest of `BUILD_ROUNDS` rounds (default 5) over four batches. Graphs: 200k
/// vertices of mean degree 20 (its id table, 800 KB, stays in a core's L2) and 3M of mean
/// degree 10 (12 MB: beyond it); `BUILD_GRAPHS=small` keeps the first.
#[test]
#[ignore = "timing report, run by hand in a release build (benchmarks/block_build.sh)"]
fn block_build_timings() {
    use gnnpar::sample::ahead::SampleAhead;
    use gnnpar::sample::build_block_forced;
    use std::time::Instant;
    gnnpar::backend::cpu::memory::keep_freed_memory();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> = match std::env::var("BUILD_THREADS") {
        Ok(list) => list
            .split(',')
            .map(|t| {
                t.trim()
                    .parse()
                    .expect("BUILD_THREADS: a comma list of counts")
            })
            .collect(),
        Err(_) => std::iter::successors(Some(1usize), |t| Some(t * 2))
            .take_while(|&t| t <= cores)
            .chain((!cores.is_power_of_two()).then_some(cores))
            .collect(),
    };
    let rounds: usize =
        std::env::var("BUILD_ROUNDS").map_or(5, |r| r.parse().expect("BUILD_ROUNDS: a count"));
    let small_only = std::env::var("BUILD_GRAPHS").is_ok_and(|g| g == "small");
    let graphs = [(200_000usize, 20usize), (3_000_000, 10)];
    for &(n, avg) in graphs.iter().take(if small_only { 1 } else { 2 }) {
        let ds = whole(random_csr(n, avg, 12));
        let adj = LocalGraph::new(&ds, None);
        let train: Vec<NodeId> = (0..n as NodeId).collect();
        let batches = epoch_batches(&train, |v| v as u64, 1, 0, 1024);
        // Every block of four batches: (destinations, sampled rows).
        let mut blocks = Vec::new();
        for (b, seeds) in batches.iter().take(4).enumerate() {
            let key = BatchKey {
                seed: 1,
                epoch: 0,
                batch: b as u64,
            };
            let mut frontier = seeds.clone();
            for (hop, &f) in [15, 10, 5].iter().enumerate() {
                let sampled = sample_neighbors(&adj, &frontier, f, key.layer(hop as u32));
                let next = build_block_forced(&frontier, &sampled, false).src_nodes;
                blocks.push((frontier, sampled));
                frontier = next;
            }
        }
        let edges: usize = blocks.iter().map(|(_, s)| s.neighbors.len()).sum();
        for &t in &threads {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .expect("a rayon pool");
            // Milliseconds per batch of `run` (four batches), the fastest round after one
            // warm-up, in this pool.
            let fastest = |run: &(dyn Fn() + Sync)| {
                pool.install(|| {
                    (0..rounds + 1)
                        .map(|_| {
                            let start = Instant::now();
                            run();
                            start.elapsed().as_secs_f64() * 1e3 / 4.0
                        })
                        .skip(1)
                        .fold(f64::MAX, f64::min)
                })
            };
            let time = |parallel: bool| {
                fastest(&|| {
                    for (dst, sampled) in &blocks {
                        std::hint::black_box(build_block_forced(dst, sampled, parallel));
                    }
                })
            };
            let (serial, parallel) = (time(false), time(true));
            // A whole batch's sampling (draws and builds, three hops) by each way of doing a
            // hop, and by `sample_blocks`, which picks one by the thread count.
            let sample = |way: Way| {
                fastest(&|| {
                    for (b, seeds) in batches.iter().take(4).enumerate() {
                        let key = BatchKey {
                            seed: 1,
                            epoch: 0,
                            batch: b as u64,
                        };
                        std::hint::black_box(sample_batch(&adj, seeds, key, way));
                    }
                })
            };
            let ways = [
                ("draws_then_serial_ms", Way::DrawsThen(false)),
                ("draws_then_parallel_ms", Way::DrawsThen(true)),
                ("pipelined_ms", Way::Pipelined),
                ("sample_blocks_ms", Way::SampleBlocks),
            ];
            let mut sampling: Vec<String> = ways
                .iter()
                .map(|&(name, way)| format!("\"{name}\": {:.4}", sample(way)))
                .collect();
            // Whole batches side by side, as a rank sampling ahead does (`--sample-ahead`):
            // a window of `t` batches, each on a thread of its own; ms per batch.
            if t > 1 {
                let mut ahead = SampleAhead::new(t);
                let window = batches.len().min(t);
                let ms = pool.install(|| {
                    (0..rounds + 1)
                        .map(|_| {
                            ahead.clear();
                            let start = Instant::now();
                            for b in 0..window {
                                let (blocks, _) = ahead
                                    .take(
                                        b,
                                        window,
                                        &adj,
                                        &[15, 10, 5],
                                        |i| batches[i].clone(),
                                        |i| BatchKey {
                                            seed: 1,
                                            epoch: 0,
                                            batch: i as u64,
                                        },
                                    )
                                    .expect("sampling threads start");
                                std::hint::black_box(blocks);
                            }
                            start.elapsed().as_secs_f64() * 1e3 / window as f64
                        })
                        .skip(1)
                        .fold(f64::MAX, f64::min)
                });
                sampling.push(format!("\"window_ms\": {ms:.4}"));
            }
            println!(
                "{{\"bench\": \"block_build\", \"vertices\": {n}, \"mean_degree\": {avg}, \
                 \"edges_per_batch\": {}, \"threads\": {t}, \"cores\": {cores}, \
                 \"serial_ms\": {serial:.4}, \"parallel_ms\": {parallel:.4}, {}}}",
                edges / 4,
                sampling.join(", ")
            );
        }
    }
}

/// How [`block_build_timings`] samples a batch's hops.
#[derive(Clone, Copy)]
enum Way {
    /// All draws, then the serial (`false`) or the parallel (`true`) build.
    DrawsThen(bool),
    /// Draws and numbering overlapped on any thread count.
    Pipelined,
    /// What `sample_blocks` picks.
    SampleBlocks,
}

/// The blocks of one batch from `seeds` with fanouts 15/10/5, sampled `way`.
fn sample_batch(adj: &LocalGraph, seeds: &[NodeId], key: BatchKey, way: Way) -> Vec<Block> {
    use gnnpar::sample::build_block_forced;
    let fanouts = [15, 10, 5];
    if let Way::SampleBlocks = way {
        return sample_blocks(adj, seeds, &fanouts, key);
    }
    let mut blocks: Vec<Block> = Vec::new();
    for (hop, &f) in fanouts.iter().enumerate() {
        let frontier: &[NodeId] = blocks.last().map_or(seeds, |b| &b.src_nodes);
        let lkey = key.layer(hop as u32);
        let block = match way {
            Way::DrawsThen(parallel) => build_block_forced(
                frontier,
                &sample_neighbors(adj, frontier, f, lkey),
                parallel,
            ),
            _ => sample_hop_pipelined(adj, frontier, f, lkey),
        };
        blocks.push(block);
    }
    blocks
}
