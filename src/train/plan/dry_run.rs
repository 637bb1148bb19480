//! The dry run (APT's "one epoch is enough", on a sample of it): sample the first
//! [`DRY_RUN_BATCHES`] mini-batches of epoch 0 once per strategy exactly as that strategy
//! samples them, and count per rank what each would move and compute. Nothing is trained and
//! no feature or hidden row moves; the sampling itself is the strategies' own (collective), and
//! what it does is counted, not timed: the edges its blocks hold and the bytes and calls of its
//! id exchanges, which the cost model prices with the calibration. So a prediction is a
//! function of the seed, the data and the calibration only: the same inputs, the same choice.
//!
//! Every rank's counts are then allgathered, so each rank holds the same table (integer counts
//! in f64, exact) and prices it alike.

use super::super::data::TrainData;
use super::super::owner_input::OwnerBatch;
use super::super::split::sample_split;
use super::super::strategy::BatchSpec;
use crate::comm::{CommStats, Group, OpStats};
use crate::exchange::{sample_blocks_distributed, RowExchange};
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::sample::{epoch_batches, sample_blocks};
use crate::sample::{BatchKey, Block, LocalGraph};
use std::collections::{BTreeMap, HashMap};

/// Mini-batches the dry run samples (a sample of epoch 0; the first ones, which every
/// strategy trains first too).
pub const DRY_RUN_BATCHES: usize = 6;

/// The strategies the dry run samples, in [`RankCounts::of`] order.
pub const SAMPLED: [&str; 4] = ["gdp", "split", "dnp", "snp"];

/// What one rank does for one strategy, per mini-batch (mean over the dry-run batches).
/// Per-layer vectors are input layer first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    /// The build phase: edges in the blocks this rank samples and their destination vertices
    /// (whose neighbours the sampler reads), and the bytes (the larger of sent and received)
    /// and calls of the strategy's id exchanges while sampling.
    pub sampled_edges: f64,
    pub sampled_vertices: f64,
    pub sample_bytes: f64,
    pub sample_calls: f64,
    /// Input-layer feature rows read from this rank's own store.
    pub input_local: f64,
    /// Input-layer feature rows of other ranks of this host, read in shared memory
    /// (`--shared-features`).
    pub input_peer: f64,
    /// Input-layer feature rows fetched from other ranks, and how many from each rank.
    pub input_remote: f64,
    pub requests_to: Vec<f64>,
    /// Input-layer feature rows this rank reads for other ranks (their `requests_to` of it).
    pub input_served: f64,
    /// Remote input rows the feature cache (`--cache-mb`) would serve (a local read; no
    /// longer in `input_remote` or `requests_to`).
    pub input_cached: f64,
    /// Rows received from other ranks per layer at the layer's input width (split above the
    /// input layer; their gradients go back).
    pub rows_in: Vec<f64>,
    /// Rows of layer 1's output width received (DNP's and SNP's exchange; gradients go back).
    pub hidden_rows: f64,
    /// SNP: partial rows of layer 1's output width from remote source owners (gradients go
    /// back), and input edges routed to a remote source owner (8 bytes each).
    pub partial_rows: f64,
    pub remote_edges: f64,
    /// SNP: partial rows this rank computes for its own destinations (those with a source of
    /// its own): they pass through the exchange to itself and are added with the rest.
    pub own_partials: f64,
    /// What this rank computes per layer.
    pub dst: Vec<f64>,
    pub src: Vec<f64>,
    pub edges: Vec<f64>,
}

impl Counts {
    fn new(layers: usize, ranks: usize) -> Counts {
        Counts {
            requests_to: vec![0.0; ranks],
            rows_in: vec![0.0; layers],
            dst: vec![0.0; layers],
            src: vec![0.0; layers],
            edges: vec![0.0; layers],
            ..Counts::default()
        }
    }

    fn flat(&self) -> Vec<f64> {
        let mut v = vec![
            self.sampled_edges,
            self.sampled_vertices,
            self.sample_bytes,
            self.sample_calls,
            self.input_local,
            self.input_remote,
            self.input_cached,
            self.input_peer,
        ];
        v.extend(&self.requests_to);
        v.extend(&self.rows_in);
        v.extend([
            self.hidden_rows,
            self.partial_rows,
            self.remote_edges,
            self.own_partials,
        ]);
        v.extend(&self.dst);
        v.extend(&self.src);
        v.extend(&self.edges);
        v
    }

