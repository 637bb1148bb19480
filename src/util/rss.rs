//! Peak resident memory of this process, for the JSON summaries of commands and benchmarks.

/// Peak resident set size of this process in MiB (`VmHWM` of `/proc/self/status`, else
/// `getrusage`'s `ru_maxrss`), or `None` where neither is available.
pub fn peak_rss_mb() -> Option<f64> {
    from_proc_status().or_else(from_getrusage)
}

/// Memory the kernel says can be allocated without swapping (`MemAvailable` of
/// `/proc/meminfo`), in MiB; `None` where unknown.
pub fn available_memory_mb() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_kib_field(&info, "MemAvailable:").map(|kib| kib as f64 / 1024.0)
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
