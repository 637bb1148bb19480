//! `slurm/train.sh` without Slurm: the script runs under bash with fake `srun`, `mpirun` and
//! `id` first on a `PATH` that holds nothing else but `dirname` and `mkdir`, and the fakes
//! record the command line and environment they were started with. Checked: where the binary
//! is looked for, in the documented order (`GNNPAR_BIN`, then
//! `$SLURM_SUBMIT_DIR/target/release/gnnpar`, then `gnnpar` on `PATH`, then the script's
//! `../target/release/gnnpar`), the not-found messages, the `srun` step (`--mpi=pmix` or
//! `GNNPAR_SRUN_MPI`, CPUs and GPUs per task, threads), and Open MPI's root override under
//! `GNNPAR_LAUNCHER=mpirun`, set for uid 0 only. `scripts/slurm-test.sh` runs the same script
//! under a real Slurm where one can be started; this test runs everywhere.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The variables the fake launchers record (absent ones are recorded as unset).
const RECORDED: [&str; 4] = [
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
    "RAYON_NUM_THREADS",
    "OMP_NUM_THREADS",
];

/// The absolute path of `name` on this process's `PATH`.
fn which(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("`{name}` is not on PATH"))
}

fn write_executable(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stand-in for the gnnpar binary: never run (the fake launchers only record its path).
fn fake_gnnpar(path: &Path) -> PathBuf {
    write_executable(path, "#!/bin/false\n");
    path.to_path_buf()
}

/// What a fake launcher saw.
#[derive(Debug)]
struct Launch {
    program: String,
    args: Vec<String>,
    /// `RECORDED` variables that were set, with their values.
    env: HashMap<String, String>,
}

impl Launch {
    fn has(&self, arg: &str) -> bool {
        self.args.iter().any(|a| a == arg)
    }
    /// The argument after `flag`.
    fn after(&self, flag: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == flag)?;
        self.args.get(i + 1).map(String::as_str)
    }
}

/// What one run of the script did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stderr: String,
    /// The launcher the script `exec`ed, if any.
    launch: Option<Launch>,
}

