//! Peak resident memory of this process, for the JSON summaries of commands and benchmarks,
//! and the memory it may still allocate, for refusing work that cannot fit.

use std::path::Path;

/// Peak resident set size of this process in MiB (`VmHWM` of `/proc/self/status`, else
/// `getrusage`'s `ru_maxrss`), or `None` where neither is available.
pub fn peak_rss_mb() -> Option<f64> {
    from_proc_status().or_else(from_getrusage)
}

/// Memory this process may still allocate, in MiB: what the kernel says can be allocated
/// without swapping (`MemAvailable` of `/proc/meminfo`), or less where a memory cgroup (a
/// Slurm job's, a container's) leaves less room under its limit; `None` where unknown.
pub fn available_memory_mb() -> Option<f64> {
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| parse_kib_field(&info, "MemAvailable:"))
        .map(|kib| kib.saturating_mul(1024));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|own| cgroup_headroom_bytes(&own, Path::new("/sys/fs/cgroup")));
    let bytes = match (host, cgroup) {
        (Some(h), Some(c)) => h.min(c),
        (h, c) => h.or(c)?,
    };
    Some(bytes as f64 / (1024.0 * 1024.0))
}

/// Room left under the tightest memory limit of this process's cgroup and its ancestors, in
/// bytes: limit less usage, where usage leaves out the inactive page cache the kernel reclaims
/// before it kills anything. `own` is `/proc/self/cgroup`, `root` where the cgroup file systems
/// are mounted. Both versions are read: v2's `memory.max` / `memory.current` (line `0::path`)
/// and v1's `memory.limit_in_bytes` / `memory.usage_in_bytes` (the `memory` controller's line,
/// under `root/memory`). A directory that does not exist (a container that sees its own cgroup
/// as the root but the host's path in `own`) is passed over on the way up. `None` where no
/// limit is set.
fn cgroup_headroom_bytes(own: &str, root: &Path) -> Option<u64> {
    struct Version<'a> {
        base: std::path::PathBuf,
        path: &'a str,
        limit: &'static str,
        usage: &'static str,
        inactive: &'static str,
    }
    let mut versions = Vec::new();
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            versions.push(Version {
                base: root.to_path_buf(),
                path,
                limit: "memory.max",
                usage: "memory.current",
                inactive: "inactive_file",
            });
        } else if controllers.split(',').any(|c| c == "memory") {
            versions.push(Version {
                base: root.join("memory"),
                path,
                limit: "memory.limit_in_bytes",
                usage: "memory.usage_in_bytes",
                // v1's own `inactive_file` leaves out the children's; the total counts them,
                // as the usage does.
                inactive: "total_inactive_file",
            });
        }
    }
    let read_number = |dir: &Path, file: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let mut tightest: Option<u64> = None;
    for v in &versions {
        let mut dir = v.base.join(v.path.trim_start_matches('/'));
        loop {
            // "max" (v2) does not parse; v1 writes "no limit" as a number near 2^63.
            if let Some(limit) = read_number(&dir, v.limit).filter(|&l| l < 1 << 60) {
                let usage = read_number(&dir, v.usage).unwrap_or(0);
                let inactive = std::fs::read_to_string(dir.join("memory.stat"))
                    .ok()
                    .and_then(|stat| stat_field(&stat, v.inactive))
                    .unwrap_or(0);
                let room = limit.saturating_sub(usage.saturating_sub(inactive));
                tightest = Some(tightest.map_or(room, |t| t.min(room)));
            }
            if dir == v.base || !dir.pop() || !dir.starts_with(&v.base) {
                break;
            }
        }
    }
    tightest
}

/// The value of a `<key> <n>` line of a cgroup's `memory.stat`.
fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// Refuse, before allocating, work that needs about `need_bytes` when less memory is available
/// (an allocation failure would abort the process without a message). `what` says what needs
/// it; where the available memory is unknown, nothing is refused.
pub fn check_available(need_bytes: u64, what: impl FnOnce() -> String) -> anyhow::Result<()> {
    check_fits(need_bytes, available_memory_mb(), what)
}

/// [`check_available`] against `available_mb` MiB.
pub fn check_fits(
    need_bytes: u64,
    available_mb: Option<f64>,
    what: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let need_mb = need_bytes as f64 / (1024.0 * 1024.0);
    if let Some(available_mb) = available_mb {
        if need_mb > available_mb {
            anyhow::bail!(
                "{} needs about {need_mb:.0} MiB but only {available_mb:.0} MiB of memory are \
                 available",
                what()
            );
        }
    }
    Ok(())
}

fn from_proc_status() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_kib_field(&status, "VmHWM:").map(|kib| kib as f64 / 1024.0)
}

