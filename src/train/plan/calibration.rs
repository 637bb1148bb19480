//! A calibration: one fitted line `seconds = latency + units · per_unit` per operator, and the
//! key that says which machine and rank layout it was measured on. Pure data and file I/O; no
//! MPI (the measuring is in [`super::calibrate`]).
//!
//! A calibration is valid only where it was measured: the key holds the host, the rank layout
//! (ranks, nodes, ranks per node, threads per rank), the device and the gnnpar version, and a
//! file whose key differs is ignored (with a log line), never silently reused.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Version of the file layout; a different one is ignored like a different key. (2 added the
/// `sample` and `spmm` operators.)
pub const FORMAT: u32 = 2;

/// Operators every calibration holds, with the unit of their `x`.
pub const OPERATORS: &[(&str, &str)] = &[
    ("alltoallv_world", "byte"),
    ("alltoallv_node", "byte"),
    ("alltoallv_leaders", "byte"),
    ("allreduce", "byte"),
    ("allgatherv", "byte"),
    ("gather", "byte"),
    ("h2d", "byte"),
    ("d2h", "byte"),
    ("gemm", "flop"),
    ("aggregate", "edge_col"),
    ("spmm", "nnz_col"),
    ("sample", "edge"),
];

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
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
        format!("calibration-{}-{hash:016x}", sanitize(&self.host))
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// One operator's line: `seconds = latency_s + x · per_unit_s` for `x` units of work per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    pub latency_s: f64,
    pub per_unit_s: f64,
    /// What `x` counts: bytes, flops, edges × columns (aggregation), stored non-zeros × output
    /// columns (products with sparse input rows), or sampled edges (block building).
    pub unit: String,
    /// The measured `(x, seconds)` points the line was fitted to (slowest rank per point).
    #[serde(default)]
    pub points: Vec<[f64; 2]>,
}

impl Fit {
    /// A free operator (nothing to move, e.g. collectives of a single rank).
    pub fn free(unit: &str) -> Fit {
        Fit {
            latency_s: 0.0,
            per_unit_s: 0.0,
            unit: unit.into(),
            points: Vec::new(),
        }
    }

    /// Seconds for `calls` calls moving `units` in all.
    pub fn seconds(&self, units: f64, calls: f64) -> f64 {
        if units <= 0.0 && calls <= 0.0 {
            return 0.0;
        }
        calls * self.latency_s + units * self.per_unit_s
    }

    /// Least-squares line through `points` (`x`, seconds). A negative intercept or slope (noise
    /// on a flat or tiny range) is refitted with that term at zero, so that no prediction is
    /// ever negative.
    pub fn least_squares(unit: &str, points: Vec<[f64; 2]>) -> Fit {
        let n = points.len() as f64;
        if points.is_empty() {
            return Fit::free(unit);
        }
        let (sx, sy) = points
            .iter()
            .fold((0.0, 0.0), |(a, b), p| (a + p[0], b + p[1]));
        let (mx, my) = (sx / n, sy / n);
        let sxx: f64 = points.iter().map(|p| (p[0] - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p[0] - mx) * (p[1] - my)).sum();
        let (mut a, mut b) = if sxx > 0.0 {
            let b = sxy / sxx;
            (my - b * mx, b)
        } else {
            (my, 0.0)
        };
        if b < 0.0 {
            (a, b) = (my, 0.0);
        } else if a < 0.0 {
            // Through the origin: b = Σxy / Σx².
            let sxx0: f64 = points.iter().map(|p| p[0] * p[0]).sum();
            let sxy0: f64 = points.iter().map(|p| p[0] * p[1]).sum();
            (a, b) = (0.0, if sxx0 > 0.0 { sxy0 / sxx0 } else { 0.0 });
        }
        Fit {
            latency_s: a,
            per_unit_s: b,
            unit: unit.into(),
            points,
        }
    }
}

/// A calibration file's contents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub format: u32,
    pub key: CalibrationKey,
    /// Seconds the measuring took.
    pub seconds_to_calibrate: f64,
    pub operators: BTreeMap<String, Fit>,
}

impl Calibration {
    /// The fit of `op` (one of [`OPERATORS`]). Every loaded or measured calibration has them
    /// all ([`Calibration::check`]); an operator the machine lacks (no device, one node) is
    /// stored as free.
    pub fn op(&self, op: &str) -> &Fit {
        self.operators
            .get(op)
            .unwrap_or_else(|| panic!("calibration without operator `{op}` (checked on load)"))
    }

    /// Refuse a calibration with a missing operator or a non-finite or negative coefficient,
    /// naming `origin` (the file) and the field.
    pub fn check(&self, origin: &str) -> Result<()> {
        for (op, unit) in OPERATORS {
            let Some(f) = self.operators.get(*op) else {
                bail!("calibration {origin}: field `operators.{op}` is missing");
            };
            for (name, v) in [("latency_s", f.latency_s), ("per_unit_s", f.per_unit_s)] {
                if !v.is_finite() || v < 0.0 {
                    bail!(
                        "calibration {origin}: field `operators.{op}.{name}` is {v}; it must \
                         be a finite number ≥ 0"
                    );
                }
            }
            if f.unit != *unit {
                bail!(
                    "calibration {origin}: field `operators.{op}.unit` is {:?}, expected {unit:?}",
                    f.unit
                );
            }
        }
        Ok(())
    }

