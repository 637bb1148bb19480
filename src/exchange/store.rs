//! The distributed feature store: every rank holds the feature rows of the vertices it owns;
//! rows of the other ranks of its host are read in shared memory where the store was shared
//! ([`FeatureStore::share_on_host`]); rows of other vertices come from their owners by
//! alltoallv, unless they sit in this rank's cache of the hottest remote rows (ranked by
//! pre-sampled access frequency, within a byte budget).

use super::host_rows::HostRows;
use super::packed_rows::{PackedRows, RowSource};
use super::plan::RowExchange;
use crate::backend::cpu::gather::gather_rows;
use crate::backend::cpu::sparse::{
    density_of_rows, prefers_sparse_by, row_nonzeros, write_row_nonzeros, CsrMatrix,
    MAX_SPARSE_DENSITY, MIN_SPARSE_COLS,
};
use crate::comm::Group;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::util::prefetch::prefetch_span;
use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Counters of one rank's store, for the epoch JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StoreStats {
    /// Rows served from this rank's own shard.
    pub local_rows: u64,
    /// Rows of other ranks of this host read in shared memory.
    pub peer_rows: u64,
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
            peer_rows: self.peer_rows - earlier.peer_rows,
            cache_hits: self.cache_hits - earlier.cache_hits,
            fetched_rows: self.fetched_rows - earlier.fetched_rows,
        }
    }

    /// Add the counters of `s`.
    pub fn add(&mut self, s: &StoreStats) {
        self.local_rows += s.local_rows;
        self.peer_rows += s.peer_rows;
        self.cache_hits += s.cache_hits;
        self.fetched_rows += s.fetched_rows;
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
    own: HostRows,
    /// The segment ([`RowFrom`]) each rank's rows are read from here: [`RowFrom::OWN`] for
    /// this rank, a host peer's for each rank sharing its rows, [`RowFrom::FETCHED`] for the
    /// rest (cached or fetched).
    segment_of_rank: Vec<u32>,
    cache_slot: HashMap<NodeId, u32>,
    cache: Array2<f32>,
    pub stats: StoreStats,
    /// Buffers of earlier gathers given back with [`FeatureStore::recycle`].
    spare: Mutex<Vec<Vec<f32>>>,
    /// Whether rows this rank sends are scanned for zeros and sent without them when that is
    /// shorter ([`RowExchange::forward_packed`]): when most values of its own rows are zero.
    /// A rank's own choice: receivers read either form.
    send_packed: bool,
    /// The own rows again as CSR, when they are wide and mostly zeros (bag-of-words
    /// features): a mini-batch that a first layer takes as sparse rows is gathered from here
    /// (its non-zeros only) instead of as dense rows that the layer then converts. On
    /// Facebook (4,714 columns, ~13 set) a batch is ~3 MB of CSR against 347 MB dense.
    own_csr: Option<CsrMatrix>,
    /// Each own row's non-zero count, for wide rows without a CSR copy to count them, made on
    /// the first [`FeatureStore::prefers_sparse_rows`]: the host then decides the first layer's
    /// sparse test without the rows (only a device gathering them asks).
    own_nonzeros: OnceLock<Vec<u32>>,
    /// Whether an own row holds a `-0.0` (checked only where there is a CSR copy).
    own_negative_zeros: bool,
}

/// Rows read to decide [`FeatureStore`]'s `send_packed`, spread over the shard.
const DENSITY_PROBE_ROWS: usize = 1024;

