//! The training loop: epochs of global mini-batches, gradient allreduce, Adam, evaluation at
//! the best validation epoch, per-epoch JSON, checkpoints and bitwise-exact resume.

pub mod agreement;
pub mod auto;
pub mod cache;
pub mod checkpoint;
pub mod columns;
pub mod data;
pub mod device;
pub mod dnp;
pub mod dump;
mod files;
pub mod hybrid;
pub mod losses;
pub mod memory;
pub mod metrics;
pub mod nfp;
pub mod owner_input;
pub mod plan;
pub mod prefetch;
pub mod report;
mod setup;
pub mod slicegcn;
pub mod snp;
pub mod split;
pub mod strategy;
mod summary;

use crate::backend::{Backend, Cpu};
use crate::comm::World;
use crate::config::TrainConfig;
use crate::exchange::inference::HaloPlan;
use crate::graph::NodeId;
use crate::kinds::{CacheSize, Strategy};
use crate::nn::{Adam, Model, ModelConfig};
use crate::sample::{epoch_batches, BatchKey};
use anyhow::{bail, Result};
use checkpoint::{Checkpoint, Position};
use data::TrainData;
use losses::StepLosses;
use metrics::{CallClock, EpochRecord, MetricsWriter, PhaseTimes, RunCalls};
use std::ops::Range;
use std::time::Instant;
use strategy::{FullGraph, InputSource, ResidentFeatures, StepArgs};

pub use files::RunFiles;
use setup::Planning;
pub(crate) use summary::RunEnd;
pub use summary::{DeviceTransfers, RunSummary};

/// Batches this rank would sample at once ahead of its steps under `cfg` on `data`
/// (`--sample-ahead`, else [`crate::sample::ahead::window_size`]'s default for its threads and
/// the graph's vertices); 1 for full-batch training. Which strategies sample ahead, and
/// whether ranks agree on one window, is the trainer's (`Trainer::sample_window`).
pub(crate) fn own_sample_window(cfg: &TrainConfig, data: &TrainData) -> usize {
    if cfg.full_batch {
        return 1;
    }
    crate::sample::ahead::window_size(
        cfg.sample_ahead,
        rayon::current_num_threads(),
        data.offsets.last().copied().unwrap_or(0),
    )
}

/// The model `cfg` describes, from `in_dim` input columns to `out_dim` outputs.
pub fn model_config(cfg: &TrainConfig, in_dim: usize, out_dim: usize) -> ModelConfig {
    ModelConfig {
        kind: cfg.model,
        in_dim,
        hidden: cfg.hidden,
        out_dim,
        layers: cfg.layers,
        heads: cfg.heads,
        dropout: cfg.dropout,
        input_dropout: cfg.first_layer_dropout(),
        gat_concat: true,
        residual: cfg.residual,
        norm: cfg.norm,
        input_proj: cfg.input_proj,
        linear_output: cfg.linear_output,
        init: cfg.init,
    }
}

/// What one (possibly partial) epoch produced.
struct EpochOutcome {
    /// Mean loss over the seeds trained.
    loss: f64,
    times: PhaseTimes,
    /// Destination rows, edges and input rows processed, summed over ranks.
    counts: (u64, u64, u64),
    /// False when `max_steps` stopped the epoch early.
    finished: bool,
    /// Split strategy only: this rank's edges per layer (input first) and cross-rank edges.
    split: Vec<split::SplitLayerStats>,
    /// The epoch's first step, when one ran.
    first_step: Option<FirstStep>,
    /// Seconds this rank waited at the epoch's end, in its last loss read, for the slowest
    /// rank to finish its steps (see [`EpochTotals::outcome`]).
    end_wait: f64,
}

/// One training run on one rank, the model on backend `B`.
pub struct Trainer<'w, B: Backend = Cpu> {
    cfg: TrainConfig,
    files: RunFiles,
    world: &'w World,
    data: TrainData,
    pub model: Model<B>,
    adam: Adam<B>,
    pos: Position,
    /// This rank's block of the whole graph and its halo exchange: full-batch training and
    /// exact evaluation (built on first use, collectively).
    full: Option<FullGraph<B>>,
    /// The whole graph's features on a device backend, when one rank owns them all and they
    /// fit: mini-batches gather their input rows there.
    resident: Option<ResidentFeatures<B>>,
    dump: Option<dump::BlockDump>,
    /// `--strategy nfp`: this rank's sliced input layer.
    nfp: Option<nfp::Nfp<B>>,
    /// The planner's prediction of every candidate, its calibration file and that file's
    /// check against the host, when planned.
    pub planned: Option<plan::Planned>,
    /// Why the run was not planned.
    unplanned: Option<String>,
    /// Bytes of remote feature rows each rank may cache (`--cache-mb`), sized once so that
    /// the planner prices the cache the trainer fills.
    cache_budget: usize,
    /// Batches sampled ahead of their steps, where this rank samples locally in its steps
    /// (`--sample-ahead`; [`crate::sample::ahead`]).
    ahead: Option<crate::sample::ahead::SampleAhead>,
}

