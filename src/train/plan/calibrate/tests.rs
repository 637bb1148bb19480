//! The calibration's own arithmetic: costs per row, far shares.

use super::gathers::SWEPT_GATHER;
use super::*;

#[test]
fn the_cost_per_row_is_the_median_extra_time_over_the_extra_rows() {
    // At 1 MiB: 4096 rows of 64 columns, 16384 of 16: 12288 more rows. Extra times of
    // 1.2288 ms, 2.4576 ms and (noise) less than the wide rows' give 100 ns, 200 ns and 0.
    let mib = 1048576.0;
    let wide = [[mib, 1e-3], [mib, 1e-3], [mib, 1e-3]];
    let narrow = [
        [mib, 1e-3 + 1.2288e-3],
        [mib, 1e-3 + 2.4576e-3],
        [mib, 0.9e-3],
    ];
    assert!((per_row(&wide, &narrow) - 1e-7).abs() < 1e-15);
    // One rank (no points): no cost per row.
    assert_eq!(per_row(&[], &[]), 0.0);
}

/// Each swept table's gather as a share of the way from the near gathers' time for the
/// same rows to the far ones', between a 0 at the near table and a 1 at the far table,
/// never falling; nothing where the far gather is no slower.
#[test]
fn far_shares_place_each_table_between_the_near_and_far_gathers() {
    let (rows, width) = SWEPT_GATHER;
    let bytes = (rows * width * 4) as f64;
    let fit = |seconds: f64| Fit {
        points: vec![[256.0, 1e-6], [rows as f64, seconds]],
        point_bytes: vec![256.0 * 512.0, bytes],
        ..Fit::free("row")
    };
    let mib = (1usize << 20) as f64;
    // The last table is the far one's size (4× a 64 MiB cache): left to the far point.
    let tables = [
        [32.0 * mib, 2e-3],
        [64.0 * mib, 1.5e-3],
        [128.0 * mib, 5e-3],
        [256.0 * mib, 2e-3],
    ];
    let cache = 64 << 20;
    let shares = far_shares(&fit(1e-3), &fit(3e-3), &tables, cache);
    assert_eq!(
        shares,
        vec![
            [16.0 * mib, 0.0],
            [32.0 * mib, 0.5],
            [64.0 * mib, 0.5],
            [128.0 * mib, 1.0],
            [256.0 * mib, 1.0],
        ]
    );
    assert!(far_shares(&fit(3e-3), &fit(3e-3), &tables, cache).is_empty());
    assert!(far_shares(&Fit::free("row"), &fit(3e-3), &tables, cache).is_empty());
}

/// The windowed sampler is timed where a rank would sample in windows (4 threads here): a
/// point per seed count, the window's edges growing with the seeds; on fewer threads than
/// `sample_ahead::MIN_THREADS` there is nothing to time.
#[test]
fn the_windowed_sampler_is_timed_where_a_rank_samples_in_windows() {
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| {
                let world = crate::comm::World::solo();
                (calibrated_window(&world), sample_ahead_points(&world, None))
            })
    };
    assert_eq!(on(2), (1, vec![]));
    // The owner-routed windows need other ranks to route to.
    let solo = crate::comm::World::solo();
    assert!(super::sampler::routed_ahead_points(&solo, None).is_empty());
    let (window, points) = on(4);
    assert_eq!(window, 4);
    assert_eq!(points.len(), 4);
    for pair in points.windows(2) {
        assert!(pair[1][0] > pair[0][0], "{points:?}");
    }
    // Two hops of fanouts 10 and 5 from 128 seeds, four batches: at most 1,280 edges and
    // then 5 for each of the (128 + 1,280) sources a batch.
    let most = 4.0 * (1280.0 + 5.0 * 1408.0);
    assert!(
        points[0][0] > 4.0 * 1280.0 && points[0][0] <= most,
        "{points:?}"
    );
    assert!(points.iter().all(|p| p[1] > 0.0), "{points:?}");
}