impl FeatureStore {
    /// A store over this rank's rows `own` (global ids `offsets[rank]..offsets[rank+1]`).
    pub fn new(offsets: Vec<u64>, rank: usize, own: Array2<f32>) -> FeatureStore {
        let d = own.ncols();
        // The fraction of non-zeros, on at most DENSITY_PROBE_ROWS rows (1 when empty).
        let density = density_of_rows(own.view(), DENSITY_PROBE_ROWS);
        // Kept as CSR too when judged as the first layer judges a batch, on more rows: a copy
        // of at most a fifth of the dense rows' bytes (8 bytes an entry at 10 % non-zeros).
        let sparse = d >= MIN_SPARSE_COLS && density <= MAX_SPARSE_DENSITY;
        let own_csr = sparse.then(|| CsrMatrix::from_dense(own.view()));
        let own_negative_zeros = sparse
            && own
                .as_slice()
                .is_none_or(|v| v.par_iter().any(|x| x.to_bits() == (-0.0f32).to_bits()));
        FeatureStore {
            own_negative_zeros,
            own_csr,
            own_nonzeros: OnceLock::new(),
            // Most values zero: rows sent are scanned for them.
            send_packed: density < 0.5,
            first: offsets[rank],
            segment_of_rank: (0..offsets.len().saturating_sub(1))
                .map(|r| {
                    if r == rank {
                        RowFrom::OWN
                    } else {
                        RowFrom::FETCHED
                    }
                })
                .collect(),
            offsets,
            own: HostRows::private(own),
            cache_slot: HashMap::new(),
            cache: Array2::zeros((0, d)),
            stats: StoreStats::default(),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// Feature width.
    pub fn dim(&self) -> usize {
        self.own.ncols()
    }

    /// Bytes of the dense rows this store gathers from: its own rows and its cache.
    pub fn dense_bytes(&self) -> usize {
        (self.own.len() + self.cache.len()) * std::mem::size_of::<f32>()
    }

    /// This rank's own rows.
    pub fn own_rows(&self) -> ArrayView2<'_, f32> {
        self.own.view()
    }

    /// Move this rank's rows into memory shared with the ranks of `group` (whose ranks
    /// `offsets` numbers) on its host and pretend node `node`, and read theirs there from now
    /// on instead of fetching them. Collective over `group`; returns the number of ranks
    /// whose rows are read directly (0 where this rank shares its host with none).
    pub fn share_on_host(&mut self, group: &Group, node: usize) -> usize {
        let peers = self.own.share_on_host(group, node, &self.offsets);
        for (rank, segment) in self.segment_of_rank.iter_mut().enumerate() {
            if let Some(p) = self.own.peer_index(rank) {
                *segment = RowFrom::peer(p, 0).segment;
            }
        }
        peers
    }

    /// Whether vertex `v`'s row is read without communication: own, or of a rank sharing
    /// this host's memory ([`FeatureStore::share_on_host`]).
    pub fn reads_directly(&self, v: NodeId) -> bool {
        self.is_own(v) || self.own.is_peer_row(&self.offsets, v)
    }

    /// Rows of `ids`, which must all be this rank's own vertices: a local gather, no
    /// communication (source-node parallelism reads input features only on their owners).
    /// Returns the counters to add with [`FeatureStore::add_stats`], so any thread may call it.
    ///
    /// # Panics
    /// If an id is not owned by this rank (a caller bug: the ids come from an owner-routed
    /// plan).
    pub fn own_rows_of(&self, ids: &[NodeId]) -> (Array2<f32>, StoreStats) {
        let (rows, stats) = self.own_row_indices(ids);
        (gather_rows(self.own.view(), &rows), stats)
    }

    /// The rows of this rank's shard that hold `ids`, which must all be its own vertices, for
    /// a device that keeps the shard resident to gather there (counted as own rows read, as
    /// [`FeatureStore::own_rows_of`] counts them).
    ///
    /// # Panics
    /// As [`FeatureStore::own_rows_of`].
    pub fn own_row_indices(&self, ids: &[NodeId]) -> (Vec<u32>, StoreStats) {
        let rows = ids
            .iter()
            .map(|&v| {
                assert!(self.is_own(v), "vertex {v} is not owned by this rank");
                (v as u64 - self.first) as u32
            })
            .collect();
        let stats = StoreStats {
            local_rows: ids.len() as u64,
            ..StoreStats::default()
        };
        (rows, stats)
    }

    /// Whether a first layer would take own rows `ids`, gathered densely, as sparse rows
    /// ([`prefers_sparse_by`], the test `Backend::sparse_from_dense` makes), decided from the
    /// rows' non-zero counts without gathering them; `None` when a row the test reads is not
    /// this rank's.
    pub fn prefers_sparse_rows(&self, ids: &[NodeId]) -> Option<bool> {
        let d = self.dim();
        if d < MIN_SPARSE_COLS {
            return Some(false);
        }
        let local = |i: usize| {
            let v = ids[i];
            self.is_own(v).then(|| (v as u64 - self.first) as usize)
        };
        let nonzeros = |r: usize| match &self.own_csr {
            Some(csr) => csr.row_len(r),
            None => self.own_nonzeros.get_or_init(|| {
                self.own
                    .view()
                    .axis_iter(ndarray::Axis(0))
                    .into_par_iter()
                    .with_min_len(LOOKUPS_PER_TASK / 4)
                    .map(|row| row_nonzeros(row.as_slice().expect("row-major")) as u32)
                    .collect()
            })[r] as usize,
        };
        let mut missing = false;
        let sparse = prefers_sparse_by(ids.len(), d, |i| match local(i).map(nonzeros) {
            Some(n) => n,
            None => {
                missing = true;
                0
            }
        });
        (!missing).then_some(sparse)
    }

    /// What this rank's rows are sent from: the CSR copy where there is one and it holds them
    /// exactly (no `-0.0`, which a CSR drops and the wire keeps), so they are not scanned for
    /// zeros again at every send; else the dense rows, scanned when mostly zeros.
    fn row_source(&self) -> RowSource<'_> {
        match &self.own_csr {
            Some(csr) if !self.own_negative_zeros => RowSource::Csr(csr),
            _ => RowSource::Dense(self.own.view(), self.send_packed),
        }
    }

    /// Whether the own rows are kept as CSR too ([`FeatureStore::gather_local_sparse`]).
    pub fn has_sparse_copy(&self) -> bool {
        self.own_csr.is_some()
    }

    /// Own rows `ids` as CSR, from the sparse copy kept when the rows are mostly zeros (`None`
    /// without one): the same matrix as `CsrMatrix::from_dense` of their dense gather. No
    /// communication; returns the counters to add as [`FeatureStore::gather_local`] does.
    ///
    /// # Panics
    /// If a row is not this rank's.
    pub fn gather_local_sparse(&self, ids: &[NodeId]) -> Option<(CsrMatrix, StoreStats)> {
        let csr = self.own_csr.as_ref()?;
        let rows: Vec<u32> = ids
            .par_iter()
            .with_min_len(LOOKUPS_PER_TASK)
            .map(|&v| {
                assert!(
                    self.is_own(v),
                    "gather_local_sparse: vertex {v} lives on another rank"
                );
                (v as u64 - self.first) as u32
            })
            .collect();
        let stats = StoreStats {
            local_rows: ids.len() as u64,
            ..Default::default()
        };
        Some((csr.gather_rows(&rows), stats))
    }

    /// Number of cached remote rows.
    pub fn cached_rows(&self) -> usize {
        self.cache_slot.len()
    }