    /// The fitted coefficients in [`OPERATORS`] order (what rank 0 broadcasts).
    pub fn coefficients(&self) -> Vec<f64> {
        OPERATORS
            .iter()
            .flat_map(|(op, _)| {
                let f = self.op(op);
                [f.latency_s, f.per_unit_s]
            })
            .collect()
    }

    /// Replace the coefficients by `c` (from [`Calibration::coefficients`] on rank 0), so that
    /// every rank prices with bit-identical numbers.
    pub fn set_coefficients(&mut self, c: &[f64]) {
        for (i, (op, unit)) in OPERATORS.iter().enumerate() {
            let f = self
                .operators
                .entry(op.to_string())
                .or_insert_with(|| Fit::free(unit));
            f.latency_s = c[2 * i];
            f.per_unit_s = c[2 * i + 1];
        }
    }

    /// Write atomically (a reader never sees half a file).
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "cannot create the calibration directory `{}`",
                    dir.display()
                )
            })?;
        }
        let out = crate::util::atomic::AtomicOutput::new(path)?;
        std::fs::write(out.tmp_path(), serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write calibration `{}`", path.display()))?;
        out.commit()
    }
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
    let format = value.get("format").and_then(|f| f.as_u64());
    if format != Some(FORMAT as u64) {
        return Ok(Loaded::Foreign(format!(
            "field `format` is {}, this gnnpar reads {FORMAT}",
            value
                .get("format")
                .map_or("missing".into(), |f| f.to_string())
        )));
    }
    let cal: Calibration = serde_json::from_value(value)
        .with_context(|| format!("calibration {origin} has a bad or missing field"))?;
    if let Some(why) = cal.key.mismatch(run) {
        return Ok(Loaded::Foreign(why));
    }
    cal.check(&origin)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn key() -> CalibrationKey {
        CalibrationKey {
            host: "h1".into(),
            ranks: 2,
            nodes: 1,
            ranks_per_node: 2,
            threads_per_rank: 1,
            device: "CPU".into(),
            version: "0.1.0".into(),
        }
    }

    fn calibration() -> Calibration {
        Calibration {
            format: FORMAT,
            key: key(),
            seconds_to_calibrate: 1.0,
            operators: OPERATORS
                .iter()
                .map(|(op, unit)| (op.to_string(), Fit::least_squares(unit, vec![[1.0, 2.0]])))
                .collect(),
        }
    }

    #[test]
    fn least_squares_recovers_a_line_and_never_goes_negative() {
        let pts = (1..6)
            .map(|i| [i as f64 * 1e6, 1e-5 + i as f64 * 1e6 / 5e9])
            .collect();
        let f = Fit::least_squares("byte", pts);
        assert!((f.latency_s - 1e-5).abs() < 1e-12, "{f:?}");
        assert!((f.per_unit_s - 2e-10).abs() < 1e-18, "{f:?}");
        // Decreasing noise: flat line at the mean, not a negative slope.
        let f = Fit::least_squares("byte", vec![[1.0, 3.0], [2.0, 1.0]]);
        assert_eq!((f.latency_s, f.per_unit_s), (2.0, 0.0));
        // Negative intercept: refitted through the origin.
        let f = Fit::least_squares("byte", vec![[1.0, 0.5], [2.0, 2.0], [3.0, 3.5]]);
        assert_eq!(f.latency_s, 0.0);
        assert!(f.per_unit_s > 0.0);
    }

    #[test]
    fn files_round_trip_and_foreign_keys_are_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("cal.json");
        assert!(matches!(load(&path, &key()).unwrap(), Loaded::Missing));
        let cal = calibration();
        cal.save(&path).unwrap();
        match load(&path, &key()).unwrap() {
            Loaded::Usable(c) => assert_eq!(c, cal),
            other => panic!("{other:?}"),
        }
        for (field, value) in [("host", "h2"), ("version", "9.9.9")] {
            let mut other = key();
            match field {
                "host" => other.host = value.into(),
                _ => other.version = value.into(),
            }
            match load(&path, &other).unwrap() {
                Loaded::Foreign(why) => assert!(why.contains(field), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn bad_files_name_the_file_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cal.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(err.contains("cal.json") && err.contains("JSON"), "{err}");

        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"]["gemm"]
            .as_object_mut()
            .unwrap()
            .remove("per_unit_s");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(
            err.contains("cal.json") && err.contains("per_unit_s"),
            "{err}"
        );

        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"]["allreduce"]["latency_s"] = serde_json::json!(-1.0);
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(
            err.contains("cal.json") && err.contains("operators.allreduce.latency_s"),
            "{err}"
        );

        let mut v = serde_json::to_value(calibration()).unwrap();
        v["operators"].as_object_mut().unwrap().remove("h2d");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(err.contains("operators.h2d"), "{err}");
    }

    #[test]
    fn default_paths_differ_by_layout() {
        let mut other = key();
        other.ranks = 4;
        assert_ne!(default_path(&key()), default_path(&other));
    }
}
