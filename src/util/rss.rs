//! Peak resident memory of this process, for the JSON summaries of commands and benchmarks.

/// Peak resident set size of this process in MiB (`VmHWM` of `/proc/self/status`, else
/// `getrusage`'s `ru_maxrss`), or `None` where neither is available.
pub fn peak_rss_mb() -> Option<f64> {
    from_proc_status().or_else(from_getrusage)
}

fn from_proc_status() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm_kib(&status).map(|kib| kib as f64 / 1024.0)
}

/// The `VmHWM:  <n> kB` value of a `/proc/<pid>/status` text, in KiB.
fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut words = line["VmHWM:".len()..].split_whitespace();
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
    fn parses_vm_hwm() {
        let status = "Name:\tgnnpar\nVmPeak:\t  9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm_kib(status), Some(2048));
        assert_eq!(parse_vm_hwm_kib("VmRSS: 5 kB\n"), None);
        assert_eq!(parse_vm_hwm_kib("VmHWM: x kB\n"), None);
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