    /// The cached remote rows, one per slot ([`FeatureStore::cache_slot`]).
    pub fn cache_matrix(&self) -> ArrayView2<'_, f32> {
        self.cache.slice(ndarray::s![..self.cached_rows(), ..])
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
        self.cache = plan.forward_packed(group, "store_cache_fill", self.row_source());
        self.cache_slot = chosen
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect();
    }

    /// How a gather brings its missing rows: from their owners over `group`, packed, one
    /// alltoallv (`store_rows`). Collective when called.
    fn fetch_from<'a>(&'a self, group: &'a Group) -> impl FnOnce(&[NodeId]) -> PackedRows + 'a {
        move |missing| {
            let plan = RowExchange::new(group, &self.offsets, missing);
            plan.forward_packed_rows(group, "store_rows", self.row_source())
        }
    }

    /// Rows of `ids` (any owners), in order. Collective: every rank calls it once per
    /// mini-batch, possibly with no ids. Rows of other owners not in the cache travel by one
    /// alltoallv; every row is then copied by all threads.
    pub fn gather(&mut self, group: &Group, ids: &[NodeId]) -> Array2<f32> {
        let (rows, stats) = self.gather_with(ids, self.fetch_from(group));
        self.add_stats(&stats);
        rows
    }

    /// Rows of `ids`, which must all be own or cached rows: no communication, so any thread
    /// may call it (the trainer's prefetch thread does, on one rank). Returns the rows and the
    /// counters to add with [`FeatureStore::add_stats`] on the thread that owns the store.
    ///
    /// # Panics
    /// If a row would have to be fetched from another rank.
    pub fn gather_local(&self, ids: &[NodeId]) -> (Array2<f32>, StoreStats) {
        self.gather_with(ids, no_fetch("gather_local"))
    }

    /// [`FeatureStore::gather_input`] of rows that must all be own or cached: the same
    /// lookups and the same CSR assembly, without communication (the calibration times the
    /// input rows' path with it).
    ///
    /// # Panics
    /// If a row would have to be fetched from another rank.
    pub fn gather_local_input(
        &self,
        ids: &[NodeId],
        sparse_first_layer: bool,
    ) -> (InputRows, StoreStats) {
        let (from, fetched, stats) = self.locate_and_fetch(ids, no_fetch("gather_local_input"));
        (self.fill_input(&from, &fetched, sparse_first_layer), stats)
    }

    /// Count rows served elsewhere ([`FeatureStore::gather_local`]) in [`FeatureStore::stats`].
    pub fn add_stats(&mut self, s: &StoreStats) {
        self.stats.add(s);
    }

    /// Give back a matrix of gathered rows that is no longer needed: the next gather writes
    /// into its memory instead of a fresh allocation. A fresh allocation of a large gather
    /// (hundreds of MB on Facebook) is mapped from the kernel page by page as it is first
    /// written, and those page faults cost more than the copy itself.
    pub fn recycle(&self, rows: Array2<f32>) {
        if !rows.is_standard_layout() {
            return;
        }
        let (buf, offset) = rows.into_raw_vec_and_offset();
        if offset.unwrap_or(0) != 0 || buf.capacity() == 0 {
            return;
        }
        let mut pool = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        pool.push(buf);
        // Keep the largest few: enough for the batch in training and those prefetched.
        pool.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
        pool.truncate(SPARE_BUFFERS);
    }

    /// A buffer of at least `len` floats: the smallest recycled one that is large enough, else
    /// the largest one grown (a large buffer is its own mapping, which `realloc` extends
    /// without copying or touching its pages again), else a fresh one. Grown and fresh
    /// buffers get an eighth more room, so that the next batch, a little larger, still fits.
    fn buffer(&self, len: usize) -> Vec<f32> {
        let mut pool = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let fit = pool
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut b = match fit {
            Some(i) => pool.swap_remove(i),
            None => {
                let largest = (0..pool.len()).max_by_key(|&i| pool[i].capacity());
                largest.map_or_else(Vec::new, |i| pool.swap_remove(i))
            }
        };
        b.clear();
        if b.capacity() < len {
            b.reserve_exact(len + len / 8);
        }
        b
    }

    /// Rows of `ids` in order: own and cached rows from this rank, the rest from
    /// `fetch(missing)` (one row per missing id, in order of first position in `ids`), each
    /// decoded straight into its place in the batch: no decoded matrix in between, which on
    /// Facebook (10,000 fetched rows of 18.9 KB) cost 85 ms a step in page faults for its
    /// fresh memory and then one more copy of every fetched row.
    fn gather_with(
        &self,
        ids: &[NodeId],
        fetch: impl FnOnce(&[NodeId]) -> PackedRows,
    ) -> (Array2<f32>, StoreStats) {
        let (from, fetched, stats) = self.locate_and_fetch(ids, fetch);
        (self.fill(&from, &fetched), stats)
    }

    /// Rows of `ids` (any owners) for a first layer that takes sparse rows when
    /// `sparse_first_layer`: where this store keeps a sparse copy and the rows pass that
    /// layer's test (made from their counts: own rows' CSR lengths, cached and fetched rows'
    /// non-zeros, the same rows sampled, so the same answer as on their dense form), as CSR
    /// assembled from the copy, the cache and the fetched rows, never dense (Facebook: 3.8k
    /// rows of 18.9 KB per rank per step at 16 ranks, ~14 non-zeros each); else dense, as
    /// [`FeatureStore::gather`]. Collective, as `gather`, over `group`, which may be another
    /// thread's (the store is only read): returns the rows and the counters to add with
    /// [`FeatureStore::add_stats`].
    pub fn gather_input(
        &self,
        group: &Group,
        ids: &[NodeId],
        sparse_first_layer: bool,
    ) -> (InputRows, StoreStats) {
        let (from, fetched, stats) = self.locate_and_fetch(ids, self.fetch_from(group));
        (self.fill_input(&from, &fetched, sparse_first_layer), stats)
    }

    /// The batch of rows `from` (fetched ones from `fetched`) as an input layer reads them:
    /// as CSR where it takes sparse rows (`sparse_first_layer`), this store keeps a CSR copy
    /// and the rows pass that layer's test (made from their counts: own rows' CSR lengths,
    /// cached and fetched rows' non-zeros, the same rows sampled, so the same answer as on
    /// their dense form); else dense.
    fn fill_input(
        &self,
        from: &[RowFrom],
        fetched: &PackedRows,
        sparse_first_layer: bool,
    ) -> InputRows {
        if let Some(own) = self.own_csr.as_ref().filter(|_| sparse_first_layer) {
            let sparse = prefers_sparse_by(from.len(), self.dim(), |i| {
                self.row_nonzeros(own, from[i], fetched)
            });
            if sparse {
                return InputRows::Sparse(self.fill_sparse(own, from, fetched));
            }
        }
        InputRows::Dense(self.fill(from, fetched))
    }

    /// Rows of `ids` (any owners) for a device that keeps this rank's own rows resident, and
    /// its cache too when `cache_on_device`: where each of those rows is, for the device to
    /// gather, and only the rest made here (fetched from their owners, and cached rows the
    /// device does not hold), dense. Collective, as [`FeatureStore::gather`], over `group`,
    /// which may be another thread's; returns the counters to add with
    /// [`FeatureStore::add_stats`].
    pub fn place_input(
        &self,
        group: &Group,
        ids: &[NodeId],
        cache_on_device: bool,
    ) -> (PlacedRows, StoreStats) {
        let (from, fetched, stats) = self.locate_and_fetch(ids, self.fetch_from(group));
        let mut placed = PlacedRows {
            len: ids.len(),
            ..PlacedRows::default()
        };
        let mut made_here = Vec::new();
        for (i, &r) in from.iter().enumerate() {
            let at = i as u32;
            match r.segment {
                RowFrom::OWN => {
                    placed.own_pos.push(at);
                    placed.own_rows.push(r.row);
                }
                RowFrom::CACHE if cache_on_device => {
                    placed.cached_pos.push(at);
                    placed.cached_slots.push(r.row);
                }
                _ => {
                    placed.host_pos.push(at);
                    made_here.push(r);
                }
            }
        }
        placed.host_rows = self.fill(&made_here, &fetched);
        (placed, stats)
    }

    /// The stored entries (`!= 0.0`) of the row `r` reads, own rows from their CSR copy `own`.
    fn row_nonzeros(&self, own: &CsrMatrix, r: RowFrom, fetched: &PackedRows) -> usize {
        match r.segment {
            RowFrom::OWN => own.row_len(r.row as usize),
            RowFrom::FETCHED => fetched.nonzeros(r.row as usize),
            _ => row_nonzeros(self.dense_row(r)),
        }
    }

    /// [`FeatureStore::fill`] as CSR: the entries `CsrMatrix::from_dense` keeps of the dense
    /// batch, read from the own rows' CSR copy `own`, the cache and the fetched rows.
    fn fill_sparse(&self, own: &CsrMatrix, from: &[RowFrom], fetched: &PackedRows) -> CsrMatrix {
        let counts: Vec<usize> = from
            .par_iter()
            .with_min_len(LOOKUPS_PER_TASK)
            .map(|&r| self.row_nonzeros(own, r, fetched))
            .collect();
        CsrMatrix::from_row_fill(self.dim(), &counts, |i, idx, val| {
            let r = from[i];
            match r.segment {
                RowFrom::OWN => {
                    let (c, v) = own.row(r.row as usize);
                    idx.copy_from_slice(c);
                    val.copy_from_slice(v);
                }
                RowFrom::FETCHED => fetched.write_row_entries(r.row as usize, idx, val),
                _ => write_row_nonzeros(self.dense_row(r), idx, val),
            }
        })
    }

    /// The dense row a local `r` (own, a peer's or cached) reads.
    fn dense_row(&self, r: RowFrom) -> &[f32] {
        let d = self.dim();
        let i = r.row as usize;
        match r.segment {
            RowFrom::OWN => &self.own.as_slice()[i * d..(i + 1) * d],
            RowFrom::CACHE => self.cache.row(i).to_slice().expect("row-major cache"),
            RowFrom::FETCHED => panic!("a fetched row is decoded, not read"),
            p => self.own.peer_row_slice(p - RowFrom::FIRST_PEER, r.row),
        }
    }

    /// Where every row of `ids` comes from, the rows `fetch(missing)` brought (one per missing
    /// id, in order of first position in `ids`), and the counters.
    fn locate_and_fetch(
        &self,
        ids: &[NodeId],
        fetch: impl FnOnce(&[NodeId]) -> PackedRows,
    ) -> (Vec<RowFrom>, PackedRows, StoreStats) {
        // Where every row comes from, looked up in parallel; missing rows are numbered in a
        // second (serial) pass only when there are any, which one rank never has.
        // The owner's segment and the row in it come from tables, not from a branch on
        // whether the row is this rank's or a host peer's ([`RowFrom`]).
        let mut from: Vec<RowFrom> = ids
            .par_iter()
            .with_min_len(LOOKUPS_PER_TASK)
            .map(|&v| {
                let owner = owner_of(&self.offsets, v as u64);
                let segment = self.segment_of_rank[owner];
                if segment != RowFrom::FETCHED {
                    return RowFrom {
                        segment,
                        row: (v as u64 - self.offsets[owner]) as u32,
                    };
                }
                match self.cache_slot.get(&v) {
                    Some(&slot) => RowFrom::cached(slot),
                    None => RowFrom::fetched(0),
                }
            })
            .collect();
        // Rows of each kind (own, peer, cached, fetched), counted in one pass.
        let [local_rows, peer_rows, cache_hits, fetched_rows] = from
            .par_iter()
            .with_min_len(LOOKUPS_PER_TASK)
            .fold(
                || [0u64; 4],
                |mut n, r| {
                    n[r.kind()] += 1;
                    n
                },
            )
            .reduce(|| [0u64; 4], |a, b| std::array::from_fn(|k| a[k] + b[k]));
        let stats = StoreStats {
            local_rows,
            peer_rows,
            cache_hits,
            fetched_rows,
        };
        let mut missing = Vec::with_capacity(stats.fetched_rows as usize);
        if stats.fetched_rows > 0 {
            for (r, &v) in from.iter_mut().zip(ids) {
                if r.segment == RowFrom::FETCHED {
                    r.row = missing.len() as u32;
                    missing.push(v);
                }
            }
        }
        let fetched = fetch(&missing);
        assert_eq!(
            fetched.len(),
            missing.len(),
            "one fetched row per missing id"
        );
        (from, fetched, stats)
    }

    /// Where vertex `v`'s row is read in a host peer's shared shard.
    ///
    /// # Panics
    /// If no rank of this host shares it (a caller bug: the caller classified `v` with
    /// [`FeatureStore::reads_directly`]).
    fn peer_row_of(&self, v: NodeId) -> RowFrom {
        let (p, r) = self
            .own
            .peer_row(&self.offsets, v)
            .unwrap_or_else(|| panic!("vertex {v}'s row is not shared on this host"));
        RowFrom::peer(p, r)
    }

    /// The cache slot of remote vertex `v`, when the cache holds its row.
    pub fn cache_slot(&self, v: NodeId) -> Option<u32> {
        self.cache_slot.get(&v).copied()
    }

    /// The input rows of a layer whose sources were routed when it was sampled (split's input
    /// layer): `n` rows, row `own_pos[i]` this rank's shard row `own_rows[i]`, row
    /// `cached_pos[i]` cache slot `cached_slots[i]` ([`FeatureStore::cache_slot`]), row
    /// `peer_pos[i]` vertex `peer_ids[i]`'s row, which a rank of this host shares
    /// ([`FeatureStore::reads_directly`]), row `remote_pos[j]` the plan's `j`-th wanted row, brought by `plan` packed as
    /// [`FeatureStore::gather`] brings them and decoded straight into place — as CSR under
    /// [`FeatureStore::gather_input`]'s rule (`sparse_first_layer`). Collective over
    /// `group`, which may be another thread's; returns the counters to add with
    /// [`FeatureStore::add_stats`].
    ///
    /// # Panics
    /// If the positions do not cover `0..n` once each (a caller bug).
    #[allow(clippy::too_many_arguments)]
    pub fn gather_planned(
        &self,
        group: &Group,
        kind: &'static str,
        plan: &RowExchange,
        [(own_rows, own_pos), (cached_slots, cached_pos), (peer_ids, peer_pos)]: [(&[u32], &[u32]);
            3],
        remote_pos: &[u32],
        n: usize,
        sparse_first_layer: bool,
    ) -> (InputRows, StoreStats) {
        assert_eq!(own_rows.len(), own_pos.len(), "one row per own position");
        assert_eq!(
            cached_slots.len(),
            cached_pos.len(),
            "one slot per cached position"
        );
        assert_eq!(peer_ids.len(), peer_pos.len(), "one id per peer position");
        assert_eq!(
            own_pos.len() + cached_pos.len() + peer_pos.len() + remote_pos.len(),
            n,
            "one source per row"
        );
        let unset = RowFrom::fetched(u32::MAX);
        let mut from = vec![unset; n];
        for (&row, &pos) in own_rows.iter().zip(own_pos) {
            from[pos as usize] = RowFrom::own(row);
        }
        for (&slot, &pos) in cached_slots.iter().zip(cached_pos) {
            from[pos as usize] = RowFrom::cached(slot);
        }
        for (&v, &pos) in peer_ids.iter().zip(peer_pos) {
            from[pos as usize] = self.peer_row_of(v);
        }
        for (j, &pos) in remote_pos.iter().enumerate() {
            from[pos as usize] = RowFrom::fetched(j as u32);
        }
        assert!(
            !from.contains(&unset),
            "gather_planned: a row has no source"
        );
        let (fetched, stats) = self.fetch_planned(
            group,
            kind,
            plan,
            [
                own_rows.len(),
                peer_pos.len(),
                cached_pos.len(),
                remote_pos.len(),
            ],
        );
        (self.fill_input(&from, &fetched, sparse_first_layer), stats)
    }

    /// The rows `plan` brings (`remote` of them), with the store's counters of a planned
    /// gather of `own` own, `peer` host peers', `cached` cached and those rows. Collective.
    fn fetch_planned(
        &self,
        group: &Group,
        kind: &'static str,
        plan: &RowExchange,
        [own, peer, cached, remote]: [usize; 4],
    ) -> (PackedRows, StoreStats) {
        let fetched = plan.forward_packed_rows(group, kind, self.row_source());
        assert_eq!(fetched.len(), remote, "one fetched row per remote source");
        let stats = StoreStats {
            local_rows: own as u64,
            peer_rows: peer as u64,
            cache_hits: cached as u64,
            fetched_rows: remote as u64,
        };
        (fetched, stats)
    }

    /// [`FeatureStore::gather_planned`] for a device that holds this rank's own rows (and
    /// its cache when `cache_on_device`): only the rows it lacks are made here, dense, in
    /// order: the cached rows (unless the device holds them), the rows of `peer_ids` (which
    /// ranks of this host share), then the plan's fetched rows.
    /// The caller places them. Collective, as `gather_planned`, and returns the counters as
    /// it does.
    pub fn gather_planned_missing(
        &self,
        group: &Group,
        kind: &'static str,
        plan: &RowExchange,
        (own, cached_slots, peer_ids, remote): (usize, &[u32], &[NodeId], usize),
        cache_on_device: bool,
    ) -> (Array2<f32>, StoreStats) {
        let counts = [own, peer_ids.len(), cached_slots.len(), remote];
        let (fetched, stats) = self.fetch_planned(group, kind, plan, counts);
        let cached: &[u32] = if cache_on_device { &[] } else { cached_slots };
        let from: Vec<RowFrom> = cached
            .iter()
            .map(|&slot| RowFrom::cached(slot))
            .chain(peer_ids.iter().map(|&v| self.peer_row_of(v)))
            .chain((0..remote as u32).map(RowFrom::fetched))
            .collect();
        (self.fill(&from, &fetched), stats)
    }

    /// A batch of `from.len()` rows, each copied from the shard or the cache or decoded from
    /// `fetched`, in parallel into a recycled buffer.
    fn fill(&self, from: &[RowFrom], fetched: &PackedRows) -> Array2<f32> {
        let d = self.dim();
        // Every local segment's rows, indexed by `RowFrom::segment`: the own shard, the
        // cache, then the host peers' shards.
        let segments: Vec<&[f32]> = [
            self.own.as_slice(),
            self.cache.as_slice().expect("row-major cache"),
        ]
        .into_iter()
        .chain(self.own.peer_slices())
        .collect();
        // A local row (own, a peer's or cached) to copy; fetched rows are decoded instead.
        let local = |r: RowFrom| -> Option<&[f32]> {
            if r.segment == RowFrom::FETCHED {
                return None;
            }
            let i = r.row as usize;
            Some(&segments[r.segment as usize][i * d..(i + 1) * d])
        };
        let n = from.len();
        let mut buf = self.buffer(n * d);
        if d > 0 {
            // Rows go straight into uninitialised memory, in parallel: no zero-filling pass
            // first, and tasks of about `BYTES_PER_TASK` each (a row of Facebook is 18 KB).
            let rows_per_task = (BYTES_PER_TASK / (4 * d)).max(1);
            buf.spare_capacity_mut()[..n * d]
                .par_chunks_mut(rows_per_task * d)
                .zip(from.par_chunks(rows_per_task))
                .for_each(|(out, rows)| {
                    for (k, (dst, &r)) in out.chunks_exact_mut(d).zip(rows).enumerate() {
                        if let Some(row) = rows.get(k + ROWS_AHEAD).and_then(|&a| local(a)) {
                            // The row's first lines: the hardware prefetcher follows a wide
                            // row (18 KB on Facebook) by itself once its start is read.
                            prefetch_span(row.as_ptr(), row.len().min(PREFETCH_FLOATS));
                        }
                        match local(r) {
                            Some(row) => {
                                dst.write_copy_of_slice(row);
                            }
                            None => fetched.write_row(r.row as usize, dst),
                        }
                    }
                });
        }
        // SAFETY: the loop above wrote all `n * d` floats (one row each).
        unsafe { buf.set_len(n * d) };
        Array2::from_shape_vec((n, d), buf).expect("one row each")
    }
}

