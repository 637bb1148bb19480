//! The CUDA C sources of the backend's kernels (`cuda/*.cu` and the header they share),
//! embedded in the binary so that the crate builds without a CUDA toolkit and a run compiles
//! them once at start (NVRTC on a GPU, g++ under the emulator), and the launch shapes the
//! wrappers in [`super::ops`] use.
//!
//! Every kernel is `extern "C" __global__ void gnn_…(…)` with plain pointer, integer and float
//! parameters; each `.cu` file includes `common.cuh` (headers are listed first, so a compiler that
//! takes headers by name finds them). Kernel names are unique across files.

use super::gpu::Launch;

/// `(file name, text)` of every source in `cuda/`: the header first, then the kernels.
pub const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../../../cuda/common.cuh")),
    ("edge_sum.cuh", include_str!("../../../cuda/edge_sum.cuh")),
    ("activation.cu", include_str!("../../../cuda/activation.cu")),
    ("adam.cu", include_str!("../../../cuda/adam.cu")),
    ("aggregate.cu", include_str!("../../../cuda/aggregate.cu")),
    ("dropout.cu", include_str!("../../../cuda/dropout.cu")),
    (
        "elementwise.cu",
        include_str!("../../../cuda/elementwise.cu"),
    ),
    ("epilogue.cu", include_str!("../../../cuda/epilogue.cu")),
    ("gat.cu", include_str!("../../../cuda/gat.cu")),
    ("gather.cu", include_str!("../../../cuda/gather.cu")),
    ("layernorm.cu", include_str!("../../../cuda/layernorm.cu")),
    ("loss.cu", include_str!("../../../cuda/loss.cu")),
    ("reduce.cu", include_str!("../../../cuda/reduce.cu")),
    ("sparse.cu", include_str!("../../../cuda/sparse.cu")),
];

/// The headers among [`SOURCES`] (included by name, not compiled on their own).
pub fn headers() -> impl Iterator<Item = (&'static str, &'static str)> {
    SOURCES
        .iter()
        .copied()
        .filter(|(name, _)| name.ends_with(".cuh"))
}

/// The compilation units among [`SOURCES`].
pub fn units() -> impl Iterator<Item = (&'static str, &'static str)> {
    SOURCES
        .iter()
        .copied()
        .filter(|(name, _)| name.ends_with(".cu"))
}

/// Threads per block of every launch (8 warps).
pub const THREADS: u32 = 256;

/// The most blocks a grid-stride launch asks for: 8 waves of 8 resident 256-thread blocks on
/// a 132-SM H100, plenty to hide latency; more would only add scheduling.
const MAX_BLOCKS: usize = 8192;

/// One thread per item (grid-stride beyond [`MAX_BLOCKS`] blocks).
pub fn per_thread(items: usize) -> Launch {
    Launch::blocks(
        items.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
        THREADS,
    )
}

/// One warp per item (a row), grid-stride beyond [`MAX_BLOCKS`] blocks.
pub fn per_warp(items: usize) -> Launch {
    per_thread(items.saturating_mul(32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_is_embedded_and_names_are_unique() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("cuda/")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(
            embedded, on_disk,
            "kernels.rs must embed every file of cuda/"
        );
        let mut names = Vec::new();
        for (_, text) in units() {
            for part in text.split("extern \"C\" __global__ void ").skip(1) {
                names.push(part.split('(').next().unwrap().trim().to_string());
            }
        }
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "kernel names repeat: {names:?}");
        assert!(names.iter().all(|n| n.starts_with("gnn_")), "{names:?}");
        let headers_on_disk = on_disk.iter().filter(|n| n.ends_with(".cuh")).count();
        assert_eq!(headers().count(), headers_on_disk);
        assert_eq!(SOURCES[0].0, "common.cuh", "the shared header comes first");
    }

    #[test]
    fn launches_cover_their_items() {
        let l = per_thread(1000);
        assert_eq!((l.grid.0, l.block.0), (4, 256));
        assert_eq!(per_warp(9).grid.0, 2);
        assert_eq!(per_thread(0).grid.0, 1);
        assert_eq!(per_thread(usize::MAX / 2).grid.0 as usize, MAX_BLOCKS);
    }
}
