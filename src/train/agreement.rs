//! Ranks launched differently are refused before they meet in a collective. An SPMD job whose
//! ranks got other options or other data (a config edited on one node, a dataset copied to
//! node-local scratch in another version) would hang in a collective, corrupt an allreduce of
//! mismatched lengths, or train a mixed model and exit 0. Every rank states a fingerprint of the
//! settings that must agree and of its data; rank 0 names every rank that differs, and how.

use crate::comm::World;
use crate::config::{differing_between, settings_hash, TrainConfig};
use crate::graph::{format, parts};
use anyhow::{bail, Result};
use std::path::Path;

/// Settings a rank may choose for itself: how it computes, not what (its thread count, its
/// prefetch workers, its batches sampled ahead, how its MPI moves device buffers) or a label.
const PER_RANK: [&str; 5] = [
    "threads",
    "prefetch_workers",
    "sample_ahead",
    "cuda_aware_mpi",
    "dataset",
];

/// The settings every rank must share, by name.
pub fn shared_settings(cfg: &TrainConfig) -> serde_json::Value {
    let mut all = serde_json::to_value(cfg).expect("a config serialises");
    if let Some(map) = all.as_object_mut() {
        for key in PER_RANK {
            map.remove(key);
        }
    }
    all
}

/// What a rank trains on, as compared across ranks and with a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct DataIdentity {
    /// The content id of the dataset (a partition's: of the dataset it was made from); `None`
    /// for files of older builds, which record none.
    pub id: Option<u64>,
    /// What the data is, for messages.
    pub description: String,
}

impl DataIdentity {
    /// Identify the data at `path` (`None`: the synthetic default) from headers only.
    pub fn of(path: Option<&Path>) -> Result<DataIdentity> {
        let Some(p) = path else {
            return Ok(DataIdentity {
                // Generated from the config's seed, which the settings compare.
                id: Some(settings_hash(&serde_json::json!("synthetic default"))),
                description: "the synthetic default graph".into(),
            });
        };
        let show = |id: Option<u64>| id.map_or("none recorded".into(), |i| format!("{i:016x}"));
        if parts::is_parts_dir(p) {
            let id = parts::read_identity(p)?.source_id;
            return Ok(DataIdentity {
                id,
                description: format!(
                    "partition `{}` (source content id {})",
                    p.display(),
                    show(id)
                ),
            });
        }
        let h = format::read_header(p)?;
        Ok(DataIdentity {
            id: h.content_id,
            description: format!(
                "`{}` ({} vertices, {} edges, {} features, {} classes, content id {})",
                p.display(),
                h.num_nodes,
                h.num_edges,
                h.feature_dim,
                h.num_classes,
                show(h.content_id)
            ),
        })
    }

    /// A number to compare across ranks: the content id, or where none is recorded the
    /// description's hash less its path (ranks may read copies at different paths).
    fn fingerprint(&self, path: Option<&Path>) -> u64 {
        self.id.unwrap_or_else(|| {
            let text = match path {
                Some(p) => self.description.replacen(&p.display().to_string(), "", 1),
                None => self.description.clone(),
            };
            settings_hash(&serde_json::json!(text))
        })
    }
}

/// Refuse to go on when the ranks of `world` were given different shared settings or different
/// data. Collective; the first collective of a run, so that nothing hangs before it.
pub fn refuse_disagreeing_ranks(
    world: &World,
    cfg: &TrainConfig,
    data: Option<&Path>,
) -> Result<()> {
    if world.size() == 1 {
        return Ok(());
    }
    let settings = shared_settings(cfg);
    // A rank that cannot read its data says so when it loads it (naming itself); here it
    // compares nothing, so that the reason it gives is the real one.
    let identity = DataIdentity::of(data).ok();
    let unknown = u64::MAX;
    let settings_ids = world.allgather_u64(settings_hash(&settings));
    let data_ids = world.allgather_u64(identity.as_ref().map_or(unknown, |i| i.fingerprint(data)));
    let texts = world.gather_strings(&settings.to_string());
    let descriptions =
        world.gather_strings(identity.as_ref().map_or("", |i| i.description.as_str()));
    let differs =
        |ids: &[u64], r: usize| ids[r] != ids[0] && ids[r] != unknown && ids[0] != unknown;
    let odd: Vec<usize> = (1..world.size())
        .filter(|&r| differs(&settings_ids, r) || differs(&data_ids, r))
        .collect();
    if odd.is_empty() {
        return Ok(());
    }
    if world.rank() != 0 {
        // Rank 0 names what differs and ends the job; waiting here keeps its message the one
        // the user reads.
        world.barrier_sleeping(std::time::Duration::from_millis(50));
        bail!("the ranks were launched with different settings or data (rank 0 says how)");
    }
    let rank0: serde_json::Value = serde_json::from_str(&texts[0]).unwrap_or_default();
    let mut lines = Vec::new();
    for r in odd {
        if differs(&settings_ids, r) {
            let theirs: serde_json::Value = serde_json::from_str(&texts[r]).unwrap_or_default();
            let diff =
                differing_between(&rank0, "rank 0", &theirs, &format!("rank {r}")).join("; ");
            lines.push(format!("rank {r}'s settings differ from rank 0's: {diff}"));
        }
        if differs(&data_ids, r) {
            lines.push(format!(
                "rank {r} trains on {}, rank 0 on {}",
                descriptions[r], descriptions[0]
            ));
        }
    }
    bail!(
        "the ranks were launched differently, and would hang or train a mixed model: {}. \
         Launch every rank with the same options and the same data",
        lines.join("; ")
    )
}