/// A sandbox: a copy of `slurm/train.sh` at `<tmp>/project/slurm/train.sh`, fake tools on
/// `<tmp>/fakes`, `dirname` and `mkdir` on `<tmp>/tools`, a working directory `<tmp>/work`.
struct Sandbox {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    script: PathBuf,
    log: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let tmp = common::tempdir();
        let root = tmp.path().to_path_buf();
        let script = root.join("project/slurm/train.sh");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm/train.sh");
        std::fs::create_dir_all(script.parent().unwrap()).unwrap();
        std::fs::copy(&source, &script).unwrap();
        let log = root.join("launch.log");
        let bash = which("bash");
        let record = format!(
            "#!{bash}\n{{\n  printf 'program=%s\\n' \"${{0##*/}}\"\n  \
             for a in \"$@\"; do printf 'arg=%s\\n' \"$a\"; done\n  \
             for v in {vars}; do\n    \
             if [ -n \"${{!v+x}}\" ]; then printf 'env=%s=%s\\n' \"$v\" \"${{!v}}\"; fi\n  \
             done\n}} > {log}\n",
            bash = bash.display(),
            vars = RECORDED.join(" "),
            log = log.display(),
        );
        for program in ["srun", "mpirun"] {
            write_executable(&root.join("fakes").join(program), &record);
        }
        // `id -u` answers FAKE_UID.
        write_executable(
            &root.join("fakes/id"),
            &format!(
                "#!{}\n[ \"$1\" = -u ] && echo \"$FAKE_UID\"\n",
                bash.display()
            ),
        );
        std::fs::create_dir_all(root.join("tools")).unwrap();
        for tool in ["dirname", "mkdir"] {
            std::os::unix::fs::symlink(which(tool), root.join("tools").join(tool)).unwrap();
        }
        std::fs::create_dir_all(root.join("work")).unwrap();
        Sandbox {
            _tmp: tmp,
            root,
            script,
            log,
        }
    }

    /// A directory for a fake `gnnpar` on `PATH`.
    fn path_dir(&self) -> PathBuf {
        self.root.join("path")
    }

    /// `bash train.sh data.h5 config.toml --epochs 1` in `<tmp>/work` with only `vars` (and a
    /// `PATH` of the fakes, the tools, and `path_dir()` when `with_path_dir`) in the
    /// environment.
    fn run(&self, with_path_dir: bool, vars: &[(&str, &str)]) -> Run {
        let _ = std::fs::remove_file(&self.log);
        let mut path = vec![self.root.join("fakes"), self.root.join("tools")];
        if with_path_dir {
            path.push(self.path_dir());
        }
        let mut cmd = Command::new(which("bash"));
        cmd.arg(&self.script)
            .args(["data.h5", "config.toml", "--epochs", "1"])
            .current_dir(self.root.join("work"))
            .env_clear()
            .env("PATH", std::env::join_paths(path).unwrap())
            .env("FAKE_UID", "1000");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = common::run_with_timeout(cmd, TIMEOUT);
        let launch = std::fs::read_to_string(&self.log).ok().map(|text| {
            let mut launch = Launch {
                program: String::new(),
                args: Vec::new(),
                env: HashMap::new(),
            };
            for line in text.lines() {
                if let Some(p) = line.strip_prefix("program=") {
                    launch.program = p.to_string();
                } else if let Some(a) = line.strip_prefix("arg=") {
                    launch.args.push(a.to_string());
                } else if let Some((k, v)) =
                    line.strip_prefix("env=").and_then(|e| e.split_once('='))
                {
                    launch.env.insert(k.to_string(), v.to_string());
                }
            }
            launch
        });
        Run {
            code: out.code,
            stderr: out.stderr,
            launch,
        }
    }

    /// Run expecting a launch; returns it.
    fn launch(&self, with_path_dir: bool, vars: &[(&str, &str)]) -> Launch {
        let run = self.run(with_path_dir, vars);
        assert_eq!(run.code, Some(0), "train.sh failed:\n{}", run.stderr);
        run.launch
            .unwrap_or_else(|| panic!("train.sh started no launcher:\n{}", run.stderr))
    }
}

/// The binary a launch starts: the argument before `train`.
fn binary_of(launch: &Launch) -> String {
    let i = launch
        .args
        .iter()
        .position(|a| a == "train")
        .unwrap_or_else(|| panic!("no `train` argument: {launch:?}"));
    launch.args[i - 1].clone()
}