impl<'w> Trainer<'w, Cpu> {
    /// Load the data, build the model on the CPU, and restore a checkpoint when resuming.
    pub fn new(cfg: TrainConfig, files: RunFiles, world: &'w World) -> Result<Trainer<'w, Cpu>> {
        Trainer::on(Cpu, cfg, files, world)
    }
}

/// Sum the gradients over the world, in place: on the device when the MPI library takes device
/// pointers ([`crate::comm::Group::device_pointers`]), else through a host copy (none on the
/// CPU backend). Collective.
///
/// `skip`: ranges of the buffer left out (sorted, disjoint), whose gradients stay on their rank
/// (NFP's sliced input weights).
fn allreduce_grads<B: Backend>(
    world: &World,
    params: &mut crate::nn::ParamStore<B>,
    skip: &[Range<usize>],
) {
    let be = params.backend().clone();
    let n = be.buffer_len(&params.grads);
    let segments = complement(skip, n);
    if world.device_pointers() && !B::IS_HOST {
        let mut done = true;
        for seg in &segments {
            let len = seg.len();
            // Reduce from a copy: the host path sums in place (`MPI_IN_PLACE`), but in place on
            // device pointers has never run on a CUDA-aware MPI here, so this keeps the form
            // that has.
            let send = be.to_owned(be.buffer_view(&params.grads, seg.start, 1, len));
            let spans = (
                be.device_span(be.view(&send)),
                be.device_span_mut(be.buffer_view_mut(&mut params.grads, seg.start, 1, len)),
            );
            if let (Some(s), Some(r)) = spans {
                // SAFETY: `send` and the gradients outlive the call, nothing is queued on them
                // (the spans waited), and the world takes device pointers.
                unsafe { world.allreduce_sum_device(s, r) };
            } else {
                // Every rank's backend answers alike, so all ranks take the host path below.
                done = false;
                break;
            }
        }
        if done {
            return;
        }
    }
    be.with_host_buffer(&mut params.grads, &mut |g| {
        for seg in &segments {
            world.allreduce_sum_f32(&mut g[seg.clone()]);
        }
    });
}

/// The parts of `0..n` outside the sorted, disjoint ranges `skip`.
fn complement(skip: &[Range<usize>], n: usize) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(skip.len() + 1);
    let mut at = 0;
    for r in skip {
        if r.start > at {
            out.push(at..r.start);
        }
        at = at.max(r.end);
    }
    if at < n {
        out.push(at..n);
    }
    out
}

impl<'w, B: Backend> Trainer<'w, B> {
    /// `gnnpar plan`: load the data and plan the run, without building the model on the
    /// backend. `None` where the run is not planned (the log says why). Collective.
    pub fn plan_only(
        backend: B,
        cfg: TrainConfig,
        files: RunFiles,
        world: &World,
    ) -> Result<Option<plan::Planned>> {
        Ok(Planning::on(&backend, cfg, &files, world)?.planned)
    }