    fn from_flat(v: &[f64], layers: usize, ranks: usize) -> Counts {
        let mut it = v.iter().copied();
        let mut take = |n: usize| -> Vec<f64> { it.by_ref().take(n).collect() };
        let head = take(8);
        let requests_to = take(ranks);
        let rows_in = take(layers);
        let mid = take(4);
        Counts {
            sampled_edges: head[0],
            sampled_vertices: head[1],
            sample_bytes: head[2],
            sample_calls: head[3],
            input_local: head[4],
            input_remote: head[5],
            input_cached: head[6],
            input_peer: head[7],
            requests_to,
            input_served: 0.0,
            rows_in,
            hidden_rows: mid[0],
            partial_rows: mid[1],
            remote_edges: mid[2],
            own_partials: mid[3],
            dst: take(layers),
            src: take(layers),
            edges: take(layers),
        }
    }

    /// The field-wise sum of `counts` (`input_served` is filled in after the allgather).
    fn sum<'a>(counts: impl Iterator<Item = &'a Counts>, layers: usize, ranks: usize) -> Counts {
        let mut total = Counts::new(layers, ranks).flat();
        for c in counts {
            total.iter_mut().zip(c.flat()).for_each(|(t, x)| *t += x);
        }
        Counts::from_flat(&total, layers, ranks)
    }

    fn scale(&mut self, k: f64) {
        self.sampled_edges *= k;
        self.sampled_vertices *= k;
        self.sample_bytes *= k;
        self.sample_calls *= k;
        self.input_local *= k;
        self.input_remote *= k;
        self.input_cached *= k;
        self.input_peer *= k;
        self.hidden_rows *= k;
        self.partial_rows *= k;
        self.remote_edges *= k;
        self.own_partials *= k;
        for v in [
            &mut self.requests_to,
            &mut self.rows_in,
            &mut self.dst,
            &mut self.src,
            &mut self.edges,
        ] {
            v.iter_mut().for_each(|x| *x *= k);
        }
    }

    /// Count the input rows of `ids` (local, read in the host's shared memory, or whose
    /// owner).
    fn input_rows(&mut self, data: &TrainData, ids: &[NodeId]) {
        for &v in ids {
            if data.owns(v) {
                self.input_local += 1.0;
            } else if data.store.reads_directly(v) {
                self.input_peer += 1.0;
            } else {
                self.input_remote += 1.0;
                self.requests_to[owner_of(&data.offsets, v as u64)] += 1.0;
            }
        }
    }

    /// The id exchanges of a sampling pass: what `stats` recorded since `before`.
    fn sampling_traffic(&mut self, stats: &CommStats, before: &BTreeMap<&'static str, OpStats>) {
        for op in stats.since(before).values() {
            self.sample_bytes += op.bytes_sent.max(op.bytes_received) as f64;
            self.sample_calls += op.calls as f64;
        }
    }

    fn block(&mut self, l: usize, b: &Block, self_loops: bool) {
        self.dst[l] += b.num_dst as f64;
        self.src[l] += b.num_src() as f64;
        // GCN's self-loop is one more edge per destination.
        self.edges[l] += (b.num_edges() + if self_loops { b.num_dst } else { 0 }) as f64;
    }
}

/// Every rank's counts of every sampled strategy, identical on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct DryRun {
    /// Mini-batches sampled, and in the whole epoch.
    pub batches: usize,
    pub epoch_batches: usize,
    /// `ranks[r][s]`: rank `r`, strategy [`SAMPLED`]`[s]`, the mean over the batches.
    pub ranks: Vec<[Counts; 4]>,
    /// `per_batch[b][r][s]`: the same of dry-run batch `b` alone (their mean is `ranks`). A
    /// step waits for its slowest rank at each collective, and which rank that is changes from
    /// batch to batch: the mean of the batches' maxima, not the maximum of the ranks' means.
    pub per_batch: Vec<Vec<[Counts; 4]>>,
}

