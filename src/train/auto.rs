//! `--strategy auto`: pick a strategy before training.
//!
//! On several nodes `auto` is `hybrid` (only gradients cross nodes). On one node it compares
//! the single-node strategies (gdp, split, dnp, and snp for GraphSAGE and GCN) with a dry run:
//! the first [`DRY_RUN_BATCHES`] mini-batches of epoch 0 are sampled exactly as each strategy
//! would sample them (no forward or backward), and per strategy the run counts
//!
//! - **bytes moved**: rows sent between ranks × the row's width × 4 bytes. GDP: remote input
//!   feature rows. Split: each layer's cross-rank source rows at that layer's input width,
//!   forward, plus their gradients backward above the input layer. DNP: the input-layer
//!   outputs (layer-1 width) sent to the requesters and their gradients back, plus the
//!   remote feature rows the owners fetch for the input layer. SNP: DNP's exchange of
//!   input-layer outputs, no feature rows, and per (destination, remote source owner) pair a
//!   partial row of layer-1 width each way, plus 8 bytes per edge whose source is remote.
//! - **redundant compute**: rows (and their edges) computed by more than one rank. Split
//!   computes every (layer, vertex) once, so its per-layer counts are the distinct ones;
//!   GDP's excess over them is redundant, and so is DNP's above the input layer.
//!
//! and prices them with the crude time model of [`CostModel`]. Every strategy trains the
//! same model (invariant 4), so the choice changes the speed only, never the parameters.
//! Counts are summed over ranks with an allreduce of integers (exact in f64), so every rank
//! computes the same estimate and picks the same strategy without a broadcast.

use super::data::TrainData;
use super::split::sample_split;
use crate::comm::{Group, World};
use crate::config::TrainConfig;
use crate::exchange::{sample_blocks_distributed, RowExchange};
use crate::graph::NodeId;
use crate::kinds::Strategy;
use crate::nn::Model;
use crate::sample::{build_block, epoch_batches, sample_blocks, sample_neighbors};
use crate::sample::{BatchKey, Block, LocalGraph};
use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;

/// Mini-batches the dry run samples.
pub const DRY_RUN_BATCHES: usize = 4;

/// The single-node strategies `auto` chooses among, in order of preference on a tie (snp only
/// for configurations it supports, see [`crate::config::TrainConfig::check_snp`]).
pub const CANDIDATES: &[&str] = &["gdp", "split", "dnp", "snp"];

/// The time model: seconds = bytes / bandwidth + flops / rate, per rank and mini-batch.
///
/// These constants are deliberately crude (a PCIe/NVLink-class link and a modest sustained
/// GEMM rate, one value for every machine); they only need to rank strategies whose costs
/// differ by a wide margin. APT's calibration (measured bandwidth per link and kernel rates)
/// is meant to override them later; they live here, in one place, for that reason.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CostModel {
    /// Bytes per second between two ranks of a node.
    pub bandwidth_bytes_per_s: f64,
    /// Floating-point operations per second of one rank.
    pub flops_per_s: f64,
}

/// The assumed constants (see [`CostModel`]).
pub const ASSUMED: CostModel = CostModel {
    bandwidth_bytes_per_s: 10.0e9,
    flops_per_s: 100.0e9,
};

/// What the dry run counted for one strategy, summed over ranks and dry-run batches, and
/// its estimated seconds per mini-batch (mean over ranks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StrategyCost {
    pub bytes: f64,
    pub redundant_rows: f64,
    pub redundant_flops: f64,
    pub seconds_per_batch: f64,
}

/// The estimate of every candidate and the choice.
#[derive(Clone, Debug, Serialize)]
pub struct Estimate {
    pub batches: usize,
    pub ranks: usize,
    pub model: CostModel,
    /// Every candidate's cost.
    pub strategies: BTreeMap<String, StrategyCost>,
    pub choice: String,
}

/// Resolve `auto` where no data is needed: full-batch training runs the same full-graph step
/// whatever the strategy (gdp); on several nodes, hybrid. Otherwise leaves `auto` for
/// [`choose`]. Every rank decides alike (the node count is the same everywhere).
pub fn resolve_without_data(cfg: &mut TrainConfig, world: &World) {
    if cfg.strategy != Strategy::Auto {
        return;
    }
    let nodes = world.node_index().1;
    let (choice, why) = if cfg.full_batch {
        (
            Strategy::Gdp,
            "full-batch training runs one full-graph step whatever the strategy".into(),
        )
    } else if nodes > 1 {
        (
            Strategy::Hybrid,
            format!("{nodes} nodes: only gradients cross nodes"),
        )
    } else {
        return;
    };
    if world.rank() == 0 {
        log::info!("strategy auto: {choice} ({why})");
    }
    cfg.strategy = choice;
}