/// The fetch of a gather that must find every row on this rank: none, and a panic naming
/// `caller` where a row would have to come from another rank.
fn no_fetch(caller: &'static str) -> impl FnOnce(&[NodeId]) -> PackedRows {
    move |missing| {
        assert!(
            missing.is_empty(),
            "{caller}: {} rows live on other ranks (first: vertex {})",
            missing.len(),
            missing[0]
        );
        PackedRows::default()
    }
}

/// A batch's input rows as [`FeatureStore::gather_input`] gathered them.
#[derive(Debug)]
pub enum InputRows {
    Dense(Array2<f32>),
    /// Mostly-zero rows, for a first layer that takes sparse rows.
    Sparse(CsrMatrix),
}

/// A batch's input rows by where they are, for a device holding this rank's own rows (and
/// maybe the cache) ([`FeatureStore::place_input`]): batch row `own_pos[k]` is own row
/// `own_rows[k]`, `cached_pos[k]` is cache slot `cached_slots[k]`, and `host_pos[k]` is row
/// `k` of `host_rows`, made on the host.
#[derive(Debug, Default)]
pub struct PlacedRows {
    /// Rows in the batch.
    pub len: usize,
    pub own_pos: Vec<u32>,
    pub own_rows: Vec<u32>,
    pub cached_pos: Vec<u32>,
    pub cached_slots: Vec<u32>,
    pub host_pos: Vec<u32>,
    pub host_rows: Array2<f32>,
}