/// The value of a `<field> <n> kB` line of a `/proc` text (`field` includes the colon), in KiB.
fn parse_kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let mut words = line[field.len()..].split_whitespace();
    let value = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(value)
}

fn from_getrusage() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; it is zero-initialised, so it is a valid
    // `rusage` even if the call fails.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: zero-initialised and possibly filled by the kernel: valid either way.
    let max_rss = unsafe { usage.assume_init() }.ru_maxrss;
    // Linux reports KiB, macOS bytes.
    let kib = if cfg!(target_os = "macos") {
        max_rss as f64 / 1024.0
    } else {
        max_rss as f64
    };
    (kib > 0.0).then_some(kib / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_is_available() {
        let e = check_fits(3 << 30, Some(1024.0), || "importing `x`".to_string()).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("importing `x` needs about 3072 MiB"), "{e}");
        assert!(e.contains("only 1024 MiB"), "{e}");
        assert!(check_fits(1 << 30, Some(1024.0), || unreachable!()).is_ok());
        assert!(check_fits(u64::MAX, None, || unreachable!()).is_ok());
    }

    /// A fake cgroup tree under a temporary directory: `files` are (path under root, text).
    fn cgroup_tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_v2_cgroup_limit_leaves_limit_less_working_set_and_the_tightest_ancestor_wins() {
        const MIB: u64 = 1 << 20;
        let own = "0::/job_7/step_0/task_1\n";
        let tree = cgroup_tree(&[
            ("memory.max", "max\n"),
            ("job_7/memory.max", &format!("{}\n", 1000 * MIB)),
            ("job_7/memory.current", &format!("{}\n", 400 * MIB)),
            (
                "job_7/memory.stat",
                &format!("anon 1\ninactive_file {}\n", 100 * MIB),
            ),
            ("job_7/step_0/memory.max", "max\n"),
            (
                "job_7/step_0/task_1/memory.max",
                &format!("{}\n", 5000 * MIB),
            ),
            (
                "job_7/step_0/task_1/memory.current",
                &format!("{}\n", 10 * MIB),
            ),
        ]);
        // The job's 1000 MiB less 300 MiB used (400 less 100 reclaimable cache).
        assert_eq!(cgroup_headroom_bytes(own, tree.path()), Some(700 * MIB));
        // No limit anywhere: nothing to say.
        let open = cgroup_tree(&[("memory.max", "max\n"), ("a/memory.max", "max\n")]);
        assert_eq!(cgroup_headroom_bytes("0::/a\n", open.path()), None);
        // Usage above the limit leaves no room, rather than wrapping around.
        let over = cgroup_tree(&[("memory.max", "100\n"), ("memory.current", "150\n")]);
        assert_eq!(cgroup_headroom_bytes("0::/\n", over.path()), Some(0));
    }

    #[test]
    fn a_v1_memory_cgroup_is_read_under_its_controller_and_a_missing_path_falls_to_the_root() {
        const MIB: u64 = 1 << 20;
        let own = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n";
        // The container sees its own cgroup as the root: `docker/abc` does not exist in it.
        let tree = cgroup_tree(&[
            ("memory/memory.limit_in_bytes", &format!("{}\n", 2048 * MIB)),
            ("memory/memory.usage_in_bytes", &format!("{}\n", 1024 * MIB)),
            (
                "memory/memory.stat",
                &format!("inactive_file 1\ntotal_inactive_file {}\n", 24 * MIB),
            ),
        ]);
        assert_eq!(cgroup_headroom_bytes(own, tree.path()), Some(1048 * MIB));
        // v1's "no limit" is a number near 2^63.
        let unlimited = cgroup_tree(&[("memory/memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(cgroup_headroom_bytes(own, unlimited.path()), None);
        assert_eq!(stat_field("a 1\nab 2\n", "ab"), Some(2));
        assert_eq!(stat_field("a x\n", "a"), None);
    }

    #[test]
    fn parses_vm_hwm() {
        let status = "Name:\tgnnpar\nVmPeak:\t  9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_kib_field(status, "VmHWM:"), Some(2048));
        assert_eq!(parse_kib_field("VmRSS: 5 kB\n", "VmHWM:"), None);
        assert_eq!(parse_kib_field("VmHWM: x kB\n", "VmHWM:"), None);
        assert!(available_memory_mb().is_some_and(|mb| mb > 0.0));
    }

    #[test]
    fn peak_grows_after_touching_memory() {
        let before = peak_rss_mb().expect("peak RSS is readable on this platform");
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let after = peak_rss_mb().unwrap();
        assert!(
            after >= before && after >= 64.0,
            "before {before} after {after}"
        );
    }
}
