//! Evicting the host's caches between timed calls, so that an operator is timed as a training
//! step runs it: after the step's other phases have filled the caches with their own data.

use std::path::Path;

/// The buffer is this many times the largest cache, so that a pass leaves none of the
/// timed call's data in it.
const CACHE_MULTIPLE: usize = 2;
/// Bounds of the buffer: a host that reports no cache sizes gets the lower one.
const MIN_BYTES: usize = 32 << 20;
const MAX_BYTES: usize = 1 << 30;

/// A buffer larger than the host's largest cache; [`Evictor::evict`] writes through it.
pub struct Evictor {
    buffer: Vec<u64>,
}

impl Evictor {
    /// A buffer of twice the largest cache `sysfs` reports for CPU 0.
    pub fn for_host() -> Evictor {
        let bytes = (host_cache_bytes().unwrap_or(0) * CACHE_MULTIPLE).clamp(MIN_BYTES, MAX_BYTES);
        Evictor {
            buffer: vec![1; bytes / 8],
        }
    }

    /// Bytes written by each [`Evictor::evict`].
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.buffer.len() * 8
    }

    /// Write one word of every cache line of the buffer: the lines it displaces are dirty
    /// ones of its own afterwards, as a step's freshly written matrices are.
    pub fn evict(&mut self) {
        for (i, word) in self.buffer.iter_mut().enumerate().step_by(8) {
            *word = word.wrapping_add(i as u64);
        }
        std::hint::black_box(&self.buffer);
    }
}

/// The largest data or unified cache `sysfs` reports for CPU 0 (its last level, which the
/// cores of its package share), `None` where it reports none.
pub fn host_cache_bytes() -> Option<usize> {
    largest_cache_bytes(Path::new("/sys/devices/system/cpu/cpu0/cache"))
}

/// The largest data or unified cache below the last level that `sysfs` reports for CPU 0
/// (its L2 on the hosts gnnpar ran on, a core's own or a pair's), the only one where it
/// reports one size, `None` where it reports none.
pub fn private_cache_bytes() -> Option<usize> {
    below_largest_cache_bytes(Path::new("/sys/devices/system/cpu/cpu0/cache"))
}

/// The largest data or unified cache under `dir` (`index*/size`, as "107520K"), in bytes.
fn largest_cache_bytes(dir: &Path) -> Option<usize> {
    cache_sizes(dir).last().copied()
}

/// The largest data or unified cache under `dir` smaller than the largest; the largest where
/// every level is as large.
fn below_largest_cache_bytes(dir: &Path) -> Option<usize> {
    let sizes = cache_sizes(dir);
    let largest = *sizes.last()?;
    Some(
        sizes
            .iter()
            .rev()
            .copied()
            .find(|&s| s < largest)
            .unwrap_or(largest),
    )
}

/// The sizes of the data and unified caches under `dir` (`index*/size`), ascending.
fn cache_sizes(dir: &Path) -> Vec<usize> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut sizes: Vec<usize> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter(|e| {
            std::fs::read_to_string(e.path().join("type")).is_ok_and(|t| t.trim() != "Instruction")
        })
        .filter_map(|e| parse_size(&std::fs::read_to_string(e.path().join("size")).ok()?))
        .collect();
    sizes.sort_unstable();
    sizes
}

/// "48K", "2048K", "105M" or a plain byte count.
fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 1 << 10),
        'M' => (&t[..t.len() - 1], 1 << 20),
        'G' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<usize>().ok().map(|n| n * unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_within_its_bounds_and_evicting_writes_it() {
        let mut e = Evictor::for_host();
        assert!((MIN_BYTES..=MAX_BYTES).contains(&e.bytes()));
        e.evict();
        assert_eq!(e.buffer[8], 1 + 8);
        assert_eq!(e.buffer[9], 1, "one word a cache line");
    }

    #[test]
    fn sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("48K\n"), Some(48 << 10));
        assert_eq!(parse_size("105M"), Some(105 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("big"), None);
    }

    #[test]
    fn the_largest_data_or_unified_cache_is_found_and_instruction_caches_are_not() {
        let dir = std::env::temp_dir().join(format!("gnnpar-evict-{}", std::process::id()));
        for (index, kind, size) in [
            (0, "Data", "48K"),
            (1, "Instruction", "900M"),
            (2, "Unified", "2048K"),
            (3, "Unified", "107520K"),
        ] {
            let d = dir.join(format!("index{index}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        assert_eq!(largest_cache_bytes(&dir), Some(107520 << 10));
        assert_eq!(below_largest_cache_bytes(&dir), Some(2048 << 10));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(largest_cache_bytes(&dir), None);
        assert_eq!(below_largest_cache_bytes(&dir), None);
    }
}
