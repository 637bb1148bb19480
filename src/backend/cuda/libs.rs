//! Finding the CUDA libraries where clusters keep them, without ever panicking.
//!
//! cudarc's own loaders panic when a library is absent, and their file-name candidates depend
//! on the CUDA version the bindings were generated for (ours: 12.0, so no `.so.13`). gnnpar
//! therefore loads NVRTC and cuBLAS itself ([`super::nvrtc`], [`super::cublas`]) from the
//! places searched here, and probes the driver's `libcuda` with `libloading` before the first
//! cudarc call ([`super::probe`]).
//!
//! # Search order (NVRTC, cuBLAS and cuBLASLt)
//!
//! 1. `$GNNPAR_CUDA_LIB_DIR` (a directory: an explicit override);
//! 2. `$GNNPAR_NVRTC_DIR` (NVRTC only; the test suite points it at the pip wheel);
//! 3. `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT` (what `module load cuda` sets), each with
//!    `/lib64`, `/lib` and `/targets/<arch>-linux/lib`;
//! 4. `/usr/local/cuda/lib64`;
//! 5. `/usr/local/cuda-X.Y/targets/<arch>-linux/lib` and `/usr/local/cuda-X.Y/lib64`, newest
//!    version first;
//! 6. the pip wheels (`nvidia/cuda_nvrtc/lib`, `nvidia/cublas/lib`, `nvidia/cu13/lib` under a
//!    `site-packages`) of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, `~/.local/lib/python3*` and
//!    `/usr/local/lib/python3*/{site,dist}-packages`;
//! 7. the plain loader path (`LD_LIBRARY_PATH`, `ld.so.cache`) by file name.
//!
//! In each directory the majors are tried newest first: 13, 12, then 11; the first file that
//! exists (and, for [`load`], loads and is accepted) wins. The driver's `libcuda.so.1` is not
//! searched for in toolkit directories (those hold only a stub that cannot drive a GPU): it is
//! looked for on the loader path alone ([`driver_candidates`]).
//!
//! The file system and environment are read through [`SearchEnv`], so that the order and the
//! "looked in" message are tested with a fake tree.

use std::fmt;
use std::path::{Path, PathBuf};

/// A CUDA version as the driver reports it (`cuDriverGetVersion`: 12040 is 12.4) or a
/// library's own version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    /// From the driver API's encoding, `1000 · major + 10 · minor`.
    pub fn from_encoded(v: i32) -> CudaVersion {
        let v = v.max(0) as u32;
        CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A library gnnpar loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    /// The driver API (`libcuda.so.1`, installed with the NVIDIA driver).
    Driver,
    /// The run-time compiler (`libnvrtc.so.*`).
    Nvrtc,
    /// cuBLAS (`libcublas.so.*`).
    Cublas,
    /// cuBLASLt (`libcublasLt.so.*`), which cuBLAS links against.
    CublasLt,
}

impl Lib {
    /// The name users know it by.
    pub fn label(self) -> &'static str {
        match self {
            Lib::Driver => "CUDA driver",
            Lib::Nvrtc => "NVRTC",
            Lib::Cublas => "cuBLAS",
            Lib::CublasLt => "cuBLASLt",
        }
    }

    /// `lib<stem>.so`.
    fn stem(self) -> &'static str {
        match self {
            Lib::Driver => "cuda",
            Lib::Nvrtc => "nvrtc",
            Lib::Cublas => "cublas",
            Lib::CublasLt => "cublasLt",
        }
    }

    /// File names in the order tried, with the major each one stands for.
    pub fn file_names(self) -> Vec<(String, Option<u32>)> {
        let stem = self.stem();
        match self {
            Lib::Driver => vec![(format!("lib{stem}.so.1"), None)],
            // CUDA 11's NVRTC is `libnvrtc.so.11.2` (one soname for every 11.x).
            Lib::Nvrtc => vec![
                (format!("lib{stem}.so.13"), Some(13)),
                (format!("lib{stem}.so.12"), Some(12)),
                (format!("lib{stem}.so.11.2"), Some(11)),
                (format!("lib{stem}.so"), None),
            ],
            Lib::Cublas | Lib::CublasLt => vec![
                (format!("lib{stem}.so.13"), Some(13)),
                (format!("lib{stem}.so.12"), Some(12)),
                (format!("lib{stem}.so.11"), Some(11)),
                (format!("lib{stem}.so"), None),
            ],
        }
    }

    /// The pip wheels' directories (below `site-packages`) that hold it.
    fn wheel_dirs(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &[],
            Lib::Nvrtc => &["nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib"],
            Lib::Cublas | Lib::CublasLt => &["nvidia/cublas/lib", "nvidia/cu13/lib"],
        }
    }
}

