//! The summary of a run ([`RunSummary`]): what it trained, how long each phase took, its
//! memory and transfers, and the planner's prediction beside the measurement. Printed as the
//! run's last JSON line and written with `--summary`.

use super::checkpoint::Position;
use super::data::TrainData;
use super::metrics::{self, PhaseTimes};
use super::{memory, plan};
use crate::backend::Backend;
use crate::comm::World;
use crate::config::TrainConfig;
use crate::kinds::{ModelKind, Strategy};
use anyhow::{Context, Result};
use serde::Serialize;
use std::time::Instant;

/// The summary of a run (also printed as the last JSON line).
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub dataset: String,
    pub model: ModelKind,
    pub strategy: Strategy,
    pub ranks: usize,
    pub threads: usize,
    pub metric: metrics::MetricKind,
    /// What this rank computed on (rank 0's, in the printed summary).
    pub device: String,
    /// The pages large per-step host buffers got (`util::huge_pages::describe`): epoch times
    /// of full-batch runs differ by up to a fifth between huge and 4 KiB pages.
    pub host_memory: String,
    pub epochs_run: usize,
    pub steps: u64,
    pub best_epoch: Option<usize>,
    pub val: f64,
    pub test: f64,
    pub final_loss: f64,
    pub epoch_time_mean: f64,
    pub epoch_time_median: f64,
    pub total_seconds: f64,
    pub peak_rss_mb: f64,
    /// Batches rank 0 sampled at once ahead of their steps (`--sample-ahead`, as resolved:
    /// the default, the ranks' agreement under GDP); 1 where each batch was sampled in its
    /// step or by prefetch workers.
    pub sample_window: usize,
    /// Peak memory of every rank, host and device, and the largest of each.
    pub memory: memory::MemoryReport,
    /// The most device memory this rank had in use at once (MiB), on a device backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_mb: Option<f64>,
    /// MiB this rank copied to and from its device over the run, on a device backend:
    /// `{"to_device": …, "to_host": …}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_transfer_mb: Option<DeviceTransfers>,
    /// On a device backend, this rank's calls into the device over the run's training steps
    /// and per step: what a step costs the host besides its kernels (each launch and copy is
    /// driver time on the host; each download or synchronize waits for the device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_calls: Option<metrics::StepCalls>,
    pub seconds: PhaseTimes,
    /// The planner's prediction for the strategy that ran against what was measured; absent
    /// when no calibration was at hand (fixed strategies do not measure one) or the run is not
    /// planned (full batch, MLP, several nodes).
    pub prediction: Option<plan::report::PredictionReport>,
    /// Why there is no prediction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction_skipped: Option<String>,
}

/// Bytes copied between the host and the device, in MiB.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct DeviceTransfers {
    pub to_device: f64,
    pub to_host: f64,
}

/// How a run's loop ended, whichever trainer ran it: what its summary is made of besides the
/// configuration, the data, the backend and the position.
pub(crate) struct RunEnd<'a> {
    pub started: Instant,
    pub epoch_times: &'a [f64],
    pub final_loss: f64,
    pub seconds: PhaseTimes,
    /// The model parameters this rank holds.
    pub params: usize,
    /// Calls into the device over the training steps (None on the host).
    pub device_calls: Option<metrics::StepCalls>,
}

impl RunSummary {
    /// The summary of a run of `cfg` on `data` on backend `be`, at `pos`. The prediction fields
    /// are empty (the trainer that planned fills them). Collective over `world` (the memory
    /// report is gathered).
    pub(crate) fn assemble<B: Backend>(
        cfg: &TrainConfig,
        data: &TrainData,
        world: &World,
        be: &B,
        pos: &Position,
        end: RunEnd,
    ) -> RunSummary {
        let mut sorted = end.epoch_times.to_vec();
        sorted.sort_by(f64::total_cmp);
        const MIB: f64 = 1048576.0;
        RunSummary {
            dataset: data.part.name.clone(),
            model: cfg.model,
            strategy: cfg.strategy,
            ranks: world.size(),
            threads: rayon::current_num_threads(),
            metric: data.metric,
            device: be.describe(),
            host_memory: crate::util::huge_pages::describe(),
            epochs_run: end.epoch_times.len(),
            steps: pos.step,
            best_epoch: pos.best_epoch,
            val: pos.best_val,
            test: pos.best_test,
            final_loss: end.final_loss,
            // No epoch ran (a resume already at its end): no time, `null` in the JSON.
            epoch_time_mean: match end.epoch_times.len() {
                0 => f64::NAN,
                n => end.epoch_times.iter().sum::<f64>() / n as f64,
            },
            epoch_time_median: sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN),
            total_seconds: end.started.elapsed().as_secs_f64(),
            peak_rss_mb: crate::util::rss::peak_rss_mb().unwrap_or(f64::NAN),
            sample_window: 1,
            memory: memory::gather(world, be, end.params),
            peak_device_mb: be.peak_memory().map(|b| b as f64 / MIB),
            device_transfer_mb: be.transfers().map(|(up, down)| DeviceTransfers {
                to_device: up as f64 / MIB,
                to_host: down as f64 / MIB,
            }),
            device_calls: end.device_calls,
            seconds: end.seconds,
            prediction: None,
            prediction_skipped: None,
        }
    }

    /// Write the summary to `path` (atomically) on rank 0 of `world`.
    pub(crate) fn write(&self, world: &World, path: Option<&std::path::Path>) -> Result<()> {
        if let (Some(p), 0) = (path, world.rank()) {
            let out = crate::util::atomic::AtomicOutput::new(p)?;
            std::fs::write(out.tmp_path(), serde_json::to_string_pretty(self)?)
                .with_context(|| format!("cannot write summary `{}`", p.display()))?;
            out.commit()?;
        }
        Ok(())
    }
}
