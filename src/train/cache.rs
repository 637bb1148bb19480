//! Which remote feature rows are worth caching, by the rule of the strategy that runs (APT's):
//! a presampling pass over the first mini-batches, sampled as that strategy (only) samples them,
//! counts how often each remote vertex is read as an input row; the most read come first.
//! The planner's dry run prices the cache with the same counting
//! ([`crate::train::plan::dry_run`]).

use super::data::TrainData;
use super::plan::dry_run::{ranked, remote_reads};
use crate::comm::Group;
use crate::graph::NodeId;
use crate::kinds::{CacheSize, Strategy};
use crate::util::rss::available_memory_mb;

/// The share of a node's available memory (`MemAvailable`, or a cgroup limit's room) that `--cache-mb auto` fills,
/// split evenly among the node's ranks: the rest stays for the batches in flight, the
/// activations and the system. APT sizes its GPU cache as the memory training leaves free;
/// gnnpar's cache is in host memory, where what training leaves free is only known once it
/// has run, so a fixed share stands in for it.
pub const AUTO_MEMORY_SHARE: f64 = 0.25;

const MIB: f64 = 1024.0 * 1024.0;

/// The cache's budget in bytes per rank: `size` as given, or under `auto`
/// [`auto_budget_bytes`] of this node's available memory, the smallest over `group` so that
/// every rank caches (and the planner prices) the same. Collective over `group` under `auto`
/// (every rank has the same configuration, so all or none take part).
pub fn budget_bytes(size: CacheSize, group: &Group, ranks_on_node: usize) -> usize {
    match size {
        CacheSize::MiB(m) => (m * MIB) as usize,
        CacheSize::Auto => {
            let mine = auto_budget_bytes(available_memory_mb(), ranks_on_node);
            (-group.allreduce_max_f64(-mine)).max(0.0) as usize
        }
    }
}

/// `--cache-mb auto`'s budget per rank for a node with `available_mb` MiB available
/// (`None`: unknown, no cache) shared by `ranks_on_node` ranks.
pub fn auto_budget_bytes(available_mb: Option<f64>, ranks_on_node: usize) -> f64 {
    available_mb.map_or(0.0, |mb| {
        mb * MIB * AUTO_MEMORY_SHARE / ranks_on_node.max(1) as f64
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_a_quarter_of_the_available_memory_split_over_the_nodes_ranks() {
        assert_eq!(auto_budget_bytes(Some(8192.0), 4), 512.0 * MIB);
        assert_eq!(auto_budget_bytes(Some(8192.0), 1), 2048.0 * MIB);
        assert_eq!(auto_budget_bytes(Some(8192.0), 0), 2048.0 * MIB);
        assert_eq!(auto_budget_bytes(None, 2), 0.0);
    }
}
