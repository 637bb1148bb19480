//! Evaluation metrics (accuracy, ROC-AUC) and the per-epoch JSON records.

use crate::backend::DeviceCalls;
use ndarray::Array2;
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Which metric a task is judged by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// Fraction of correctly classified nodes (multi-class tasks).
    Accuracy,
    /// Area under the ROC curve of the positive class (binary tasks, as in the
    /// heterophilous benchmark).
    RocAuc,
}

impl MetricKind {
    /// ROC-AUC for two classes, accuracy otherwise.
    pub fn for_classes(classes: usize) -> MetricKind {
        if classes == 2 {
            MetricKind::RocAuc
        } else {
            MetricKind::Accuracy
        }
    }

    /// Evaluate `logits` (rows = `rows` of the dataset) against `labels`.
    pub fn eval(self, logits: &Array2<f32>, rows: &[usize], labels: &[i64]) -> f64 {
        match self {
            MetricKind::Accuracy => accuracy(logits, rows, labels),
            MetricKind::RocAuc => {
                let scores: Vec<f64> = rows
                    .iter()
                    .map(|&r| (logits[[r, 1]] - logits[[r, 0]]) as f64)
                    .collect();
                let y: Vec<bool> = rows.iter().map(|&r| labels[r] == 1).collect();
                roc_auc(&scores, &y)
            }
        }
    }
}

/// Fraction of `rows` whose arg-max logit equals the label.
pub fn accuracy(logits: &Array2<f32>, rows: &[usize], labels: &[i64]) -> f64 {
    if rows.is_empty() {
        return f64::NAN;
    }
    correct_count(logits, rows, labels) as f64 / rows.len() as f64
}

/// How many of `rows` have their arg-max logit at the label.
fn correct_count(logits: &Array2<f32>, rows: &[usize], labels: &[i64]) -> usize {
    rows.iter()
        .filter(|&&r| {
            let row = logits.row(r);
            let mut best = 0;
            for (c, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = c;
                }
            }
            best as i64 == labels[r]
        })
        .count()
}

/// ROC-AUC by the rank-sum (Mann–Whitney) formula; tied scores get their average rank.
/// NaN when only one class is present.
pub fn roc_auc(scores: &[f64], positive: &[bool]) -> f64 {
    let n = scores.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut rank_sum_pos = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            if positive[k] {
                rank_sum_pos += avg_rank;
            }
        }
        i = j + 1;
    }
    let n_pos = positive.iter().filter(|&&p| p).count() as f64;
    let n_neg = n as f64 - n_pos;
    if n_pos == 0.0 || n_neg == 0.0 {
        return f64::NAN;
    }
    (rank_sum_pos - n_pos * (n_pos + 1.0) / 2.0) / (n_pos * n_neg)
}

/// Seconds spent in each phase of training.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseTimes {
    /// Sampling and input-row gathers, as long as they took; with `--prefetch on` they ran on
    /// the prefetch thread, overlapped with training, and `prefetch_wait` is what the loop
    /// waited for them.
    pub sample: f64,
    pub gather: f64,
    /// Seconds the training loop waited for the prefetch thread's next batch.
    pub prefetch_wait: f64,
    /// The forward and backward passes, without the shuffles inside them.
    pub forward: f64,
    pub backward: f64,
    /// Exchanges of hidden rows between ranks inside the forward and backward passes, both
    /// directions: split's layer rows and their gradients, DNP's and SNP's input-layer rows
    /// (and SNP's partial sums), NFP's partials and their gradients, full-batch halo rows.
    /// What the planner calls `shuffle`; 0 where a strategy exchanges none (GDP).
    pub shuffle: f64,
    pub allreduce: f64,
    /// The optimizer steps; on a device backend also the waits while a group of steps'
    /// losses is read (`train::losses`: the device finishing the work queued before).
    pub optimizer: f64,
    pub eval: f64,
    /// On a device backend: of the training phases above (not `eval`), the seconds the host
    /// was blocked waiting for the device (a download, a staging copy, a synchronize). Near
    /// the phases' sum, the device bounds the step; near 0, the host keeps the device waiting.
    /// 0 on the CPU and on the emulator.
    pub device_blocked: f64,
}

impl PhaseTimes {
    /// Add another set of times.
    pub fn add(&mut self, o: &PhaseTimes) {
        self.sample += o.sample;
        self.gather += o.gather;
        self.prefetch_wait += o.prefetch_wait;
        self.forward += o.forward;
        self.backward += o.backward;
        self.shuffle += o.shuffle;
        self.allreduce += o.allreduce;
        self.optimizer += o.optimizer;
        self.eval += o.eval;
        self.device_blocked += o.device_blocked;
    }

    /// Run `f`, an exchange of hidden rows between ranks, and count its time as `shuffle`.
    pub fn time_shuffle<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let out = f();
        self.shuffle += t.elapsed().as_secs_f64();
        out
    }
}

