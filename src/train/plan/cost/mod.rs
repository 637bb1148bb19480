//! The cost model: price a [`DryRun`]'s counts with a [`Calibration`], per strategy and phase,
//! and pick the cheapest. Pure arithmetic (no MPI, no clock), so every rank holding the same
//! dry run and calibration computes the same prediction bit for bit.
//!
//! Per mini-batch and rank, `T = T_build + T_load + T_shuffle + T_train + T_sync`:
//! - build: the strategy's sampling (`sample`, edges in its blocks) and its id exchanges
//!   (`alltoallv`, the bytes and calls the dry run counted; NFP's allgather of every rank's
//!   input block, `allgatherv`);
//! - load: input feature rows — the local gather (`gather`, bytes of the rows this rank reads
//!   for itself, from the feature cache, and serves to others), the fetch of remote rows (`alltoallv`, 8-byte ids out
//!   and the rows back, each row exchange priced by its bytes and its rows) and, on a device
//!   backend, the copy of the input rows to it (`h2d`);
//! - shuffle: hidden rows between ranks (`alltoallv`, row exchanges forward and their
//!   gradients back); partial sums sent as ready rows and added on receipt
//!   (`partial_sums`: SNP's and NFP's);
//! - train: per layer the dense products (`gemm` forward, `gemm_tn` the weight gradients,
//!   `gemm_nt` the input gradients; flops and bytes) and the aggregation (`aggregate`,
//!   edges × columns) of forward and backward, in the order the layer itself picks (SNP's input
//!   layer always projects first, on the sources' owners); an input layer on mostly-zero
//!   features multiplies only their non-zeros (`spmm`) after a scan of the dense rows; every
//!   hidden layer's activation forward and backward (`elementwise`, bytes streamed);
//! - sync: the gradient allreduce (`allreduce`, 4 bytes per parameter synced: NFP's ranks
//!   keep their first-layer weight slices' gradients; on a device without
//!   CUDA-aware MPI the gradients also go down and back up, `d2h` and `h2d`) and the step's
//!   share of the small allreduce of losses and counters (one per 16 steps); and the ranks'
//!   waits for each other at the step's collectives, a calibrated share of the step's work
//!   (`drift`);
//! - optimizer: zeroing the gradients and the Adam update (`optimizer`, per parameter a rank
//!   holds: NFP's ranks hold a slice of the first layer's weights).
//!
//! Each phase is bounded by its slowest rank (ranks meet at every exchange), so a strategy's
//! step is the sum over phases of the maximum over ranks. Adding a strategy is one function
//! from the ranks' counts to a [`RankCost`] per rank (see [`nfp`]).

use super::calibration::Calibration;
use super::dry_run::DryRun;
use crate::kinds::{ModelKind, Strategy};
use crate::train::prefetch::prefetches_strategy;
use serde::Serialize;
use std::collections::BTreeMap;

mod compute;
mod strategies;
#[cfg(test)]
mod tests;

pub use compute::{gat_layer_work, layer_work, Aggregations, LayerWork};
pub use strategies::{dnp, gdp, nfp, partial_sums_op, snp, split};

/// The candidates in order of preference on a tie.
pub const CANDIDATES: &[&str] = &["gdp", "split", "dnp", "snp", "nfp"];

