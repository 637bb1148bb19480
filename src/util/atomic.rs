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

/// Fail early when an output `what` (e.g. "checkpoint") cannot be written at `path`: a
/// temporary file is made beside it and removed, so the check is the write's own.
pub fn check_writable(path: &Path, what: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let unwritable = || format!("{what} path `{}` is not writable", path.display());
    let out = AtomicOutput::new(path).with_context(unwritable)?;
    std::fs::write(out.tmp_path(), b"").with_context(unwritable)?;
    // Dropped without commit: the probe file is removed.
    Ok(())
}

/// Refuse to write `output` (named by its option, `what`) where it is the same file as one of
/// the command's `inputs` (option, path): the finished output would be renamed over that input,
/// which would be lost (the audit found `--checkpoint data.h5` and `prepare x.npz -o x.npz` doing
/// exactly that). Links count: two paths of one file are the same file.
pub fn refuse_overwriting_inputs(
    output: &Path,
    what: &str,
    inputs: &[(&str, Option<&Path>)],
) -> Result<()> {
    for (name, input) in inputs {
        if let Some(input) = input {
            if same_file(output, input) {
                anyhow::bail!(
                    "{what} `{}` is the same file as {name} `{}`: writing it would replace that \
                     input; choose another path",
                    output.display(),
                    input.display()
                );
            }
        }
    }
    Ok(())
}

/// Whether two paths name one existing file (same device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_naming_an_input_is_refused_links_included() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("data.h5");
        std::fs::write(&input, b"x").unwrap();
        let link = dir.path().join("link.h5");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let other = dir.path().join("out.h5");
        let inputs = [("--data", Some(input.as_path())), ("--config", None)];
        let e = refuse_overwriting_inputs(&link, "--checkpoint", &inputs).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("--checkpoint") && e.contains("--data"), "{e}");
        assert!(refuse_overwriting_inputs(&input, "-o", &inputs).is_err());
        // A new file, or an existing one that is not an input, is fine.
        assert!(refuse_overwriting_inputs(&other, "-o", &inputs).is_ok());
        std::fs::write(&other, b"y").unwrap();
        assert!(refuse_overwriting_inputs(&other, "-o", &inputs).is_ok());
        assert_eq!(std::fs::read(&input).unwrap(), b"x");
    }
}
