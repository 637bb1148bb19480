//! Which remote feature rows are worth caching, by the rule of the strategy that runs (APT's):
//! a presampling pass over the first mini-batches, sampled as that strategy (only) samples them,
//! counts how often each remote vertex is read as an input row; the most read come first.
//! The planner's dry run prices the cache with the same counting
//! ([`crate::train::plan::dry_run`]).

use super::data::TrainData;
use super::plan::dry_run::{ranked, remote_reads};
use crate::comm::Group;
use crate::graph::NodeId;
use crate::kinds::Strategy;

/// Epoch key of the presampling pass: distinct from every training epoch, so the cache is
/// chosen from the access distribution rather than from the exact batches to come.
pub const PRESAMPLE_EPOCH: u64 = u64::MAX;

/// Remote vertices this rank reads as input rows in `batches` under `strategy`, most read
/// first (ties by id). GDP reads its own samples' inputs, split its cooperative input layer,
/// DNP its owner-sampled input layer (hybrid is split inside the node). Collective: every
/// rank samples the same batches.
pub fn hottest_remote_rows(
    data: &TrainData,
    group: &Group,
    batches: &[Vec<NodeId>],
    fanouts: &[i32],
    seed: u64,
    strategy: Strategy,
) -> Vec<NodeId> {
    let name = match strategy {
        Strategy::Split | Strategy::Hybrid => "split",
        Strategy::Dnp => "dnp",
        _ => "gdp",
    };
    let reads = remote_reads(group, data, batches, fanouts, (seed, PRESAMPLE_EPOCH), name);
    ranked(&reads)
}
