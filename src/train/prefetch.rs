//! Sampling that keeps up: while batch `b` trains, prefetch workers sample batch `b + 1` and
//! gather its input rows, so the host's share of a step hides behind the model's (on a GPU,
//! the host phases are otherwise the whole step).
//!
//! It applies to GDP mini-batches, and to split's, hybrid's, DNP's and SNP's on several ranks
//! ([`prefetches_strategy`]): every strategy that samples mini-batches but NFP. On one rank,
//! preparing a GDP batch is local work. On several, sampling routes every hop's frontier to
//! its owners (split's cooperative sampling, DNP's and SNP's owner sampling and SNP's routed
//! edges build their exchange plans the same way) and missing input rows are fetched
//! (alltoallv): each worker then owns a communicator of its own, a duplicate of the world's
//! (hybrid: of its node's; [`crate::comm::World::thread_comms`], which needs
//! `MPI_THREAD_MULTIPLE`), so its collectives never match the main thread's (hidden rows,
//! partial sums, the gradient allreduce), and worker `w` of every rank prepares the same
//! batches in the same order. The workers only read the training data; the backend (the
//! model, uploads, device gathers) and the main communicators' collectives stay on the main
//! thread. A plan a worker built names ranks, not a communicator, so the main thread runs it
//! on its own. For a model on a device, GDP's and split's (so hybrid's) workers also build
//! the blocks' transposes its backward reads ([`InputSource::transposes`]): on the training
//! thread they were half of a GPU step's host time.
//!
//! One batch's sampling does not keep 16 cores busy (its hops are short parallel loops with
//! serial joins between them), so several threads prepare whole batches at once, each in a
//! rayon pool of its own (a share of the rank's threads; in the rank's pool their loops queued
//! behind one another's and the training thread's): worker `w`
//! of `W` prepares batches `start + w`, `start + w + W`, …, and the loop takes them in order
//! from worker `b mod W`. Each worker holds at most the batch it is preparing and the one it
//! finished, so at most `2W` batches are in memory; that is why the default is one worker
//! when the host gathers the input rows (they are the bulk of a batch) and a quarter of the
//! rank's threads, at most 8, when the device gathers them (`prefetch_workers`).
//!
//! It changes no number: a batch's sample and rows are a pure function of its key
//! ([`gdp_host_batch`], [`split_host_batch`], [`dnp_host_batch`], [`snp_host_batch`]),
//! whichever thread computes them and whenever, and the step on the main thread is the same
//! code as without prefetch (the matching `*_train_step`).

use super::data::TrainData;
use super::dnp::{dnp_host_batch, dnp_train_step, DnpHostBatch};
use super::hybrid::{data_group, split_seeds};
use super::metrics::PhaseTimes;
use super::snp::{snp_host_batch, snp_train_step, SnpHostBatch, SnpInput};
use super::split::{
    add_split_stats, split_host_batch, split_train_step, SplitHostBatch, SplitLayerStats,
};
use super::strategy::{
    gdp_host_batch, gdp_train_step, BatchSpec, HostBatch, InputSource, StepArgs,
};
use super::{finish_step, EpochOutcome, EpochTotals, Trainer};
use crate::backend::Backend;
use crate::comm::{Group, ThreadComm};
use crate::config::TrainConfig;
use crate::exchange::store::StoreStats;
use crate::graph::NodeId;
use crate::kinds::{Prefetch, Strategy};
use crate::sample::BatchKey;
use anyhow::{anyhow, Result};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

/// The most workers `auto` starts: beyond this the batches in flight cost memory and the
/// workers only compete for the same cores.
pub const MAX_AUTO_WORKERS: usize = 8;

/// Rank threads per worker under `auto`. Measured on the 16-core GPU host (200k-vertex SBM,
/// `inputs/sage-bench.toml`, H200, each worker in a pool of its own), s/epoch: 2 workers
/// 0.53, 4 workers 0.28 and 0.37, 8 workers 0.28; Tolokers (12 steps an epoch) 0.009-0.011
/// with 4 or 8. Past 4 the gain is within the noise and each worker holds batches in memory.
const THREADS_PER_AUTO_WORKER: usize = 4;

/// How many workers prepare batches at once: `configured` when set, else one when the host
/// gathers the input rows (each batch in flight holds them: 347 MB on Facebook with
/// `inputs/sage-bench.toml`), else a quarter of `threads`, between 1 and
/// [`MAX_AUTO_WORKERS`].
pub fn worker_count(configured: Option<usize>, gather_on_host: bool, threads: usize) -> usize {
    match configured {
        Some(n) => n.max(1),
        None if gather_on_host => 1,
        None => (threads / THREADS_PER_AUTO_WORKER).clamp(1, MAX_AUTO_WORKERS),
    }
}

