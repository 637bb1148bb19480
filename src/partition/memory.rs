//! The memory `gnnpar partition` will need, stated before it reads the arrays: the dataset as
//! held in memory, the adjacency METIS gets, METIS' own working memory, and the relabelling
//! and writing pass, compared with the memory the machine has available.
//!
//! Widths are those of the in-memory types: `indptr` u64, `indices` and split ids `NodeId`
//! (u32), features f32, labels i64, and METIS' `idx_t` for everything METIS gets.

use super::Method;
use crate::graph::format::Header;
use crate::graph::NodeId;
use crate::util::h5;
use anyhow::{Context, Result};
use metis::Idx;
use std::mem::size_of;
use std::path::Path;

/// METIS' own working memory, in multiples of the level-0 graph `G` it holds (`xadj`, `vwgt`,
/// `adjncy`, `adjwgt`). From METIS 5.1's source (`kmetis.c`, `coarsen.c`, `kwayrefine.c`):
///
/// * coarsening stops at `n / (40 log2 k)` vertices (at least `30 k`), and vertices about
///   halve a level, so there are about 7 to 9 levels whatever `n` is;
/// * each level allocates a graph whose `adjncy` and `adjwgt` have the finer level's length,
///   trimmed only when the coarse graph has under 90 % of its edges. On irregular sparse graphs
///   (social, web, R-MAT, SBM) matching merges few edges, so edges shrink slowly and each
///   level costs nearly one `G`: about 6 `G` over the levels (the `cmap` of every level and the
///   per-vertex arrays add little next to the edges);
/// * refinement adds `where`, `bndptr`, `bndind`, a 16-byte `ckrinfo` per vertex and a pool of
///   up to one 8-byte neighbour-part entry per adjacency entry: up to one more `G`.
///
/// Measured (peak RSS of `gnnpar partition` minus the same run with `--method random`, less
/// the input) on 1-2 M-vertex, 10-20 M-edge SBM and R-MAT graphs, 2 to 64 parts: 5.3 to 9.0
/// `G`. Hence 8: the upper end for irregular graphs, so a warning is not missed; graphs with
/// locality (meshes, road networks) coarsen faster and need less.
pub const METIS_WORK_FACTOR: u64 = 8;

/// What is known of a dataset before reading its arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatasetShape {
    pub num_nodes: u64,
    pub num_edges: u64,
    pub feature_dim: u64,
    /// Label columns: 0 without labels, 1 for class labels, `c` for multi-label.
    pub label_width: u64,
    /// Entries of `train_idx`, `val_idx` and `test_idx` together.
    pub split_ids: u64,
    /// `false` when every edge is stored in both directions (the header's `directed`).
    pub directed: bool,
}

impl DatasetShape {
    /// Read the shapes of `path`'s datasets (nothing else is read).
    pub fn read(path: &Path, header: &Header) -> Result<DatasetShape> {
        let file = h5::open(path)?;
        let shapes = || -> Result<(u64, u64)> {
            let label_width = if h5::has(&file, "labels") {
                let s = h5::shape(&file, "labels")?;
                s.get(1).copied().unwrap_or(1) as u64
            } else {
                0
            };
            let mut split_ids = 0u64;
            for name in ["train_idx", "val_idx", "test_idx"] {
                if h5::has(&file, name) {
                    split_ids += h5::shape(&file, name)?.iter().product::<usize>() as u64;
                }
            }
            Ok((label_width, split_ids))
        };
        let (label_width, split_ids) =
            shapes().with_context(|| format!("reading the shapes of `{}`", path.display()))?;
        Ok(DatasetShape {
            num_nodes: header.num_nodes,
            num_edges: header.num_edges,
            feature_dim: header.feature_dim as u64,
            label_width,
            split_ids,
            directed: header.directed,
        })
    }
}