/// The clock of a forward or backward pass that leaves out the shuffles timed inside it
/// ([`PhaseTimes::time_shuffle`]), so that the phases partition a step instead of counting an
/// exchange twice.
pub struct PassClock {
    started: Instant,
    shuffle_before: f64,
}

impl PassClock {
    pub fn start(times: &PhaseTimes) -> PassClock {
        PassClock {
            started: Instant::now(),
            shuffle_before: times.shuffle,
        }
    }

    /// Seconds since the start, less the shuffles `times` counted meanwhile.
    pub fn seconds(&self, times: &PhaseTimes) -> f64 {
        let shuffled = times.shuffle - self.shuffle_before;
        (self.started.elapsed().as_secs_f64() - shuffled).max(0.0)
    }
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize)]
pub struct EpochRecord {
    pub epoch: usize,
    /// The strategy that ran (what `auto` resolved to).
    pub strategy: crate::kinds::Strategy,
    pub steps: u64,
    pub loss: f64,
    pub metric: MetricKind,
    pub train: Option<f64>,
    pub val: Option<f64>,
    pub test: Option<f64>,
    pub epoch_seconds: f64,
    pub seconds: PhaseTimes,
    /// Destination rows computed and edges aggregated, summed over layers and ranks.
    pub nodes: u64,
    pub edges: u64,
    pub input_rows: u64,
    /// Split strategy: per layer (input first), edges per rank (max, mean, imbalance = max /
    /// mean) and the % of edges whose source lives on another rank (GSplit's figure 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<serde_json::Value>,
    /// Per-rank phase seconds, bytes moved per operation and cache counters, with their
    /// max and mean over ranks (rank 0's record only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<serde_json::Value>,
    /// The epoch stopped before its end (`--max-steps`); a resumed run writes the epoch again
    /// when it ends, its loss over all of the epoch's batches.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// On a device backend, this rank's calls into the device during the epoch's training
    /// steps (not its evaluation): launches, copies, waits ([`DeviceCalls`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_calls: Option<DeviceCalls>,
}

/// The calls a backend made into its device between [`CallClock::start`] and
/// [`CallClock::stop`]; `None` throughout on the host.
pub struct CallClock(Option<DeviceCalls>);

impl CallClock {
    pub fn start<B: crate::backend::Backend>(be: &B) -> CallClock {
        CallClock(be.device_calls())
    }

    pub fn stop<B: crate::backend::Backend>(&self, be: &B) -> Option<DeviceCalls> {
        Some(be.device_calls()?.since(self.0.as_ref()?))
    }
}

/// Calls into the device over a run's training steps, and per step (the run's summary).
#[derive(Clone, Debug, Serialize)]
pub struct StepCalls {
    /// Training steps of this run (this invocation's, after a resume).
    pub steps: u64,
    pub total: DeviceCalls,
    /// `total / steps`, by kind.
    pub per_step: std::collections::BTreeMap<&'static str, f64>,
}

/// A run's calls into the device, added epoch by epoch (nothing on the host).
#[derive(Debug, Default)]
pub struct RunCalls(Option<(DeviceCalls, u64)>);

impl RunCalls {
    /// Add an epoch's calls (`None` on the host) over its `steps` training steps.
    pub fn add(&mut self, epoch: Option<&DeviceCalls>, steps: u64) {
        if let Some(calls) = epoch {
            let (total, run_steps) = self.0.get_or_insert_default();
            total.add(calls);
            *run_steps += steps;
        }
    }

    /// The run's total and per step, for its summary.
    pub fn summary(self) -> Option<StepCalls> {
        self.0.map(|(total, steps)| StepCalls {
            steps,
            per_step: total.per_step(steps),
            total,
        })
    }
}

/// Appends JSON lines to a metrics file (created fresh, or appended to on resume). The file is
/// opened at the first record, not before: a run that fails before its first epoch ends (a
/// rank's error, a NaN loss, an interrupt) leaves an earlier run's metrics where they were.
pub struct MetricsWriter {
    path: Option<std::path::PathBuf>,
    append: bool,
    file: Option<std::fs::File>,
}

impl MetricsWriter {
    /// Write to `path` (None: write nothing). `append` keeps earlier lines (resume). The
    /// directory is checked now, so that a path that cannot be written fails before training.
    pub fn open(path: Option<&Path>, append: bool) -> anyhow::Result<MetricsWriter> {
        if let Some(p) = path {
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                anyhow::bail!(
                    "cannot open metrics file `{}`: directory `{}` does not exist",
                    p.display(),
                    dir.display()
                );
            }
            if p.is_dir() {
                anyhow::bail!(
                    "cannot open metrics file `{}`: it is a directory",
                    p.display()
                );
            }
        }
        Ok(MetricsWriter {
            path: path.map(Path::to_path_buf),
            append,
            file: None,
        })
    }

    /// Write one record as a JSON line.
    pub fn write<T: Serialize>(&mut self, record: &T) -> anyhow::Result<()> {
        use anyhow::Context;
        let Some(path) = &self.path else {
            return Ok(());
        };
        if self.file.is_none() {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(self.append)
                .truncate(!self.append)
                .open(path)
                .with_context(|| format!("cannot open metrics file `{}`", path.display()))?;
            self.file = Some(file);
        }
        let f = self.file.as_mut().expect("opened above");
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        // One write per line: a reader tailing the file never sees half a record.
        f.write_all(&line)
            .and_then(|()| f.flush())
            .with_context(|| format!("cannot write metrics file `{}`", path.display()))
    }
}

