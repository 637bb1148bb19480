//! The distributed feature store: every rank holds the feature rows of the vertices it owns;
//! rows of other vertices come from their owners by alltoallv, unless they sit in this rank's
//! cache of the hottest remote rows (ranked by pre-sampled access frequency, within a byte
//! budget).

use super::plan::RowExchange;
use crate::backend::cpu::gather::gather_rows;
use crate::comm::Group;
use crate::graph::NodeId;
use ndarray::Array2;
use serde::Serialize;
use std::collections::HashMap;

/// Counters of one rank's store, for the epoch JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StoreStats {
    /// Rows served from this rank's own shard.
    pub local_rows: u64,
    /// Remote rows served from the cache.
    pub cache_hits: u64,
    /// Remote rows fetched from their owners.
    pub fetched_rows: u64,
}

impl StoreStats {
    /// Counters accumulated since `earlier`.
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            local_rows: self.local_rows - earlier.local_rows,
            cache_hits: self.cache_hits - earlier.cache_hits,
            fetched_rows: self.fetched_rows - earlier.fetched_rows,
        }
    }

    /// Fraction of remote accesses the cache served (NaN without remote accesses).
    pub fn hit_rate(&self) -> f64 {
        self.cache_hits as f64 / (self.cache_hits + self.fetched_rows) as f64
    }
}

/// Own feature rows, a cache of remote rows, and the ownership ranges.
pub struct FeatureStore {
    offsets: Vec<u64>,
    first: u64,
    own: Array2<f32>,
    cache_slot: HashMap<NodeId, u32>,
    cache: Array2<f32>,
    pub stats: StoreStats,
}

impl FeatureStore {
    /// A store over this rank's rows `own` (global ids `offsets[rank]..offsets[rank+1]`).
    pub fn new(offsets: Vec<u64>, rank: usize, own: Array2<f32>) -> FeatureStore {
        let d = own.ncols();
        FeatureStore {
            first: offsets[rank],
            offsets,
            own,
            cache_slot: HashMap::new(),
            cache: Array2::zeros((0, d)),
            stats: StoreStats::default(),
        }
    }

    /// Feature width.
    pub fn dim(&self) -> usize {
        self.own.ncols()
    }

    /// This rank's own rows.
    pub fn own_rows(&self) -> &Array2<f32> {
        &self.own
    }

    /// Rows of `ids`, which must all be this rank's own vertices: a local gather, no
    /// communication (source-node parallelism reads input features only on their owners).
    ///
    /// # Panics
    /// If an id is not owned by this rank (a caller bug: the ids come from an owner-routed
    /// plan).
    pub fn own_rows_of(&mut self, ids: &[NodeId]) -> Array2<f32> {
        let rows: Vec<u32> = ids
            .iter()
            .map(|&v| {
                assert!(self.is_own(v), "vertex {v} is not owned by this rank");
                (v as u64 - self.first) as u32
            })
            .collect();
        self.stats.local_rows += ids.len() as u64;
        gather_rows(self.own.view(), &rows)
    }

    /// Number of cached remote rows.
    pub fn cached_rows(&self) -> usize {
        self.cache_slot.len()
    }

    fn is_own(&self, v: NodeId) -> bool {
        let v = v as u64;
        v >= self.first && v < self.first + self.own.nrows() as u64
    }

    /// Fill the cache with the first remote ids of `hottest` (most accessed first) that fit in
    /// `budget_bytes`. Collective: every rank calls it (possibly with nothing to cache).
    pub fn fill_cache(&mut self, group: &Group, hottest: &[NodeId], budget_bytes: usize) {
        let row_bytes = (self.dim() * std::mem::size_of::<f32>()).max(1);
        let capacity = budget_bytes / row_bytes;
        let chosen: Vec<NodeId> = hottest
            .iter()
            .copied()
            .filter(|&v| !self.is_own(v))
            .take(capacity)
            .collect();
        let plan = RowExchange::new(group, &self.offsets, &chosen);
        self.cache = plan.forward(group, "store_cache_fill", self.own.view());
        self.cache_slot = chosen
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect();
    }

    /// Rows of `ids` (any owners), in order. Collective: every rank calls it once per
    /// mini-batch, possibly with no ids.
    pub fn gather(&mut self, group: &Group, ids: &[NodeId]) -> Array2<f32> {
        let d = self.dim();
        let mut out = Array2::<f32>::zeros((ids.len(), d));
        let mut missing_pos = Vec::new();
        let mut missing = Vec::new();
        let (mut local, mut hits) = (0u64, 0u64);
        {
            let own = self.own.as_slice().expect("row-major features");
            let cache = self.cache.as_slice().expect("row-major cache");
            let out_s = out.as_slice_mut().expect("fresh matrix");
            for (i, &v) in ids.iter().enumerate() {
                let dst = &mut out_s[i * d..(i + 1) * d];
                if self.is_own(v) {
                    let r = (v as u64 - self.first) as usize;
                    dst.copy_from_slice(&own[r * d..(r + 1) * d]);
                    local += 1;
                } else if let Some(&slot) = self.cache_slot.get(&v) {
                    let r = slot as usize;
                    dst.copy_from_slice(&cache[r * d..(r + 1) * d]);
                    hits += 1;
                } else {
                    missing_pos.push(i);
                    missing.push(v);
                }
            }
        }
        let plan = RowExchange::new(group, &self.offsets, &missing);
        let fetched = plan.forward(group, "store_rows", self.own.view());
        for (k, &p) in missing_pos.iter().enumerate() {
            out.row_mut(p).assign(&fetched.row(k));
        }
        self.stats.local_rows += local;
        self.stats.cache_hits += hits;
        self.stats.fetched_rows += missing.len() as u64;
        out
    }
}
