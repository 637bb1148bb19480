//! The SliceGCN training loop on one rank: one full-graph step per epoch, exact evaluation of
//! the whole model at every `eval_every` epochs (test at the best validation), per-epoch JSON,
//! checkpoints of every rank's parameters (resumed only at the same rank count), the summary.

use super::data;
use super::layout::{param_counts, SliceLayout};
use super::model::{SliceInput, SliceModel};
use crate::backend::Backend;
use crate::comm::World;
use crate::config::TrainConfig;
use crate::exchange::inference::HaloPlan;
use crate::nn::schedule::lr_at;
use crate::nn::Adam;
use crate::sample::BatchKey;
use crate::train::checkpoint::{self, Checkpoint, Position};
use crate::train::data::TrainData;
use crate::train::metrics::{CallClock, EpochRecord, MetricsWriter, PhaseTimes, RunCalls};
use crate::train::strategy::dropout_stream;
use crate::train::{RunEnd, RunFiles, RunSummary};
use anyhow::{bail, Result};
use std::time::Instant;

/// One rank's SliceGCN run.
pub struct SliceTrainer<'w, B: Backend> {
    cfg: TrainConfig,
    files: RunFiles,
    world: &'w World,
    data: TrainData,
    pub model: SliceModel<B>,
    adam_shared: Adam<B>,
    adam_gcn: Adam<B>,
    pos: Position,
    graph: B::Graph,
    transpose: B::Transpose,
    x: B::Mat,
    keys: Vec<u64>,
    /// Row indices of the training vertices (global ids: every rank holds every vertex).
    train_rows: Vec<usize>,
    train_labels: Vec<i64>,
}

