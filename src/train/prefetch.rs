//! Sampling that keeps up: while batch `b` trains, a prefetch thread samples batch `b + 1` and
//! gathers its input rows, so the host's share of a step hides behind the model's (on a GPU,
//! the host phases are otherwise the whole step).
//!
//! It applies to GDP mini-batches on a one-rank group, where preparing a batch is local work:
//! with several ranks, sampling routes every hop's frontier to its owners (alltoallv), and MPI
//! calls stay on the main thread. The prefetch thread only reads the training data; the
//! backend (the model, uploads, device gathers) and every collective stay on the main thread.
//!
//! It changes no number: a batch's sample is a pure function of its key
//! ([`gdp_host_batch`]), whichever thread computes it and whenever, and the step on the main
//! thread is the same code as without prefetch ([`gdp_train_step`]).

use super::data::TrainData;
use super::metrics::PhaseTimes;
use super::strategy::{gdp_host_batch, gdp_train_step, HostBatch, StepArgs};
use super::{finish_step, EpochOutcome, EpochTotals, Trainer};
use crate::backend::Backend;
use crate::exchange::store::StoreStats;
use crate::graph::NodeId;
use crate::kinds::{Prefetch, Strategy};
use crate::sample::BatchKey;
use anyhow::{anyhow, Result};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// Batches prepared ahead of the one training. One is enough when preparing a batch takes
/// less time than training one, and each costs a batch's input rows in memory (347 MB on
/// Facebook with `inputs/sage-bench.toml`).
pub const DEPTH: usize = 1;

impl<B: Backend> Trainer<'_, B> {
    /// How many batches the prefetch thread prepares ahead, or `None` when this run prepares
    /// every batch in its step: `--prefetch off` (or `auto` on the CPU backend), full-batch
    /// training, another strategy than GDP, or GDP over several ranks (whose sampling
    /// communicates).
    pub(super) fn prefetch_depth(&self) -> Option<usize> {
        let wanted = match self.cfg.prefetch {
            Prefetch::On => true,
            Prefetch::Off => false,
            // On the CPU backend the next batch's preparation would share the cores (and the
            // memory bandwidth) with this one's training: measured no faster, often slower.
            Prefetch::Auto => !B::IS_HOST,
        };
        let applies = wanted
            && !self.cfg.full_batch
            && self.cfg.strategy == Strategy::Gdp
            && self.data_group().size() == 1;
        applies.then_some(DEPTH)
    }

    /// [`Trainer::train_epoch`] with a prefetch thread preparing the batches `depth` ahead.
    pub(super) fn train_epoch_prefetched(
        &mut self,
        batches: &[Vec<NodeId>],
        depth: usize,
    ) -> Result<EpochOutcome> {
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
        let mut totals = EpochTotals::default();
        let mut store = StoreStats::default();
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
        // On a device holding the features, input rows are gathered there, not on the host.
        let gather = resident.is_none();
        let keep_sampled = dump.is_some();

        let result = std::thread::scope(|s| -> Result<()> {
            // A rendezvous channel holds no batch: the thread keeps the one it finished
            // until the loop takes it, so `depth` batches are ready ahead at most.
            let (tx, rx) = sync_channel::<HostBatch>(depth - 1);
            let keys = &keys;
            let producer = s.spawn(move || {
                for b in start..end {
                    let host = gdp_host_batch(
                        data,
                        &batches[b],
                        fanouts,
                        keys[b],
                        self_loops,
                        gather,
                        keep_sampled,
                    );
                    if tx.send(host).is_err() {
                        break; // the loop stopped early (an error): nothing more is needed
                    }
                }
            });
            for b in start..end {
                let t = Instant::now();
                let Some(host) = receive(&rx) else {
                    // The thread ended without sending: it panicked. Pass its panic on.
                    if let Err(panic) = producer.join() {
                        std::panic::resume_unwind(panic);
                    }
                    return Err(anyhow!("the prefetch thread stopped before batch {b}"));
                };
                times.prefetch_wait += t.elapsed().as_secs_f64();
                store.local_rows += host.store.local_rows;
                store.cache_hits += host.store.cache_hits;
                store.fetched_rows += host.store.fetched_rows;
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
                let out = gdp_train_step(
                    model,
                    data,
                    resident.as_ref(),
                    host,
                    &args,
                    &mut times,
                    dump,
                )?;
                finish_step(
                    world,
                    model,
                    adam,
                    pos,
                    &out,
                    batch.len(),
                    &mut times,
                    &mut totals,
                    &[],
                )?;
                progress.inc(1);
            }
            Ok(())
        });
        self.data.store.add_stats(&store);
        result?;
        progress.finish();
        Ok(EpochOutcome {
            loss: totals.loss_sum / totals.loss_count.max(1) as f64,
            times,
            counts: totals.counts,
            finished: self.pos.batch >= batches.len(),
            split: Vec::new(),
        })
    }
}

/// The next batch from the prefetch thread, or `None` once it has stopped sending.
///
/// The trainer's main thread is worker 0 of rayon's pool (`use_current_thread`), and the
/// prefetch thread's parallel sampling and gathers are jobs queued on that pool: blocked in a
/// plain `recv`, a one-thread pool would never run them. So a pool thread waits by running
/// pool jobs, and sleeps only in short slices when there are none.
fn receive<T>(rx: &Receiver<T>) -> Option<T> {
    if rayon::current_thread_index().is_none() {
        return rx.recv().ok();
    }
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            match rx.recv_timeout(Duration::from_micros(50)) {
                Ok(v) => return Some(v),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}