/// Where one requested row is read: row `row` of a segment, the own shard
/// ([`RowFrom::OWN`]), the cache ([`RowFrom::CACHE`]), a host peer's shard in shared memory
/// (from [`RowFrom::FIRST_PEER`] on), or the rows fetched for this gather
/// ([`RowFrom::FETCHED`]).
///
/// Numbers, not an enum whose variant the gather branches on: a batch of 2 ranks sharing a
/// host reads own and peer rows about equally, in random order, and a branch on each row's
/// source mispredicts about every other row. Looked up in tables (the owner's segment) and
/// copied through a table of segments, a row costs the same from any of them: 2-rank GDP
/// steps (SAGE, hidden 64, 2-core EPYC VM, three runs each) gathered Tolokers' 40-byte rows
/// in 15-16 ns against 25-38 with the enum, the 200k SBM's 512-byte rows in 71-75 against
/// 77-90, and R-MAT's 256-byte ones in 43-52 against 45-57 (their memory's time hides more
/// of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowFrom {
    segment: u32,
    row: u32,
}

impl RowFrom {
    const OWN: u32 = 0;
    const CACHE: u32 = 1;
    const FIRST_PEER: u32 = 2;
    const FETCHED: u32 = u32::MAX;

    fn own(row: u32) -> RowFrom {
        RowFrom {
            segment: RowFrom::OWN,
            row,
        }
    }