/// The prefetch workers of one epoch: how many, and on several ranks the communicator each
/// owns.
pub(super) struct Workers {
    count: usize,
    /// One per worker on several ranks; empty on one.
    comms: Vec<ThreadComm>,
}

/// The workers that would prepare GDP's mini-batches ahead under `cfg` ([`worker_count`]), or
/// `None` where each batch is prepared in its step: `--prefetch off`, `auto` on the CPU
/// backend (`device` false), or full-batch training. `gather_on_host`: the host gathers the
/// dense input rows (so each batch in flight holds them).
pub fn planned_workers(
    cfg: &TrainConfig,
    device: bool,
    gather_on_host: bool,
    threads: usize,
) -> Option<usize> {
    prefetches(cfg, device).then(|| worker_count(cfg.prefetch_workers, gather_on_host, threads))
}

/// Whether `cfg` prepares mini-batches ahead on a backend that is (`device`) or is not a
/// device: `--prefetch on`, or `auto` on a device; never for full-batch training.
pub fn prefetches(cfg: &TrainConfig, device: bool) -> bool {
    let wanted = match cfg.prefetch {
        Prefetch::On => true,
        Prefetch::Off => false,
        // On the CPU backend the next batch's preparation would share the cores (and the
        // memory bandwidth) with this one's training: measured no faster, often slower.
        Prefetch::Auto => device,
    };
    wanted && !cfg.full_batch
}

/// Whether `strategy`, its graph partitioned over `ranks` ranks (the world, or hybrid's
/// node), prepares its batches apart from its steps, so that workers can prepare them ahead:
/// GDP, and split, hybrid (split inside each node), DNP and SNP over several ranks (their
/// batches are collective, and the workers of a one-rank group get no communicator). NFP's
/// and SliceGCN's ranks hold column slices and prepare in the step.
pub fn prefetches_strategy(strategy: Strategy, ranks: usize) -> bool {
    match strategy {
        Strategy::Gdp => true,
        Strategy::Split | Strategy::Hybrid | Strategy::Dnp | Strategy::Snp => ranks > 1,
        _ => false,
    }
}

/// A rayon pool for each of `workers` workers, a share of the rank's threads (at least one).
/// In the rank's own pool every worker's parallel loops queued behind one another's and the
/// training thread's, and batches came no faster with 4, 8 or 12 workers (200k SBM on an H200,
/// 0.54-0.57 s an epoch; 8 workers on one rank thread took 128 ms a batch, a serial sample 20).
fn worker_pools(workers: usize) -> Result<Vec<rayon::ThreadPool>> {
    let per_worker = (rayon::current_num_threads() / workers).max(1);
    (0..workers)
        .map(|w| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(per_worker)
                .thread_name(move |i| format!("gnnpar-prefetch-{w}.{i}"))
                .build()
                .map_err(|e| anyhow!("prefetch worker {w}: starting its {per_worker} threads: {e}"))
        })
        .collect()
}

/// What a worker needs to prepare any batch of an epoch (every worker shares one).
struct BatchPreparer<'a> {
    data: &'a TrainData,
    batches: &'a [Vec<NodeId>],
    keys: &'a [BatchKey],
    fanouts: &'a [i32],
    self_loops: bool,
    strategy: Strategy,
    /// This rank's node and the number of nodes (hybrid's share of a batch).
    node: (usize, usize),
    input: InputSource,
    snp_input: Option<SnpInput>,
    /// Keep the blocks as sampled, for `--dump-blocks`.
    keep_sampled: bool,
}

impl BatchPreparer<'_> {
    /// The host side of batch `b` for the strategy, on `group` (the worker's communicator;
    /// `None` on one rank).
    fn batch(&self, b: usize, group: Option<&Group>) -> Prepared {
        let spec = BatchSpec {
            batch: &self.batches[b],
            fanouts: self.fanouts,
            key: self.keys[b],
            self_loops: self.self_loops,
        };
        let several = || group.expect("prefetches on several ranks");
        let (data, input) = (self.data, self.input);
        match self.strategy {
            Strategy::Split | Strategy::Hybrid => {
                // Hybrid: this node's share of the batch.
                let seeds = split_seeds(self.strategy, spec.batch, self.node);
                let spec = BatchSpec {
                    batch: &seeds,
                    ..spec
                };
                Prepared::Split(split_host_batch(
                    data,
                    several(),
                    spec,
                    input,
                    self.keep_sampled,
                ))
            }
            Strategy::Snp => {
                let snp = self.snp_input.expect("resolved for snp");
                Prepared::Snp(snp_host_batch(data, several(), spec, snp, input))
            }
            Strategy::Dnp => Prepared::Dnp(dnp_host_batch(data, several(), spec, input)),
            _ => Prepared::Gdp(gdp_host_batch(
                data,
                group,
                spec,
                input,
                self.keep_sampled,
                None,
            )),
        }
    }
}