/// Columns of a weights file's `vertex_weights` (its constraints), read from the shape alone;
/// `None` when the file or the dataset cannot be read.
pub fn weights_constraints(path: &Path) -> Option<u64> {
    let file = h5::open(path).ok()?;
    let shape = h5::shape(&file, "vertex_weights").ok()?;
    shape.get(1).map(|&c| c as u64)
}

/// The partitioning job being estimated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub method: Method,
    pub parts: usize,
    /// Vertex constraints METIS balances (columns of `vwgt`).
    pub ncon: u64,
    /// Whether a weights file is given (its arrays are held, and METIS gets edge weights).
    pub weights: bool,
}

/// Bytes, by what holds them. The peak is [`MemoryEstimate::peak`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// indptr, indices, features, labels, splits: held throughout.
    pub dataset: u64,
    /// The weights file's vertex and edge weights (held until METIS returns).
    pub weights: u64,
    /// Entries of the symmetrised adjacency counted: `m` for an undirected dataset (every
    /// edge stored both ways merges into one entry per endpoint), else the bound `2m` (see
    /// [`super::symmetric::adjacency_bound`]); 0 without METIS.
    pub adjacency_entries: u64,
    /// What gnnpar hands METIS: `xadj`, `adjncy`, `adjwgt` (with weights), `vwgt`.
    pub metis_input: u64,
    /// METIS' own allocations: `adjwgt` of ones when none is given, and
    /// [`METIS_WORK_FACTOR`] × the level-0 graph.
    pub metis_working: u64,
    /// The part of every vertex, both id maps, and one part's copy being written.
    pub relabel_write: u64,
}

impl MemoryEstimate {
    /// The dataset and weights are held while either METIS or the writing pass runs; the
    /// METIS arrays are freed before relabelling starts. Symmetrising needs less than METIS
    /// does (its scratch: 8 bytes per vertex and 4, or 8 with weights, per entry of the bound
    /// `2m`, plus the final arrays; METIS' phase is at least 16 bytes per entry of `E ≥ m`
    /// plus three times that again), so it never sets the peak and is left out.
    pub fn peak(&self) -> u64 {
        self.dataset.saturating_add(self.weights).saturating_add(
            (self.metis_input.saturating_add(self.metis_working)).max(self.relabel_write),
        )
    }
}

/// `a × b × width` bytes, saturating (the estimate must not overflow on absurd headers).
fn bytes(a: u64, b: u64, width: usize) -> u64 {
    a.saturating_mul(b).saturating_mul(width as u64)
}

/// Saturating sum.
fn sum(terms: &[u64]) -> u64 {
    terms.iter().fold(0u64, |a, &b| a.saturating_add(b))
}

/// Estimate the memory of partitioning a dataset of `shape` as `job` says.
pub fn estimate(shape: &DatasetShape, job: &Job) -> MemoryEstimate {
    let (n, m) = (shape.num_nodes, shape.num_edges);
    let rows = n.saturating_add(1);
    let dataset = sum(&[
        bytes(rows, 1, size_of::<u64>()),               // indptr
        bytes(m, 1, size_of::<NodeId>()),               // indices
        bytes(n, shape.feature_dim, size_of::<f32>()),  // features
        bytes(n, shape.label_width, size_of::<i64>()),  // labels
        bytes(shape.split_ids, 1, size_of::<NodeId>()), // train/val/test ids
    ]);
    let metis = job.method == Method::Metis;
    let weights = if metis && job.weights {
        sum(&[
            bytes(n, job.ncon, size_of::<i64>()),
            bytes(m, 1, size_of::<i64>()),
        ])
    } else {
        0
    };
    let (mut adjacency_entries, mut metis_input, mut metis_working) = (0, 0, 0);
    if metis && job.parts > 1 {
        let e = if shape.directed {
            super::symmetric::adjacency_bound(m)
        } else {
            m
        };
        let idx = size_of::<Idx>();
        let xadj = bytes(rows, 1, idx);
        let adjncy = bytes(e, 1, idx);
        let adjwgt = bytes(e, 1, idx);
        let vwgt = bytes(n, job.ncon, idx);
        let given_adjwgt = if job.weights { adjwgt } else { 0 };
        metis_input = sum(&[xadj, adjncy, given_adjwgt, vwgt]);
        // METIS always holds an `adjwgt`, allocating ones when none is given.
        let level0 = sum(&[xadj, adjncy, adjwgt, vwgt]);
        metis_working = sum(&[
            adjwgt - given_adjwgt,
            level0.saturating_mul(METIS_WORK_FACTOR),
        ]);
        adjacency_entries = e;
    }
    // `part` (u32) and `new_id` / `orig_id` (NodeId) per vertex, and one part's dataset at a
    // time (about the dataset over the parts, balanced).
    let relabel_write = bytes(n, 1, size_of::<u32>() + 2 * size_of::<NodeId>())
        .saturating_add(dataset.div_ceil(job.parts.max(1) as u64));
    MemoryEstimate {
        dataset,
        weights,
        adjacency_entries,
        metis_input,
        metis_working,
        relabel_write,
    }
}

