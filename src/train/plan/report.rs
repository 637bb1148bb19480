//! Every planned run reports its own error: the prediction for the strategy that ran against
//! the measured step time and phases, in the run summary.

use super::cost::{Phases, StrategyPrediction};
use crate::comm::World;
use crate::train::metrics::PhaseTimes;
use crate::train::FirstStep;
use serde::Serialize;
use std::path::Path;

/// The predicted side: seconds per phase and per step, and the epoch's.
#[derive(Clone, Debug, Serialize)]
pub struct Predicted {
    pub phases: Phases,
    pub step_seconds: f64,
    pub epoch_seconds: f64,
}

/// The measured side: each training phase's seconds per step (the slowest rank's), the
/// wall-clock seconds per step (evaluation excluded), and that times the epoch's mini-batches
/// (an extrapolation when `--max-steps` stopped inside an epoch). When more than one step ran,
/// these are of the steps after the run's first, whose one-time costs an epoch amortises
/// ([`crate::train::FirstStep`]); that step is reported apart.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    pub phases: PhaseTimes,
    pub step_seconds: f64,
    pub epoch_seconds: f64,
    /// Steps measured (the first left out when more than one ran) and run.
    pub steps: u64,
    pub steps_run: u64,
    /// The run's first step, wall-clock (the slowest rank's), and the mean over every step
    /// it included.
    pub first_step_seconds: f64,
    pub step_seconds_with_first: f64,
}

/// Predicted against measured for the strategy that ran.
#[derive(Clone, Debug, Serialize)]
pub struct PredictionReport {
    /// The planner's entry the run is compared with (hybrid on one node is split's).
    pub strategy: String,
    pub calibration: String,
    pub predicted: Predicted,
    pub measured: Measured,
    /// `(predicted − measured) / measured` of the step time.
    pub relative_error: f64,
}

impl PredictionReport {
    /// Compare `p` with the run's totals: `total` this rank's phase seconds, `train_seconds`
    /// the epochs' wall-clock seconds without evaluation, over `steps` steps, of which
    /// `first` was the first. Collective (the slowest rank's phases); `None` when no step ran.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        world: &World,
        entry: &str,
        p: &StrategyPrediction,
        calibration: &Path,
        epoch_batches: usize,
        total: &PhaseTimes,
        train_seconds: f64,
        steps: u64,
        first: Option<&FirstStep>,
    ) -> Option<PredictionReport> {
        let first = first.cloned().unwrap_or_default();
        // Leave the first step out when there are steps after it.
        let (skip, after) = if steps >= 2 {
            (&first, steps - 1)
        } else {
            (&FirstStep::default(), steps)
        };
        let fields = |t: &PhaseTimes| {
            [
                t.sample,
                t.gather,
                t.prefetch_wait,
                t.forward,
                t.backward,
                t.allreduce,
                t.optimizer,
            ]
        };
        let n = after.max(1) as f64;
        let m: Vec<f64> = fields(total)
            .iter()
            .zip(fields(&skip.phases))
            .map(|(&v, w)| world.allreduce_max_f64(v - w) / n)
            .collect();
        let step = world.allreduce_max_f64(train_seconds - skip.seconds) / n;
        let first_seconds = world.allreduce_max_f64(first.seconds);
        let with_first = world.allreduce_max_f64(train_seconds) / steps.max(1) as f64;
        if steps == 0 {
            return None;
        }
        Some(PredictionReport {
            strategy: entry.to_string(),
            calibration: calibration.display().to_string(),
            predicted: Predicted {
                phases: p.phases,
                step_seconds: p.step_seconds,
                epoch_seconds: p.epoch_seconds,
            },
            measured: Measured {
                phases: PhaseTimes {
                    sample: m[0],
                    gather: m[1],
                    prefetch_wait: m[2],
                    forward: m[3],
                    backward: m[4],
                    allreduce: m[5],
                    optimizer: m[6],
                    eval: 0.0,
                    device_blocked: 0.0,
                },
                step_seconds: step,
                epoch_seconds: step * epoch_batches as f64,
                steps: after,
                steps_run: steps,
                first_step_seconds: first_seconds,
                step_seconds_with_first: with_first,
            },
            relative_error: (p.step_seconds - step) / step,
        })
    }
}