/// Counts of one strategy before pricing, summed over this rank's dry-run batches.
/// Per-layer vectors are input layer first.
#[derive(Clone, Debug, Default)]
struct Counts {
    /// Rows received from other ranks, per layer, at the layer's input width.
    rows_in: Vec<f64>,
    /// Rows received at layer 1's output width (DNP's and SNP's exchange), forward.
    hidden_rows: f64,
    /// SNP: partial rows at layer 1's output width from remote source owners, forward (their
    /// gradients go back), and input edges routed to a remote source owner.
    partial_rows: f64,
    remote_edges: f64,
    /// Destination rows and edges computed per layer.
    dst_rows: Vec<f64>,
    edges: Vec<f64>,
}

impl Counts {
    fn new(layers: usize) -> Counts {
        Counts {
            rows_in: vec![0.0; layers],
            hidden_rows: 0.0,
            partial_rows: 0.0,
            remote_edges: 0.0,
            dst_rows: vec![0.0; layers],
            edges: vec![0.0; layers],
        }
    }

    fn flat(&self) -> Vec<f64> {
        let mut v = self.rows_in.clone();
        v.extend([self.hidden_rows, self.partial_rows, self.remote_edges]);
        v.extend(&self.dst_rows);
        v.extend(&self.edges);
        v
    }

    fn from_flat(v: &[f64], layers: usize) -> Counts {
        Counts {
            rows_in: v[..layers].to_vec(),
            hidden_rows: v[layers],
            partial_rows: v[layers + 1],
            remote_edges: v[layers + 2],
            dst_rows: v[layers + 3..2 * layers + 3].to_vec(),
            edges: v[2 * layers + 3..3 * layers + 3].to_vec(),
        }
    }

    fn add_blocks(&mut self, blocks: &[Block], skip_input: bool) {
        for (l, b) in blocks.iter().enumerate() {
            if l == 0 && skip_input {
                continue;
            }
            self.dst_rows[l] += b.num_dst as f64;
            self.edges[l] += b.num_edges() as f64;
        }
    }
}

/// Run the dry run on one node, log the estimate as one JSON line, and return the chosen
/// strategy. Collective over the world (which is the node here).
pub fn choose(
    cfg: &TrainConfig,
    data: &TrainData,
    model: &Model,
    world: &World,
) -> Result<Strategy> {
    let layers = cfg.fanouts.len();
    let batches = epoch_batches(
        &data.train_all,
        |v| data.orig_of(v),
        cfg.seed,
        0,
        cfg.batch_size,
    );
    let take = DRY_RUN_BATCHES.min(batches.len());
    let mut counts = [
        Counts::new(layers),
        Counts::new(layers),
        Counts::new(layers),
        Counts::new(layers),
    ];
    for (b, batch) in batches[..take].iter().enumerate() {
        let key = BatchKey {
            seed: cfg.seed,
            epoch: 0,
            batch: b as u64,
        };
        dry_run_batch(world, data, batch, &cfg.fanouts, key, &mut counts);
    }
    // One allreduce of every count: identical sums (of integers) on every rank.
    let mut flat: Vec<f64> = counts.iter().flat_map(Counts::flat).collect();
    world.allreduce_sum_f64(&mut flat);
    let per = flat.len() / counts.len();
    let summed: Vec<Counts> = flat
        .chunks(per)
        .map(|c| Counts::from_flat(c, layers))
        .collect();
    let snp_ok = cfg.check_snp().is_ok();
    let candidates: Vec<&str> = CANDIDATES
        .iter()
        .copied()
        .filter(|&s| s != "snp" || snp_ok)
        .collect();
    let estimate = price(&candidates, &summed, model, take, world.size(), ASSUMED);
    if world.rank() == 0 {
        log::info!(
            "strategy auto: {}",
            serde_json::json!({ "auto_estimate": &estimate })
        );
        log::info!("strategy auto: chose {}", estimate.choice);
    }
    estimate.choice.parse()
}