/// `bytes` for people: B, KiB, MiB, GiB or TiB with one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The one log line stating the estimate, and the warning when it exceeds `available` bytes
/// (`MemAvailable`, or less under a cgroup limit; `None` where unknown). Returns the line (for
/// tests).
pub fn report(est: &MemoryEstimate, available: Option<u64>) -> String {
    let mut line = format!(
        "memory estimate: about {} at peak = dataset {} (indptr, indices, features, labels, \
         splits)",
        human(est.peak()),
        human(est.dataset)
    );
    if est.weights > 0 {
        line += &format!(" + weights file {}", human(est.weights));
    }
    if est.metis_input > 0 {
        line += &format!(
            " + METIS input {} (xadj, vwgt, adjncy{} for at most {} entries) + METIS working \
             ~{} ({METIS_WORK_FACTOR}× its graph: coarsening levels, refinement); then \
             relabelling and writing {} instead of METIS",
            human(est.metis_input),
            if est.weights > 0 { ", adjwgt" } else { "" },
            est.adjacency_entries,
            human(est.metis_working),
            human(est.relabel_write)
        );
    } else {
        line += &format!(" + relabelling and writing {}", human(est.relabel_write));
    }
    line += &match available {
        Some(a) => format!("; {} available", human(a)),
        None => "; available memory unknown (no /proc/meminfo, no cgroup limit)".to_string(),
    };
    log::info!("{line}");
    if let Some(a) = available {
        if est.peak() > a {
            log::warn!(
                "partitioning may need about {} but only {} is available: it may \
                 swap or be killed. Use a machine with more memory, or --method random|hash \
                 (no adjacency, no METIS)",
                human(est.peak()),
                human(a)
            );
        }
    }
    line
}