impl<'w, B: Backend> SliceTrainer<'w, B> {
    /// Load this rank's slice of the data, build its model, restore a checkpoint when
    /// resuming. Collective (the resume reads every rank's parameter count).
    pub fn on(
        backend: B,
        cfg: TrainConfig,
        files: RunFiles,
        world: &'w World,
    ) -> Result<SliceTrainer<'w, B>> {
        cfg.validate()?;
        files.check_checkpoint(&cfg)?;
        files.check_reports(world)?;
        let (rank, ranks) = (world.rank(), world.size());
        let (d, generated) = data::feature_dim(files.data.as_deref(), cfg.seed)?;
        let layout = SliceLayout::new(
            rank,
            ranks,
            d,
            cfg.hidden,
            cfg.slice_size_scale,
            cfg.feature_fusion,
        )?;
        // Nothing of the data is divided among ranks: load and index it as one rank would.
        let solo = World::solo();
        let mut data = data::load(files.data.as_deref(), generated, &layout, &cfg, &solo)?;
        let self_loops = cfg.uses_self_loops();
        data.build_gcn_degrees(&solo, self_loops)?;
        let block = HaloPlan::new(&solo, &data.part, &data.offsets, self_loops).block;
        let graph = backend.graph(block);
        let x = backend.upload(data.store.own_rows().view());
        let n = data.part.local_nodes();
        let keys: Vec<u64> = (0..n as u64).collect();
        let train_rows: Vec<usize> = data.train_all.iter().map(|&v| v as usize).collect();
        let train_labels = train_rows.iter().map(|&r| data.labels[r]).collect();
        let host = SliceModel::new(layout.clone(), &cfg, data.num_classes, cfg.seed)?;
        let model = host.to_backend(backend.clone());
        let (own, shared) = model.num_params();
        let all = world.allgather_u64(own as u64);
        if rank == 0 {
            log::info!(
                "slicegcn: {ranks} rank(s), GCN width {} per rank, slice {:?} of {d} features \
                 ({}), encoding {}; parameters per rank: GCN {:?}, shared {shared} (plain-model \
                 formula {:?})",
                layout.width,
                layout.read_cols,
                if layout.fusion { "fused" } else { "direct" },
                if cfg.slice_encoding { "on" } else { "off" },
                all,
                param_counts(
                    &layout,
                    cfg.layers,
                    cfg.hidden,
                    data.num_classes,
                    cfg.slice_encoding
                )
            );
        }
        let adam_shared = Adam::on(backend.clone(), shared, cfg.lr, cfg.weight_decay);
        let adam_gcn = Adam::on(backend.clone(), own, cfg.lr, cfg.weight_decay);
        let mut t = SliceTrainer {
            cfg,
            files,
            world,
            data,
            model,
            adam_shared,
            adam_gcn,
            pos: Position::start(),
            graph,
            transpose: Default::default(),
            x,
            keys,
            train_rows,
            train_labels,
        };
        if t.files.resume {
            t.restore()?;
        }
        Ok(t)
    }

    fn input(&self) -> SliceInput<'_, B> {
        SliceInput {
            graph: &self.graph,
            transpose: &self.transpose,
            x: &self.x,
            keys: &self.keys,
            gcn_degrees: self.data.gcn_degrees.as_deref(),
        }
    }

    /// Exact evaluation: (train, val, test) metric; the same on every rank. Collective.
    pub fn evaluate(&self) -> (f64, f64, f64) {
        let n = self.keys.len();
        let all: Vec<usize> = (0..n).collect();
        let logits = self.model.logits(self.world, &self.input(), &all);
        let splits = self.data.splits();
        let eval = |ids: &[crate::graph::NodeId]| {
            let rows: Vec<usize> = ids.iter().map(|&v| v as usize).collect();
            self.data.metric.eval(&logits, &rows, &self.data.labels)
        };
        (eval(&splits.train), eval(&splits.val), eval(&splits.test))
    }

    /// One optimizer step on the whole graph; returns the mean training loss. Collective.
    pub fn step(&mut self, times: &mut PhaseTimes) -> Result<f64> {
        let key = BatchKey {
            seed: self.cfg.seed,
            epoch: self.pos.epoch as u64,
            batch: 0,
        };
        let input = SliceInput {
            graph: &self.graph,
            transpose: &self.transpose,
            x: &self.x,
            keys: &self.keys,
            gcn_degrees: self.data.gcn_degrees.as_deref(),
        };
        let loss_sum = self.model.train_step_timed(
            self.world,
            &input,
            &self.train_rows,
            &self.train_labels,
            dropout_stream(key),
            times,
        );
        let loss = loss_sum / self.train_rows.len() as f64;
        if !loss.is_finite() {
            // Named as the other engine names it: the epoch, the optimizer step (steps taken
            // before this one) and the batch, here always 0: the epoch's one full batch.
            bail!(
                "loss is {loss} at epoch {} step {} (batch 0, the full batch; slicegcn); lower \
                 `lr` or check the features for extreme values",
                self.pos.epoch,
                self.pos.step
            );
        }
        let t = Instant::now();
        let m = &mut self.model;
        self.adam_shared.step(&mut m.shared.values, &m.shared.grads);
        self.adam_gcn
            .step(&mut m.gcn.params.values, &m.gcn.params.grads);
        times.optimizer += t.elapsed().as_secs_f64();
        self.pos.step += 1;
        Ok(loss)
    }

    /// Train until `epochs` (or `max_steps`) and return the summary. Collective.
    pub fn run(&mut self) -> Result<RunSummary> {
        let started = Instant::now();
        let first_step = self.pos.step;
        crate::train::checkpoint::warn_if_nothing_to_train(
            self.world,
            &self.cfg,
            &self.pos,
            self.files.resume,
        );
        let rank0 = self.world.rank() == 0;
        let mut writer = MetricsWriter::open(
            if rank0 {
                self.files.metrics.as_deref()
            } else {
                None
            },
            self.files.resume,
        )?;
        let (mut epoch_times, mut total, mut final_loss) =
            (Vec::new(), PhaseTimes::default(), f64::NAN);
        let mut run_calls = RunCalls::default();
        let exhausted =
            |pos: &Position, cfg: &TrainConfig| cfg.max_steps.is_some_and(|m| pos.step >= m);
        while self.pos.epoch < self.cfg.epochs && !exhausted(&self.pos, &self.cfg) {
            let epoch = self.pos.epoch;
            let lr = lr_at(self.cfg.lr_schedule, self.cfg.lr, epoch, self.cfg.epochs);
            self.adam_shared.lr = lr;
            self.adam_gcn.lr = lr;
            let t_epoch = Instant::now();
            let comm_before = self.world.stats().snapshot();
            let mut times = PhaseTimes::default();
            let blocked_before = self.model.gcn.params.backend().blocked_seconds();
            let calls = CallClock::start(self.model.gcn.params.backend());
            let loss = self.step(&mut times)?;
            let epoch_calls = calls.stop(self.model.gcn.params.backend());
            // Full graph: the epoch is one step.
            run_calls.add(epoch_calls.as_ref(), 1);
            if let (Some(after), Some(before)) = (
                self.model.gcn.params.backend().blocked_seconds(),
                blocked_before,
            ) {
                times.device_blocked = after - before;
            }
            final_loss = loss;
            let epoch_seconds = t_epoch.elapsed().as_secs_f64();
            epoch_times.push(epoch_seconds);
            // Full graph: one step is the whole epoch, so no epoch is ever partial.
            self.pos.next_epoch();
            let last = self.pos.epoch == self.cfg.epochs || exhausted(&self.pos, &self.cfg);
            let due = self.cfg.eval_every > 0 && self.pos.epoch.is_multiple_of(self.cfg.eval_every);
            let (train_m, val, test) = if due || last {
                let t = Instant::now();
                let r = self.evaluate();
                times.eval = t.elapsed().as_secs_f64();
                self.pos.record_eval(epoch, r)
            } else {
                (None, None, None)
            };
            total.add(&times);
            // Per-rank seconds and bytes by operation, as the other strategies report them
            // (no feature store here: every rank reads its own columns of every row).
            let ranks = crate::train::report::gather(
                self.world,
                &crate::train::report::RankReport {
                    rank: self.world.rank(),
                    seconds: times.clone(),
                    comm: self.world.stats().since(&comm_before),
                    store: Default::default(),
                    cache_hit_rate: None,
                    split: Default::default(),
                },
            );
            if rank0 {
                log::info!(
                    "epoch {epoch}: loss {loss:.4} (lr {lr:.3e}){} in {epoch_seconds:.3} s",
                    match (val, test) {
                        (Some(v), Some(t)) => format!(", val {v:.4}, test {t:.4}"),
                        _ => String::new(),
                    }
                );
            }
            let g = &self.data.part.graph;
            writer.write(&EpochRecord {
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
                nodes: (g.num_rows() * self.cfg.layers * self.world.size()) as u64,
                edges: (g.indices.len() * self.cfg.layers * self.world.size()) as u64,
                input_rows: g.num_rows() as u64,
                split: None,
                ranks,
                partial: false,
                device_calls: epoch_calls,
            })?;
            let ck_due = self.cfg.checkpoint_every > 0
                && self.pos.epoch.is_multiple_of(self.cfg.checkpoint_every);
            if ck_due && !last {
                self.save_checkpoint()?;
            }
        }
        if self.files.checkpoint.is_some() && self.pos.step > first_step {
            self.save_checkpoint()?;
        }
        let mut summary = RunSummary::assemble(
            &self.cfg,
            &self.data,
            self.world,
            self.model.shared.backend(),
            &self.pos,
            RunEnd {
                started,
                epoch_times: &epoch_times,
                final_loss,
                seconds: total,
                params: {
                    let (own, shared) = self.model.num_params();
                    own + shared
                },
                device_calls: run_calls.summary(),
            },
        );
        summary.prediction_skipped =
            Some("slicegcn trains another model than the strategies the planner prices".into());
        summary.write(self.world, self.files.summary.as_deref())?;
        Ok(summary)
    }

    /// Every rank's GCN parameters and moments go to rank 0, which writes one file: the
    /// shared parts, then rank 0's GCN, rank 1's, …, and the rank count. Collective.
    fn save_checkpoint(&self) -> Result<()> {
        let Some(path) = &self.files.checkpoint else {
            return Ok(());
        };
        let (gm, gv, t) = self.adam_gcn.state();
        let mine = self.model.gcn.params.values_on_host();
        let (all_values, counts) = self.world.allgatherv("checkpoint", &mine);
        let (all_m, _) = self.world.allgatherv("checkpoint", &gm);
        let (all_v, _) = self.world.allgatherv("checkpoint", &gv);
        if self.world.rank() != 0 {
            return Ok(());
        }
        let (sm, sv, _) = self.adam_shared.state();
        let cat = |a: Vec<f32>, b: Vec<f32>| a.into_iter().chain(b).collect::<Vec<f32>>();
        let mut entries = self.model.shared.entries.clone();
        let mut offset = self.model.shared.len();
        for (r, &c) in counts.iter().enumerate() {
            entries.push(crate::nn::ParamEntry {
                name: format!("rank{r}.gcn"),
                offset,
                shape: vec![c],
            });
            offset += c;
        }
        checkpoint::save(
            path,
            &Checkpoint {
                config_hash: self.cfg.model_hash(),
                model_settings: self.cfg.model_settings(),
                run_config: serde_json::to_string(&self.cfg)?,
                position: self.pos.clone(),
                params: cat(self.model.shared.values_on_host(), all_values),
                adam_m: cat(sm, all_m),
                adam_v: cat(sv, all_v),
                adam_t: t,
                slice_ranks: Some(self.world.size() as u64),
                data_id: checkpoint::data_id_of(&self.files),
            },
            &entries,
        )?;
        log::info!("checkpoint written to `{}`", path.display());
        Ok(())
    }

    /// Take the shared parts and this rank's GCN from a checkpoint written by as many ranks.
    /// Collective.
    fn restore(&mut self) -> Result<()> {
        let path = self.files.checkpoint.clone().expect("checked in on");
        let ck = checkpoint::read(&path, &self.cfg, checkpoint::data_id_of(&self.files))?;
        let ranks = self.world.size();
        match ck.slice_ranks {
            Some(p) if p as usize == ranks => {}
            Some(p) => bail!(
                "checkpoint `{}` holds SliceGCN parameters of {p} ranks (one GCN per rank); \
                 this run has {ranks} ranks: resume with {p} ranks, or start without --resume",
                path.display()
            ),
            None => bail!(
                "checkpoint `{}` holds no per-rank SliceGCN parameters (written by another \
                 strategy); start without --resume",
                path.display()
            ),
        }
        let counts: Vec<usize> = self
            .world
            .allgather_u64(self.model.gcn.params.len() as u64)
            .into_iter()
            .map(|c| c as usize)
            .collect();
        let shared = self.model.shared.len();
        let total = shared + counts.iter().sum::<usize>();
        if ck.params.len() != total {
            bail!(
                "checkpoint `{}`: `params` has {} values, this SliceGCN of {ranks} ranks has {total}",
                path.display(),
                ck.params.len()
            );
        }
        let start = shared + counts[..self.world.rank()].iter().sum::<usize>();
        let mine = start..start + counts[self.world.rank()];
        self.model.shared.set_values(&ck.params[..shared]);
        self.model.gcn.params.set_values(&ck.params[mine.clone()]);
        self.adam_shared
            .set_state(&ck.adam_m[..shared], &ck.adam_v[..shared], ck.adam_t)?;
        self.adam_gcn
            .set_state(&ck.adam_m[mine.clone()], &ck.adam_v[mine], ck.adam_t)?;
        self.pos = ck.position;
        log::info!(
            "resumed from `{}` at epoch {} (step {})",
            path.display(),
            self.pos.epoch,
            self.pos.step
        );
        Ok(())
    }
}