impl DryRun {
    /// A dry run whose batches are all alike: `ranks` (synthetic counts in tests).
    pub fn uniform(batches: usize, epoch_batches: usize, ranks: Vec<[Counts; 4]>) -> DryRun {
        DryRun {
            batches,
            epoch_batches,
            per_batch: vec![ranks.clone()],
            ranks,
        }
    }

    /// The counts of `strategy` (one of [`SAMPLED`]) on every rank, mean per batch.
    pub fn of(&self, strategy: &str) -> Vec<&Counts> {
        let s = sampled_index(strategy);
        self.ranks.iter().map(|r| &r[s]).collect()
    }

    /// The counts of `strategy` on every rank in each dry-run batch.
    pub fn of_each_batch(&self, strategy: &str) -> Vec<Vec<&Counts>> {
        let s = sampled_index(strategy);
        self.per_batch
            .iter()
            .map(|batch| batch.iter().map(|r| &r[s]).collect())
            .collect()
    }
}

fn sampled_index(strategy: &str) -> usize {
    SAMPLED
        .iter()
        .position(|&n| n == strategy)
        .expect("a sampled strategy")
}

/// Remote input rows each strategy reads ([`SAMPLED`] order), with how often: the rows a
/// feature cache would hold. SNP reads none.
pub type Reads = [HashMap<NodeId, u32>; 4];

/// The strategies whose input rows pass through the feature store, hence its cache (SNP and
/// NFP read only their own rows).
pub const CACHED: [&str; 3] = ["gdp", "split", "dnp"];

/// Sample the dry-run batches as every strategy would and gather the counts. With a feature
/// cache of `cache_rows` rows, each strategy's cache holds the remote rows it reads most in the
/// first half of the dry-run batches (APT's rule: the most accessed, per strategy), and the
/// second half's reads of them count as cached. Collective over `group` (the ranks the graph
/// is partitioned over).
#[allow(clippy::too_many_arguments)]
pub fn dry_run(
    group: &Group,
    data: &TrainData,
    fanouts: &[i32],
    seed: u64,
    batch_size: usize,
    self_loops: bool,
    cache_rows: usize,
    node_share: Option<(usize, usize)>,
) -> DryRun {
    let layers = fanouts.len();
    let ranks = group.size();
    let mut batches = epoch_batches(&data.train_all, |v| data.orig_of(v), seed, 0, batch_size);
    // Under hybrid over several nodes, `group` is this node and samples its share of every
    // global batch.
    if let Some((node, nodes)) = node_share {
        for b in &mut batches {
            *b = crate::train::hybrid::node_share(b, node, nodes);
        }
    }
    let take = DRY_RUN_BATCHES.min(batches.len());
    let chosen_from = take.div_ceil(2);
    let fresh = || -> [Counts; 4] { std::array::from_fn(|_| Counts::new(layers, ranks)) };
    let mut first: Reads = Default::default();
    let mut second: Reads = Default::default();
    // Each batch counted on its own (`DryRun::per_batch`); no batch at all counts as one
    // batch of nothing.
    let mut each: Vec<[Counts; 4]> = Vec::with_capacity(take.max(1));
    for b in 0..take {
        let reads = if b < chosen_from {
            &mut first
        } else {
            &mut second
        };
        let mut c = fresh();
        let pass = (self_loops, [true; 4]);
        sample_range(
            group,
            data,
            &batches,
            b..b + 1,
            fanouts,
            (seed, 0),
            pass,
            &mut c,
            reads,
        );
        each.push(c);
    }
    if each.is_empty() {
        each.push(fresh());
    }
    let n = each.len() as f64;
    if cache_rows > 0 {
        // With one dry-run batch, it both fills the cache and is read through it.
        let (evaluated, on) = if take > chosen_from {
            (&second, (take - chosen_from) as f64)
        } else {
            (&first, take.max(1) as f64)
        };
        for s in 0..CACHED.len() {
            // Per owner, the rows a batch reads of it on the mean (what its cached rows can
            // save at most), and what the cache serves of them.
            let mut left: Vec<f64> = (0..ranks)
                .map(|o| each.iter().map(|e| e[s].requests_to[o]).sum::<f64>() / n)
                .collect();
            let mut moved = vec![0.0; ranks];
            for &v in ranked(&first[s]).iter().take(cache_rows) {
                let Some(&reads) = evaluated[s].get(&v) else {
                    continue;
                };
                let owner = owner_of(&data.offsets, v as u64);
                let m = (reads as f64 / on).min(left[owner]);
                left[owner] -= m;
                moved[owner] += m;
            }
            // Each batch's reads of an owner's rows go to the cache in proportion to them,
            // so that the batches' mean moves by the mean's.
            for (owner, moved) in moved.into_iter().enumerate() {
                let of_all: f64 = each.iter().map(|e| e[s].requests_to[owner]).sum();
                if moved <= 0.0 || of_all <= 0.0 {
                    continue;
                }
                for e in &mut each {
                    let m = moved * n * e[s].requests_to[owner] / of_all;
                    e[s].requests_to[owner] -= m;
                    e[s].input_remote -= m;
                    e[s].input_cached += m;
                }
            }
        }
    }
    // Allgathered batch by batch; every rank derives the same means from the same table.
    let per = fresh()[0].flat().len();
    let mine: Vec<f64> = each.iter().flatten().flat_map(Counts::flat).collect();
    let (all, _) = group.allgatherv("plan_counts", &mine);
    let of_rank: Vec<&[f64]> = all.chunks(per * 4 * each.len()).collect();
    let mut per_batch: Vec<Vec<[Counts; 4]>> = (0..each.len())
        .map(|b| {
            of_rank
                .iter()
                .map(|r| {
                    std::array::from_fn(|s| {
                        Counts::from_flat(&r[(b * 4 + s) * per..], layers, ranks)
                    })
                })
                .collect()
        })
        .collect();
    let mut table: Vec<[Counts; 4]> = (0..ranks)
        .map(|r| {
            std::array::from_fn(|s| {
                let mut mean = Counts::sum(per_batch.iter().map(|b| &b[r][s]), layers, ranks);
                mean.scale(1.0 / n);
                mean
            })
        })
        .collect();
    for t in std::iter::once(&mut table).chain(per_batch.iter_mut()) {
        add_served(t);
    }
    DryRun {
        batches: take,
        epoch_batches: batches.len(),
        ranks: table,
        per_batch,
    }
}

