//! Checkpoints in HDF5: the flat parameter buffer (`params`) with its name/offset/shape table,
//! the Adam moments, and where the run stands (epoch, batch, step, best validation), plus a
//! hash of the model-defining configuration and those settings by name (`model_settings`, so a
//! refused resume says which differ) and the whole resolved configuration (`run_config`, for the
//! record). Because sampling, batching and dropout are pure
//! functions of (seed, epoch, batch), that position is all the "RNG state" there is, and a
//! resumed run reproduces the uninterrupted one bit for bit.

use super::agreement::DataIdentity;
use crate::config::{differing_settings, TrainConfig};
use crate::nn::ParamEntry;
use crate::util::{atomic::AtomicOutput, h5};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Checkpoint file format version.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Where a run stands, and the best evaluation so far.
#[derive(Clone, Debug, PartialEq)]
pub struct Position {
    /// Epoch to run next (or to continue).
    pub epoch: usize,
    /// Next mini-batch within `epoch`.
    pub batch: usize,
    /// Optimizer steps taken.
    pub step: u64,
    pub best_epoch: Option<usize>,
    pub best_val: f64,
    pub best_test: f64,
    /// Loss summed over the seeds of `epoch` trained so far, and their count: a run resumed
    /// mid-epoch reports the whole epoch's loss, as the uninterrupted run does (the sum goes
    /// on in the same order, so bit for bit).
    pub epoch_loss_sum: f64,
    pub epoch_loss_seeds: u64,
}

impl Position {
    /// The start of a run: epoch 0, nothing trained or evaluated.
    pub fn start() -> Position {
        Position {
            epoch: 0,
            batch: 0,
            step: 0,
            best_epoch: None,
            best_val: f64::NEG_INFINITY,
            best_test: f64::NAN,
            epoch_loss_sum: 0.0,
            epoch_loss_seeds: 0,
        }
    }

    /// The mean loss over the seeds of the current epoch trained so far.
    pub fn epoch_loss(&self) -> f64 {
        self.epoch_loss_sum / self.epoch_loss_seeds.max(1) as f64
    }

    /// Move on to the next epoch's first batch.
    pub fn next_epoch(&mut self) {
        self.epoch += 1;
        self.batch = 0;
        self.epoch_loss_sum = 0.0;
        self.epoch_loss_seeds = 0;
    }

    /// Record the (train, val, test) metrics of `epoch`'s evaluation: the best validation so
    /// far (the first evaluation counts) keeps its epoch and test score. Returns them for the
    /// epoch's record.
    pub fn record_eval(
        &mut self,
        epoch: usize,
        (train, val, test): (f64, f64, f64),
    ) -> (Option<f64>, Option<f64>, Option<f64>) {
        if val > self.best_val || self.best_epoch.is_none() {
            self.best_val = val;
            self.best_test = test;
            self.best_epoch = Some(epoch);
        }
        (Some(train), Some(val), Some(test))
    }
}

/// Everything a checkpoint holds.
pub struct Checkpoint {
    pub config_hash: u64,
    /// [`TrainConfig::model_settings`] of the run that wrote it.
    pub model_settings: serde_json::Value,
    /// The whole resolved configuration of that run (JSON), for the record.
    pub run_config: String,
    pub position: Position,
    pub params: Vec<f32>,
    pub adam_m: Vec<f32>,
    pub adam_v: Vec<f32>,
    pub adam_t: u64,
    /// SliceGCN: the rank count whose per-rank parameters `params` holds (after the shared
    /// parts, rank by rank); `None` for the other strategies, whose parameters are the same
    /// on every rank.
    pub slice_ranks: Option<u64>,
    /// The content id of the data it was trained on ([`DataIdentity`]); `None` where the data
    /// records none (files of older builds) and in checkpoints of older builds.
    pub data_id: Option<u64>,
}

/// The content id of the data `files` trains on, as checkpoints record it.
pub fn data_id_of(files: &super::RunFiles) -> Option<u64> {
    DataIdentity::of(files.data.as_deref())
        .ok()
        .and_then(|d| d.id)
}

