//! Every planned run reports its own error: the prediction for the strategy that ran against
//! the measured step time and phases, in the run summary.

use super::cost::Phases;
use super::Planned;
use crate::comm::World;
use crate::train::metrics::PhaseTimes;
use crate::train::FirstStep;
use serde::Serialize;

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
    /// The longest any rank waited at the epochs' ends for the slowest (left out of the
    /// steps and phases above).
    pub end_wait_seconds: f64,
}

/// One planner phase, predicted and measured, seconds per step.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PhaseError {
    pub predicted: f64,
    pub measured: f64,
    /// `(predicted − measured) / measured`; `None` when nothing was measured.
    pub relative_error: Option<f64>,
}

/// Each planner phase against the training phases that measure it: `build` ↔ `sample`,
/// `load` ↔ `gather`, `shuffle` ↔ `shuffle`, `train` ↔ `forward` + `backward`, `sync` ↔
/// `allreduce`, `optimizer` ↔ `optimizer`. With prefetch workers the measured `sample` and
/// `gather` are the workers' (overlapped with training), as the predicted ones are.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseErrors {
    pub build: PhaseError,
    pub load: PhaseError,
    pub shuffle: PhaseError,
    pub train: PhaseError,
    pub sync: PhaseError,
    pub optimizer: PhaseError,
}

impl PhaseErrors {
    fn new(p: &Phases, m: &PhaseTimes) -> PhaseErrors {
        let pair = |predicted: f64, measured: f64| PhaseError {
            predicted,
            measured,
            relative_error: (measured > 0.0).then(|| (predicted - measured) / measured),
        };
        PhaseErrors {
            build: pair(p.build, m.sample),
            load: pair(p.load, m.gather),
            shuffle: pair(p.shuffle, m.shuffle),
            train: pair(p.train, m.forward + m.backward),
            sync: pair(p.sync, m.allreduce),
            optimizer: pair(p.optimizer, m.optimizer),
        }
    }
}

/// Predicted against measured for the strategy that ran.
#[derive(Clone, Debug, Serialize)]
pub struct PredictionReport {
    /// The planner's entry the run is compared with (hybrid on one node is split's).
    pub strategy: String,
    pub calibration: String,
    /// A few of the calibration's products timed at the start of the run against the time
    /// the calibration holds for them (absent when the run measured its calibration): far from
    /// 1, the calibration did not describe the host the run had, nor its predictions the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration_products_now: Option<f64>,
    /// The same of a few of its feature gathers: the caches and memory, which a host's
    /// neighbours share, where the products are the cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration_gathers_now: Option<f64>,
    pub predicted: Predicted,
    pub measured: Measured,
    /// `(predicted − measured) / measured` of the step time.
    pub relative_error: f64,
    /// The same per phase.
    pub phases: PhaseErrors,
}

/// What a run's epochs add up to on this rank, for [`PredictionReport::new`].
#[derive(Clone, Copy, Debug)]
pub struct RunTotals<'a> {
    /// This rank's phase seconds.
    pub phases: &'a PhaseTimes,
    /// The epochs' wall-clock seconds without evaluation.
    pub train_seconds: f64,
    /// What this rank waited at the epochs' ends for the slowest rank (in `train_seconds` and
    /// in `phases`' optimizer phase).
    pub end_waits: f64,
    /// Steps run, of which `first` was the first.
    pub steps: u64,
    pub first: Option<&'a FirstStep>,
}

impl PredictionReport {
    /// Compare `planned`'s prediction for `entry` with the run's totals. The first step and
    /// the end waits are left out of the measured step and phases; the end waits are
    /// reported apart: they are once an epoch, and the slowest rank, which bounds the
    /// measured step, waited for no one. Collective (the slowest rank's phases); `None` when
    /// no step ran.
    pub fn new(
        world: &World,
        entry: &str,
        planned: &Planned,
        run: RunTotals,
    ) -> Option<PredictionReport> {
        let RunTotals {
            phases: total,
            train_seconds,
            end_waits,
            steps,
            first,
        } = run;
        let p = &planned.prediction.strategies[entry];
        let epoch_batches = planned.prediction.epoch_batches;
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
                t.shuffle,
                t.allreduce,
                t.optimizer,
            ]
        };
        let n = after.max(1) as f64;
        let mut steps_only = total.clone();
        steps_only.optimizer -= end_waits;
        let m: Vec<f64> = fields(&steps_only)
            .iter()
            .zip(fields(&skip.phases))
            .map(|(&v, w)| world.allreduce_max_f64(v - w) / n)
            .collect();
        let step = world.allreduce_max_f64(train_seconds - end_waits - skip.seconds) / n;
        let end_wait_seconds = world.allreduce_max_f64(end_waits);
        let first_seconds = world.allreduce_max_f64(first.seconds);
        let with_first = world.allreduce_max_f64(train_seconds - end_waits) / steps.max(1) as f64;
        if steps == 0 {
            return None;
        }
        let measured = PhaseTimes {
            sample: m[0],
            gather: m[1],
            prefetch_wait: m[2],
            forward: m[3],
            backward: m[4],
            shuffle: m[5],
            allreduce: m[6],
            optimizer: m[7],
            eval: 0.0,
            device_blocked: 0.0,
        };
        Some(PredictionReport {
            strategy: entry.to_string(),
            calibration: planned.calibration.display().to_string(),
            calibration_products_now: planned.products_now,
            calibration_gathers_now: planned.gathers_now,
            predicted: Predicted {
                phases: p.phases,
                step_seconds: p.step_seconds,
                epoch_seconds: p.epoch_seconds,
            },
            phases: PhaseErrors::new(&p.phases, &measured),
            measured: Measured {
                phases: measured,
                step_seconds: step,
                epoch_seconds: step * epoch_batches as f64,
                steps: after,
                steps_run: steps,
                first_step_seconds: first_seconds,
                step_seconds_with_first: with_first,
                end_wait_seconds,
            },
            relative_error: (p.step_seconds - step) / step,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_planner_phase_is_compared_with_the_training_phases_that_measure_it() {
        let p = Phases {
            build: 1.0,
            load: 2.0,
            shuffle: 3.0,
            train: 4.0,
            sync: 5.0,
            optimizer: 6.0,
        };
        let m = PhaseTimes {
            sample: 2.0,
            gather: 2.0,
            prefetch_wait: 9.0,
            forward: 1.0,
            backward: 3.0,
            shuffle: 0.0,
            allreduce: 10.0,
            optimizer: 3.0,
            eval: 9.0,
            device_blocked: 9.0,
        };
        let e = PhaseErrors::new(&p, &m);
        assert_eq!(e.build.relative_error, Some(-0.5));
        assert_eq!(e.load.relative_error, Some(0.0));
        // Nothing measured: no ratio.
        assert_eq!((e.shuffle.measured, e.shuffle.relative_error), (0.0, None));
        assert_eq!((e.train.measured, e.train.relative_error), (4.0, Some(0.0)));
        assert_eq!(e.sync.relative_error, Some(-0.5));
        assert_eq!(e.optimizer.relative_error, Some(1.0));
    }
}