/// Rows served: what the other ranks ask of each rank (`input_served` from their
/// `requests_to`).
fn add_served(table: &mut [[Counts; 4]]) {
    let ranks = table.len();
    let served: Vec<[f64; 4]> = (0..ranks)
        .map(|r| std::array::from_fn(|s| table.iter().map(|q| q[s].requests_to[r]).sum()))
        .collect();
    for (rank, served) in table.iter_mut().zip(served) {
        for (c, s) in rank.iter_mut().zip(served) {
            c.input_served = s;
        }
    }
}

/// `reads`' rows, most read first (ties by id, so every run ranks alike).
pub fn ranked(reads: &HashMap<NodeId, u32>) -> Vec<NodeId> {
    let mut r: Vec<(NodeId, u32)> = reads.iter().map(|(&v, &n)| (v, n)).collect();
    r.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    r.into_iter().map(|(v, _)| v).collect()
}

/// Sample `batches` (of `epoch`, under `seed`) as `strategy` (one of [`CACHED`]) would and
/// return the remote input rows it reads. Collective over `group`.
pub fn remote_reads(
    group: &Group,
    data: &TrainData,
    batches: &[Vec<NodeId>],
    fanouts: &[i32],
    (seed, epoch): (u64, u64),
    strategy: &str,
) -> HashMap<NodeId, u32> {
    let s = SAMPLED
        .iter()
        .position(|&n| n == strategy)
        .expect("a sampled strategy");
    let mut wanted = [false; 4];
    wanted[s] = true;
    let mut counts: [Counts; 4] = std::array::from_fn(|_| Counts::new(fanouts.len(), group.size()));
    let mut reads: Reads = Default::default();
    let all = 0..batches.len();
    let pass = (false, wanted);
    sample_range(
        group,
        data,
        batches,
        all,
        fanouts,
        (seed, epoch),
        pass,
        &mut counts,
        &mut reads,
    );
    std::mem::take(&mut reads[s])
}