#[test]
fn the_binary_is_found_in_the_documented_order() {
    let sb = Sandbox::new();
    let explicit = fake_gnnpar(&sb.root.join("explicit/gnnpar"));
    let submit = sb.root.join("submit");
    let submitted = fake_gnnpar(&submit.join("target/release/gnnpar"));
    let on_path = fake_gnnpar(&sb.path_dir().join("gnnpar"));
    let beside = fake_gnnpar(&sb.root.join("project/target/release/gnnpar"));
    let beside_dir = sb.root.join("project/slurm/../target/release/gnnpar");
    let (explicit, submitted, on_path) = (
        explicit.display().to_string(),
        submitted.display().to_string(),
        on_path.display().to_string(),
    );
    let submit_dir = submit.display().to_string();

    // 1. GNNPAR_BIN first, even when every other place has a binary.
    let all = [
        ("GNNPAR_BIN", explicit.as_str()),
        ("SLURM_SUBMIT_DIR", submit_dir.as_str()),
    ];
    assert_eq!(binary_of(&sb.launch(true, &all)), explicit);
    // 2. Then the submit directory's build.
    let no_bin = [("SLURM_SUBMIT_DIR", submit_dir.as_str())];
    assert_eq!(binary_of(&sb.launch(true, &no_bin)), submitted);
    // 3. Then PATH: without SLURM_SUBMIT_DIR, and with one that holds no build.
    assert_eq!(binary_of(&sb.launch(true, &[])), on_path);
    let empty_submit = sb.root.join("work").display().to_string();
    assert_eq!(
        binary_of(&sb.launch(true, &[("SLURM_SUBMIT_DIR", empty_submit.as_str())])),
        on_path
    );
    // 4. Last, the script's own ../target/release/gnnpar.
    assert_eq!(
        Path::new(&binary_of(&sb.launch(false, &[]))),
        beside_dir.as_path()
    );

    // Nowhere: every place is named, in order, and nothing is launched.
    std::fs::remove_file(&beside).unwrap();
    let run = sb.run(false, &[("SLURM_SUBMIT_DIR", empty_submit.as_str())]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.launch.is_none(), "launched without a binary");
    let expected = [
        "gnnpar binary not found. Looked at, in order:".to_string(),
        "  GNNPAR_BIN (unset)".to_string(),
        format!("  {empty_submit}/target/release/gnnpar"),
        "  gnnpar on PATH".to_string(),
        format!("  {}", beside_dir.display()),
    ];
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert!(
        lines.len() > expected.len() && lines[..expected.len()] == expected,
        "not-found message:\n{}",
        run.stderr
    );
    assert!(run.stderr.contains("set GNNPAR_BIN"), "{}", run.stderr);
    // Without SLURM_SUBMIT_DIR the message says so rather than printing a bare path.
    let run = sb.run(false, &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("$SLURM_SUBMIT_DIR/target/release/gnnpar (SLURM_SUBMIT_DIR unset)"),
        "{}",
        run.stderr
    );

    // GNNPAR_BIN set but missing: an error naming it, and no fallback to the binaries that
    // exist elsewhere (the submit directory's, PATH's).
    let missing = sb.root.join("nowhere/gnnpar").display().to_string();
    let run = sb.run(
        true,
        &[
            ("GNNPAR_BIN", missing.as_str()),
            ("SLURM_SUBMIT_DIR", submit_dir.as_str()),
        ],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.launch.is_none(), "fell back to another binary");
    assert!(
        run.stderr.contains(&format!(
            "gnnpar binary not found: GNNPAR_BIN={missing} is not an executable file"
        )) && run.stderr.contains("Only GNNPAR_BIN was checked"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("Looked at, in order") && !run.stderr.contains("on PATH"),
        "the message claims places that were not checked:\n{}",
        run.stderr
    );
    // A directory is not a binary.
    let run = sb.run(false, &[("GNNPAR_BIN", submit_dir.as_str())]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.launch.is_none());
}

#[test]
fn srun_gets_the_mpi_plugin_cpus_and_gpus_of_the_job() {
    let sb = Sandbox::new();
    let bin = fake_gnnpar(&sb.root.join("bin/gnnpar"));
    let bin = bin.display().to_string();
    let base = [("GNNPAR_BIN", bin.as_str()), ("SLURM_JOB_ID", "42")];

    // Defaults: --mpi=pmix, one CPU and thread per task, no GPUs; outputs in gnnpar-<job id>.
    let l = sb.launch(false, &base);
    assert_eq!(l.program, "srun");
    for arg in [
        "--mpi=pmix",
        "--kill-on-bad-exit=1",
        "--cpus-per-task=1",
        "--cpu-bind=cores",
    ] {
        assert!(l.has(arg), "srun without {arg}: {:?}", l.args);
    }
    assert!(
        !l.args.iter().any(|a| a.starts_with("--gpus-per-task")),
        "{:?}",
        l.args
    );
    assert_eq!(l.after("--threads"), Some("1"), "{:?}", l.args);
    assert_eq!(l.after("--data"), Some("data.h5"));
    assert_eq!(l.after("--config"), Some("config.toml"));
    assert_eq!(l.after("--metrics"), Some("gnnpar-42/metrics.jsonl"));
    assert_eq!(l.after("--summary"), Some("gnnpar-42/summary.json"));
    assert_eq!(l.after("--checkpoint"), Some("gnnpar-42/checkpoint.h5"));
    assert!(sb.root.join("work/gnnpar-42").is_dir());
    // The caller's extra options come last, as given.
    assert_eq!(
        l.args[l.args.len() - 2..],
        ["--epochs", "1"],
        "{:?}",
        l.args
    );
    // The step's options come before the binary.
    let bin_at = l.args.iter().position(|a| *a == bin).unwrap();
    assert!(l.args[..bin_at].iter().all(|a| a.starts_with("--")));

    // GNNPAR_SRUN_MPI, CPUs per task and GPUs per task pass through.
    let mut vars = base.to_vec();
    vars.extend([
        ("GNNPAR_SRUN_MPI", "pmi2"),
        ("SLURM_CPUS_PER_TASK", "3"),
        ("SLURM_GPUS_PER_TASK", "1"),
        ("GNNPAR_OUT", "runs/a"),
    ]);
    let l = sb.launch(false, &vars);
    for arg in ["--mpi=pmi2", "--cpus-per-task=3", "--gpus-per-task=1"] {
        assert!(l.has(arg), "srun without {arg}: {:?}", l.args);
    }
    assert!(!l.has("--mpi=pmix"), "{:?}", l.args);
    assert_eq!(l.after("--threads"), Some("3"), "{:?}", l.args);
    assert_eq!(
        l.env.get("RAYON_NUM_THREADS").map(String::as_str),
        Some("3")
    );
    assert_eq!(l.env.get("OMP_NUM_THREADS").map(String::as_str), Some("3"));
    assert_eq!(l.after("--summary"), Some("runs/a/summary.json"));
    assert!(sb.root.join("work/runs/a").is_dir());

    // An unknown launcher is refused.
    let mut vars = base.to_vec();
    vars.push(("GNNPAR_LAUNCHER", "aprun"));
    let run = sb.run(false, &vars);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.launch.is_none());
    assert!(
        run.stderr.contains("unknown GNNPAR_LAUNCHER=aprun"),
        "{}",
        run.stderr
    );
}