/// [`crate::util::rss::available_memory_mb`] in bytes, `None` where unknown.
pub fn available_bytes() -> Option<u64> {
    crate::util::rss::available_memory_mb().map(|mb| (mb * 1024.0 * 1024.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: u64, m: u64) -> DatasetShape {
        DatasetShape {
            num_nodes: n,
            num_edges: m,
            feature_dim: 4,
            label_width: 1,
            split_ids: 7,
            directed: true,
        }
    }

    fn job(method: Method, weights: bool) -> Job {
        Job {
            method,
            parts: 2,
            ncon: if weights { 2 } else { 3 },
            weights,
        }
    }

    #[test]
    fn small_case_by_hand() {
        // n = 10, m = 30, 4 features, class labels, 7 split ids.
        // dataset: indptr 8·11 + indices 4·30 + features 4·10·4 + labels 8·10 + splits 4·7
        //        = 88 + 120 + 160 + 80 + 28 = 476.
        let est = estimate(&shape(10, 30), &job(Method::Metis, false));
        assert_eq!(est.dataset, 476);
        assert_eq!(est.weights, 0);
        // Adjacency bound 2m = 60 entries. Input: xadj 4·11 + adjncy 4·60 + vwgt 4·10·3
        // = 44 + 240 + 120 = 404. Level-0 graph adds METIS' adjwgt of ones: 404 + 240 = 644;
        // working = 240 + 8·644 = 5392.
        assert_eq!(est.adjacency_entries, 60);
        assert_eq!(est.metis_input, 404);
        assert_eq!(est.metis_working, 5392);
        // part + new_id + orig_id 12·10 + one part ⌈476 / 2⌉ = 120 + 238.
        assert_eq!(est.relabel_write, 358);
        assert_eq!(est.peak(), 476 + 404 + 5392);

        // With a weights file (2 constraints): vertex weights 8·10·2 + edge weights 8·30 =
        // 400; METIS gets adjwgt: input 44 + 240 + 240 + 4·10·2 = 604 = its level-0 graph;
        // working 8·604 = 4832.
        let est = estimate(&shape(10, 30), &job(Method::Metis, true));
        assert_eq!(est.weights, 400);
        assert_eq!(est.metis_input, 604);
        assert_eq!(est.metis_working, 4832);
        assert_eq!(est.peak(), 476 + 400 + 604 + 4832);

        // The baselines hold the dataset and write.
        for method in [Method::Random, Method::Hash] {
            let est = estimate(&shape(10, 30), &job(method, false));
            assert_eq!(
                est,
                MemoryEstimate {
                    dataset: 476,
                    relabel_write: 358,
                    ..Default::default()
                }
            );
            assert_eq!(est.peak(), 476 + 358);
        }
        // Undirected (both directions stored): m = 30 entries. Input 44 + 120 + 120 = 284,
        // level-0 graph 284 + 120 = 404, working 120 + 8·404 = 3352.
        let mut undirected = shape(10, 30);
        undirected.directed = false;
        let est = estimate(&undirected, &job(Method::Metis, false));
        assert_eq!(est.adjacency_entries, 30);
        assert_eq!(est.metis_input, 284);
        assert_eq!(est.metis_working, 3352);
        // One part: METIS is not called.
        let mut one = job(Method::Metis, false);
        one.parts = 1;
        let est = estimate(&shape(10, 30), &one);
        assert_eq!((est.metis_input, est.metis_working), (0, 0));
    }

    #[test]
    fn grows_with_every_input() {
        let base = estimate(&shape(10, 30), &job(Method::Metis, false)).peak();
        // Each extra edge: 4 (indices) + 2 entries × (4 adjncy + 4 adjwgt ones + 8·(4 + 4)).
        assert_eq!(
            estimate(&shape(10, 31), &job(Method::Metis, false)).peak(),
            base + 4 + 2 * (4 + 4 + 8 * 8)
        );
        let mut wider = shape(10, 30);
        wider.feature_dim = 5;
        assert_eq!(
            estimate(&wider, &job(Method::Metis, false)).peak(),
            base + 10 * 4
        );
        let mut multi = shape(10, 30);
        multi.label_width = 3;
        assert_eq!(
            estimate(&multi, &job(Method::Metis, false)).peak(),
            base + 10 * 2 * 8
        );
        assert!(estimate(&shape(11, 30), &job(Method::Metis, false)).peak() > base);
        // Absurd headers saturate instead of overflowing.
        assert_eq!(
            estimate(
                &shape(u64::MAX / 2, u64::MAX / 2),
                &job(Method::Metis, true)
            )
            .peak(),
            u64::MAX
        );
    }

    #[test]
    fn report_states_the_estimate_and_the_available_memory() {
        let est = estimate(&shape(10, 30), &job(Method::Metis, false));
        let line = report(&est, Some(1 << 30));
        assert!(
            line.starts_with("memory estimate: about 6.1 KiB at peak"),
            "{line}"
        );
        assert!(line.contains("dataset 476 B"), "{line}");
        assert!(line.contains("METIS working ~5.3 KiB"), "{line}");
        assert!(line.contains("1.0 GiB available"), "{line}");
        assert!(report(&est, None).contains("available memory unknown"));
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 40), "3.0 TiB");
    }
}