impl fmt::Display for Lib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The environment and file system as the search sees them.
pub trait SearchEnv {
    /// An environment variable (`None` when unset or empty).
    fn var(&self, name: &str) -> Option<String>;
    /// The names of the entries of `dir` (empty when it cannot be read).
    fn list(&self, dir: &Path) -> Vec<String>;
    /// Whether `path` exists (following links).
    fn exists(&self, path: &Path) -> bool;
}

/// The real process environment and file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemEnv;

impl SearchEnv for SystemEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    fn list(&self, dir: &Path) -> Vec<String> {
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

/// One file to try: a full path in a searched directory, or a bare file name for the loader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// What to pass to `dlopen`.
    pub path: PathBuf,
    /// The major its file name stands for (`None`: an unversioned name).
    pub major: Option<u32>,
    /// Where it was found, for messages (`$CUDA_HOME/lib64`, `the loader path`).
    pub origin: String,
}

impl Candidate {
    /// True when it is a bare name handed to the loader's own search.
    pub fn on_loader_path(&self) -> bool {
        self.path.parent().is_none_or(|p| p.as_os_str().is_empty())
    }
}

/// A library found: its path (a bare file name when found on the loader path) and the major of
/// its file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub major: Option<u32>,
}

/// A library not found (or not usable), with every place looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub library: Lib,
    /// The places searched, in order (`$CUDA_HOME/lib64 = /opt/cuda/lib64`, …).
    pub looked_in: Vec<String>,
    /// Files that exist but were refused: `path: why` (not loadable, too new for the driver).
    pub rejected: Vec<String>,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rejected.is_empty() {
            write!(f, "{} not found", self.library)?;
        } else {
            write!(
                f,
                "no usable {} ({})",
                self.library,
                self.rejected.join("; ")
            )?;
        }
        write!(f, " (looked in {}", self.looked_in.join(", "))?;
        if self.library != Lib::Driver {
            f.write_str("; module load cuda, or set GNNPAR_CUDA_LIB_DIR")?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for Missing {}

/// `x86_64-linux` or `sbsa-linux`: the toolkit's `targets/` directory of this machine.
fn target_dir() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "sbsa-linux"
    } else {
        "x86_64-linux"
    }
}

/// A place searched: a directory (with the variable it came from, for the message), or a
/// note where a step named no directory (an unset variable, a glob that matched nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    Dir { label: String, path: PathBuf },
    Note(String),
}