    /// Load the data, build the model on `backend`, and restore a checkpoint when resuming.
    pub fn on(
        backend: B,
        cfg: TrainConfig,
        files: RunFiles,
        world: &'w World,
    ) -> Result<Trainer<'w, B>> {
        let Planning {
            cfg,
            data,
            host_model,
            planned,
            unplanned,
            cache_budget,
        } = Planning::on(&backend, cfg, &files, world)?;
        // NFP keeps only this rank's rows of the input layer's weights.
        let (model, nfp) = if cfg.strategy == Strategy::Nfp {
            let (model, nfp) = nfp::Nfp::slice_model(host_model, &data, backend.clone())?;
            (model, Some(nfp))
        } else {
            (host_model.to_backend(backend.clone()), None)
        };
        let adam = Adam::on(
            backend.clone(),
            model.params.len(),
            cfg.lr,
            cfg.weight_decay,
        );
        // Mostly-zero rows that the store keeps as CSR go up as CSR, batch by batch and for
        // evaluation (`FullGraph::infer`): a dense resident copy would only cost device memory
        // (Facebook: 424 MB, half the mini-batch run's peak).
        let csr_input = InputSource::of(&model, None).csr_rows(&data);
        // Every mini-batch strategy but NFP (whose ranks hold column slices) assembles its
        // input rows there, on one rank or several.
        let assembles_rows = !cfg.full_batch && cfg.strategy != Strategy::Nfp;
        // Evaluation decides collectively whether it reads a resident copy, so every rank
        // keeps one or none; `assembles_rows` is the same everywhere, so every rank or none
        // makes the collective check.
        let keep = assembles_rows
            && ResidentFeatures::fit_on_every_rank(&backend, &data, world, csr_input);
        let resident = keep.then(|| ResidentFeatures {
            own: backend.upload(data.store.own_rows().view()),
            cache: None,
        });
        let mut t = Trainer {
            pos: Position::start(),
            cfg,
            files,
            world,
            data,
            model,
            adam,
            full: None,
            resident,
            dump: None,
            nfp,
            planned,
            unplanned,
            cache_budget,
            ahead: None,
        };
        let window = t.sample_window();
        if window > 1 {
            if t.world.rank() == 0 {
                let together = if t.windows_routed() {
                    ", each hop of all of them routed to the owners in one exchange"
                } else {
                    ""
                };
                log::info!(
                    "sampling ahead: {window} batches at once, each on a thread of its own{together} \
                     (--sample-ahead)"
                );
            }
            t.ahead = Some(crate::sample::ahead::SampleAhead::new(window));
        }
        if let Some(dir) = &t.files.dump_blocks {
            t.dump = Some(dump::BlockDump::create(dir, world.rank())?);
        }
        if t.files.resume {
            t.restore()?;
        }
        // SNP and NFP read no remote feature row, so a cache would never be read.
        let reads_remote_rows = !matches!(t.cfg.strategy, Strategy::Snp | Strategy::Nfp);
        if !t.cfg.cache_mb.is_off()
            && !t.files.plan_only
            && !t.cfg.full_batch
            && t.data_group().size() > 1
            && reads_remote_rows
        {
            t.fill_cache();
        }
        t.keep_cache_on_device();
        if t.world.size() > 1 && t.world.rank() == 0 {
            if let Some(r) = &t.resident {
                let others = if t.cfg.strategy == Strategy::Snp {
                    "SNP reads no row of another rank"
                } else {
                    "rows of other ranks are read (shared on the host) or fetched on the host per batch and placed there"
                };
                log::info!(
                    "features on the device: each rank's own rows{}; {others}",
                    if r.cache.is_some() {
                        " and its cache of remote rows"
                    } else {
                        ""
                    }
                );
            }
        }
        Ok(t)
    }

    /// Where this rank keeps its own features on the device, keep its cache of remote rows
    /// there too when it fits: cached rows are then gathered there, not copied up per batch.
    fn keep_cache_on_device(&mut self) {
        let cached = self.data.store.cached_rows();
        let Some(resident) = &mut self.resident else {
            return;
        };
        let be = self.model.params.backend();
        if cached > 0 && be.fits(cached * self.data.feature_dim() * 4) {
            resident.cache = Some(be.upload(self.data.store.cache_matrix()));
        }
    }

    /// Fill each rank's cache with the remote rows a presampling pass reads most. Collective.
    fn fill_cache(&mut self) {
        let group = self.data_group();
        let batches = self.batches();
        let take = self.cfg.cache_presample_batches.min(batches.len());
        let hot = cache::hottest_remote_rows(
            &self.data,
            group,
            &batches[..take],
            &self.cfg.fanouts,
            self.cfg.seed,
            self.cfg.strategy,
        );
        let budget = self.cache_budget;
        self.data.store.fill_cache(group, &hot, budget);
        let sizing = match self.cfg.cache_mb {
            CacheSize::Auto => format!(
                " (auto: budget {:.1} MiB, {:.0} % of the node's available memory over its \
                 {} rank(s); {} remote rows read)",
                budget as f64 / 1048576.0,
                100.0 * cache::AUTO_MEMORY_SHARE,
                self.world.node().size(),
                hot.len()
            ),
            CacheSize::MiB(_) => String::new(),
        };
        log::info!(
            "feature cache: {} remote rows ({:.1} MiB) from {take} presampled batches{sizing}",
            self.data.store.cached_rows(),
            (self.data.store.cached_rows() * self.data.feature_dim() * 4) as f64 / 1048576.0
        );
    }

    fn restore(&mut self) -> Result<()> {
        let path = self.files.checkpoint.clone().expect("checked in new");
        // A checkpoint holds the whole model (NFP's too): NFP cuts it to this rank's rows.
        let whole_len = self
            .nfp
            .as_ref()
            .map_or(self.model.params.len(), |n| n.whole_len());
        let ck = checkpoint::load(
            &path,
            whole_len,
            &self.cfg,
            checkpoint::data_id_of(&self.files),
        )?;
        let (params, m, v) = match &self.nfp {
            Some(nfp) => (
                nfp.narrow(&ck.params)?,
                nfp.narrow(&ck.adam_m)?,
                nfp.narrow(&ck.adam_v)?,
            ),
            None => (ck.params, ck.adam_m, ck.adam_v),
        };
        self.model.params.set_values(&params);
        self.adam.set_state(&m, &v, ck.adam_t)?;
        self.pos = ck.position;
        log::info!(
            "resumed from `{}` at epoch {} batch {} (step {})",
            path.display(),
            self.pos.epoch,
            self.pos.batch,
            self.pos.step
        );
        Ok(())
    }

    /// The ranks the graph is partitioned over (the node under hybrid, else the world).
    fn data_group(&self) -> &'w crate::comm::Group {
        hybrid::data_group(self.world, self.cfg.strategy)
    }

    /// The data this run trains on.
    pub fn data(&self) -> &TrainData {
        &self.data
    }

    /// Build the full-graph plan on first use. Collective: every rank reaches it at the same
    /// point (first full-batch step or first evaluation).
    fn ensure_full_plan(&mut self) {
        if self.full.is_none() {
            let plan = HaloPlan::new(
                self.data_group(),
                &self.data.part,
                &self.data.offsets,
                self.cfg.uses_self_loops(),
            );
            self.full = Some(FullGraph::new(plan));
        }
    }

    /// Train until `epochs` (or `max_steps`) and return the summary.
    pub fn run(&mut self) -> Result<RunSummary> {
        let started = Instant::now();
        let first_step = self.pos.step;
        checkpoint::warn_if_nothing_to_train(self.world, &self.cfg, &self.pos, self.files.resume);
        let mut writer = MetricsWriter::open(
            if self.world.rank() == 0 {
                self.files.metrics.as_deref()
            } else {
                None
            },
            self.files.resume,
        )?;
        let mut epoch_times = Vec::new();
        let mut first_of_run: Option<FirstStep> = None;
        let mut total = PhaseTimes::default();
        let mut end_waits = 0.0;
        let mut final_loss = f64::NAN;
        let mut stopped_early = false;
        let mut run_calls = RunCalls::default();
        while self.pos.epoch < self.cfg.epochs && !self.steps_exhausted() {
            let epoch = self.pos.epoch;
            let t_epoch = Instant::now();
            let comm_before = self.world.stats().snapshot();
            let store_before = self.data.store.stats;
            self.adam.lr = crate::nn::schedule::lr_at(
                self.cfg.lr_schedule,
                self.cfg.lr,
                epoch,
                self.cfg.epochs,
            );
            let blocked_before = self.model.params.backend().blocked_seconds();
            let calls = CallClock::start(self.model.params.backend());
            let steps_before = self.pos.step;
            let EpochOutcome {
                loss,
                times,
                counts,
                finished,
                split,
                first_step,
                end_wait,
            } = self.train_epoch()?;
            end_waits += end_wait;
            let blocked = self.model.params.backend().blocked_seconds();
            let epoch_calls = calls.stop(self.model.params.backend());
            run_calls.add(epoch_calls.as_ref(), self.pos.step - steps_before);
            first_of_run = first_of_run.or(first_step);
            // The whole epoch's, also when it began before a resume (this call's own batches
            // are what `loss` covers).
            let loss = if self.pos.epoch_loss_seeds > 0 {
                self.pos.epoch_loss()
            } else {
                loss
            };
            final_loss = loss;
            let epoch_seconds = t_epoch.elapsed().as_secs_f64();
            epoch_times.push(epoch_seconds);
            let mut times = times;
            if let (Some(after), Some(before)) = (blocked, blocked_before) {
                times.device_blocked = after - before;
            }
            let last = !finished || epoch + 1 == self.cfg.epochs || self.steps_exhausted();
            let due = self.cfg.eval_every > 0 && (epoch + 1).is_multiple_of(self.cfg.eval_every);
            let (train_m, val, test) = if due || last {
                let t = Instant::now();
                let r = self.evaluate()?;
                times.eval = t.elapsed().as_secs_f64();
                self.pos.record_eval(epoch, r)
            } else {
                (None, None, None)
            };
            total.add(&times);
            let store = self.data.store.stats.since(&store_before);
            let comm = report::gather(
                self.world,
                &report::RankReport {
                    rank: self.world.rank(),
                    seconds: times.clone(),
                    comm: self.world.stats().since(&comm_before),
                    store,
                    cache_hit_rate: (store.cache_hits + store.fetched_rows > 0)
                        .then(|| store.hit_rate()),
                    split: split
                        .iter()
                        .enumerate()
                        .map(|(l, s)| (format!("layer{l}"), *s))
                        .collect(),
                },
            );
            let split_summary = comm
                .as_ref()
                .and_then(|c| report::split_summary(c, split.len()));
            let record = EpochRecord {
                epoch,
                strategy: self.cfg.strategy,
                steps: self.pos.step,
                loss,
                metric: self.data.metric,
                train: train_m,
                val,
                test,
                epoch_seconds,
                seconds: times,
                nodes: counts.0,
                edges: counts.1,
                input_rows: counts.2,
                ranks: comm,
                split: split_summary,
                partial: !finished,
                device_calls: epoch_calls,
            };
            if self.world.rank() == 0 {
                log::info!(
                    "epoch {epoch}{}: loss {loss:.4}{} in {epoch_seconds:.3} s",
                    if finished {
                        String::new()
                    } else {
                        format!(" (stopped before batch {})", self.pos.batch)
                    },
                    match (val, test) {
                        (Some(v), Some(t)) => format!(", val {v:.4}, test {t:.4}"),
                        _ => String::new(),
                    }
                );
            }
            writer.write(&record)?;
            if finished {
                self.pos.next_epoch();
            }
            let ck_due = self.cfg.checkpoint_every > 0
                && finished
                && self.pos.epoch.is_multiple_of(self.cfg.checkpoint_every);
            if ck_due && !last {
                self.save_checkpoint()?;
            }
            if last {
                stopped_early = !finished;
                break;
            }
        }
        // A resumed run with nothing left to train leaves its checkpoint as it was.
        if self.files.checkpoint.is_some() && self.pos.step > first_step {
            self.save_checkpoint()?;
        }
        let direct = self.world.stats().device_pointer_calls();
        if self.world.rank() == 0 && self.world.device_pointers() {
            log::info!("MPI: {direct} collectives on this rank took device pointers");
        }
        if stopped_early {
            log::info!(
                "stopped after {} optimizer steps (--max-steps)",
                self.pos.step
            );
        }
        let planned = self
            .planned
            .as_ref()
            .and_then(|planned| Some((planned, plan::entry_of(self.cfg.strategy)?)));
        let (prediction, prediction_skipped) = match planned {
            Some((planned, entry)) => {
                let run = plan::report::RunTotals {
                    phases: &total,
                    train_seconds: epoch_times.iter().sum(),
                    end_waits,
                    steps: self.pos.step - first_step,
                    first: first_of_run.as_ref(),
                };
                let report = plan::report::PredictionReport::new(self.world, entry, planned, run);
                if let (Some(r), 0) = (&report, self.world.rank()) {
                    log::info!(
                        "planner: {entry} predicted {:.4} s per step, measured {:.4} s ({:+.1}%)",
                        r.predicted.step_seconds,
                        r.measured.step_seconds,
                        100.0 * r.relative_error
                    );
                }
                (report, None)
            }
            None => (None, self.unplanned.clone()),
        };
        let mut summary = RunSummary::assemble(
            &self.cfg,
            &self.data,
            self.world,
            self.model.params.backend(),
            &self.pos,
            RunEnd {
                started,
                epoch_times: &epoch_times,
                final_loss,
                seconds: total,
                params: self.model.params.len(),
                device_calls: run_calls.summary(),
            },
        );
        (summary.prediction, summary.prediction_skipped) = (prediction, prediction_skipped);
        summary.sample_window = self.ahead.as_ref().map_or(1, |a| a.size());
        summary.write(self.world, self.files.summary.as_deref())?;
        Ok(summary)
    }

    fn save_checkpoint(&mut self) -> Result<()> {
        if self.files.checkpoint.is_none() {
            return Ok(());
        }
        // Every rank reaches this point (rank 0 alone writes): NFP's gather runs on all.
        let whole = self
            .nfp
            .as_ref()
            .map(|nfp| nfp.whole_state(self.world, &self.model, &self.adam));
        let Some(path) = &self.files.checkpoint else {
            return Ok(());
        };
        // Parameters are identical on every rank; rank 0 writes.
        if self.world.rank() != 0 {
            return Ok(());
        }
        let whole = whole.unwrap_or_else(|| {
            let (adam_m, adam_v, adam_t) = self.adam.state();
            nfp::WholeState {
                entries: self.model.params.entries.clone(),
                params: self.model.params.values_on_host(),
                adam_m,
                adam_v,
                adam_t,
            }
        });
        checkpoint::save(
            path,
            &Checkpoint {
                config_hash: self.cfg.model_hash(),
                model_settings: self.cfg.model_settings(),
                run_config: serde_json::to_string(&self.cfg)?,
                position: self.pos.clone(),
                params: whole.params,
                adam_m: whole.adam_m,
                adam_v: whole.adam_v,
                adam_t: whole.adam_t,
                slice_ranks: None,
                data_id: checkpoint::data_id_of(&self.files),
            },
            &whole.entries,
        )?;
        log::info!("checkpoint written to `{}`", path.display());
        Ok(())
    }

    fn steps_exhausted(&self) -> bool {
        self.cfg.max_steps.is_some_and(|m| self.pos.step >= m)
    }

    /// Global mini-batches of the current epoch (identical on every rank).
    fn batches(&self) -> Vec<Vec<NodeId>> {
        let train = &self.data.train_all;
        if self.cfg.full_batch {
            return vec![train.clone()];
        }
        epoch_batches(
            train,
            |v| self.data.orig_of(v),
            self.cfg.seed,
            self.pos.epoch as u64,
            self.cfg.batch_size,
        )
    }

    /// Batches a window of [`crate::sample::ahead`] samples at once on this rank: GDP's
    /// mini-batches without prefetch workers (with them, the workers prepare whole batches
    /// side by side already) and NFP's (whose ranks sample their seeds locally, over the whole
    /// topology, and never prefetch); 1 elsewhere (split's, DNP's and SNP's sampling is built
    /// into their exchange plans) and for full-batch training. GDP on several ranks samples
    /// its windows together (each hop of every batch of a window in one exchange,
    /// [`crate::exchange::sampling::distributed_window`]), so its ranks take the smallest
    /// window any of them would: collective there.
    fn sample_window(&self) -> usize {
        let ahead = match self.cfg.strategy {
            Strategy::Gdp => !prefetch::prefetches(&self.cfg, !B::IS_HOST),
            Strategy::Nfp => true,
            _ => false,
        };
        if !ahead || self.cfg.full_batch {
            return 1;
        }
        let mine = own_sample_window(&self.cfg, &self.data);
        if self.windows_routed() {
            self.data_group().allreduce_min_usize(mine)
        } else {
            mine
        }
    }

    /// Whether this run's windows are sampled together over several ranks (GDP's), rather
    /// than locally (one GDP rank, NFP's ranks over the whole topology).
    fn windows_routed(&self) -> bool {
        self.cfg.strategy == Strategy::Gdp && self.data_group().size() > 1
    }

    /// Batch `b`'s blocks (as sampled, before self-loops) from the window of batches sampled
    /// ahead, sampling the next window first when `b` is not in it (its seconds go to
    /// `times.sample`); `None` where this run samples each batch in its step.
    fn sampled_ahead(
        &mut self,
        batches: &[Vec<NodeId>],
        b: usize,
        times: &mut PhaseTimes,
    ) -> Result<Option<Vec<crate::sample::Block>>> {
        let routed = self.windows_routed();
        let Some(ahead) = self.ahead.as_mut() else {
            return Ok(None);
        };
        let data = &self.data;
        let topology = match (&data.sliced, self.cfg.strategy) {
            (Some(sliced), Strategy::Nfp) => &sliced.topology,
            _ => &data.part,
        };
        let graph = crate::sample::LocalGraph::new(topology, data.orig_ids.as_deref());
        // Only batches this run will step through: `max_steps` may end the epoch early.
        let mut end = batches.len();
        if let Some(max) = self.cfg.max_steps {
            end = end.min(b + max.saturating_sub(self.pos.step) as usize);
        }
        let (seed, epoch) = (self.cfg.seed, self.pos.epoch as u64);
        let seeds_of = |i: usize| -> Vec<NodeId> {
            batches[i]
                .iter()
                .copied()
                .filter(|&v| data.owns(v))
                .collect()
        };
        let key_of = |i: usize| BatchKey {
            seed,
            epoch,
            batch: i as u64,
        };
        let fanouts = &self.cfg.fanouts;
        let (blocks, seconds) = if routed {
            ahead.take_window(b, end, |window| {
                crate::exchange::sampling::distributed_window(
                    hybrid::data_group(self.world, self.cfg.strategy),
                    &graph,
                    &data.offsets,
                    fanouts,
                    window,
                    seeds_of,
                    key_of,
                )
            })?
        } else {
            ahead.take(b, end, &graph, fanouts, seeds_of, key_of)?
        };
        times.sample += seconds;
        Ok(Some(blocks))
    }

    /// Run the rest of the current epoch (or until `max_steps`).
    fn train_epoch(&mut self) -> Result<EpochOutcome> {
        // The epoch's batch order is one of its one-time costs (2 ms for R-MAT's 64 batches on
        // the 2-core VM): the first step's time holds it, as it holds the run's other
        // one-time costs, so that a short measurement does not spread it over its few steps.
        let started = Instant::now();
        let batches = self.batches();
        if let Some(workers) = self.prefetch_workers() {
            return self.train_epoch_prefetched(&batches, workers, started);
        }
        if let Some(ahead) = &mut self.ahead {
            ahead.clear();
        }
        let mut times = PhaseTimes::default();
        let mut totals = EpochTotals::new(started);
        let mut split_stats: Vec<split::SplitLayerStats> = Vec::new();
        let mut progress = crate::util::progress::Progress::new(
            &format!("epoch {}", self.pos.epoch),
            (batches.len() - self.pos.batch.min(batches.len())) as u64,
        );
        while self.pos.batch < batches.len() {
            if self.steps_exhausted() {
                progress.finish();
                return totals.outcome(self.world, &mut self.pos, times, false, split_stats);
            }
            let b = self.pos.batch;
            let batch = &batches[b];
            let key = BatchKey {
                seed: self.cfg.seed,
                epoch: self.pos.epoch as u64,
                batch: b as u64,
            };
            self.model.params.zero_grads();
            if self.cfg.full_batch {
                self.ensure_full_plan();
            }
            // Only GDP and NFP sample ahead (`sample_window`).
            let sampled = self.sampled_ahead(&batches, b, &mut times)?;

            let args = StepArgs {
                group: self.world,
                batch,
                fanouts: &self.cfg.fanouts,
                key,
                self_loops: self.cfg.uses_self_loops(),
                scale: 1.0 / batch.len() as f32,
            };
            let dump = self.dump.as_mut().map(|d| (d, self.pos.step));
            let (model, data) = (&mut self.model, &mut self.data);
            let out = match (self.cfg.full_batch, self.cfg.strategy) {
                // Full batch: every layer over owned vertices plus a halo, whatever the strategy.
                (true, _) => {
                    let full = self.full.as_ref().expect("built above");
                    strategy::full_batch_step(
                        model, data, self.world, full, key, args.scale, &mut times,
                    )?
                }
                (false, Strategy::Split | Strategy::Hybrid) => {
                    // Hybrid: this node's share of the batch, split over the node's ranks.
                    let (group, seeds) = hybrid::split_scope(self.world, self.cfg.strategy, batch);
                    let args = StepArgs {
                        group,
                        batch: &seeds,
                        ..args
                    };
                    let resident = self.resident.as_ref();
                    let (out, stats) =
                        split::split_step(model, data, resident, &args, &mut times, dump)?;
                    split::add_split_stats(&mut split_stats, &stats);
                    out
                }
                (false, Strategy::Dnp) => {
                    dnp::dnp_step(model, data, self.resident.as_ref(), &args, &mut times)?
                }
                (false, Strategy::Snp) => {
                    snp::snp_step(model, data, self.resident.as_ref(), &args, &mut times)?
                }
                (false, Strategy::Nfp) => {
                    let nfp = self.nfp.as_mut().expect("built in Trainer::on for nfp");
                    nfp.step(model, data, &args, sampled, &mut times)?
                }
                (false, Strategy::Gdp) => strategy::gdp_minibatch_step(
                    model,
                    data,
                    self.resident.as_ref(),
                    &args,
                    sampled,
                    &mut times,
                    dump,
                )?,
                (false, Strategy::Auto) => unreachable!("auto is resolved in Trainer::new"),
                (false, Strategy::Slicegcn) => {
                    bail!("strategy slicegcn runs its own trainer (`train::slicegcn`)")
                }
            };
            let skip = self.unsynced_ranges();
            finish_step(
                self.world,
                &mut self.model,
                &mut self.adam,
                &mut self.pos,
                out,
                batch.len(),
                &mut times,
                &mut totals,
                &skip,
            )?;
            progress.inc(1);
        }
        progress.finish();
        totals.outcome(self.world, &mut self.pos, times, true, split_stats)
    }

    /// Exact full-graph inference (no sampling, no dropout) over the partitioned graph:
    /// (train, val, test) metric. Collective.
    pub fn evaluate(&mut self) -> Result<(f64, f64, f64)> {
        self.ensure_full_plan();
        let full = self.full.as_ref().expect("built above");
        let group = self.data_group();
        let logits = match &mut self.nfp {
            Some(nfp) => nfp.infer(
                group,
                &self.model,
                &self.data,
                full,
                self.cfg.uses_self_loops(),
            )?,
            None => {
                let own = self.resident.as_ref().map(|r| &r.own);
                full.infer(group, &self.model, &self.data, own)
            }
        };
        let logits = self.model.params.backend().download_owned(logits);
        let first = self.data.part.first_node;
        let splits = self.data.splits();
        let eval = |ids: &[NodeId]| {
            let rows: Vec<usize> = ids.iter().map(|&v| (v as u64 - first) as usize).collect();
            metrics::distributed_metric(group, self.data.metric, &logits, &rows, &self.data.labels)
        };
        Ok((eval(&splits.train), eval(&splits.val), eval(&splits.test)))
    }

    /// Parameter ranges whose gradients stay on their rank (NFP's sliced input weights):
    /// left out of the gradient allreduce, and stale outside this rank's rows.
    fn unsynced_ranges(&self) -> Vec<Range<usize>> {
        self.nfp
            .as_ref()
            .map_or_else(Vec::new, |n| n.unsynced_ranges(&self.model))
    }
}

