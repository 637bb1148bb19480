//! Sampling ahead in windows: where a rank samples its batches in its steps (GDP, NFP; no
//! prefetch workers: the CPU backend's default), the next `K` batches are sampled at once,
//! each whole batch on one thread, and the steps then take their blocks from the window.
//! `gnnpar presample` samples its epochs the same way ([`SampleAhead::take_with`]: any
//! per-batch work, here the blocks with their edges' positions). GDP on several ranks samples
//! a window together ([`SampleAhead::take_window`] with
//! `exchange::sampling::distributed_window`: work on the calling thread alongside the
//! batches', there each hop's exchanges for all of them).
//!
//! Why: one batch's sampling is short parallel loops with a serial block build between them,
//! so its threads idle (on the 16-core GPU hosts a batch's sampling scaled 2.3× at 4 threads
//! and 2.7-2.9× at 16, while the gather scaled 8.8×); whole batches side by side scale with
//! the threads (the prefetch workers, each preparing whole batches in a pool of its own, did
//! on the 16-core H200 host). Unlike the prefetch workers, the window runs between steps, on
//! every thread, so it never shares the cores with training (what keeps prefetch off on the
//! CPU backend). By default from [`MIN_THREADS`] rank threads on: below, a batch's own
//! parallel sampling does as well (`benchmarks/results/sample_ahead_ab.md`).
//!
//! Each batch samples in a rayon pool of one thread of its own, so inside it the sampler
//! takes its serial path (the parallel block build and the pipelined hop are for threads a
//! batch has to itself). The blocks are bitwise what the step would have sampled: a batch's
//! sample is a pure function of its key (ARCHITECTURE invariant 3).
//!
//! Memory: a window holds `K` batches' blocks, and each sampling thread keeps an id table of
//! 4 bytes per vertex of the graph for its life ([`crate::sample::build`]); `K` is bounded by
//! [`MAX_WINDOW`] and so that the tables stay within [`TABLES_BUDGET_BYTES`].

use super::{sample_blocks, Adjacency, BatchKey, Block};
use crate::graph::NodeId;
use anyhow::{anyhow, Result};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// The most batches one window samples: beyond this their blocks cost memory (a few MB a
/// batch with `inputs/sage-bench.toml`'s fanouts on the 200k SBM) for throughput the
/// measured hosts (16 cores) could not use.
pub const MAX_WINDOW: usize = 16;

/// The id tables of a window's sampling threads together (4 bytes per vertex each).
pub const TABLES_BUDGET_BYTES: u64 = 1 << 30;

/// The fewest rank threads that sample in windows by default. Below, a batch's own parallel
/// sampling does about as well: on the 2-core VM at two threads (`benchmarks/block_build.sh`,
/// 1,024 seeds, fanouts 15/10/5) a window of two took 3.96 ms a batch against 4.10 for
/// `sample_blocks` on a 200k-vertex graph (4.58 against 5.97 on a 3M one), and in training
/// Tolokers' 12 steps sampled in 0.015 s in windows against 0.013 in the steps, the 200k
/// SBM's 20 in 0.133 against 0.143 (`benchmarks/results/sample_ahead_ab.md`). From four
/// threads a batch's own sampling stops scaling (2.3× at 4 threads, 2.9× at 16 on the
/// 16-core H200 host, while whole batches side by side on prefetch workers scaled with them).
pub const MIN_THREADS: usize = 4;

/// Batches a window samples at once: `configured` (`--sample-ahead`) when set, else the
/// rank's `threads` up to [`MAX_WINDOW`] from [`MIN_THREADS`] on (1 below); at most as many
/// sampling threads as keep their id tables of a `vertices`-vertex graph within
/// [`TABLES_BUDGET_BYTES`]. 1 means each batch is sampled in its step.
pub fn window_size(configured: Option<usize>, threads: usize, vertices: u64) -> usize {
    let default = if threads >= MIN_THREADS {
        threads.min(MAX_WINDOW)
    } else {
        1
    };
    let wanted = configured.unwrap_or(default).max(1);
    let table = 4 * vertices.max(1);
    let fit = (TABLES_BUDGET_BYTES / table).max(1) as usize;
    wanted.min(fit)
}