/// Every place searched for `lib`, in order.
pub fn search_dirs(lib: Lib, env: &dyn SearchEnv) -> Vec<Place> {
    let mut places: Vec<Place> = Vec::new();
    if lib == Lib::Driver {
        return places;
    }
    let dir = |label: String, path: PathBuf| Place::Dir { label, path };
    let tdir = format!("targets/{}/lib", target_dir());

    let mut overrides = vec!["GNNPAR_CUDA_LIB_DIR"];
    if lib == Lib::Nvrtc {
        overrides.push("GNNPAR_NVRTC_DIR");
    }
    for var in overrides {
        match env.var(var) {
            Some(d) => places.push(dir(format!("${var}"), PathBuf::from(d))),
            None => places.push(Place::Note(format!("${var} (unset)"))),
        }
    }

    let mut unset = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        match env.var(var) {
            Some(root) => {
                for sub in ["lib64", "lib", tdir.as_str()] {
                    places.push(dir(format!("${var}/{sub}"), Path::new(&root).join(sub)));
                }
            }
            None => unset.push(format!("${var}")),
        }
    }
    if !unset.is_empty() {
        places.push(Place::Note(format!("{} (unset)", unset.join(", "))));
    }

    places.push(dir(String::new(), PathBuf::from("/usr/local/cuda/lib64")));

    // /usr/local/cuda-X.Y, newest first.
    let mut versions: Vec<((u32, u32), String)> = env
        .list(Path::new("/usr/local"))
        .into_iter()
        .filter_map(|name| {
            let v = name.strip_prefix("cuda-")?;
            let (major, minor) = v.split_once('.').unwrap_or((v, "0"));
            Some(((major.parse().ok()?, minor.parse().unwrap_or(0)), name))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    if versions.is_empty() {
        places.push(Place::Note("/usr/local/cuda-* (none)".to_string()));
    }
    for (_, name) in &versions {
        let root = Path::new("/usr/local").join(name);
        places.push(dir(String::new(), root.join(&tdir)));
        places.push(dir(String::new(), root.join("lib64")));
    }

    // pip wheels.
    let mut site_packages: Vec<(String, PathBuf)> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = env.var(var) {
            let lib_dir = Path::new(&prefix).join("lib");
            for py in python_dirs(env, &lib_dir) {
                site_packages.push((
                    format!("${var}/lib/{py}/site-packages"),
                    lib_dir.join(&py).join("site-packages"),
                ));
            }
        }
    }
    if let Some(home) = env.var("HOME") {
        let lib_dir = Path::new(&home).join(".local/lib");
        for py in python_dirs(env, &lib_dir) {
            site_packages.push((
                format!("~/.local/lib/{py}/site-packages"),
                lib_dir.join(&py).join("site-packages"),
            ));
        }
    }
    let usr = Path::new("/usr/local/lib");
    for py in python_dirs(env, usr) {
        for sp in ["site-packages", "dist-packages"] {
            site_packages.push((String::new(), usr.join(&py).join(sp)));
        }
    }
    if site_packages.is_empty() {
        places.push(Place::Note(
            "pip wheels (no site-packages found)".to_string(),
        ));
    }
    for (label, sp) in site_packages {
        for wheel in lib.wheel_dirs() {
            let label = if label.is_empty() {
                String::new()
            } else {
                format!("{label}/{wheel}")
            };
            places.push(dir(label, sp.join(wheel)));
        }
    }
    places
}

/// `python3*` entries of `dir`, newest version first.
fn python_dirs(env: &dyn SearchEnv, dir: &Path) -> Vec<String> {
    let mut v: Vec<(u32, String)> = env
        .list(dir)
        .into_iter()
        .filter_map(|n| {
            let minor = n.strip_prefix("python3")?;
            let minor = minor.strip_prefix('.').unwrap_or(minor);
            Some((minor.parse().unwrap_or(0), n))
        })
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    v.into_iter().map(|(_, n)| n).collect()
}

/// A directory for the message: `$CUDA_HOME/lib64 = /opt/cuda/lib64`, or the path itself.
fn show_dir(label: &str, dir: &Path) -> String {
    if label.is_empty() {
        dir.display().to_string()
    } else {
        format!("{label} = {}", dir.display())
    }
}

/// Every file to try for `lib`, in order, and the list of places looked (for [`Missing`]).
/// Files in searched directories are listed only when they exist; the loader-path names come
/// last and are always listed (only `dlopen` can tell whether they are there).
pub fn candidates(lib: Lib, env: &dyn SearchEnv) -> (Vec<Candidate>, Vec<String>) {
    let names = lib.file_names();
    let mut out = Vec::new();
    let mut looked = Vec::new();
    for place in search_dirs(lib, env) {
        let (label, dir) = match place {
            Place::Dir { label, path } => (label, path),
            Place::Note(n) => {
                looked.push(n);
                continue;
            }
        };
        let (label, dir) = (&label, &dir);
        looked.push(show_dir(label, dir));
        for (name, major) in &names {
            let path = dir.join(name);
            if env.exists(&path) {
                out.push(Candidate {
                    path,
                    major: *major,
                    origin: show_dir(label, dir),
                });
            }
        }
    }
    let loader_names: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
    looked.push(match env.var("LD_LIBRARY_PATH") {
        Some(p) => format!(
            "the loader path ({}; LD_LIBRARY_PATH={p})",
            loader_names.join(", ")
        ),
        None => format!("the loader path ({})", loader_names.join(", ")),
    });
    for (name, major) in names {
        out.push(Candidate {
            path: PathBuf::from(name),
            major,
            origin: "the loader path".to_string(),
        });
    }
    (out, looked)
}