/// What the cost model needs of the model and the run.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub kind: ModelKind,
    /// Per layer (input first), the convolution's input and output widths; GAT's output width
    /// is that of its product, every head's columns (a last layer averages them afterwards).
    pub in_w: Vec<f64>,
    pub out_w: Vec<f64>,
    /// Parameters (the allreduce moves 4 bytes each).
    pub params: f64,
    /// Whether the model lives on a device (input rows are copied to it).
    pub device: bool,
    /// Whether the gradient allreduce goes through host memory (a device without CUDA-aware
    /// MPI: the gradients are copied down and back up around it).
    pub staged_gradients: bool,
    /// Stored non-zeros per input row when the input layer multiplies the features as sparse
    /// rows (mostly-zero features on a backend with a sparse path), else `None`.
    pub input_nnz: Option<f64>,
    /// Bytes of one fetched feature row on the wire when the store packs rows (features
    /// mostly zeros, `exchange::packed_rows`: a count word, a column and a value per
    /// non-zero), else `None` (the row travels dense).
    pub packed_row_bytes: Option<f64>,
    /// GDP's sparse batches come as CSR (every rank's store keeps a CSR copy of its rows, and
    /// the input layer multiplies sparse rows): its load reads, moves and copies up the
    /// entries, not dense rows, and its input layer scans no dense rows for them.
    pub csr_batches: bool,
    /// The ranks keep their own feature rows (and the cache) on the device
    /// (`train::strategy::ResidentFeatures`; every mini-batch strategy but NFP): their dense
    /// batches gather those there, and only fetched rows are made on the host and copied up.
    pub resident_rows: bool,
    /// Ranks the gradients are summed over when more than those sharing a mini-batch (hybrid
    /// over several nodes: the world, where the dry run saw one node); 1 otherwise.
    pub sync_ranks: usize,
    /// Bytes of the dense feature rows the fullest rank's store gathers from (its own rows
    /// and its cache): what of them the host's cache cannot hold is gathered at the price of
    /// rows from memory ([`Calibration::far_share`]).
    pub store_bytes: f64,
    /// Bytes of the fullest rank's adjacency (row offsets and neighbour ids), which its
    /// sampler reads, and of the whole graph's, which NFP's ranks each hold and sample: what of
    /// them the host's cache still holds at the next batch prices the sampler
    /// ([`Calibration::sampling`]).
    pub graph_bytes: f64,
    pub whole_graph_bytes: f64,
    /// Workers that prepare the batches of every strategy but NFP ahead while the device trains
    /// (`train::prefetch`; `prefetches_strategy` says where),
    /// or `None` where each batch is prepared in its step (the CPU backend, whose cores the
    /// preparation would share, or `--prefetch off`).
    pub prefetch_workers: Option<usize>,
    /// Batches sampled at once, each on a thread of its own, ahead of their steps
    /// (`sample::ahead`) where GDP samples in its steps (no prefetch workers): locally on one
    /// rank, together on several (each hop of a window routed to the owners in one exchange,
    /// the window the ranks agree on); 1: each batch sampled in its step.
    pub gdp_sample_window: usize,
    /// The same for NFP, whose ranks all sample their seeds locally.
    pub nfp_sample_window: usize,
    /// Each rank's input columns under NFP (`columns::planned_bounds`: equal non-zeros on
    /// mostly-zero features, else even widths); empty: even widths.
    pub nfp_columns: Vec<f64>,
}

impl ModelShape {
    /// [`ModelShape::packed_row_bytes`] for rows of `width` columns with `density` of their
    /// values non-zero: `None` unless most values are zero (the store's own test).
    pub fn packed_row_bytes(width: f64, density: f64) -> Option<f64> {
        (density < 0.5).then(|| (4.0 * (1.0 + 2.0 * density * width)).min(4.0 * (1.0 + width)))
    }

    /// Rank `r`'s input columns under NFP over `ranks` ranks.
    fn nfp_width(&self, r: usize, ranks: usize) -> f64 {
        match self.nfp_columns.get(r) {
            Some(&w) if self.nfp_columns.len() == ranks => w,
            _ => self.in_w[0] / ranks as f64,
        }
    }

    /// The widest NFP slice over `ranks` ranks: its rank holds and updates the most of the
    /// sliced weights.
    fn nfp_widest(&self, ranks: usize) -> f64 {
        (0..ranks)
            .map(|r| self.nfp_width(r, ranks))
            .fold(0.0, f64::max)
    }
}

/// The order an input layer computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The layer picks (aggregate first unless projecting first is fewer multiply-adds).
    Cheaper,
    /// Project every source first (SNP's source owners: partial rows are of the output width).
    ProjectFirst,
}

/// Predicted seconds per mini-batch of each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    pub build: f64,
    pub load: f64,
    pub shuffle: f64,
    pub train: f64,
    pub sync: f64,
    pub optimizer: f64,
}

impl Phases {
    pub fn total(&self) -> f64 {
        self.build + self.load + self.shuffle + self.train + self.sync + self.optimizer
    }

    /// `self + k·o`, phase by phase.
    fn plus(&self, o: &Phases, k: f64) -> Phases {
        Phases {
            build: self.build + k * o.build,
            load: self.load + k * o.load,
            shuffle: self.shuffle + k * o.shuffle,
            train: self.train + k * o.train,
            sync: self.sync + k * o.sync,
            optimizer: self.optimizer + k * o.optimizer,
        }
    }

    fn max(&self, o: &Phases) -> Phases {
        Phases {
            build: self.build.max(o.build),
            load: self.load.max(o.load),
            shuffle: self.shuffle.max(o.shuffle),
            train: self.train.max(o.train),
            sync: self.sync.max(o.sync),
            optimizer: self.optimizer.max(o.optimizer),
        }
    }
}

/// One rank's cost of one strategy per mini-batch: phases and the bytes it receives.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankCost {
    pub phases: Phases,
    pub bytes: f64,
    /// The part of `phases.load` that the training thread spends (input rows copied up to
    /// the device); the rest is host work that prefetch workers can do ahead.
    pub upload: f64,
}