    fn cached(slot: u32) -> RowFrom {
        RowFrom {
            segment: RowFrom::CACHE,
            row: slot,
        }
    }

    fn peer(peer: u32, row: u32) -> RowFrom {
        RowFrom {
            segment: RowFrom::FIRST_PEER + peer,
            row,
        }
    }

    /// The `k`-th row fetched for the gather.
    fn fetched(k: u32) -> RowFrom {
        RowFrom {
            segment: RowFrom::FETCHED,
            row: k,
        }
    }

    /// Where the row is read, in [`StoreStats`]' order: 0 own, 1 a host peer's, 2 cached,
    /// 3 fetched.
    fn kind(self) -> usize {
        match self.segment {
            RowFrom::OWN => 0,
            RowFrom::CACHE => 2,
            RowFrom::FETCHED => 3,
            _ => 1,
        }
    }
}

/// How many rows ahead of the copy a gather asks the CPU to load its source row: rows sit at
/// random places of the shard, so without the hint every row's first lines are misses that
/// the copy waits for.
const ROWS_AHEAD: usize = 4;

/// How much of a row ahead is prefetched (1 KB, a 256-wide row).
const PREFETCH_FLOATS: usize = 256;

/// Ids looked up per task of a gather.
const LOOKUPS_PER_TASK: usize = 4096;