/// A batch a worker prepared, for the strategy that trains it.
enum Prepared {
    Gdp(HostBatch),
    Split(SplitHostBatch),
    Dnp(DnpHostBatch),
    Snp(SnpHostBatch),
}

impl Prepared {
    /// The feature store's counters for the batch's input rows.
    fn store(&self) -> &StoreStats {
        match self {
            Prepared::Gdp(h) => &h.store,
            Prepared::Split(h) => &h.store,
            Prepared::Dnp(h) => &h.store,
            Prepared::Snp(h) => &h.store,
        }
    }
}

impl<B: Backend> Trainer<'_, B> {
    /// The workers that prepare this epoch's batches ahead ([`planned_workers`]), or `None`
    /// when this run prepares every batch in its step: prefetch off, a strategy that
    /// prepares in its step ([`prefetches_strategy`]), or several ranks whose MPI did not
    /// grant `MPI_THREAD_MULTIPLE`. Collective on several ranks: every rank gets the fewest
    /// workers any rank wanted.
    pub(super) fn prefetch_workers(&self) -> Option<Workers> {
        // Every node has as many ranks, so every rank takes the same branch.
        let group = self.data_group();
        if !prefetches_strategy(self.cfg.strategy, group.size()) {
            return None;
        }
        // A batch in flight holds its dense input rows only where the host gathers them.
        let input = InputSource::of(&self.model, self.resident.as_ref());
        let gather_on_host = !input.resident && !input.csr_rows(&self.data);
        let threads = rayon::current_num_threads();
        let count = planned_workers(&self.cfg, !B::IS_HOST, gather_on_host, threads)?;
        if self.world.size() == 1 {
            return Some(Workers {
                count,
                comms: Vec::new(),
            });
        }
        let comms = self.world.thread_comms(group, count);
        if comms.is_empty() {
            if self.pos.epoch == 0 {
                log::warn!(
                    "prefetch off: several ranks prefetch on communicators of their own, and \
                     this MPI library did not grant MPI_THREAD_MULTIPLE on every rank"
                );
            }
            return None;
        }
        Some(Workers {
            count: comms.len(),
            comms,
        })
    }

    /// [`Trainer::train_epoch`] with `workers` preparing the batches ahead.
    pub(super) fn train_epoch_prefetched(
        &mut self,
        batches: &[Vec<NodeId>],
        workers: Workers,
        started: Instant,
    ) -> Result<EpochOutcome> {
        let Workers {
            count: workers,
            comms,
        } = workers;
        let start = self.pos.batch.min(batches.len());
        // The batches this call trains: the rest of the epoch, or fewer under `max_steps`
        // (the thread prepares no batch that will not train).
        let end = match self.cfg.max_steps {
            Some(max) => {
                let left = max.saturating_sub(self.pos.step);
                batches.len().min(start.saturating_add(left as usize))
            }
            None => batches.len(),
        };
        let mut progress = crate::util::progress::Progress::new(
            &format!("epoch {}", self.pos.epoch),
            (batches.len() - start) as u64,
        );
        let mut times = PhaseTimes::default();
        let mut totals = EpochTotals::new(started);
        let mut store = StoreStats::default();
        let mut split_stats: Vec<SplitLayerStats> = Vec::new();
        let Trainer {
            cfg,
            world,
            data,
            model,
            adam,
            pos,
            resident,
            dump,
            ..
        } = self;
        let world = *world;
        let data: &TrainData = data;
        let fanouts = &cfg.fanouts;
        let self_loops = cfg.uses_self_loops();
        let key = |b: usize| BatchKey {
            seed: cfg.seed,
            epoch: pos.epoch as u64,
            batch: b as u64,
        };
        let keys: Vec<BatchKey> = (0..batches.len()).map(key).collect();
        // On a device holding the features, dense input rows are gathered there, not on the
        // host; mostly-zero rows come as CSR from the store's sparse copy either way.
        let input = InputSource::of(model, resident.as_ref());
        let strategy = cfg.strategy;
        let node = world.node_index();
        // What SNP's host side needs of the model (checked here, before any collective).
        let snp_input = match strategy {
            Strategy::Snp => Some(SnpInput::of(model, data)?),
            _ => None,
        };
        let keep_sampled = dump.is_some();
        if pos.epoch == 0 && start == 0 {
            log::info!(
                "prefetch: {workers} worker(s) prepare batches ahead (input rows {}{})",
                input_rows_where(input, data),
                if comms.is_empty() {
                    ""
                } else {
                    "; each worker samples and fetches on a communicator of its own"
                }
            );
        }

        let pools = worker_pools(workers)?;
        let partitioned = !comms.is_empty();
        let prepare = &BatchPreparer {
            data,
            batches,
            keys: &keys,
            fanouts,
            self_loops,
            strategy,
            node,
            input,
            snp_input,
            keep_sampled,
        };
        let result = std::thread::scope(|s| -> Result<()> {
            // One rendezvous channel per worker: it holds no batch, so a worker keeps the one
            // it finished until the loop takes it, and starts the next only then.
            let mut receivers = Vec::with_capacity(workers);
            let mut producers = Vec::with_capacity(workers);
            let mut comms = comms.into_iter();
            for (w, pool) in pools.into_iter().enumerate() {
                let (tx, rx) = sync_channel::<Prepared>(0);
                receivers.push(rx);
                let comm = comms.next();
                producers.push(s.spawn(move || {
                    pool.install(|| {
                        let group = comm.map(ThreadComm::into_group);
                        for b in (start + w..end).step_by(workers) {
                            if tx.send(prepare.batch(b, group.as_ref())).is_err() {
                                break; // the loop stopped early (an error): nothing more is needed
                            }
                        }
                        // This worker's bytes and seconds, for the world's counts.
                        group.map(|g| g.stats().snapshot())
                    })
                }));
            }
            for b in start..end {
                let t = Instant::now();
                let worker = (b - start) % workers;
                let Ok(host) = receivers[worker].recv() else {
                    // The worker ended without sending: it panicked. Pass its panic on.
                    if let Err(panic) = producers.swap_remove(worker).join() {
                        std::panic::resume_unwind(panic);
                    }
                    return Err(anyhow!("prefetch worker {worker} stopped before batch {b}"));
                };
                times.prefetch_wait += t.elapsed().as_secs_f64();
                store.add(host.store());
                model.params.zero_grads();
                let batch = &batches[b];
                let args = StepArgs {
                    group: world,
                    batch,
                    fanouts,
                    key: keys[b],
                    self_loops,
                    scale: 1.0 / batch.len() as f32,
                };
                let dump = dump.as_mut().map(|d| (d, pos.step));
                let resident = resident.as_ref();
                let stepped = match host {
                    Prepared::Gdp(host) => {
                        gdp_train_step(model, data, resident, host, &args, &mut times, dump)
                    }
                    Prepared::Dnp(host) => {
                        dnp_train_step(model, data, resident, host, &args, &mut times)
                    }
                    Prepared::Snp(host) => {
                        snp_train_step(model, data, resident, host, &args, &mut times)
                    }
                    Prepared::Split(host) => {
                        // Hybrid: the node's ranks shuffle rows over the node's communicator
                        // (the worker already took the node's share of the batch).
                        let args = StepArgs {
                            group: data_group(world, strategy),
                            ..args
                        };
                        split_train_step(model, data, resident, host, &args, &mut times, dump).map(
                            |(out, stats)| {
                                add_split_stats(&mut split_stats, &stats);
                                out
                            },
                        )
                    }
                }
                .and_then(|out| {
                    finish_step(
                        world,
                        model,
                        adam,
                        pos,
                        out,
                        batch.len(),
                        &mut times,
                        &mut totals,
                        &[],
                    )
                });
                if let Err(e) = stepped {
                    // This rank's workers may be inside a collective with the other ranks'
                    // workers, which will not end now: end the job here, naming the rank,
                    // rather than wait for them to join.
                    if partitioned {
                        crate::comm::fail_job(&e);
                    }
                    return Err(e);
                }
                progress.inc(1);
            }
            for producer in producers {
                match producer.join() {
                    Ok(Some(comm)) => world.stats().add(&comm),
                    Ok(None) => {}
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            Ok(())
        });
        self.data.store.add_stats(&store);
        result?;
        progress.finish();
        let finished = self.pos.batch >= batches.len();
        totals.outcome(self.world, &mut self.pos, times, finished, split_stats)
    }
}

/// Where a prefetched batch's input rows are made, for the log.
fn input_rows_where(input: InputSource, data: &TrainData) -> &'static str {
    match (input.csr_rows(data), input.resident) {
        (true, _) => "as CSR on the host, from the store's sparse copy",
        (false, true) => "gathered on the device, other ranks' rows read or fetched on the host",
        (false, false) => "gathered on the host",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_as_configured_else_one_for_host_rows_else_a_quarter_of_the_threads() {
        assert_eq!(worker_count(Some(3), true, 16), 3);
        assert_eq!(worker_count(Some(3), false, 2), 3);
        assert_eq!(worker_count(None, true, 16), 1);
        assert_eq!(worker_count(None, false, 2), 1);
        assert_eq!(worker_count(None, false, 16), 4);
        assert_eq!(worker_count(None, false, 12), 3);
        assert_eq!(worker_count(None, false, 128), MAX_AUTO_WORKERS);
    }
}