/// The prediction for one strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrategyPrediction {
    /// Seconds per mini-batch of each phase: its slowest rank in each dry-run batch, averaged
    /// over the batches.
    pub phases: Phases,
    pub step_seconds: f64,
    /// `step_seconds` × the epoch's mini-batches.
    pub epoch_seconds: f64,
    /// Bytes moved between ranks per mini-batch, summed over ranks (received).
    pub bytes_per_step: f64,
    /// Destination rows computed more than once (above split's distinct rows), per step.
    pub redundant_rows: f64,
    /// Whether `auto` may pick it (a strategy this build trains, which supports the model).
    pub pickable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Every candidate's prediction and the choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// Dry-run mini-batches sampled, and in the epoch.
    pub batches: usize,
    pub epoch_batches: usize,
    pub ranks: usize,
    pub strategies: BTreeMap<String, StrategyPrediction>,
    pub choice: String,
    /// What the rows stand for when not the whole world sharing each mini-batch (hybrid over
    /// several nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// The parameters whose gradients `strategy`'s ranks allreduce: all of them, except under NFP,
/// whose ranks keep the gradients of their slices of the first layer's weights
/// (`Nfp::unsynced_ranges`; the matrices lead the buffer, so the rest is one call). Priced as
/// the whole buffer, NFP's sync came out at 2-8× its measured time on the 2-rank grid,
/// where the first layer holds most of the parameters (R-MAT, 64 features × 1024: 131k of
/// 147k).
fn params_synced(shape: &ModelShape, strategy: &str, ranks: usize) -> f64 {
    (shape.params - sliced_weights(shape, strategy, ranks)).max(0.0)
}

/// The parameters the busiest rank of `strategy` holds and updates: all of them, except under
/// NFP, whose ranks hold a row slice of the first layer's weights, the widest slice's rank the
/// most (on Facebook's two ranks, sliced by non-zeros, 87 % of them: 10× the other's Adam).
fn params_held(shape: &ModelShape, strategy: &str, ranks: usize) -> f64 {
    let sliced = sliced_weights(shape, strategy, ranks);
    if sliced == 0.0 {
        return shape.params;
    }
    shape.params - sliced * (1.0 - shape.nfp_widest(ranks) / shape.in_w[0])
}

/// The weights `strategy` slices across its `ranks`: NFP's first-layer matrices (two for
/// SAGE), cut by rows on several ranks; none otherwise.
fn sliced_weights(shape: &ModelShape, strategy: &str, ranks: usize) -> f64 {
    if strategy != "nfp" || ranks < 2 {
        return 0.0;
    }
    let mats = if shape.kind == ModelKind::Sage {
        2.0
    } else {
        1.0
    };
    mats * shape.in_w[0] * shape.out_w[0]
}

/// How much faster `W` prefetch workers prepare batches than one: `√W`. A batch's own
/// sampling already runs on the rank's threads, so whole batches in parallel gain only what
/// one batch leaves idle; fitted to the 16-core GPU host (200k SBM, H100), where 4 workers
/// made the epoch 1.4-1.9× faster than 1.
fn prefetch_speedup(workers: usize) -> f64 {
    (workers.max(1) as f64).sqrt()
}

/// A step when prefetch workers prepare batches while the device trains (GDP; split, DNP and
/// SNP on several ranks): the training thread's work (uploading the rows, the hidden-row
/// shuffles, the model, the allreduce, the optimizer) and the workers' (sampling, gathering
/// and fetching the rows) overlap, so the slower bounds it.
pub fn prefetched_step(phases: &Phases, upload: f64, workers: usize) -> f64 {
    let prepared = phases.build + phases.load - upload;
    let trained = upload + phases.shuffle + phases.train + phases.sync + phases.optimizer;
    trained.max(prepared / prefetch_speedup(workers))
}