/// The sampler's synthetic graph, cut as ranks hold it: each part is a CSR of its own rows,
/// `SYNTHETIC_DEGREE` neighbours each, with global ids within the graph, and the parts'
/// rows put together are the whole graph's.
#[test]
fn the_samplers_synthetic_parts_are_the_whole_graphs_rows() {
    use crate::sample::{Adjacency, LocalGraph};
    let n = 1000;
    let whole = sampler::synthetic_part(n, 16, 0, n);
    let (a, b) = (
        sampler::synthetic_part(n, 16, 0, 400),
        sampler::synthetic_part(n, 16, 400, n),
    );
    assert_eq!((a.local_nodes(), b.local_nodes()), (400, 600));
    let (gw, ga, gb) = (
        LocalGraph::new(&whole, None),
        LocalGraph::new(&a, None),
        LocalGraph::new(&b, None),
    );
    for v in 0..n as crate::graph::NodeId {
        let part = if v < 400 { &ga } else { &gb };
        assert!(part.owns(v) && !(if v < 400 { &gb } else { &ga }).owns(v));
        assert_eq!(part.neighbors(v), gw.neighbors(v), "vertex {v}");
        assert_eq!(gw.neighbors(v).len(), 16);
        assert!(gw.neighbors(v).iter().all(|&u| (u as usize) < n));
    }
    // Pseudo-random, not a pattern the sampler's de-duplication would flatter.
    let distinct: std::collections::HashSet<_> = whole.graph.indices.iter().collect();
    assert!(
        distinct.len() > 9 * n / 10,
        "{} distinct ids",
        distinct.len()
    );
}

/// The sampler's points cover two synthetic graphs, each batch's destination vertices kept
/// beside its edges: about 0.18 an edge on the denser graph (fanouts 10 and 5 from 16
/// neighbours), 0.5 on the sparser (every neighbour of 2), so that a fit can tell the two
/// costs apart.
#[test]
fn the_sampler_is_timed_over_two_graphs_with_its_vertices() {
    let world = World::solo();
    let (points, vertices) = sampler::sample_points(&world, None);
    assert_eq!(points.len(), 8);
    assert_eq!(vertices.len(), 8);
    for (i, (p, v)) in points.iter().zip(&vertices).enumerate() {
        let per_edge = v / p[0];
        let want = if i < 4 { 11.0 / 60.0 } else { 0.5 };
        assert!((per_edge - want).abs() < 0.02, "point {i}: {per_edge}");
        assert!(p[1] > 0.0);
    }
}

/// The sparse products' columns follow Zipf's law as a bag-of-words matrix's do: the hottest
/// column draws about 1/H(4096) of the non-zeros, the top 5 % about two thirds, and nearly
/// every column is drawn (no two ranks map onto one column).
#[test]
fn sparse_product_columns_are_drawn_by_zipfs_law() {
    let cols = 4096;
    let draws = kernels::zipf_columns(cols * 41, cols);
    assert_eq!(
        draws,
        kernels::zipf_columns(cols * 41, cols),
        "deterministic"
    );
    let mut counts = vec![0usize; cols];
    for &j in &draws {
        counts[j] += 1;
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let share = |top: usize| counts[..top].iter().sum::<usize>() as f64 / draws.len() as f64;
    let harmonic: f64 = (1..=cols).map(|r| 1.0 / r as f64).sum();
    assert!((share(1) - 1.0 / harmonic).abs() < 0.01, "{}", share(1));
    assert!(
        (0.62..0.70).contains(&share(cols / 20)),
        "{}",
        share(cols / 20)
    );
    assert!(counts.iter().filter(|&&c| c > 0).count() > cols * 9 / 10);
}

/// A collective's point is timed on buffers made before its runs, once a point and of its
/// size: a step runs its allreduce on gradients it holds, and making a fresh buffer in the
/// timed call priced a 16 MiB allreduce at 1.2-1.4× the call itself.
#[test]
fn collectives_are_timed_on_buffers_made_before_their_runs() {
    use std::cell::Cell;
    let world = World::solo();
    let made = RefCell::new(vec![]);
    let runs = Cell::new(0usize);
    let points = comm_points(
        &world,
        Some(&world),
        |_, bytes| {
            made.borrow_mut().push(bytes);
            vec![0.0f32; bytes / 4]
        },
        |_, buf| {
            // Each run gets the buffer of its point, made before the run.
            assert_eq!(made.borrow().last(), Some(&(buf.len() * 4)));
            runs.set(runs.get() + 1);
        },
    );
    assert_eq!(*made.borrow(), MESSAGE_BYTES.to_vec());
    assert!(runs.get() >= REPS * MESSAGE_BYTES.len());
    let sizes: Vec<f64> = points.iter().map(|p| p[0]).collect();
    let expected: Vec<f64> = MESSAGE_BYTES.iter().map(|&b| b as f64).collect();
    assert_eq!(sizes, expected);
}
