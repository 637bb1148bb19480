//! The calibration file: the key that says where it was measured, where it is kept, and
//! loading it (a file of another key or format is ignored, not used).

use super::{Calibration, FORMAT};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where and how a calibration was measured. Two runs may share one only when these agree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationKey {
    pub host: String,
    pub ranks: usize,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub threads_per_rank: usize,
    /// The backend's own description (CPU threads and GEMM kernels, or the GPU).
    pub device: String,
    pub version: String,
}

impl CalibrationKey {
    /// Why `self` (a file's key) does not fit `run`, or `None` when it does.
    pub fn mismatch(&self, run: &CalibrationKey) -> Option<String> {
        let mut why = Vec::new();
        macro_rules! cmp {
            ($($f:ident),*) => { $( if self.$f != run.$f {
                why.push(format!("{} {:?} (this run: {:?})", stringify!($f), self.$f, run.$f));
            } )* };
        }
        cmp!(
            host,
            version,
            ranks,
            nodes,
            ranks_per_node,
            threads_per_rank,
            device
        );
        (!why.is_empty()).then(|| why.join(", "))
    }

    /// A short stable name for the default file of this key.
    fn file_stem(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        let hash = crate::util::hash::fnv1a(text.bytes());
        format!("calibration-{}-{hash:016x}", sanitize(&self.host))
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// What reading a calibration file found.
#[derive(Debug)]
pub enum Loaded {
    /// No file at the path.
    Missing,
    /// A well-formed file measured elsewhere (another host, version, layout or device): why.
    Foreign(String),
    /// A file for this run.
    Usable(Calibration),
}

/// Read `path` and compare its key with `run`'s. A malformed file is an error naming the file
/// and the field; a file for another key is [`Loaded::Foreign`], not an error.
pub fn load(path: &Path, run: &CalibrationKey) -> Result<Loaded> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read calibration `{}`", path.display()))
        }
    };
    let origin = format!("`{}`", path.display());
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("calibration {origin} is not valid JSON"))?;
    // Every calibration gnnpar ever wrote has an integer `format`: a file without one is
    // something else, which a new calibration must not overwrite.
    let Some(format) = value.get("format").and_then(|f| f.as_u64()) else {
        bail!(
            "{origin} is not a gnnpar calibration: it has no integer field `format`; give \
             --calibration another path, or remove the file"
        );
    };
    if format != FORMAT as u64 {
        return Ok(Loaded::Foreign(format!(
            "it is of calibration format {format}, and this gnnpar reads format {FORMAT}"
        )));
    }
    let cal: Calibration = serde_json::from_value(value)
        .with_context(|| format!("calibration {origin} has a bad or missing field"))?;
    // A damaged file is reported, whatever it was measured for.
    cal.check(&origin)?;
    if let Some(why) = cal.key.mismatch(run) {
        return Ok(Loaded::Foreign(format!("it was measured for {why}")));
    }
    Ok(Loaded::Usable(cal))
}

/// The default calibration file of `key`: `$GNNPAR_CALIBRATION_DIR`, else
/// `$XDG_CACHE_HOME/gnnpar`, else `$HOME/.cache/gnnpar`, else the working directory; the name
/// carries the host and a hash of the key, so layouts do not overwrite each other.
pub fn default_path(key: &CalibrationKey) -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = env("GNNPAR_CALIBRATION_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("gnnpar")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("gnnpar")))
        .unwrap_or_else(|| PathBuf::from("."));
    dir.join(format!("{}.json", key.file_stem()))
}

/// This host's name (the kernel's), or `unknown`.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname NUL-terminates within it or fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