#[test]
fn mpirun_gets_the_root_override_only_as_root() {
    let sb = Sandbox::new();
    let bin = fake_gnnpar(&sb.root.join("bin/gnnpar"));
    let bin = bin.display().to_string();
    let job = [
        ("GNNPAR_BIN", bin.as_str()),
        ("GNNPAR_LAUNCHER", "mpirun"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NTASKS_PER_NODE", "2(x2)"),
        ("SLURM_CPUS_PER_TASK", "3"),
    ];

    let mut root = job.to_vec();
    root.push(("FAKE_UID", "0"));
    let l = sb.launch(false, &root);
    assert_eq!(l.program, "mpirun");
    for var in ["OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] {
        assert_eq!(
            l.env.get(var).map(String::as_str),
            Some("1"),
            "{var} as root: {:?}",
            l.env
        );
    }
    assert_eq!(l.after("-np"), Some("4"), "{:?}", l.args);
    assert_eq!(l.after("--map-by"), Some("ppr:2:node:PE=3"), "{:?}", l.args);
    assert_eq!(l.after("--bind-to"), Some("core"), "{:?}", l.args);
    assert_eq!(binary_of(&l), bin);
    assert_eq!(l.after("--threads"), Some("3"), "{:?}", l.args);

    // Not root (the sandbox's default uid is 1000): no override.
    let l = sb.launch(false, &job);
    assert_eq!(l.program, "mpirun");
    for var in ["OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] {
        assert!(
            !l.env.contains_key(var),
            "{var} set for uid 1000: {:?}",
            l.env
        );
    }
}