/// Running totals of an epoch's steps.
struct EpochTotals {
    /// Losses and counters summed over ranks (and those still on the device).
    losses: StepLosses,
    /// Steps finished; when the epoch began (its batch order included), and the first step
    /// once it has finished.
    steps: usize,
    started: Instant,
    first_step: Option<FirstStep>,
}

impl EpochTotals {
    fn new(started: Instant) -> EpochTotals {
        EpochTotals {
            losses: StepLosses::default(),
            steps: 0,
            started,
            first_step: None,
        }
    }

    /// Read the losses still on the device, then what the epoch's steps add up to. The time
    /// the read waits for the device is the optimizer's (the last work queued), and so is its
    /// collective's, which is also returned apart as `end_wait`: a rank that finished its
    /// steps early waits there for the slowest. That wait is once an epoch, not once a step:
    /// where ranks share cores (4 on the 2-core VM) the last of them to be scheduled again
    /// after the last step's allreduce came 1-5 ms late, and an 8-step measurement that kept
    /// the wait in its 7 steps put R-MAT's 1.4 ms step at 2.0. Collective.
    fn outcome(
        mut self,
        world: &World,
        pos: &mut Position,
        mut times: PhaseTimes,
        finished: bool,
        split: Vec<split::SplitLayerStats>,
    ) -> Result<EpochOutcome> {
        let t = Instant::now();
        let end_wait = self.losses.read(world, pos)?;
        times.optimizer += t.elapsed().as_secs_f64();
        Ok(EpochOutcome {
            loss: self.losses.mean(),
            times,
            counts: self.losses.counts,
            finished,
            split,
            first_step: self.first_step,
            end_wait,
        })
    }
}