/// One epoch's window: what was prepared for batches `first..first + items.len()` (by
/// default a batch's sampled blocks).
pub struct SampleAhead<T = Vec<Block>> {
    /// One single-thread pool per batch of a window, started on first use.
    pools: Vec<rayon::ThreadPool>,
    size: usize,
    first: usize,
    items: Vec<Option<T>>,
}

impl<T: Send> SampleAhead<T> {
    /// A window of `size` batches (at least 2: one batch is sampled in its step).
    pub fn new(size: usize) -> SampleAhead<T> {
        debug_assert!(
            size >= 2,
            "a window of one batch is the step's own sampling"
        );
        SampleAhead {
            pools: Vec::new(),
            size,
            first: 0,
            items: Vec::new(),
        }
    }

    /// Batches a window samples at once (fewer where an epoch or `--max-steps` ends first).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Forget the window (a new epoch's batches are other batches).
    pub fn clear(&mut self) {
        self.first = 0;
        self.items.clear();
    }

    /// `make(b)` and the seconds spent making it: when `b` is not in the window, `make(i)` for
    /// batches `i` in `b..end` (at most the window's size) runs first, side by side, each in
    /// a rayon pool of one thread (so a sampler inside takes its serial path), and the seconds
    /// are the window's; else 0.
    pub fn take_with(
        &mut self,
        b: usize,
        end: usize,
        make: impl Fn(usize) -> T + Sync,
    ) -> Result<(T, f64)> {
        self.take_window(b, end, |_| (|i| Some(make(i)), || Ok(())))
    }

    /// [`SampleAhead::take_with`] for batches made together: when `b` is not in the window,
    /// `window(batches)` gives the window's per-batch work `make` and the work `alongside` it;
    /// `make(i)` runs for every batch `i` of `batches` side by side as in `take_with`, while
    /// `alongside()` runs on the calling thread (a collective sampler's exchanges for all the
    /// window's batches: only that thread may call MPI). `make(i)` is `None`, and the window
    /// fails with `alongside`'s error, where the batch could not be made.
    pub fn take_window<M, S>(
        &mut self,
        b: usize,
        end: usize,
        window: impl FnOnce(Range<usize>) -> (M, S),
    ) -> Result<(T, f64)>
    where
        M: Fn(usize) -> Option<T> + Sync,
        S: FnOnce() -> Result<()>,
    {
        let mut seconds = 0.0;
        let held = b >= self.first && b - self.first < self.items.len();
        if !held || self.items[b - self.first].is_none() {
            let t = Instant::now();
            self.fill(b, end.max(b + 1), window)?;
            seconds = t.elapsed().as_secs_f64();
        }
        let item = self.items[b - self.first]
            .take()
            .expect("batch b was prepared in the window");
        Ok((item, seconds))
    }

    fn fill<M, S>(
        &mut self,
        b: usize,
        end: usize,
        window: impl FnOnce(Range<usize>) -> (M, S),
    ) -> Result<()>
    where
        M: Fn(usize) -> Option<T> + Sync,
        S: FnOnce() -> Result<()>,
    {
        let count = (end - b).min(self.size);
        while self.pools.len() < count {
            let k = self.pools.len();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| format!("gnnpar-sample-{k}"))
                .build()
                .map_err(|e| anyhow!("sampling ahead: starting sampling thread {k}: {e}"))?;
            self.pools.push(pool);
        }
        // Forget the old window first: a failed fill leaves none.
        self.items.clear();
        let (make, alongside) = window(b..b + count);
        // Each batch on its own pool's thread, all at once; no thread is started per window.
        let slots: Vec<Mutex<Option<T>>> = (0..count).map(|_| Mutex::new(None)).collect();
        let mut beside = Ok(());
        let made = std::panic::catch_unwind(AssertUnwindSafe(|| {
            on_each_pool(
                &self.pools[..count],
                0,
                &|k| {
                    let item = make(b + k);
                    *slots[k].lock().unwrap_or_else(PoisonError::into_inner) = item;
                },
                || beside = alongside(),
            )
        }));
        made.map_err(|_| anyhow!("sampling ahead: sampling a window panicked"))?;
        beside?;
        let items: Vec<Option<T>> = slots
            .into_iter()
            .map(|slot| slot.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect();
        if let Some(k) = items.iter().position(Option::is_none) {
            return Err(anyhow!("sampling ahead: batch {} was not sampled", b + k));
        }
        self.items = items;
        self.first = b;
        Ok(())
    }
}