/// Bytes copied per task of a gather: large enough that a task's bookkeeping is noise, small
/// enough that a batch spreads over every thread.
const BYTES_PER_TASK: usize = 256 * 1024;

/// Recycled gather buffers kept at most: the batch in training, one prefetched, one spare.
const SPARE_BUFFERS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    /// A store owning global ids 100..100+rows of a `rows × d` matrix whose entry (r, c) is
    /// `r * 1000 + c`.
    fn store(rows: usize, d: usize) -> FeatureStore {
        let own = Array2::from_shape_fn((rows, d), |(r, c)| (r * 1000 + c) as f32);
        FeatureStore::new(vec![0, 100, 100 + rows as u64, 10_000], 1, own)
    }

    #[test]
    fn local_gathers_copy_the_rows_asked_for_also_into_recycled_buffers() {
        let (rows, d) = (5000, 70);
        let s = store(rows, d);
        // Batches of growing and shrinking size reuse (and grow) the recycled buffers, whose
        // old contents must never show through.
        for (batch, len) in [3000usize, 100, 4500, 4500, 0, 2000]
            .into_iter()
            .enumerate()
        {
            let ids: Vec<NodeId> = (0..len)
                .map(|i| 100 + ((i * 7919 + batch * 31) % rows) as NodeId)
                .collect();
            let (x, stats) = s.gather_local(&ids);
            assert_eq!(x.dim(), (len, d));
            assert_eq!(stats.local_rows, len as u64);
            assert_eq!(stats.cache_hits + stats.fetched_rows, 0);
            for (i, &v) in ids.iter().enumerate() {
                let r = (v - 100) as usize;
                for c in [0, d / 2, d - 1] {
                    assert_eq!(x[[i, c]], (r * 1000 + c) as f32, "batch {batch} row {i}");
                }
            }
            s.recycle(x);
        }
        assert!(s.spare.lock().unwrap().len() <= SPARE_BUFFERS);
    }

    #[test]
    fn a_planned_gather_puts_own_and_fetched_rows_where_the_plan_says() {
        // Mostly-zero rows (one value set in 40), so fetched rows travel packed; a rank of its
        // own world fetches from itself through the same exchange.
        let (rows, d) = (50, 40);
        let own = Array2::from_shape_fn(
            (rows, d),
            |(r, c)| {
                if c == r % d {
                    (r + 1) as f32
                } else {
                    0.0
                }
            },
        );
        let s = FeatureStore::new(vec![0, rows as u64], 0, own.clone());
        assert!(s.send_packed);
        let world = crate::comm::World::solo();
        let wanted: [NodeId; 3] = [7, 31, 7];
        let plan = RowExchange::new(&world, &[0, rows as u64], &wanted);
        // Rows 0..5: own rows 3 and 9 at 4 and 0, the three wanted rows at 1, 3, 2.
        let (x, stats) = s.gather_planned(
            &world,
            "test_rows",
            &plan,
            [(&[3, 9], &[4, 0]), (&[], &[]), (&[], &[])],
            &[1, 3, 2],
            5,
            false,
        );
        let InputRows::Dense(x) = x else {
            panic!("dense rows asked for")
        };
        for (pos, src) in [(4, 3), (0, 9), (1, 7), (3, 31), (2, 7)] {
            assert_eq!(x.row(pos), own.row(src), "row {pos}");
        }
        assert_eq!((stats.local_rows, stats.fetched_rows), (2, 3));
    }

    #[test]
    fn the_hosts_sparse_test_and_csr_rows_match_the_dense_gathers() {
        use crate::backend::cpu::sparse::prefers_sparse;
        // 70 columns (wide enough for the test); rows of class 0 hold 2 values, rows of class
        // 1 hold 40: batches drawn from one class or the other test sparse or dense.
        let (rows, d) = (3000, 70);
        let mixed = Array2::from_shape_fn((rows, d), |(r, c)| {
            let set = if r % 3 == 0 { 40 } else { 2 };
            if (c + r) % d < set {
                (r + c) as f32 * 0.5 - 1.0
            } else {
                0.0
            }
        });
        // Mostly zeros throughout: kept as CSR too.
        let sparse = mixed.mapv(|v| if v.abs() < 20.0 { v } else { 0.0 });
        let narrow = mixed.slice(ndarray::s![.., ..40]).to_owned();
        for (name, own, csr) in [("mixed", mixed, false), ("sparse", sparse, true)] {
            let s = FeatureStore::new(vec![0, 100, 100 + rows as u64], 1, own);
            assert_eq!(s.has_sparse_copy(), csr, "{name}");
            let mut seen = [false; 2];
            for (b, step) in [(0usize, 1usize), (1, 3), (2, 3), (0, 7), (5, 11)] {
                let ids: Vec<NodeId> = (0..500)
                    .map(|i| 100 + ((b + i * step) % rows) as NodeId)
                    .collect();
                let (x, _) = s.gather_local(&ids);
                let want = prefers_sparse(x.view());
                assert_eq!(s.prefers_sparse_rows(&ids), Some(want), "{name} batch {b}");
                seen[want as usize] = true;
                match s.gather_local_sparse(&ids) {
                    Some((rows, stats)) => {
                        assert_eq!(rows, CsrMatrix::from_dense(x.view()), "{name} batch {b}");
                        assert_eq!(stats.local_rows, ids.len() as u64);
                    }
                    None => assert!(!csr, "{name}: a sparse copy gathers"),
                }
            }
            if !csr {
                assert_eq!(seen, [true, true], "{name}: batches of both kinds");
            }
            // A row of another rank: the host cannot decide for it.
            assert_eq!(s.prefers_sparse_rows(&[100, 7, 101]), None);
        }
        let s = FeatureStore::new(vec![0, 100, 100 + rows as u64], 1, narrow);
        assert!(!s.has_sparse_copy());
        assert_eq!(s.prefers_sparse_rows(&[100, 7]), Some(false), "too narrow");
    }

    /// Rows about 1 in 37 of whose values are set (bag-of-words-like: a store keeps them as
    /// CSR too when they are wide enough).
    fn mostly_zero(rows: usize, d: usize) -> Array2<f32> {
        Array2::from_shape_fn((rows, d), |(r, c)| {
            if (c * 7 + r) % 37 == 0 {
                r as f32 + 0.5
            } else {
                0.0
            }
        })
    }

    #[test]
    fn sparse_batches_hold_the_entries_of_the_dense_batch_from_every_source() {
        use super::super::packed_rows::encode;
        // Own rows mostly zero (a sparse copy is kept); a cache row and fetched rows with a
        // -0.0 (a zero to CSR, though it travels as a value) and a NaN (a value).
        let (rows, d) = (40, 80);
        let own = mostly_zero(rows, d);
        let mut s = FeatureStore::new(vec![0, rows as u64], 0, own.clone());
        assert!(s.has_sparse_copy());
        let mut remote = Array2::<f32>::zeros((3, d));
        remote[[0, 3]] = -0.0;
        remote[[0, 9]] = 2.0;
        remote[[1, 79]] = f32::NAN;
        remote.row_mut(2).fill(1.5); // a dense row
        remote[[2, 4]] = 0.0;
        s.cache = remote.slice(ndarray::s![0..1, ..]).to_owned();
        s.cache_slot.insert(1000, 0);
        let (words, _) = encode(remote.view(), &[1, 2, 0], &[3], true);
        let fetched = PackedRows::new(words, 3, d, vec![2, 0, 1, 0]);
        let from = [
            RowFrom::fetched(0),
            RowFrom::own(5),
            RowFrom::cached(0),
            RowFrom::fetched(1),
            RowFrom::own(39),
            RowFrom::fetched(2),
            RowFrom::fetched(3),
        ];
        let dense = s.fill(&from, &fetched);
        let own_csr = s.own_csr.as_ref().expect("a sparse copy");
        let sparse = s.fill_sparse(own_csr, &from, &fetched);
        let want = CsrMatrix::from_dense(dense.view());
        assert_eq!(sparse.indptr, want.indptr);
        assert_eq!(sparse.indices, want.indices);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&sparse.values), bits(&want.values));
        for (i, &r) in from.iter().enumerate() {
            assert_eq!(
                s.row_nonzeros(own_csr, r, &fetched),
                want.row_len(i),
                "row {i}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "live on other ranks")]
    fn a_local_gather_refuses_rows_of_other_ranks() {
        store(10, 3).gather_local(&[100, 5]);
    }

    #[test]
    fn a_local_input_gather_makes_the_rows_of_the_dense_gather_in_the_form_asked() {
        let (rows, d) = (50, 128);
        let s = FeatureStore::new(vec![0, rows as u64], 0, mostly_zero(rows, d));
        assert!(s.has_sparse_copy());
        let ids = [7, 0, 49, 7, 23];
        let (dense, _) = s.gather_local(&ids);
        match s.gather_local_input(&ids, true) {
            (InputRows::Sparse(m), stats) => {
                assert_eq!(stats.local_rows, ids.len() as u64);
                let want = CsrMatrix::from_dense(dense.view());
                assert_eq!(
                    (m.indptr, m.indices, m.values),
                    (want.indptr, want.indices, want.values)
                );
            }
            other => panic!("mostly-zero rows for a sparse layer came {other:?}"),
        }
        match s.gather_local_input(&ids, false) {
            (InputRows::Dense(m), _) => assert_eq!(m, dense),
            other => panic!("rows for a dense layer came {other:?}"),
        }
    }

    #[test]
    #[should_panic(expected = "live on other ranks")]
    fn a_local_input_gather_refuses_rows_of_other_ranks() {
        store(10, 3).gather_local_input(&[100, 5], true);
    }
}