/// The wall-clock seconds and phases of a run's first step, from the start of its epoch. It
/// pays one-time costs that the steps after it do not (the epoch's batch order is made, Open
/// MPI connects a pair of ranks on their first message, buffers are first touched, GEMM
/// workspaces first sized): on this 2-core machine about five steady steps' worth, so a short
/// measurement (`--max-steps 8`) that kept it would be a third slower than the epoch a
/// prediction is for.
#[derive(Clone, Debug, Default)]
pub struct FirstStep {
    pub seconds: f64,
    pub phases: PhaseTimes,
}

/// What every mini-batch step ends with, after its backward pass: sum the gradients over ranks,
/// take the optimizer step, add the step's loss and counters to the epoch's (summed over ranks
/// and checked a group of steps at a time: a non-finite loss ends the run naming its step) and
/// move the position on by one batch. Collective. (A free function, so that the prefetching
/// loop can call it while its prefetch thread reads the training data.)
#[allow(clippy::too_many_arguments)]
fn finish_step<B: Backend>(
    world: &World,
    model: &mut Model<B>,
    adam: &mut Adam<B>,
    pos: &mut Position,
    out: strategy::StepOutput,
    batch_len: usize,
    times: &mut PhaseTimes,
    totals: &mut EpochTotals,
    skip: &[Range<usize>],
) -> Result<()> {
    let t = Instant::now();
    if world.size() > 1 {
        allreduce_grads(world, &mut model.params, skip);
    }
    times.allreduce += t.elapsed().as_secs_f64();

    // The update is queued first; the loss and counters are summed over ranks and checked with
    // a group of steps' (`losses`: on a device, reading the loss waits for the device).
    let t = Instant::now();
    adam.step(&mut model.params.values, &model.params.grads);
    let counts = [out.nodes as f64, out.edges as f64, out.input_rows as f64];
    totals
        .losses
        .add(world, pos, out.loss_sum, counts, batch_len)?;
    times.optimizer += t.elapsed().as_secs_f64();
    totals.steps += 1;
    if totals.steps == 1 {
        totals.first_step = Some(FirstStep {
            seconds: totals.started.elapsed().as_secs_f64(),
            phases: times.clone(),
        });
    }
    #[cfg(debug_assertions)]
    check_identical_params(world, model, pos.step, skip)?;
    pos.step += 1;
    pos.batch += 1;
    Ok(())
}

/// Debug builds: every rank must hold bit-identical parameters after every step (the
/// allreduce makes the gradients identical, and Adam is elementwise).
#[cfg(debug_assertions)]
fn check_identical_params<B: Backend>(
    world: &World,
    model: &Model<B>,
    step: u64,
    skip: &[Range<usize>],
) -> Result<()> {
    let values = model.params.values_on_host();
    let hash = complement(skip, values.len())
        .into_iter()
        .flat_map(|r| values[r].iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
        });
    let all = world.allgather_u64(hash);
    if all.iter().any(|&h| h != all[0]) {
        bail!(
            "parameters differ across ranks after step {step} (hashes {all:x?}): a strategy \
             broke data-parallel consistency"
        );
    }
    Ok(())
}