/// The first candidate for `lib` that exists in a searched directory, else the first
/// loader-path name (which only `dlopen` can confirm); `Missing` only when no directory has it
/// and `loader_path` is false.
pub fn find(lib: Lib, env: &dyn SearchEnv, loader_path: bool) -> Result<Found, Missing> {
    let (cands, looked_in) = candidates(lib, env);
    cands
        .into_iter()
        .find(|c| loader_path || !c.on_loader_path())
        .map(|c| Found {
            path: c.path,
            major: c.major,
        })
        .ok_or(Missing {
            library: lib,
            looked_in,
            rejected: Vec::new(),
        })
}

/// Open `lib`: hand every candidate in order to `open` (which loads it, see [`dlopen`], and
/// may refuse it with a reason, e.g. a version too new for the driver; `Err(None)` means
/// "not there" and is not worth a line) and return the first accepted. Never panics; a
/// `Missing` lists every place looked and every refusal.
pub fn load<T>(
    lib: Lib,
    env: &dyn SearchEnv,
    mut open: impl FnMut(&Candidate) -> Result<T, Option<String>>,
) -> Result<(Found, T), Missing> {
    let (cands, looked_in) = candidates(lib, env);
    let mut rejected = Vec::new();
    for c in cands {
        match open(&c) {
            Ok(t) => {
                return Ok((
                    Found {
                        path: c.path,
                        major: c.major,
                    },
                    t,
                ))
            }
            Err(Some(why)) => rejected.push(format!("{}: {why}", c.path.display())),
            Err(None) => {}
        }
    }
    Err(Missing {
        library: lib,
        looked_in,
        rejected,
    })
}

/// `dlopen` a candidate: `Err(None)` when a bare name is not on the loader path, `Err(Some)`
/// with the loader's reason when a file that exists does not load.
pub fn dlopen(c: &Candidate) -> Result<libloading::Library, Option<String>> {
    // SAFETY: loading a CUDA library runs its initialisers, which have no preconditions.
    match unsafe { libloading::Library::new(&c.path) } {
        Ok(l) => Ok(l),
        Err(_) if c.on_loader_path() => Err(None),
        Err(e) => Err(Some(one_line(&e.to_string()))),
    }
}

/// Candidates for the driver, in the order cudarc tries them (so the one that loads here is
/// the one cudarc will use).
pub fn driver_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("cuda")
}

