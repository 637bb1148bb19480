//! Write outputs under a temporary name and rename them into place only once complete, so a
//! failed or interrupted run never leaves a half-written dataset, partition or checkpoint.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// A file or directory being written at a temporary path next to its final path.
///
/// Dropping it without [`AtomicOutput::commit`] removes the temporary, so an error anywhere
/// in between leaves nothing behind.
pub struct AtomicOutput {
    final_path: PathBuf,
    tmp_path: PathBuf,
    committed: bool,
}

impl AtomicOutput {
    /// Prepare to write `path`. The temporary lives in the same directory (so the rename is
    /// atomic on one filesystem) and is named after the final name and the process id.
    pub fn new(path: &Path) -> Result<Self> {
        let file_name = path
            .file_name()
            .with_context(|| format!("output path `{}` has no file name", path.display()))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            anyhow::bail!(
                "cannot write `{}`: `{}` {}",
                path.display(),
                parent.display(),
                if parent.exists() {
                    "is not a directory"
                } else {
                    "does not exist"
                }
            );
        }
        let tmp_name = format!(
            ".{}.tmp-{}",
            file_name.to_string_lossy(),
            std::process::id()
        );
        let tmp_path = parent.join(tmp_name);
        remove_any(&tmp_path);
        Ok(AtomicOutput {
            final_path: path.to_path_buf(),
            tmp_path,
            committed: false,
        })
    }

    /// Where to write now.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp_path
    }

    /// The path the output will have once committed.
    pub fn final_path(&self) -> &Path {
        &self.final_path
    }

    /// Move the finished output into place, replacing an older one.
    pub fn commit(mut self) -> Result<()> {
        if self.tmp_path.is_dir() && self.final_path.exists() {
            // A directory cannot be renamed over a non-empty one: move the old aside first.
            let old = self.final_path.with_file_name(format!(
                ".{}.old-{}",
                self.final_path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                std::process::id()
            ));
            std::fs::rename(&self.final_path, &old).with_context(|| {
                format!("cannot replace existing `{}`", self.final_path.display())
            })?;
            let renamed = std::fs::rename(&self.tmp_path, &self.final_path);
            if renamed.is_err() {
                let _ = std::fs::rename(&old, &self.final_path);
            }
            renamed.with_context(|| format!("cannot write `{}`", self.final_path.display()))?;
            remove_any(&old);
        } else {
            std::fs::rename(&self.tmp_path, &self.final_path)
                .with_context(|| format!("cannot write `{}`", self.final_path.display()))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for AtomicOutput {
    fn drop(&mut self) {
        if !self.committed {
            remove_any(&self.tmp_path);
        }
    }
}

fn remove_any(path: &Path) {
    if path.is_dir() {
        let _ = std::fs::remove_dir_all(path);
    } else if path.exists() {
        let _ = std::fs::remove_file(path);
    }
}
