//! Where a run reads and writes besides its configuration ([`RunFiles`]), and the checks
//! that its outputs can be written before any data loads.

use super::checkpoint;
use crate::comm::World;
use crate::config::TrainConfig;
use anyhow::{bail, Result};
use std::path::PathBuf;

/// Where a run reads and writes, besides its configuration.
#[derive(Clone, Debug, Default)]
pub struct RunFiles {
    /// Dataset file or partition directory; `None` = synthetic default.
    pub data: Option<PathBuf>,
    /// Per-epoch JSON lines.
    pub metrics: Option<PathBuf>,
    /// Checkpoint written every `checkpoint_every` epochs and at the end.
    pub checkpoint: Option<PathBuf>,
    /// Continue from `checkpoint`.
    pub resume: bool,
    /// Summary JSON written at the end.
    pub summary: Option<PathBuf>,
    /// Directory where each rank writes the edges of its sampled blocks (tests, debugging).
    pub dump_blocks: Option<PathBuf>,
    /// Calibration file of the planner (default: one per host and layout in the user's cache).
    pub calibration: Option<PathBuf>,
    /// `gnnpar plan`: plan (calibrating if needed) and stop before training.
    pub plan_only: bool,
}

impl RunFiles {
    /// Check the checkpoint options before any data loads: `--resume` and a checkpoint period
    /// need a checkpoint file, and a new one must be writable (found out now, not after the
    /// first epochs).
    pub fn check_checkpoint(&self, cfg: &TrainConfig) -> Result<()> {
        if self.plan_only {
            return Ok(()); // `gnnpar plan` trains nothing and writes no checkpoint
        }
        match &self.checkpoint {
            None if self.resume => bail!("--resume needs --checkpoint <file.h5> to resume from"),
            None if cfg.checkpoint_every > 0 => bail!(
                "config: `checkpoint_every` (--checkpoint-every) is {}, but no --checkpoint \
                 <file.h5> was given to write to",
                cfg.checkpoint_every
            ),
            Some(path) if !self.resume => {
                refuse_replacing_foreign(path, "a checkpoint", checkpoint::is_checkpoint)?;
                checkpoint::check_writable(path)
            }
            _ => Ok(()),
        }
    }

    /// Check the report paths of rank 0 before any data loads: `--metrics` and `--summary`
    /// must be writable (a bad summary path found only at the end wastes the run), and a file
    /// already there must be one of the same kind (a dataset named by mistake is not replaced).
    pub fn check_reports(&self, world: &World) -> Result<()> {
        if world.rank() != 0 || self.plan_only {
            return Ok(());
        }
        if let Some(path) = &self.metrics {
            refuse_replacing_foreign(path, "metrics", |p| {
                first_json_has(p, "epoch", |text| text.lines().next())
            })?;
        }
        if let Some(path) = &self.summary {
            refuse_replacing_foreign(path, "a summary", |p| {
                first_json_has(p, "epochs_run", |text| Some(text))
            })?;
            crate::util::atomic::check_writable(path, "summary")?;
        }
        Ok(())
    }
}

/// Refuse to replace `path` by `what` when a non-empty file is there that `ours` does not
/// recognise as an earlier output of the same kind (a dataset or a config named by mistake).
fn refuse_replacing_foreign(
    path: &std::path::Path,
    what: &str,
    ours: impl FnOnce(&std::path::Path) -> bool,
) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // nothing there (or nothing readable: writing will say why)
    };
    if meta.is_file() && meta.len() > 0 && !ours(path) {
        bail!(
            "refusing to write {what} to `{}`: the file there is not {what} written by gnnpar \
             (is it an input?); choose another path, or remove it first",
            path.display()
        );
    }
    Ok(())
}

/// Whether the JSON object in `path` (the part of its text `pick` selects) has `key`.
fn first_json_has(
    path: &std::path::Path,
    key: &str,
    pick: impl FnOnce(&str) -> Option<&str>,
) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        pick(&text)
            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            .is_some_and(|v| v.get(key).is_some())
    })
}