/// Sample one mini-batch as GDP, split, DNP and SNP would, and count rows and edges
/// (`counts` in [`CANDIDATES`] order). Collective.
fn dry_run_batch(
    group: &Group,
    data: &TrainData,
    batch: &[NodeId],
    fanouts: &[i32],
    key: BatchKey,
    counts: &mut [Counts; 4],
) {
    let layers = fanouts.len();
    let graph = LocalGraph::new(&data.part, data.orig_ids.as_deref());
    let remote = |ids: &[NodeId]| ids.iter().filter(|&&v| !data.owns(v)).count() as f64;
    let seeds: Vec<NodeId> = batch.iter().copied().filter(|&v| data.owns(v)).collect();

    // GDP: owner-computes sampling of this rank's seeds; remote input rows are fetched.
    let blocks = if group.size() == 1 {
        sample_blocks(&graph, &seeds, fanouts, key)
    } else {
        sample_blocks_distributed(group, &graph, &data.offsets, &seeds, fanouts, key)
    };
    let [gdp, split, dnp, snp] = counts;
    gdp.rows_in[0] += remote(&blocks[0].src_nodes);
    gdp.add_blocks(&blocks, false);

    // DNP: the upper layers are GDP's; the input layer's destinations go to their owners,
    // which sample their input hop, fetch its remote features and send back hidden rows.
    let frontier = &blocks[0].src_nodes[..blocks[0].num_dst];
    let (_, mine) = RowExchange::to_owners(group, &data.offsets, frontier);
    let input_hop = (layers - 1) as u32;
    let sampled = sample_neighbors(&graph, &mine, fanouts[layers - 1], key.layer(input_hop));
    let input_block = build_block(&mine, &sampled);
    dnp.hidden_rows += remote(frontier);
    dnp.rows_in[0] += remote(&input_block.src_nodes);
    dnp.dst_rows[0] += input_block.num_dst as f64;
    dnp.edges[0] += input_block.num_edges() as f64;
    dnp.add_blocks(&blocks, true);

    // SNP: DNP's exchanges and computed rows, but the input layer's neighbour sums are formed
    // by the sources' owners: one partial row per (destination, remote owner) pair.
    snp.hidden_rows += remote(frontier);
    snp.dst_rows[0] += input_block.num_dst as f64;
    snp.edges[0] += input_block.num_edges() as f64;
    snp.add_blocks(&blocks, true);
    let mut owners = Vec::new();
    for v in 0..input_block.num_dst {
        owners.clear();
        for &u in &input_block.indices[input_block.indptr[v]..input_block.indptr[v + 1]] {
            let u = input_block.src_nodes[u as usize];
            if !data.owns(u) {
                snp.remote_edges += 1.0;
                owners.push(crate::graph::parts::owner_of(&data.offsets, u as u64));
            }
        }
        owners.sort_unstable();
        owners.dedup();
        snp.partial_rows += owners.len() as f64;
    }

    // Split: cooperative sampling; every (layer, vertex) once, cross-rank rows shuffled.
    let sb = sample_split(group, data, batch, fanouts, key);
    for (l, (layer, rows)) in sb.layers.iter().zip(sb.remote_rows()).enumerate() {
        split.rows_in[l] += rows as f64;
        split.dst_rows[l] += layer.block.num_dst as f64;
        split.edges[l] += layer.block.num_edges() as f64;
    }
}

/// Price the summed counts (`counts` in [`CANDIDATES`] order) of `candidates` and pick the
/// cheapest; ties go to the earlier candidate.
fn price(
    candidates: &[&str],
    counts: &[Counts],
    model: &Model,
    batches: usize,
    ranks: usize,
    cost: CostModel,
) -> Estimate {
    let in_w: Vec<f64> = model
        .layers
        .iter()
        .map(|l| l.conv.in_dim() as f64)
        .collect();
    let out_w: Vec<f64> = model
        .layers
        .iter()
        .map(|l| l.conv.out_dim() as f64)
        .collect();
    // Forward and backward of a row: about three times the forward's dense product (one
    // multiply-add per input and output column) and aggregation (one per edge and column).
    let flops =
        |l: usize, rows: f64, edges: f64| 3.0 * (2.0 * rows * in_w[l] * out_w[l] + edges * in_w[l]);
    let distinct = &counts[1]; // split computes every (layer, vertex) exactly once
    let mut strategies = Vec::with_capacity(CANDIDATES.len());
    for (name, c) in CANDIDATES.iter().zip(counts) {
        if !candidates.contains(name) {
            continue;
        }
        let mut bytes = 0.0;
        for (l, &rows) in c.rows_in.iter().enumerate() {
            // Split's shuffled rows above the input layer come back as gradients.
            let directions = if *name == "split" && l > 0 { 2.0 } else { 1.0 };
            bytes += directions * rows * in_w[l] * 4.0;
        }
        bytes += 2.0 * (c.hidden_rows + c.partial_rows) * out_w[0] * 4.0;
        bytes += 8.0 * c.remote_edges;
        let (mut redundant_rows, mut redundant_flops) = (0.0, 0.0);
        for l in 0..c.dst_rows.len() {
            let rows = (c.dst_rows[l] - distinct.dst_rows[l]).max(0.0);
            let edges = (c.edges[l] - distinct.edges[l]).max(0.0);
            redundant_rows += rows;
            redundant_flops += flops(l, rows, edges);
        }
        let seconds = (bytes / cost.bandwidth_bytes_per_s + redundant_flops / cost.flops_per_s)
            / (ranks.max(1) * batches.max(1)) as f64;
        strategies.push((
            name.to_string(),
            StrategyCost {
                bytes,
                redundant_rows,
                redundant_flops,
                seconds_per_batch: seconds,
            },
        ));
    }
    let choice = strategies
        .iter()
        .fold(None::<&(String, StrategyCost)>, |best, s| match best {
            Some(b) if b.1.seconds_per_batch <= s.1.seconds_per_batch => Some(b),
            _ => Some(s),
        })
        .map(|s| s.0.clone())
        .unwrap_or_else(|| "gdp".into());
    Estimate {
        batches,
        ranks,
        model: cost,
        strategies: strategies.into_iter().collect(),
        choice,
    }
}