/// The metric of `rows` (local rows of `logits`, labels indexed the same way) over all ranks:
/// accuracy from summed counts, ROC-AUC from the gathered scores. Collective.
pub fn distributed_metric(
    group: &crate::comm::Group,
    kind: MetricKind,
    logits: &Array2<f32>,
    rows: &[usize],
    labels: &[i64],
) -> f64 {
    match kind {
        MetricKind::Accuracy => {
            // Counts, not fractions: `(c/n)·n` is not always `c` in floating point, and the
            // metric must be the one rank's whatever the split.
            let correct = correct_count(logits, rows, labels) as f64;
            let mut sums = [correct, rows.len() as f64];
            group.allreduce_sum_f64(&mut sums);
            if sums[1] == 0.0 {
                f64::NAN
            } else {
                sums[0] / sums[1]
            }
        }
        MetricKind::RocAuc => {
            let scores: Vec<f64> = rows
                .iter()
                .map(|&r| (logits[[r, 1]] - logits[[r, 0]]) as f64)
                .collect();
            let y: Vec<i64> = rows.iter().map(|&r| labels[r]).collect();
            let (all_scores, _) = group.allgatherv("eval_scores", &scores);
            let (all_y, _) = group.allgatherv("eval_labels", &y);
            let positive: Vec<bool> = all_y.iter().map(|&l| l == 1).collect();
            roc_auc(&all_scores, &positive)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_clock_leaves_out_the_shuffles_inside_the_pass() {
        let mut times = PhaseTimes::default();
        let clock = PassClock::start(&times);
        let out = times.time_shuffle(|| 7);
        assert_eq!(out, 7);
        assert!(times.shuffle >= 0.0);
        // A shuffle inside the pass longer than the pass so far leaves it nothing.
        times.shuffle += 1000.0;
        assert_eq!(clock.seconds(&times), 0.0);
        // One counted before a pass started is not that pass's: all its time is its own.
        let later = PassClock::start(&times);
        let own = later.seconds(&times);
        assert!(own >= 0.0 && own <= later.started.elapsed().as_secs_f64());
        let mut sum = PhaseTimes::default();
        sum.add(&times);
        sum.add(&times);
        assert_eq!(sum.shuffle, 2.0 * times.shuffle);
    }

    #[test]
    fn a_metrics_file_is_replaced_only_when_the_first_record_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, "{\"epoch\":0}\n").unwrap();
        let mut writer = MetricsWriter::open(Some(&path), false).unwrap();
        // Opened but nothing written yet (a run that fails in its first epoch): kept.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"epoch\":0}\n");
        writer.write(&serde_json::json!({"epoch": 5})).unwrap();
        writer.write(&serde_json::json!({"epoch": 6})).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"epoch\":5}\n{\"epoch\":6}\n"
        );
        // Resume appends.
        let mut resumed = MetricsWriter::open(Some(&path), true).unwrap();
        resumed.write(&serde_json::json!({"epoch": 7})).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
        // A directory that does not exist, or a directory as the file, fails up front.
        let e = MetricsWriter::open(Some(&dir.path().join("no/m.jsonl")), false);
        assert!(e.err().unwrap().to_string().contains("does not exist"));
        let e = MetricsWriter::open(Some(dir.path()), false);
        assert!(e.err().unwrap().to_string().contains("is a directory"));
        assert!(MetricsWriter::open(None, false).unwrap().write(&1).is_ok());
    }

    #[test]
    fn auc_of_perfect_random_and_reversed_scores() {
        let y = [false, false, true, true];
        assert_eq!(roc_auc(&[0.1, 0.2, 0.8, 0.9], &y), 1.0);
        assert_eq!(roc_auc(&[0.9, 0.8, 0.2, 0.1], &y), 0.0);
        assert_eq!(roc_auc(&[0.5, 0.5, 0.5, 0.5], &y), 0.5);
        // One inversion out of four pairs.
        assert_eq!(roc_auc(&[0.1, 0.85, 0.8, 0.9], &y), 0.75);
    }

    #[test]
    fn accuracy_counts_argmax() {
        let logits = ndarray::arr2(&[[0.0, 1.0], [2.0, 1.0], [0.0, 3.0]]);
        assert!((accuracy(&logits, &[0, 1, 2], &[1, 0, 0]) - 2.0 / 3.0).abs() < 1e-12);
    }
}