/// Write a checkpoint atomically.
pub fn save(path: &Path, ck: &Checkpoint, entries: &[ParamEntry]) -> Result<()> {
    let out = AtomicOutput::new(path)
        .with_context(|| format!("cannot write checkpoint `{}`", path.display()))?;
    (|| -> Result<()> {
        let f = h5::create(out.tmp_path())?;
        h5::write_attr(&f, "format_version", CHECKPOINT_VERSION)?;
        h5::write_str_attr(&f, "kind", "gnnpar-checkpoint")?;
        h5::write_attr(&f, "config_hash", ck.config_hash)?;
        h5::write_str_attr(&f, "model_settings", &ck.model_settings.to_string())?;
        h5::write_str_attr(&f, "run_config", &ck.run_config)?;
        let p = &ck.position;
        h5::write_attr(&f, "epoch", p.epoch as u64)?;
        h5::write_attr(&f, "batch", p.batch as u64)?;
        h5::write_attr(&f, "step", p.step)?;
        h5::write_attr(&f, "best_epoch", p.best_epoch.map_or(-1i64, |e| e as i64))?;
        h5::write_attr(&f, "best_val", p.best_val)?;
        h5::write_attr(&f, "best_test", p.best_test)?;
        h5::write_attr(&f, "epoch_loss_sum", p.epoch_loss_sum)?;
        h5::write_attr(&f, "epoch_loss_seeds", p.epoch_loss_seeds)?;
        h5::write_attr(&f, "adam_t", ck.adam_t)?;
        if let Some(p) = ck.slice_ranks {
            h5::write_attr(&f, "slice_ranks", p)?;
        }
        if let Some(id) = ck.data_id {
            h5::write_attr(&f, "data_id", id)?;
        }
        h5::write_vec(&f, "params", &ck.params)?;
        h5::write_vec(&f, "adam_m", &ck.adam_m)?;
        h5::write_vec(&f, "adam_v", &ck.adam_v)?;
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        h5::write_str_attr(&f, "param_names", &names.join("\n"))?;
        let offsets: Vec<u64> = entries.iter().map(|e| e.offset as u64).collect();
        h5::write_vec(&f, "param_offsets", &offsets)?;
        // Shapes as (rows, cols); a vector parameter is stored as (len, 1).
        let shapes: Vec<u64> = entries
            .iter()
            .flat_map(|e| {
                let rows = e.shape.first().copied().unwrap_or(1) as u64;
                let cols = e.shape.iter().skip(1).product::<usize>() as u64;
                [rows, cols.max(1)]
            })
            .collect();
        h5::write_vec(&f, "param_shapes", &shapes)?;
        f.flush()?;
        Ok(())
    })()
    .with_context(|| format!("cannot write checkpoint `{}`", path.display()))?;
    out.commit()
}

/// Read a checkpoint and check it holds `n_params` parameters of the model `cfg` defines,
/// trained on the data whose content id is `data_id`.
pub fn load(
    path: &Path,
    n_params: usize,
    cfg: &TrainConfig,
    data_id: Option<u64>,
) -> Result<Checkpoint> {
    let ck = read(path, cfg, data_id)?;
    if ck.params.len() != n_params {
        bail!(
            "checkpoint `{}`: `params` has {} values, the model has {n_params}",
            path.display(),
            ck.params.len(),
        );
    }
    Ok(ck)
}