/// Sample `batches[range]` (numbered as in their epoch; `(seed, epoch)` key them) into
/// `counts` and `reads`; `pass` is [`sample_batch`]'s self-loops and strategies. Collective.
#[allow(clippy::too_many_arguments)]
fn sample_range(
    group: &Group,
    data: &TrainData,
    batches: &[Vec<NodeId>],
    range: std::ops::Range<usize>,
    fanouts: &[i32],
    (seed, epoch): (u64, u64),
    pass: (bool, [bool; 4]),
    counts: &mut [Counts; 4],
    reads: &mut Reads,
) {
    for b in range {
        let key = BatchKey {
            seed,
            epoch,
            batch: b as u64,
        };
        sample_batch(group, data, &batches[b], fanouts, key, pass, counts, reads);
    }
}

/// Edges in `blocks`, what a sampling pass built.
fn edges_of(blocks: &[Block]) -> f64 {
    blocks.iter().map(|b| b.num_edges() as f64).sum()
}

/// Destination vertices of `blocks`: those whose neighbours a sampling pass read.
fn vertices_of<'a>(blocks: impl IntoIterator<Item = &'a Block>) -> f64 {
    blocks.into_iter().map(|b| b.num_dst as f64).sum()
}

/// Sample one mini-batch as each `wanted` strategy of GDP, split, DNP and SNP would
/// ([`SAMPLED`] order), counting its sampling and adding the remote input rows it reads to
/// `reads`. Collective: every rank wants the same strategies.
#[allow(clippy::too_many_arguments)]
fn sample_batch(
    group: &Group,
    data: &TrainData,
    batch: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
    (self_loops, wanted): (bool, [bool; 4]),
    counts: &mut [Counts; 4],
    reads: &mut Reads,
) {
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let remote = |ids: &[NodeId]| ids.iter().filter(|&&v| !data.owns(v)).count() as f64;
    // The rows a strategy fetches, which a cache could hold: not those of its host's other
    // ranks where the store is shared.
    let mut read = |s: usize, ids: &[NodeId]| {
        for &v in ids.iter().filter(|&&v| !data.store.reads_directly(v)) {
            *reads[s].entry(v).or_default() += 1;
        }
    };
    let [gdp, split, dnp, snp] = counts;
    let stats = group.stats();

    // GDP: owner-computes sampling of this rank's seeds; remote input rows are fetched.
    if wanted[0] {
        let before = stats.snapshot();
        let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();
        let blocks = if group.size() == 1 {
            sample_blocks(&graph, &seeds, fanouts, key)
        } else {
            sample_blocks_distributed(group, &graph, &data.offsets, &seeds, fanouts, key)
        };
        gdp.sampling_traffic(stats, &before);
        gdp.sampled_edges += edges_of(&blocks);
        gdp.sampled_vertices += vertices_of(&blocks);
        gdp.input_rows(data, &blocks[0].src_nodes);
        read(0, &blocks[0].src_nodes);
        for (l, b) in blocks.iter().enumerate() {
            gdp.block(l, b, self_loops);
        }
    }

    if wanted[2] || wanted[3] {
        // DNP and SNP (`OwnerBatch::sample`): the hops above the input layer as GDP samples them
        // (the same blocks: the keys are per hop), then the input layer's destinations go to their
        // owners, which sample the input hop (DNP also fetches its remote features and sends back
        // hidden rows).
        let before = stats.snapshot();
        let spec = BatchSpec {
            batch,
            fanouts,
            key,
            // Counted apart: `block` adds GCN's self-loops to the edges.
            self_loops: false,
        };
        let ob = OwnerBatch::sample(group, data, spec);
        let (upper, input_block, frontier) = (&ob.upper, &ob.input_block, ob.frontier());
        let owner_edges = edges_of(upper) + input_block.num_edges() as f64;
        let owner_vertices = vertices_of(upper.iter().chain([input_block]));
        for c in [&mut *dnp, &mut *snp] {
            c.sampling_traffic(stats, &before);
            c.sampled_edges += owner_edges;
            c.sampled_vertices += owner_vertices;
            c.hidden_rows += remote(frontier);
            c.block(0, input_block, self_loops);
            for (l, b) in upper.iter().enumerate() {
                c.block(l + 1, b, self_loops);
            }
        }
        dnp.input_rows(data, &input_block.src_nodes);
        read(2, &input_block.src_nodes);

        // SNP: the input layer's neighbour sums are formed by the sources' owners, which read
        // only their own rows and project each distinct source once, whichever ranks asked for
        // it: one partial row per (destination, remote owner) pair.
        let (_, projected) = RowExchange::to_owners(group, &data.offsets, &input_block.src_nodes);
        snp.src[0] += projected.len() as f64 - input_block.num_src() as f64;
        snp.input_local += projected.len() as f64;
        let mut owners = Vec::new();
        for v in 0..input_block.num_dst {
            owners.clear();
            let mut own = false;
            for &u in &input_block.indices[input_block.indptr[v]..input_block.indptr[v + 1]] {
                let u = input_block.src_nodes[u as usize];
                if data.owns(u) {
                    own = true;
                } else {
                    snp.remote_edges += 1.0;
                    owners.push(owner_of(&data.offsets, u as u64));
                }
            }
            owners.sort_unstable();
            owners.dedup();
            snp.partial_rows += owners.len() as f64;
            snp.own_partials += own as u8 as f64;
        }
    }

    if wanted[1] {
        // Split: cooperative sampling; every (layer, vertex) once, cross-rank rows shuffled.
        let before = stats.snapshot();
        let sb = sample_split(group, data, batch, fanouts, key);
        split.sampling_traffic(stats, &before);
        split.sampled_edges += sb
            .layers
            .iter()
            .map(|l| l.block.num_edges() as f64)
            .sum::<f64>();
        split.sampled_vertices += vertices_of(sb.layers.iter().map(|l| &l.block));
        split.input_rows(data, &sb.layers[0].block.src_nodes);
        read(1, &sb.layers[0].block.src_nodes);
        for (l, (layer, rows)) in sb.layers.iter().zip(sb.remote_rows()).enumerate() {
            split.rows_in[l] += rows as f64;
            split.block(l, &layer.block, self_loops);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batches_counts_are_kept_apart_and_average_to_the_mean() {
        use crate::comm::World;
        use crate::config::TrainConfig;
        let cfg = TrainConfig::default();
        let world = World::solo();
        let data = TrainData::load(None, &cfg, &world).unwrap();
        let dry = dry_run(
            &world,
            &data,
            &cfg.fanouts,
            cfg.seed,
            cfg.batch_size,
            cfg.uses_self_loops(),
            0,
            None,
        );
        assert_eq!(dry.per_batch.len(), dry.batches);
        assert!(dry.batches > 1, "{} batches", dry.batches);
        for s in SAMPLED {
            let mean = dry.of(s)[0].flat();
            let each: Vec<Vec<f64>> = dry.of_each_batch(s).iter().map(|b| b[0].flat()).collect();
            for (k, m) in mean.iter().enumerate() {
                let avg = each.iter().map(|b| b[k]).sum::<f64>() / each.len() as f64;
                assert!((avg - m).abs() <= 1e-9 * m.abs().max(1.0), "{s} field {k}");
            }
            // The batches differ (their seeds do), which is what pricing them apart is for.
            let edges: Vec<f64> = dry.of_each_batch(s).iter().map(|b| b[0].edges[0]).collect();
            assert!(edges.iter().any(|&e| e != edges[0]), "{s}: {edges:?}");
        }
    }

    #[test]
    fn counts_survive_flattening() {
        let mut c = Counts::new(3, 2);
        c.sampled_edges = 0.5;
        c.sampled_vertices = 0.25;
        c.sample_bytes = 64.0;
        c.input_remote = 7.0;
        c.requests_to = vec![0.0, 7.0];
        c.rows_in = vec![1.0, 2.0, 3.0];
        c.partial_rows = 4.0;
        c.own_partials = 2.0;
        c.dst = vec![5.0, 6.0, 7.0];
        c.src = vec![8.0, 9.0, 10.0];
        c.edges = vec![11.0, 12.0, 13.0];
        assert_eq!(Counts::from_flat(&c.flat(), 3, 2), c);
    }
}