/// A message on one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    /// An environment and a tree of files, all in memory.
    #[derive(Default)]
    struct FakeEnv {
        vars: HashMap<String, String>,
        files: BTreeSet<PathBuf>,
    }

    impl FakeEnv {
        fn var(mut self, k: &str, v: &str) -> Self {
            self.vars.insert(k.into(), v.into());
            self
        }
        fn file(mut self, p: &str) -> Self {
            self.files.insert(PathBuf::from(p));
            self
        }
    }

    impl SearchEnv for FakeEnv {
        fn var(&self, name: &str) -> Option<String> {
            self.vars.get(name).cloned()
        }
        fn list(&self, dir: &Path) -> Vec<String> {
            let mut names = BTreeSet::new();
            for f in &self.files {
                if let Ok(rest) = f.strip_prefix(dir) {
                    if let Some(first) = rest.components().next() {
                        names.insert(first.as_os_str().to_string_lossy().into_owned());
                    }
                }
            }
            names.into_iter().collect()
        }
        fn exists(&self, path: &Path) -> bool {
            self.files.iter().any(|f| f.starts_with(path))
        }
    }

    fn paths(c: &[Candidate]) -> Vec<String> {
        c.iter().map(|c| c.path.display().to_string()).collect()
    }

    #[test]
    fn the_search_order_is_override_then_module_then_system_then_wheels_then_loader() {
        let t = target_dir();
        let env = FakeEnv::default()
            .var("GNNPAR_CUDA_LIB_DIR", "/override")
            .var("CUDA_HOME", "/apps/cuda/12.4")
            .var("HOME", "/home/u")
            .file("/override/libnvrtc.so.12")
            .file("/apps/cuda/12.4/lib64/libnvrtc.so.12")
            .file("/apps/cuda/12.4/lib64/libnvrtc.so")
            .file("/usr/local/cuda/lib64/libnvrtc.so.13")
            .file(&format!(
                "/usr/local/cuda-12.4/targets/{t}/lib/libnvrtc.so.12"
            ))
            .file(&format!(
                "/usr/local/cuda-13.0/targets/{t}/lib/libnvrtc.so.13"
            ))
            .file("/usr/local/cuda-9.2/lib64/libnvrtc.so.9.2")
            .file(
                "/home/u/.local/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            );
        let (c, _) = candidates(Lib::Nvrtc, &env);
        assert_eq!(
            paths(&c),
            vec![
                "/override/libnvrtc.so.12".to_string(),
                "/apps/cuda/12.4/lib64/libnvrtc.so.12".into(),
                "/apps/cuda/12.4/lib64/libnvrtc.so".into(),
                "/usr/local/cuda/lib64/libnvrtc.so.13".into(),
                format!("/usr/local/cuda-13.0/targets/{t}/lib/libnvrtc.so.13"),
                format!("/usr/local/cuda-12.4/targets/{t}/lib/libnvrtc.so.12"),
                "/home/u/.local/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
                    .into(),
                "libnvrtc.so.13".into(),
                "libnvrtc.so.12".into(),
                "libnvrtc.so.11.2".into(),
                "libnvrtc.so".into(),
            ]
        );
        assert_eq!(c[0].major, Some(12));
        assert_eq!(c[2].major, None);
        assert_eq!(c[1].origin, "$CUDA_HOME/lib64 = /apps/cuda/12.4/lib64");
        assert!(c[7].on_loader_path() && !c[6].on_loader_path());
        assert_eq!(
            find(Lib::Nvrtc, &env, false).unwrap(),
            Found {
                path: "/override/libnvrtc.so.12".into(),
                major: Some(12)
            }
        );
    }

    #[test]
    fn newer_majors_first_within_a_directory_and_newest_toolkit_first() {
        let env = FakeEnv::default()
            .file("/usr/local/cuda-12.10/lib64/libcublas.so.12")
            .file("/usr/local/cuda-12.9/lib64/libcublas.so.12")
            .file("/usr/local/cuda-13.0/lib64/libcublas.so.12")
            .file("/usr/local/cuda-13.0/lib64/libcublas.so.13");
        let (c, _) = candidates(Lib::Cublas, &env);
        let dirs: Vec<String> = paths(&c).into_iter().filter(|p| p.contains('/')).collect();
        assert_eq!(
            dirs,
            vec![
                "/usr/local/cuda-13.0/lib64/libcublas.so.13",
                "/usr/local/cuda-13.0/lib64/libcublas.so.12",
                "/usr/local/cuda-12.10/lib64/libcublas.so.12",
                "/usr/local/cuda-12.9/lib64/libcublas.so.12",
            ]
        );
    }

    #[test]
    fn wheels_of_a_venv_conda_and_the_system_python_are_searched() {
        let env = FakeEnv::default()
            .var("VIRTUAL_ENV", "/venv")
            .var("CONDA_PREFIX", "/conda")
            .file("/venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12")
            .file("/conda/lib/python3.10/site-packages/nvidia/cu13/lib/libcublas.so.13")
            .file("/usr/local/lib/python3.11/dist-packages/nvidia/cublas/lib/libcublasLt.so.12");
        let (c, looked) = candidates(Lib::Cublas, &env);
        assert_eq!(
            &paths(&c)[..2],
            &[
                "/venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12",
                "/conda/lib/python3.10/site-packages/nvidia/cu13/lib/libcublas.so.13",
            ]
        );
        let (lt, _) = candidates(Lib::CublasLt, &env);
        assert_eq!(
            paths(&lt)[0],
            "/usr/local/lib/python3.11/dist-packages/nvidia/cublas/lib/libcublasLt.so.12"
        );
        assert!(looked
            .iter()
            .any(|l| l == "$VIRTUAL_ENV/lib/python3.12/site-packages/nvidia/cublas/lib = /venv/lib/python3.12/site-packages/nvidia/cublas/lib"));
    }

    #[test]
    fn gnnpar_nvrtc_dir_is_for_nvrtc_only() {
        let env = FakeEnv::default()
            .var("GNNPAR_NVRTC_DIR", "/wheel")
            .file("/wheel/libnvrtc.so.12")
            .file("/wheel/libcublas.so.12");
        assert_eq!(
            find(Lib::Nvrtc, &env, false).unwrap().path,
            Path::new("/wheel/libnvrtc.so.12")
        );
        assert!(find(Lib::Cublas, &env, false).is_err());
    }

    #[test]
    fn the_missing_message_names_the_library_and_every_place_looked() {
        let env = FakeEnv::default()
            .var("CUDA_PATH", "/opt/cuda")
            .var("HOME", "/home/u")
            .file("/home/u/.local/lib/python3.11/x");
        let m = find(Lib::Nvrtc, &env, false).unwrap_err();
        let msg = m.to_string();
        for part in [
            "NVRTC not found",
            "$GNNPAR_CUDA_LIB_DIR (unset)",
            "$GNNPAR_NVRTC_DIR (unset)",
            "$CUDA_HOME, $CUDA_ROOT (unset)",
            "$CUDA_PATH/lib64 = /opt/cuda/lib64",
            "$CUDA_PATH/lib = /opt/cuda/lib",
            "/usr/local/cuda/lib64",
            "/usr/local/cuda-* (none)",
            "~/.local/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib",
            "the loader path (libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so.11.2, libnvrtc.so)",
            "module load cuda, or set GNNPAR_CUDA_LIB_DIR",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg}");
        }
        assert!(!msg.contains('\n'));
        // In the order searched.
        let at = |p: &str| msg.find(p).unwrap();
        assert!(at("$GNNPAR_CUDA_LIB_DIR") < at("$CUDA_PATH/lib64"));
        assert!(at("$CUDA_PATH/lib64") < at("/usr/local/cuda/lib64"));
        assert!(at("/usr/local/cuda/lib64") < at("/usr/local/cuda-*"));
        assert!(at("/usr/local/cuda-*") < at("~/.local/lib/python3.11"));
        assert!(at("~/.local/lib/python3.11") < at("the loader path"));
        // With the loader path allowed, the first loader name stands in.
        assert_eq!(
            find(Lib::Nvrtc, &env, true).unwrap().path,
            Path::new("libnvrtc.so.13")
        );
    }

    #[test]
    fn a_file_that_does_not_load_is_named_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libnvrtc.so.12"), b"").unwrap();
        struct Only(PathBuf);
        impl SearchEnv for Only {
            fn var(&self, name: &str) -> Option<String> {
                (name == "GNNPAR_CUDA_LIB_DIR").then(|| self.0.display().to_string())
            }
            fn list(&self, _: &Path) -> Vec<String> {
                Vec::new()
            }
            fn exists(&self, path: &Path) -> bool {
                path.exists()
            }
        }
        let env = Only(dir.path().to_path_buf());
        // The loader path may hold a real NVRTC on some machine: accept nothing from it.
        let err = load(Lib::Nvrtc, &env, |c| {
            dlopen(c)?;
            Err::<(), _>(Some(format!("refused {}", c.origin)))
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("no usable NVRTC ("), "{msg}");
        assert!(
            msg.contains(&format!("{}/libnvrtc.so.12: ", dir.path().display())),
            "{msg}"
        );
    }

    #[test]
    fn the_driver_is_looked_for_on_the_loader_path_only() {
        let env = FakeEnv::default()
            .var("CUDA_HOME", "/opt/cuda")
            .file("/opt/cuda/lib64/libcuda.so.1");
        let (c, looked) = candidates(Lib::Driver, &env);
        assert_eq!(paths(&c), vec!["libcuda.so.1"]);
        assert_eq!(looked, vec!["the loader path (libcuda.so.1)"]);
        assert!(driver_candidates().iter().any(|n| n == "libcuda.so.1"));
    }
}