/// Read a checkpoint and check it was written for the model `cfg` defines, on the data whose
/// content id is `data_id` (its parameter count is the caller's to check).
pub fn read(path: &Path, cfg: &TrainConfig, data_id: Option<u64>) -> Result<Checkpoint> {
    let config_hash = cfg.model_hash();
    if !path.exists() {
        bail!(
            "cannot resume: the checkpoint `{}` does not exist (--resume continues from \
             --checkpoint; without --resume a new run starts and writes it)",
            path.display()
        );
    }
    let f = h5::open(path)?;
    let ctx = || format!("reading checkpoint `{}`", path.display());
    let kind = h5::read_str_attr_or(&f, "kind", "").unwrap_or_default();
    if kind != "gnnpar-checkpoint" {
        bail!(
            "cannot resume from `{}`: it is not a gnnpar checkpoint (no attribute `kind` = \
             \"gnnpar-checkpoint\")",
            path.display()
        );
    }
    let version: u32 = h5::read_attr(&f, "format_version").with_context(ctx)?;
    if version != CHECKPOINT_VERSION {
        bail!(
            "checkpoint `{}`: unknown `format_version` {version} (expected {CHECKPOINT_VERSION})",
            path.display()
        );
    }
    let hash: u64 = h5::read_attr(&f, "config_hash").with_context(ctx)?;
    // Checkpoints written before the settings were recorded hold the hash only.
    let stored: Option<serde_json::Value> = h5::read_str_attr(&f, "model_settings")
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    if hash != config_hash {
        let which = match &stored {
            Some(stored) => {
                let diff = differing_settings(stored, &cfg.model_settings());
                format!("settings that differ: {}", diff.join("; "))
            }
            None => format!(
                "config hash {hash:016x}, this run {config_hash:016x}; this checkpoint does \
                 not record its settings by name"
            ),
        };
        bail!(
            "checkpoint `{}` was written for a different model configuration ({which}); \
             resume with the same model, data order and optimizer settings, or start without \
             --resume",
            path.display()
        );
    }
    let stored_data = match h5::has_attr(&f, "data_id") {
        true => Some(h5::read_attr::<u64>(&f, "data_id").with_context(ctx)?),
        false => None,
    };
    if let (Some(was), Some(now)) = (stored_data, data_id) {
        if was != now {
            bail!(
                "checkpoint `{}` was trained on other data (content id {was:016x}; --data has \
                 {now:016x}): resume on the data it was trained on, or start without --resume",
                path.display()
            );
        }
    }
    let run_config = h5::read_str_attr_or(&f, "run_config", "").with_context(ctx)?;
    // The cosine schedule's period is the run's epochs: a resumed run with other `epochs`
    // would follow another curve from the checkpoint on, not the uninterrupted run's.
    if cfg.lr_schedule != crate::kinds::LrSchedule::Constant {
        let was = serde_json::from_str::<serde_json::Value>(&run_config)
            .ok()
            .and_then(|c| c.get("epochs").and_then(|e| e.as_u64()));
        if let Some(was) = was.filter(|&e| e != cfg.epochs as u64) {
            bail!(
                "checkpoint `{}` was written by a run of {was} epochs under `lr_schedule` {}, \
                 whose rates follow the epochs; this run has {}: resume with --epochs {was}, \
                 or start without --resume",
                path.display(),
                serde_json::json!(cfg.lr_schedule),
                cfg.epochs
            );
        }
    }
    let params: Vec<f32> = h5::read_vec(&f, "params").with_context(ctx)?;
    let adam_m: Vec<f32> = h5::read_vec(&f, "adam_m").with_context(ctx)?;
    let adam_v: Vec<f32> = h5::read_vec(&f, "adam_v").with_context(ctx)?;
    if adam_m.len() != params.len() || adam_v.len() != params.len() {
        bail!(
            "checkpoint `{}`: `adam_m`/`adam_v` do not match `params` in length",
            path.display()
        );
    }
    // A diverged loss stops a run before its checkpoint, so a non-finite value here is damage
    // (or a model already lost), which a resume would otherwise carry on silently.
    for (field, values) in [
        ("params", &params),
        ("adam_m", &adam_m),
        ("adam_v", &adam_v),
    ] {
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            bail!(
                "checkpoint `{}`: `{field}`[{i}] is {}: the checkpoint is damaged; resume \
                 from another checkpoint or start without --resume",
                path.display(),
                values[i]
            );
        }
    }
    let best_epoch: i64 = h5::read_attr(&f, "best_epoch").with_context(ctx)?;
    Ok(Checkpoint {
        config_hash: hash,
        model_settings: stored.unwrap_or(serde_json::Value::Null),
        run_config,
        position: Position {
            epoch: h5::read_attr::<u64>(&f, "epoch").with_context(ctx)? as usize,
            batch: h5::read_attr::<u64>(&f, "batch").with_context(ctx)? as usize,
            step: h5::read_attr(&f, "step").with_context(ctx)?,
            best_epoch: (best_epoch >= 0).then_some(best_epoch as usize),
            best_val: h5::read_attr(&f, "best_val").with_context(ctx)?,
            best_test: h5::read_attr(&f, "best_test").with_context(ctx)?,
            // Checkpoints of older builds: the resumed epoch's loss counts its own batches.
            epoch_loss_sum: h5::read_attr_or(&f, "epoch_loss_sum", 0.0).with_context(ctx)?,
            epoch_loss_seeds: h5::read_attr_or(&f, "epoch_loss_seeds", 0).with_context(ctx)?,
        },
        params,
        adam_m,
        adam_v,
        adam_t: h5::read_attr(&f, "adam_t").with_context(ctx)?,
        slice_ranks: match h5::has_attr(&f, "slice_ranks") {
            true => Some(h5::read_attr(&f, "slice_ranks").with_context(ctx)?),
            false => None,
        },
        data_id: stored_data,
    })
}

/// Whether `path` is a gnnpar checkpoint (an HDF5 file with `kind` = "gnnpar-checkpoint").
pub fn is_checkpoint(path: &Path) -> bool {
    h5::open(path)
        .is_ok_and(|f| h5::read_str_attr_or(&f, "kind", "").is_ok_and(|k| k == "gnnpar-checkpoint"))
}

/// Fail early (before training) when the checkpoint path cannot be written.
pub fn check_writable(path: &Path) -> Result<()> {
    crate::util::atomic::check_writable(path, "checkpoint")
}

/// Say so when a resumed run starts where there is nothing left to train (the checkpoint is
/// at or past `epochs`, or `max_steps`): it then trains nothing and keeps the checkpoint, which
/// a job resubmitted after it finished (a Slurm requeue) should do without failing.
pub(crate) fn warn_if_nothing_to_train(
    world: &crate::comm::World,
    cfg: &TrainConfig,
    pos: &Position,
    resumed: bool,
) {
    let done = pos.epoch >= cfg.epochs || cfg.max_steps.is_some_and(|m| pos.step >= m);
    if resumed && done && world.rank() == 0 {
        log::warn!(
            "nothing to train: the checkpoint is at epoch {} (step {}) and this run ends at \
             epoch {}{}; raise --epochs (or --max-steps) to train on. The checkpoint is left \
             as it was",
            pos.epoch,
            pos.step,
            cfg.epochs,
            cfg.max_steps
                .map_or(String::new(), |m| format!(" or step {m}"))
        );
    }
}