/// Price every candidate in `allowed` (others are priced too where the counts allow, but not
/// pickable) and choose the cheapest pickable one; ties go to the earlier candidate. `a2a` is
/// the alltoallv operator of the ranks sharing a mini-batch.
pub fn predict(
    dry: &DryRun,
    shape: &ModelShape,
    cal: &Calibration,
    allowed: &[&str],
    a2a: &str,
) -> Prediction {
    let ranks = dry.ranks.len();
    let gradient_bytes = shape.params * 4.0;
    let sync_ranks = shape.sync_ranks.max(ranks);
    // The gradient allreduce of `synced` parameters, and a step's share of the one that sums
    // the losses and counters of `losses::READ_EVERY` steps; a device's gradients go through
    // the host whole (the buffer is copied down and up, synced or not).
    let sync_of = |synced: f64| {
        if sync_ranks < 2 {
            return 0.0;
        }
        let staging = if shape.staged_gradients {
            cal.op("d2h").seconds(gradient_bytes, 1.0) + cal.op("h2d").seconds(gradient_bytes, 1.0)
        } else {
            0.0
        };
        let group = crate::train::losses::READ_EVERY as f64;
        cal.op("allreduce").seconds(synced * 4.0, 1.0)
            + cal.op("allreduce").seconds(32.0 * group, 1.0) / group
            + staging
    };
    let distinct: Vec<f64> = (0..shape.in_w.len())
        .map(|l| dry.of("split").iter().map(|c| c.dst[l]).sum())
        .collect();
    let mut strategies = BTreeMap::new();
    for &name in CANDIDATES {
        let sampled = if name == "nfp" { "gdp" } else { name };
        let counts = dry.of(sampled);
        // Each dry-run batch priced on its own, the slowest rank bounding each phase, and the
        // batches' phases averaged: a step waits for whichever rank is slowest in that batch.
        let each = dry.of_each_batch(sampled);
        let share = 1.0 / each.len().max(1) as f64;
        let (mut phases, mut upload, mut bytes) = (Phases::default(), 0.0, 0.0);
        for counts in &each {
            let per_rank: Vec<RankCost> = (0..ranks)
                .map(|r| {
                    // The kernels as this rank's step runs them: from the cache as far as
                    // its data stays there.
                    let warmed =
                        cal.with_warm_kernels(strategies::kernel_warm_share(shape, cal, counts[r]));
                    let cal = &*warmed;
                    match name {
                        "gdp" => gdp(shape, cal, counts[r], a2a),
                        "split" => split(shape, cal, counts[r], a2a),
                        "dnp" => dnp(shape, cal, counts[r], a2a),
                        "snp" => snp(shape, cal, counts[r], a2a),
                        "nfp" => nfp(shape, cal, counts, r, a2a),
                        _ => unreachable!("every candidate is priced"),
                    }
                })
                .collect();
            let slowest = per_rank
                .iter()
                .fold(Phases::default(), |m, c| m.max(&c.phases));
            phases = phases.plus(&slowest, share);
            upload += share * per_rank.iter().map(|c| c.upload).fold(0.0, f64::max);
            bytes += share * per_rank.iter().map(|c| c.bytes).sum::<f64>();
        }
        phases.sync = sync_of(params_synced(shape, name, ranks));
        phases.optimizer = cal
            .op("optimizer")
            .seconds(params_held(shape, name, ranks), 1.0);
        // The ranks drift apart over the step's work and wait for each other at its
        // collectives (`drift`, a share of the work; 0 on one rank). The waits fall in every
        // phase that ends in a collective; they are charged to sync, where the last falls.
        phases.sync += cal.op("drift").seconds(phases.total() - phases.sync, 0.0);
        let computed: Vec<f64> = (0..shape.in_w.len())
            .map(|l| counts.iter().map(|c| c.dst[l]).sum())
            .collect();
        let redundant_rows = if name == "nfp" {
            0.0
        } else {
            computed
                .iter()
                .zip(&distinct)
                .map(|(c, d)| (c - d).max(0.0))
                .sum()
        };
        let buildable = name.parse::<Strategy>().is_ok();
        let note = if !buildable {
            Some(format!(
                "predicted only: this build has no `--strategy {name}`"
            ))
        } else if !allowed.contains(&name) {
            Some("not for this configuration".into())
        } else {
            None
        };
        let pickable = note.is_none();
        let prefetched = name
            .parse::<Strategy>()
            .is_ok_and(|s| prefetches_strategy(s, ranks));
        let (step, note) = match shape.prefetch_workers {
            Some(workers) if prefetched => (
                prefetched_step(&phases, upload, workers),
                note.or_else(|| {
                    Some(format!(
                        "{workers} prefetch worker(s) build and load while the device trains: \
                         the step is the slower side, not the phases' sum"
                    ))
                }),
            ),
            _ => (phases.total(), note),
        };
        strategies.insert(
            name.to_string(),
            StrategyPrediction {
                phases,
                step_seconds: step,
                epoch_seconds: step * dry.epoch_batches as f64,
                bytes_per_step: bytes
                    + if sync_ranks > 1 {
                        sync_ranks as f64 * shape.params * 4.0
                    } else {
                        0.0
                    },
                redundant_rows,
                pickable,
                note,
            },
        );
    }
    let choice = CANDIDATES
        .iter()
        .filter(|n| strategies[**n].pickable)
        .fold(None::<&str>, |best, &n| match best {
            Some(b) if strategies[b].step_seconds <= strategies[n].step_seconds => Some(b),
            _ => Some(n),
        })
        .unwrap_or("gdp")
        .to_string();
    Prediction {
        batches: dry.batches,
        epoch_batches: dry.epoch_batches,
        ranks,
        strategies,
        choice,
        scope: None,
    }
}