/// `job(first + k)` on pool `k`'s threads for every pool, all at once, and `last()` on the
/// calling thread meanwhile; returns when every job is done (each pool's scope waits for its
/// job, inside the next pool's; `last` runs inside the innermost).
fn on_each_pool(
    pools: &[rayon::ThreadPool],
    first: usize,
    job: &(impl Fn(usize) + Sync),
    last: impl FnOnce(),
) {
    match pools.split_first() {
        Some((pool, rest)) => pool.in_place_scope(|scope| {
            scope.spawn(move |_| job(first));
            on_each_pool(rest, first + 1, job, last);
        }),
        None => last(),
    }
}

impl SampleAhead<Vec<Block>> {
    /// The blocks of batch `b` (input layer first, as [`sample_blocks`] returns them) and the
    /// seconds spent sampling for it ([`SampleAhead::take_with`]), batch `i` sampled as
    /// `sample_blocks(adj, &seeds_of(i), fanouts, key_of(i))`.
    pub fn take<A: Adjacency + Sync>(
        &mut self,
        b: usize,
        end: usize,
        adj: &A,
        fanouts: &[i32],
        seeds_of: impl Fn(usize) -> Vec<NodeId> + Sync,
        key_of: impl Fn(usize) -> BatchKey + Sync,
    ) -> Result<(Vec<Block>, f64)> {
        self.take_with(b, end, |i| {
            sample_blocks(adj, &seeds_of(i), fanouts, key_of(i))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::LocalGraph;

    #[test]
    fn the_window_is_as_large_as_the_threads_allow_and_the_tables_fit() {
        assert_eq!(window_size(None, 1, 1000), 1);
        assert_eq!(window_size(None, 2, 1000), 1);
        assert_eq!(window_size(Some(2), 2, 1000), 2);
        assert_eq!(window_size(None, 4, 1000), 4);
        assert_eq!(window_size(None, 64, 1000), MAX_WINDOW);
        assert_eq!(window_size(Some(3), 64, 1000), 3);
        assert_eq!(window_size(Some(0), 64, 1000), 1);
        // 111M vertices (ogbn-papers100M): 444 MB a table, two fit in the budget.
        assert_eq!(window_size(None, 16, 111_000_000), 2);
        assert_eq!(window_size(Some(8), 16, 1 << 31), 1);
    }

    #[test]
    fn batches_sampled_ahead_are_the_blocks_each_step_would_sample() {
        let data = crate::graph::generate::synthetic_default(0);
        let graph = LocalGraph::new(&data, None);
        let n = data.num_nodes as NodeId;
        let seeds_of = |i: usize| -> Vec<NodeId> {
            (0..64).map(|j| ((i * 97 + j * 13) as NodeId) % n).collect()
        };
        let key_of = |i: usize| BatchKey {
            seed: 5,
            epoch: 1,
            batch: i as u64,
        };
        let fanouts = [5, 3, 2];
        let mut ahead = SampleAhead::new(3);
        let end = 7;
        let mut windows = 0;
        for b in 0..end {
            let (blocks, seconds) = ahead
                .take(b, end, &graph, &fanouts, seeds_of, key_of)
                .unwrap();
            windows += usize::from(seconds > 0.0);
            let direct = sample_blocks(&graph, &seeds_of(b), &fanouts, key_of(b));
            assert_eq!(blocks, direct, "batch {b}");
        }
        // Batches 0-2, 3-5 and 6.
        assert_eq!(windows, 3);
        // A batch taken twice (a resumed step) is sampled again, the same.
        ahead.clear();
        let (again, _) = ahead
            .take(4, end, &graph, &fanouts, seeds_of, key_of)
            .unwrap();
        assert_eq!(
            again,
            sample_blocks(&graph, &seeds_of(4), &fanouts, key_of(4))
        );
    }
}
