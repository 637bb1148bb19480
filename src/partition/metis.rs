//! METIS k-way partitioning (vendored METIS 5 through the `metis` crate).

use super::constraints::Constraints;
use super::symmetric::SymmetricGraph;
use anyhow::{anyhow, bail, Result};
use metis::{option, Graph, Idx};
use std::sync::Mutex;

/// METIS draws from one process-wide random state (GKlib's `srand`/Mersenne twister), so two
/// concurrent calls would perturb each other and a seed would no longer fix the result.
/// Every call holds this lock.
static METIS_LOCK: Mutex<()> = Mutex::new(());

/// Knobs passed to METIS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetisOptions {
    /// METIS' random seed (METIS is deterministic for a given seed and input).
    pub seed: u64,
    /// Allowed imbalance in thousandths (`1 + ufactor / 1000`); `None`: METIS' default (30).
    pub ufactor: Option<u32>,
}

/// Partition `graph` into `parts` parts balancing `constraints`; returns the part of every
/// vertex. `parts == 1` puts everything in part 0 without calling METIS.
pub fn kway(
    graph: &SymmetricGraph,
    constraints: &Constraints,
    parts: usize,
    opts: MetisOptions,
) -> Result<Vec<u32>> {
    let n = graph.num_nodes();
    if parts == 1 {
        return Ok(vec![0; n]);
    }
    if constraints.weights.len() != n * constraints.ncon() {
        bail!(
            "internal: {} vertex weights for {n} vertices × {} constraints",
            constraints.weights.len(),
            constraints.ncon()
        );
    }
    let nparts = Idx::try_from(parts).map_err(|_| anyhow!("--parts {parts} is too large"))?;
    let mut part = vec![0 as Idx; n];
    let mut g = Graph::new(
        constraints.ncon() as Idx,
        nparts,
        &graph.xadj,
        &graph.adjncy,
    )
    .map_err(|e| anyhow!("METIS refused the graph: {e}"))?
    .set_vwgt(&constraints.weights)
    // Seeds above METIS' 31-bit range fold into it (deterministically).
    .set_option(option::Seed((opts.seed % (i32::MAX as u64)) as Idx));
    if let Some(w) = &graph.adjwgt {
        g = g.set_adjwgt(w);
    }
    if let Some(u) = opts.ufactor {
        let u = Idx::try_from(u).map_err(|_| anyhow!("--ufactor {u} is too large"))?;
        g = g.set_option(option::UFactor(u));
    }
    let _serialised = METIS_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    g.part_kway(&mut part)
        .map_err(|e| anyhow!("METIS k-way partitioning into {parts} parts failed: {e}"))?;
    part.into_iter()
        .enumerate()
        .map(|(v, p)| {
            u32::try_from(p)
                .ok()
                .filter(|&p| (p as usize) < parts)
                .ok_or_else(|| anyhow!("METIS put vertex {v} in part {p} (expected 0..{parts})"))
        })
        .collect()
}
