//! The cost model's arithmetic on synthetic calibrations: known rates in, known prices out.

use super::compute::*;
use super::strategies::*;
use super::*;
use crate::train::plan::calibration::{
    Calibration, CalibrationKey, Fit, Product, FORMAT, OPERATORS,
};
use crate::train::plan::dry_run::Counts;

/// A synthetic machine: 1 GB/s alltoallv with 1 ms latency, 10 ns a row and 10 GB/s
/// gather (30 ns a row as CSR), 2 GB/s allreduce, 1 GFLOP/s, 1e8 edge-columns per second, free kernel
/// launches, 10 ns per parameter of the optimizer (10 µs a call), 10 GB/s device copies
/// (10 µs a call), 10 GB/s activation passes.
fn machine() -> Calibration {
    let line = |op: &str| match op {
        "alltoallv_world" | "alltoallv_node" => (1e-3, 1e-9),
        "partial_sums_world" | "partial_sums_node" => (1e-3, 5e-10),
        "gather" => (0.0, 1e-8),
        "gather_sparse" => (0.0, 3e-8),
        "allreduce" => (0.0, 5e-10),
        "allgatherv" => (1e-3, 1e-9),
        "gemm" => (0.0, 1e-9),
        "aggregate" => (0.0, 1e-8),
        "sample" => (1e-4, 1e-6),
        "optimizer" => (1e-5, 1e-8),
        "h2d" | "d2h" => (1e-5, 1e-10),
        "elementwise" => (0.0, 1e-10),
        _ => (0.0, 0.0),
    };
    Calibration {
        format: FORMAT,
        key: CalibrationKey {
            host: "test".into(),
            ranks: 2,
            nodes: 1,
            ranks_per_node: 2,
            threads_per_rank: 1,
            device: "CPU".into(),
            version: "0".into(),
        },
        seconds_to_calibrate: 0.0,
        operators: OPERATORS
            .iter()
            .map(|(op, unit)| {
                let (a, b) = line(op);
                let mut f = Fit::free(unit);
                f.latency_s = a;
                f.per_unit_s = b;
                if *op == "gather" || *op == "gather_sparse" {
                    f.per_byte_s = 1e-10;
                }
                // 1e8 edge-columns (non-zero-columns) per second: a 4-byte column of a
                // row read per edge (per non-zero).
                if *op == "aggregate" || *op == "spmm" {
                    (f.per_unit_s, f.per_byte_s) = (0.0, 1e-8 / 4.0);
                }
                (op.to_string(), f)
            })
            .collect(),
        shared_cores: None,
        cache_bytes: 32.0 * 1024.0 * 1024.0,
        private_cache_bytes: 0.0,
        sample_window: 1,
        far_shares: vec![],
    }
}

fn shape() -> ModelShape {
    ModelShape {
        kind: ModelKind::Gcn,
        in_w: vec![100.0, 10.0],
        out_w: vec![10.0, 2.0],
        params: 1000.0,
        device: false,
        staged_gradients: false,
        input_nnz: None,
        packed_row_bytes: None,
        csr_batches: false,
        prefetch_workers: None,
        gdp_sample_window: 1,
        nfp_sample_window: 1,
        resident_rows: false,
        sync_ranks: 1,
        store_bytes: 0.0,
        graph_bytes: 0.0,
        whole_graph_bytes: 0.0,
        nfp_columns: vec![],
    }
}

fn counts(remote: f64) -> Counts {
    Counts {
        sampled_edges: 2200.0,
        sampled_vertices: 400.0,
        sample_bytes: 8000.0,
        sample_calls: 6.0,
        input_local: 1000.0,
        input_remote: remote,
        requests_to: vec![0.0, remote],
        input_served: remote,
        input_cached: 0.0,
        input_peer: 0.0,
        rows_in: vec![remote, 50.0],
        hidden_rows: 20.0,
        partial_rows: 30.0,
        remote_edges: 40.0,
        own_partials: 120.0,
        dst: vec![200.0, 10.0],
        src: vec![1000.0 + remote, 200.0],
        edges: vec![2000.0, 200.0],
    }
}

#[test]
fn batches_sampled_in_windows_share_the_calibrated_window() {
    let mut cal = machine();
    // One rank's batches: sampled without an exchange.
    let mut c = counts(0.0);
    (c.sample_bytes, c.sample_calls) = (0.0, 0.0);
    let local = ModelShape {
        gdp_sample_window: 4,
        nfp_sample_window: 4,
        ..shape()
    };
    // A calibration of one thread has no window: its sampler prices every batch, also the
    // windowed ones, and GDP on one rank pays no id exchange.
    let one = gdp(&local, &cal, &c, "alltoallv_world").phases.build;
    assert!((one - (1e-4 + 2200.0 * 1e-6)).abs() < 1e-15, "{one}");
    // Calibrated in windows of 8 batches at 1 µs an edge with 1 ms latency: 8 batches of
    // 2,200 edges take 18.6 ms side by side; the run's windows of 4 share it 4 ways (4 of the
    // calibration's 8 threads), of 16 share it 8 ways.
    cal.sample_window = 8;
    let ahead = cal.operators.get_mut("sample_ahead").unwrap();
    (ahead.latency_s, ahead.per_unit_s) = (1e-3, 1e-6);
    let window = 1e-3 + 8.0 * 2200.0 * 1e-6;
    let four = gdp(&local, &cal, &c, "alltoallv_world").phases.build;
    assert!((four - window / 4.0).abs() < 1e-15, "{four}");
    let sixteen = ModelShape {
        gdp_sample_window: 16,
        ..shape()
    };
    let wide = gdp(&sixteen, &cal, &c, "alltoallv_world").phases.build;
    assert!((wide - window / 8.0).abs() < 1e-15, "{wide}");
    // Several GDP ranks sample in their steps (window 1): the owner-routed sampler and its
    // id exchanges, as before.
    let routed_counts = counts(0.0);
    let routed = gdp(&shape(), &cal, &routed_counts, "alltoallv_world")
        .phases
        .build;
    let exchanges = cal.op("alltoallv_world").seconds(8000.0, 6.0);
    assert!((routed - (1e-4 + 2200.0 * 1e-6) - exchanges).abs() < 1e-15);
    // Their windows of 4 sampled together, with a calibration that timed none (one rank):
    // each batch priced by the owner-routed sampler, the exchanges' calls shared 4 ways.
    let together = gdp(&local, &cal, &routed_counts, "alltoallv_world")
        .phases
        .build;
    let shared = cal.op("alltoallv_world").seconds(8000.0, 6.0 / 4.0);
    assert!((together - (1e-4 + 2200.0 * 1e-6) - shared).abs() < 1e-15);
    // Timed in windows of 8 at 2 µs an edge and 3 ms: the window's time shared 4 ways.
    let routed_ahead = cal.operators.get_mut("sample_ahead_routed").unwrap();
    (routed_ahead.latency_s, routed_ahead.per_unit_s) = (3e-3, 2e-6);
    let together = gdp(&local, &cal, &routed_counts, "alltoallv_world")
        .phases
        .build;
    let window_routed = 3e-3 + 8.0 * 2200.0 * 2e-6;
    assert!((together - window_routed / 4.0 - shared).abs() < 1e-15);
    // NFP: its window's sampling and the blocks' allgather.
    let all = [&c, &c];
    let nfp_windowed = nfp(&local, &cal, &all, 0, "alltoallv_world").phases.build;
    let nfp_step = nfp(&shape(), &cal, &all, 0, "alltoallv_world").phases.build;
    let gap = (1e-4 + 2200.0 * 1e-6) - window / 4.0;
    assert!((nfp_step - nfp_windowed - gap).abs() < 1e-15);
}

#[test]
fn row_exchanges_of_narrow_rows_pay_per_row() {
    let mut cal = machine();
    let c = counts(500.0);
    let before = split(&shape(), &cal, &c, "alltoallv_world").phases.shuffle;
    cal.operators.get_mut("alltoallv_world").unwrap().per_row_s = 1e-7;
    let after = split(&shape(), &cal, &c, "alltoallv_world").phases.shuffle;
    // Layer 2's 50 rows of 10 columns each way: 100 rows of 4000 bytes, where rows of the
    // calibrated 64 columns would be 15.625.
    let extra = (100.0 - 4000.0 / 256.0) * 1e-7;
    assert!((after - before - extra).abs() < 1e-15, "{before} {after}");
}

#[test]
fn known_bandwidths_give_known_phases() {
    let cal = machine();
    let c = counts(500.0);
    let r = gdp(&shape(), &cal, &c, "alltoallv_world");
    // Gather: (1000 + 500 served) rows × 400 B at 10 GB/s = 60 µs, and 10 ns for each of
    // those and the 500 fetched rows placed; fetch: 2 ms latency + 500 × 408 B at 1 GB/s.
    let load = 1500.0 * 400.0 * 1e-10 + 2000.0 * 1e-8 + 2e-3 + 500.0 * 408.0 * 1e-9;
    assert!((r.phases.load - load).abs() < 1e-12, "{:?}", r.phases);
    // Build: 2200 sampled edges (0.1 ms a call + 1 µs an edge) and 6 id exchanges moving
    // 8000 bytes.
    let build = 1e-4 + 2200.0 * 1e-6 + 6.0 * 1e-3 + 8000.0 * 1e-9;
    assert!((r.phases.build - build).abs() < 1e-15, "{:?}", r.phases);
    assert_eq!(r.phases.shuffle, 0.0);
    // GCN layer 1 (100 → 10; 200 dst, 1500 src, 2000 edges): aggregating first costs
    // 2000·100 + 200·100·10 = 400k ≤ 1500·100·10 + 2000·10: gemm 2·200·100·10 = 400k
    // flops forward, as many backward (no input gradient); aggregation 200k forward.
    // Layer 2 (10 → 2; 10 dst, 200 src, 200 edges): aggregate first (2000+200 ≤
    // 4000+400): gemm 400 flops, ×3 with the input gradient; aggregation 2000 ×2.
    // Layer 1's 200 × 10 outputs are activated: 16 bytes a value at 10 GB/s.
    let train =
        (800_000.0 + 1200.0) * 1e-9 + (200_000.0 + 4000.0) * 1e-8 + 16.0 * 200.0 * 10.0 * 1e-10;
    assert!((r.phases.train - train).abs() < 1e-12, "{:?}", r.phases);
    assert_eq!(r.bytes, 500.0 * 408.0);

    // Split shuffles layer 2's 50 remote rows of width 10 (40 B) each way; around the
    // exchange its 150 own source rows are copied in and their gradients out, the 50
    // remote gradients gathered (gather, 10 GB/s), and the 200 source rows and layer 1's
    // 200 rows start zeroed (elementwise, 10 GB/s).
    let s = split(&shape(), &cal, &c, "alltoallv_world");
    let local = (2.0 * 150.0 + 50.0) * 40.0 * 1e-10 + 400.0 * 40.0 * 1e-10;
    let shuffle = 2e-3 + 2.0 * 50.0 * 40.0 * 1e-9 + local;
    assert!((s.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", s.phases);
    // DNP: the 20 remote rows of layer 1's width each way, and the rank's 180 own rows of
    // its 200-row frontier six times through the exchange locally.
    let own = 6.0 * 180.0 * 40.0 * 1e-10;
    let d = dnp(&shape(), &cal, &c, "alltoallv_world");
    let shuffle = 2e-3 + 2.0 * 20.0 * 40.0 * 1e-9 + own;
    assert!((d.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", d.phases);
    // SNP: the 20 hidden rows each way as row exchanges (1 GB/s) and the 30 partial
    // sums each way as ready rows (2 GB/s), four calls; its 120 own partial sums four
    // times through the exchange locally (10 GB/s) into 200 zeroed rows (10 GB/s); own
    // hidden rows as DNP; routing its 40 remote edges to their sources' owners (an id
    // and a weight each, two exchanges) and building the plan are the batch's
    // preparation.
    let s = snp(&shape(), &cal, &c, "alltoallv_world");
    let exchanges = 4e-3 + 2.0 * 20.0 * 40.0 * 1e-9 + 2.0 * 30.0 * 40.0 * 5e-10;
    let own_partials = 4.0 * 120.0 * 40.0 * 1e-10 + 200.0 * 40.0 * 1e-10;
    let shuffle = exchanges + own_partials + own;
    assert!((s.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", s.phases);
    let routing = 2.0 * (1e-3 + 40.0 * 4.0 * 1e-9);
    let plan = cal.op("sample").seconds(c.edges[0], 0.0);
    assert!((s.phases.build - r.phases.build - plan - routing).abs() < 1e-15);
}

#[test]
fn the_slowest_rank_bounds_each_phase_and_the_cheapest_is_picked() {
    let cal = machine();
    let mk = |remote: f64| -> [Counts; 4] { std::array::from_fn(|_| counts(remote)) };
    let mut ranks = vec![mk(100.0), mk(900.0)];
    // Rank 0 samples slower, rank 1 fetches more: the step pays both.
    ranks[0][0].sampled_edges = 500_000.0;
    let dry = DryRun::uniform(2, 10, ranks);
    let p = predict(
        &dry,
        &shape(),
        &cal,
        &["gdp", "split", "dnp", "snp"],
        "alltoallv_world",
    );
    let g = &p.strategies["gdp"];
    let slow_load = gdp(&shape(), &cal, &dry.ranks[1][0], "alltoallv_world")
        .phases
        .load;
    let slow_build = 1e-4 + 500_000.0 * 1e-6 + 6.0 * 1e-3 + 8000.0 * 1e-9;
    assert!(
        (g.phases.build - slow_build).abs() < 1e-15,
        "{:?}",
        g.phases
    );
    assert_eq!(g.phases.load, slow_load);
    assert!((g.phases.sync - 4000.0 * 5e-10 - 32.0 * 5e-10).abs() < 1e-18);
    // Every rank updates its 1000 parameters: 10 µs + 1000 × 10 ns.
    assert!((g.phases.optimizer - (1e-5 + 1000.0 * 1e-8)).abs() < 1e-18);
    assert!((g.step_seconds - g.phases.total()).abs() < 1e-18);
    assert!((g.epoch_seconds - 10.0 * g.step_seconds).abs() < 1e-12);
    // GDP samples slowest here (0.5 s on rank 0), so another strategy wins; NFP is priced but
    // not pickable where it is not allowed.
    assert_ne!(p.choice, "gdp");
    let best = p
        .strategies
        .iter()
        .filter(|(_, s)| s.pickable)
        .map(|(_, s)| s.step_seconds)
        .fold(f64::INFINITY, f64::min);
    assert_eq!(p.strategies[&p.choice].step_seconds, best);
    assert!(!p.strategies["nfp"].pickable);
    assert!(p.strategies["nfp"].step_seconds > 0.0);
    // Not allowed: priced, never picked.
    let p2 = predict(&dry, &shape(), &cal, &["gdp"], "alltoallv_world");
    assert_eq!(p2.choice, "gdp");
}

#[test]
fn each_batch_waits_for_its_own_slowest_rank() {
    let cal = machine();
    let mk = |remote: f64| -> [Counts; 4] { std::array::from_fn(|_| counts(remote)) };
    // Rank 0 fetches 900 rows in batch 0 and 100 in batch 1, rank 1 the other way round:
    // their means are even, yet every step waits for a rank fetching 900.
    let (heavy, light) = (mk(900.0), mk(100.0));
    let even = DryRun::uniform(2, 2, vec![mk(500.0), mk(500.0)]);
    let alternating = DryRun {
        per_batch: vec![
            vec![heavy.clone(), light.clone()],
            vec![light.clone(), heavy.clone()],
        ],
        ..even.clone()
    };
    let all = ["gdp", "split", "dnp", "snp"];
    let p_even = predict(&even, &shape(), &cal, &all, "alltoallv_world");
    let p_alt = predict(&alternating, &shape(), &cal, &all, "alltoallv_world");
    let load = |c: &Counts| gdp(&shape(), &cal, c, "alltoallv_world").phases.load;
    assert_eq!(
        p_even.strategies["gdp"].phases.load,
        load(&even.ranks[0][0])
    );
    assert!((p_alt.strategies["gdp"].phases.load - load(&heavy[0])).abs() < 1e-15);
    assert!(
        p_alt.strategies["gdp"].step_seconds > p_even.strategies["gdp"].step_seconds,
        "{:?} against {:?}",
        p_alt.strategies["gdp"],
        p_even.strategies["gdp"]
    );
    // Bytes add up over ranks whichever way the batches fall.
    let bytes = |p: &Prediction| p.strategies["gdp"].bytes_per_step;
    assert!((bytes(&p_alt) - bytes(&p_even)).abs() < 1e-9 * bytes(&p_even));
}

/// A dry run of one batch on two ranks with the same counts.
fn two_even_ranks() -> DryRun {
    DryRun::uniform(1, 1, vec![std::array::from_fn(|_| counts(500.0)); 2])
}

#[test]
fn nfp_allreduces_all_but_its_sliced_first_layer() {
    let dry = two_even_ranks();
    // 100 × 10 first-layer weights, 32 parameters more (biases, the second layer).
    let shape = ModelShape {
        params: 1032.0,
        ..shape()
    };
    let p = predict(&dry, &shape, &machine(), &["gdp", "nfp"], "alltoallv_world");
    let loss = 32.0 * 5e-10;
    let gdp = &p.strategies["gdp"].phases;
    let nfp = &p.strategies["nfp"].phases;
    assert!(
        (gdp.sync - 1032.0 * 4.0 * 5e-10 - loss).abs() < 1e-18,
        "{gdp:?}"
    );
    assert!(
        (nfp.sync - 32.0 * 4.0 * 5e-10 - loss).abs() < 1e-18,
        "{nfp:?}"
    );
}

#[test]
fn the_ranks_drift_is_a_share_of_the_steps_work_charged_to_sync() {
    let dry = two_even_ranks();
    let all = ["gdp", "split", "dnp", "snp"];
    let still = predict(&dry, &shape(), &machine(), &all, "alltoallv_world");
    let mut drifting = machine();
    drifting.operators.get_mut("drift").unwrap().per_unit_s = 0.1;
    let p = predict(&dry, &shape(), &drifting, &all, "alltoallv_world");
    for s in all {
        let (a, b) = (&still.strategies[s].phases, &p.strategies[s].phases);
        let work = a.total() - a.sync;
        assert!(
            (b.sync - a.sync - 0.1 * work).abs() < 1e-15,
            "{s}: {a:?} {b:?}"
        );
        assert_eq!(b.train, a.train);
    }
}

#[test]
fn snp_projects_every_source_of_its_input_layer_first() {
    let cal = machine();
    let c = counts(500.0);
    // Layer 1 (100 → 10; 200 dst, 1500 src, 2000 edges) projected first on the owners:
    // 2·1500·100·10 = 3M flops forward, as many backward; aggregation at width 10,
    // 20k forward and 20k transposed. Layer 2 and the activation as GDP prices them.
    let activation = 16.0 * 200.0 * 10.0 * 1e-10;
    let train = (6_000_000.0 + 1200.0) * 1e-9 + (40_000.0 + 4000.0) * 1e-8 + activation;
    let s = snp(&shape(), &cal, &c, "alltoallv_world");
    assert!((s.phases.train - train).abs() < 1e-12, "{:?}", s.phases);
    // Its partial sums' plan costs the input block's 2000 edges at the sampler's 1 µs, and
    // routing the 40 remote edges two exchanges.
    let g = gdp(&shape(), &cal, &c, "alltoallv_world");
    let routing = 2.0 * cal.op("alltoallv_world").seconds(40.0 * 4.0, 1.0);
    assert!((s.phases.build - g.phases.build - 2000.0 * 1e-6 - routing).abs() < 1e-15);
    // GDP aggregates first there, which is cheaper on these counts.
    assert!(gdp(&shape(), &cal, &c, "alltoallv_world").phases.train < s.phases.train);
}

#[test]
fn rows_of_mostly_zero_features_are_priced_as_the_store_sends_them() {
    // Facebook: 4,714 columns, 0.3 % non-zero: a count word and 14 (column, value) pairs.
    let facebook = ModelShape::packed_row_bytes(4714.0, 0.003).expect("packed");
    assert!((facebook - 4.0 * (1.0 + 2.0 * 0.003 * 4714.0)).abs() < 1e-9);
    // Mostly non-zero features travel dense; a packed row is never longer than dense.
    assert_eq!(ModelShape::packed_row_bytes(100.0, 0.9), None);
    assert!(ModelShape::packed_row_bytes(100.0, 0.499).unwrap() <= 404.0);
    let cal = machine();
    let c = counts(500.0);
    let packed = ModelShape {
        packed_row_bytes: Some(40.0),
        ..shape()
    };
    let (dense, sparse) = (
        load(&shape(), &cal, &c, "alltoallv_world", Rows::Dense),
        load(&packed, &cal, &c, "alltoallv_world", Rows::Dense),
    );
    // 360 bytes less per fetched row on the wire, and each one decoded at the receiver
    // (a gather's bytes of a dense row).
    assert_eq!(dense.bytes - sparse.bytes, 500.0 * 360.0);
    let wire = cal.op("alltoallv_world");
    let gather = cal.op("gather");
    let expect = dense.phases.load - wire.seconds(500.0 * 408.0, 2.0)
        + wire.seconds(500.0 * 48.0, 2.0)
        + gather.seconds_touching(
            2000.0,
            (c.input_local + c.input_cached + c.input_served + 500.0) * 400.0,
            2.0,
        )
        - gather.seconds_touching(
            2000.0,
            (c.input_local + c.input_cached + c.input_served) * 400.0,
            2.0,
        );
    assert!(
        (sparse.phases.load - expect).abs() < 1e-12,
        "{:?}",
        sparse.phases
    );
}

#[test]
fn sparse_input_rows_cost_their_non_zeros() {
    let cal = machine();
    let c = counts(500.0);
    let sparse = ModelShape {
        input_nnz: Some(3.0),
        ..shape()
    };
    let r = gdp(&sparse, &cal, &c, "alltoallv_world");
    // Layer 1: scan 1500 dense rows of 400 B (gather), 3 non-zeros × 1500 sources forward
    // and as many for the weight gradient, each reading a row of 10 columns (spmm, by
    // the bytes of those rows), aggregation at width 10
    // forward and transposed, its activation; layer 2 as before.
    let layer1 = 1500.0 * 400.0 * 1e-10
        + 1500.0 * 1e-8
        + 2.0 * 3.0 * 10.0 * 1500.0 * 1e-8
        + 40_000.0 * 1e-8
        + 16.0 * 200.0 * 10.0 * 1e-10;
    let layer2 = 1200.0 * 1e-9 + 4000.0 * 1e-8;
    assert!(
        (r.phases.train - (layer1 + layer2)).abs() < 1e-12,
        "{:?}",
        r.phases
    );
    // Dense rows of 100 columns would cost more.
    assert!(gdp(&shape(), &cal, &c, "alltoallv_world").phases.train > r.phases.train);
}

#[test]
fn gdp_batches_that_come_as_csr_cost_their_entries_and_no_scan() {
    let cal = machine();
    let c = counts(500.0);
    let sparse = ModelShape {
        input_nnz: Some(3.0),
        packed_row_bytes: Some(28.0),
        device: true,
        ..shape()
    };
    let csr = ModelShape {
        csr_batches: true,
        ..sparse.clone()
    };
    let (dense, r) = (
        gdp(&sparse, &cal, &c, "alltoallv_world"),
        gdp(&csr, &cal, &c, "alltoallv_world"),
    );
    // The same words on the wire; 24-byte entries (3 columns and values) gathered for
    // the 1000 own, 500 served and 500 fetched rows instead of 400-byte rows, and 32 bytes
    // a row to the device (entries and an offset).
    assert_eq!(r.bytes, dense.bytes);
    let (gather, sparse_gather) = (cal.op("gather"), cal.op("gather_sparse"));
    let (wire, h2d) = (cal.op("alltoallv_world"), cal.op("h2d"));
    let load = sparse_gather.seconds_touching(2000.0, 2000.0 * 24.0, 2.0)
        + wire.seconds(500.0 * 36.0, 2.0)
        + h2d.seconds(1500.0 * 32.0, 1.0);
    assert!((r.phases.load - load).abs() < 1e-12, "{:?}", r.phases);
    // The input layer no longer scans 1500 dense rows of 400 B.
    let scan = gather.seconds_touching(1500.0, 1500.0 * 400.0, 1.0);
    assert!((dense.phases.train - r.phases.train - scan).abs() < 1e-12);
    // Split's input layer and DNP's owners make their rows the same way.
    for cost in [
        split as fn(&ModelShape, &Calibration, &Counts, &str) -> RankCost,
        dnp,
    ] {
        let (s, d) = (
            cost(&csr, &cal, &c, "alltoallv_world"),
            cost(&sparse, &cal, &c, "alltoallv_world"),
        );
        assert_eq!(s.phases.load, r.phases.load);
        assert!((d.phases.train - s.phases.train - scan).abs() < 1e-12);
    }
}

#[test]
fn products_are_priced_by_their_bytes_too() {
    let mut cal = machine();
    cal.operators.get_mut("gemm").unwrap().per_byte_s = 1e-9;
    let c = counts(500.0);
    let with_bytes = gdp(&shape(), &cal, &c, "alltoallv_world").phases.train;
    let flops_only = gdp(&shape(), &machine(), &c, "alltoallv_world")
        .phases
        .train;
    // Layer 1 aggregates first (200 rows × 100 → 10): 4·(200·100 + 100·10 + 200·10) B per
    // product, forward and weight gradient; layer 2 (10 rows × 10 → 2), three products.
    let bytes = 2.0 * 4.0 * (20_000.0 + 1000.0 + 2000.0) + 3.0 * 4.0 * (100.0 + 20.0 + 20.0);
    assert!((with_bytes - flops_only - bytes * 1e-9).abs() < 1e-12);
    let w = layer_work(
        ModelKind::Sage,
        (100.0, 10.0),
        (200.0, 1500.0, 2000.0),
        true,
        Order::ProjectFirst,
    );
    // SAGE projected first: the neighbour product on 1500 rows, the root one on 200.
    let per = |m: f64| 4.0 * (m * 100.0 + 1000.0 + m * 10.0);
    assert_eq!(w.forward.bytes, per(1500.0) + per(200.0));
    assert_eq!(w.flops(), 3.0 * 2.0 * (1500.0 + 200.0) * 1000.0);
    assert_eq!(w.forward.calls, 2.0, "two products a pass");
    assert_eq!(
        w.forms().collect::<Vec<_>>(),
        Product::ALL,
        "forward, weight and input gradients"
    );
    // Aggregating first, the two weights stack into one product a pass.
    let stacked = layer_work(
        ModelKind::Sage,
        (100.0, 10.0),
        (200.0, 1500.0, 2000.0),
        false,
        Order::Cheaper,
    );
    assert_eq!(stacked.forward.calls, 1.0);
    assert_eq!(stacked.forms().count(), 2, "no input gradient");
}

#[test]
fn aggregations_are_priced_by_edges_and_the_width_of_their_rows() {
    // The input layer aggregates first at its 100 columns, forward only (no gradient
    // passes it); projecting first, at its 10 output columns, forward and transposed.
    let first = layer_work(
        ModelKind::Gcn,
        (100.0, 10.0),
        (200.0, 1500.0, 2000.0),
        false,
        Order::Cheaper,
    );
    let agg = |edges, width, passes| Aggregations {
        edges,
        width,
        passes,
    };
    assert_eq!(first.aggregations, agg(2000.0, 100.0, 1.0));
    let projected = layer_work(
        ModelKind::Gcn,
        (100.0, 10.0),
        (200.0, 1500.0, 2000.0),
        false,
        Order::ProjectFirst,
    );
    assert_eq!(projected.aggregations, agg(2000.0, 10.0, 2.0));
    // Through measured points: 1000 and 10,000 edges each at 16 and 1024 columns, wide
    // rows dearer per column once they outgrow a cache (the largest point).
    let mut cal = machine();
    cal.operators.insert(
        "aggregate".into(),
        Fit {
            by_points: true,
            ..Fit::least_squares_relative_with_bytes(
                "edge",
                vec![[1e3, 4e-6], [1e4, 4e-5], [1e3, 1e-4], [1e4, 4e-3]],
                vec![64e3, 64e4, 4096e3, 4096e4],
            )
        },
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
    // A measured point costs what it measured; two passes twice one.
    assert!(close(agg(1e4, 1024.0, 1.0).seconds(&cal), 4e-3));
    assert!(close(agg(1e3, 16.0, 2.0).seconds(&cal), 8e-6));
    // The same edge-columns at 1024 columns cost what their edges do at that width, not
    // what as many edge-columns of narrow rows do.
    let narrow = agg(64e4, 16.0, 1.0).seconds(&cal);
    let wide = agg(1e4, 1024.0, 1.0).seconds(&cal);
    assert!(wide > 1.1 * narrow, "wide {wide} narrow {narrow}");
    assert_eq!(Aggregations::default().seconds(&cal), 0.0);
    // A backward pass is priced by the transposed aggregation's own points where the
    // calibration has them: here three times the forward's.
    let mut transposed = cal.op("aggregate").clone();
    transposed.points.iter_mut().for_each(|p| p[1] *= 3.0);
    cal.operators
        .insert("aggregate_transpose".into(), transposed);
    assert!(close(agg(1e3, 16.0, 1.0).seconds(&cal), 4e-6));
    assert!(close(agg(1e3, 16.0, 2.0).seconds(&cal), 4e-6 + 12e-6));
}

#[test]
fn cached_rows_are_read_locally_not_fetched() {
    let cal = machine();
    let mut c = counts(500.0);
    (c.input_remote, c.input_cached) = (300.0, 200.0);
    let r = gdp(&shape(), &cal, &c, "alltoallv_world");
    // 1000 own, 200 cached and 500 served rows read, those and 300 fetched rows placed.
    let load =
        (1000.0 + 200.0 + 500.0) * 400.0 * 1e-10 + 2000.0 * 1e-8 + 2e-3 + 300.0 * 408.0 * 1e-9;
    assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
    assert_eq!(r.bytes, 300.0 * 408.0);
}

#[test]
fn rows_of_host_peers_are_read_in_shared_memory_not_fetched() {
    let cal = machine();
    let mut c = counts(500.0);
    (c.input_remote, c.input_peer) = (300.0, 200.0);
    c.requests_to = vec![0.0, 300.0];
    let r = gdp(&shape(), &cal, &c, "alltoallv_world");
    // As a cached row: 1000 own, 200 peer and 500 served rows read, those and 300 fetched
    // rows placed, and only the fetched rows on the wire.
    let load =
        (1000.0 + 200.0 + 500.0) * 400.0 * 1e-10 + 2000.0 * 1e-8 + 2e-3 + 300.0 * 408.0 * 1e-9;
    assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
    assert_eq!(r.bytes, 300.0 * 408.0);
    // With own rows on the device, peers' rows are read on the host and go up with the
    // fetched ones.
    let resident = ModelShape {
        device: true,
        resident_rows: true,
        ..shape()
    };
    let r = gdp(&resident, &cal, &c, "alltoallv_world");
    let up = 1e-5 + 500.0 * 400.0 * 1e-10;
    assert!((r.upload - up).abs() < 1e-18, "{}", r.upload);
}

#[test]
fn resident_rows_leave_only_fetched_rows_to_the_host_and_the_copy_up() {
    let cal = machine();
    let mut c = counts(500.0);
    (c.input_remote, c.input_cached) = (300.0, 200.0);
    let device = ModelShape {
        device: true,
        ..shape()
    };
    let resident = ModelShape {
        resident_rows: true,
        ..device.clone()
    };
    let fetch = 2e-3 + 300.0 * 408.0 * 1e-9;
    // On the host: the 300 fetched rows decoded and the 500 served rows read (400 B
    // each); up: the 300 fetched rows. Own and cached rows are gathered on the device.
    let r = gdp(&resident, &cal, &c, "alltoallv_world");
    let up = 1e-5 + 300.0 * 400.0 * 1e-10;
    let load = 800.0 * (400.0 * 1e-10 + 1e-8) + fetch + up;
    assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
    assert!((r.upload - up).abs() < 1e-18);
    // Without: own, cached and served rows read, and every batch row copied up.
    let d = gdp(&device, &cal, &c, "alltoallv_world");
    let up = 1e-5 + 1500.0 * 400.0 * 1e-10;
    let load = 1700.0 * 400.0 * 1e-10 + 2000.0 * 1e-8 + fetch + up;
    assert!((d.phases.load - load).abs() < 1e-15, "{:?}", d.phases);
    assert_eq!(r.bytes, d.bytes, "the same rows cross ranks");
    // DNP's owners and split's input layer place their rows the same way.
    assert_eq!(
        dnp(&resident, &cal, &c, "alltoallv_world").phases.load,
        r.phases.load
    );
    assert_eq!(
        split(&resident, &cal, &c, "alltoallv_world").phases.load,
        r.phases.load
    );
    // SNP's sources are all own rows: none is read on the host or copied up.
    let own = counts(0.0);
    let s = snp(&resident, &cal, &own, "alltoallv_world");
    assert_eq!((s.phases.load, s.upload), (0.0, 0.0), "{:?}", s.phases);
    assert!(snp(&device, &cal, &own, "alltoallv_world").upload > 0.0);
}

#[test]
fn every_strategy_reads_sparse_rows_as_csr_and_scans_no_dense_rows() {
    let cal = machine();
    let own = counts(0.0);
    let sparse = ModelShape {
        input_nnz: Some(5.0),
        csr_batches: true,
        ..shape()
    };
    let dense = ModelShape {
        csr_batches: false,
        ..sparse.clone()
    };
    let (c, d) = (
        snp(&sparse, &cal, &own, "alltoallv_world"),
        snp(&dense, &cal, &own, "alltoallv_world"),
    );
    // 1000 own rows × 5 entries of 8 B, against 1000 dense rows of 400 B.
    let gather = cal.op("gather");
    assert_eq!(
        c.phases.load,
        cal.op("gather_sparse")
            .seconds_touching(1000.0, 1000.0 * 5.0 * 8.0, 2.0)
    );
    assert_eq!(
        d.phases.load,
        gather.seconds_touching(1000.0, 1000.0 * 400.0, 2.0)
    );
    assert!(
        c.phases.train < d.phases.train,
        "no dense rows scanned for their zeros"
    );
    // DNP's owners and split's input layer make their rows as GDP makes its batches.
    let remote = counts(500.0);
    let g = gdp(&sparse, &cal, &remote, "alltoallv_world").phases.load;
    assert_eq!(
        dnp(&sparse, &cal, &remote, "alltoallv_world").phases.load,
        g
    );
    assert_eq!(
        split(&sparse, &cal, &remote, "alltoallv_world").phases.load,
        g
    );
}

#[test]
fn nfp_prices_each_rank_by_its_own_slice_and_the_widest_updates_the_most() {
    let cal = machine();
    let (a, b) = (counts(500.0), counts(500.0));
    // 100 columns cut 80 / 20 (equal non-zeros on skewed features), 100 × 10 weights.
    let shape = ModelShape {
        params: 1032.0,
        nfp_columns: vec![80.0, 20.0],
        ..shape()
    };
    // Each rank gathers both ranks' 1500 source rows at its own width.
    let load = |r| {
        nfp(&shape, &cal, &[&a, &b], r, "alltoallv_world")
            .phases
            .load
    };
    assert!((load(0) - 3000.0 * (80.0 * 4.0 * 1e-10 + 1e-8)).abs() < 1e-15);
    assert!((load(1) - 3000.0 * (20.0 * 4.0 * 1e-10 + 1e-8)).abs() < 1e-15);
    // The widest slice's rank holds 80 of the weights' 100 rows besides the 32 whole
    // parameters, and bounds the optimizer; even slices hold 50 each.
    assert_eq!(params_held(&shape, "nfp", 2), 32.0 + 800.0);
    let even = ModelShape {
        nfp_columns: vec![],
        ..shape.clone()
    };
    assert_eq!(params_held(&even, "nfp", 2), 32.0 + 500.0);
    assert_eq!(params_held(&shape, "gdp", 2), 1032.0);
    // Widths of another rank count than the plan's are not used.
    assert_eq!(params_held(&shape, "nfp", 4), 32.0 + 250.0);
    let p = predict(&two_even_ranks(), &shape, &cal, &["nfp"], "alltoallv_world");
    let optimizer = cal.op("optimizer").seconds(832.0, 1.0);
    assert!((p.strategies["nfp"].phases.optimizer - optimizer).abs() < 1e-18);
}

#[test]
fn nfp_moves_no_feature_rows_and_slices_the_first_layer() {
    let cal = machine();
    let (a, b) = (counts(500.0), counts(500.0));
    let r = nfp(&shape(), &cal, &[&a, &b], 0, "alltoallv_world");
    // Gather: both ranks' 1500 source rows at 50 columns.
    assert!((r.phases.load - 3000.0 * (50.0 * 4.0 * 1e-10 + 1e-8)).abs() < 1e-15);
    // Blocks: 3000 src ids, 4000 edges, 400 dst; partials 200 rows × 40 B each way, as
    // ready rows (2 GB/s).
    let blocks = 3000.0 * 8.0 + 4000.0 * 4.0 + 400.0 * 8.0;
    // This rank's own 200 rows of 40 B pass through its copies (into a zeroed sum,
    // forward; gathered and passed to itself, backward).
    let own = 200.0 * 40.0;
    let shuffle = 2e-3 + 2.0 * 200.0 * 40.0 * 5e-10 + local_side(&cal, 4.0 * own, own);
    assert!((r.phases.shuffle - shuffle).abs() < 1e-15, "{:?}", r.phases);
    // The model phase runs the sliced input layer once over both ranks' blocks stacked
    // into one (their 400 destinations, 3000 sources and 4000 edges), then activates and
    // runs the layers above on this rank's own rows only; nothing is stacked or copied
    // out around it.
    let sliced = ModelShape {
        in_w: vec![50.0, shape().in_w[1]],
        csr_batches: false,
        ..shape()
    };
    let input = |c: &Counts| (c.dst[0], c.src[0], c.edges[0]);
    let on = |rows| layer(&sliced, &cal, 0, rows, Order::Cheaper, true);
    let stacked = (
        a.dst[0] + b.dst[0],
        a.src[0] + b.src[0],
        a.edges[0] + b.edges[0],
    );
    assert!(on(stacked) > on(input(&a)));
    let train = compute(&sliced, &cal, &a, Order::Cheaper, true) - on(input(&a)) + on(stacked);
    assert!((r.phases.train - train).abs() < 1e-15, "{:?}", r.phases);
    // A rank whose block is empty (no seeds this step) adds nothing to the stacked block.
    let mut none = b.clone();
    (none.dst[0], none.src[0], none.edges[0]) = (0.0, 0.0, 0.0);
    let alone = nfp(&shape(), &cal, &[&a, &none], 0, "alltoallv_world");
    let train = compute(&sliced, &cal, &a, Order::Cheaper, true);
    assert!(
        (alone.phases.train - train).abs() < 1e-15,
        "{:?}",
        alone.phases
    );
    // Sampling is local (every rank holds the topology): the sampler's time for the
    // rank's 2200 edges, without GDP's routing of ids to owners; then every rank's input
    // block is allgathered (1 ms + 1 ns a byte), as training times it in its sample phase.
    let sampled = cal.op("sample").seconds(2200.0, 1.0);
    assert!((r.phases.build - sampled - (1e-3 + blocks * 1e-9)).abs() < 1e-15);
    assert!(gdp(&shape(), &cal, &a, "alltoallv_world").phases.build > sampled);
}

#[test]
fn nfp_on_mostly_zero_features_gathers_and_multiplies_csr_slices() {
    let cal = machine();
    let (a, b) = (counts(500.0), counts(500.0));
    // 400 columns, 8 set per row: slices of 200 columns, 4 entries per row each.
    let sparse = ModelShape {
        in_w: vec![400.0, 10.0],
        input_nnz: Some(8.0),
        ..shape()
    };
    let r = nfp(&sparse, &cal, &[&a, &b], 0, "alltoallv_world");
    // Both ranks' 1500 source rows from the CSR copy: 4 entries of 8 bytes and a row
    // pointer each.
    let load = 3000.0 * (3e-8 + (4.0 * 8.0 + 8.0) * 1e-10);
    assert!((r.phases.load - load).abs() < 1e-15, "{:?}", r.phases);
    // The input layer multiplies the entries it was given, once over the ranks' blocks
    // stacked: no dense rows scanned.
    let sliced = ModelShape {
        in_w: vec![200.0, 10.0],
        input_nnz: Some(4.0),
        ..sparse.clone()
    };
    let on = |rows| layer(&sliced, &cal, 0, rows, Order::Cheaper, false);
    let stacked = (
        a.dst[0] + b.dst[0],
        a.src[0] + b.src[0],
        a.edges[0] + b.edges[0],
    );
    let train = compute(&sliced, &cal, &a, Order::Cheaper, false)
        - on((a.dst[0], a.src[0], a.edges[0]))
        + on(stacked);
    assert!((r.phases.train - train).abs() < 1e-15, "{:?}", r.phases);
    // Slices narrower than the sparse path takes are gathered and multiplied dense.
    let narrow = ModelShape {
        in_w: vec![100.0, 10.0],
        input_nnz: Some(2.0),
        ..shape()
    };
    let r = nfp(&narrow, &cal, &[&a, &b], 0, "alltoallv_world");
    assert!((r.phases.load - 3000.0 * (1e-8 + 50.0 * 4.0 * 1e-10)).abs() < 1e-15);
}

#[test]
fn prefetch_hides_the_host_preparation_of_every_strategy_but_nfp_behind_the_device() {
    // Phases 1 + 2 (0.5 of it the upload) + 0 + 3 + 0.25 + 0.25: the training thread
    // has 0.5 + 3 + 0.5 = 4, the workers 2.5; with 4 workers (√4 = 2× one) 1.25.
    let phases = Phases {
        build: 1.0,
        load: 2.0,
        shuffle: 0.0,
        train: 3.0,
        sync: 0.25,
        optimizer: 0.25,
    };
    assert_eq!(prefetched_step(&phases, 0.5, 4), 4.0);
    // A host-bound step: the preparation, sped up √W, bounds it.
    let slow = Phases {
        build: 9.0,
        ..phases
    };
    assert_eq!(prefetched_step(&slow, 0.5, 4), 10.5 / 2.0);
    assert_eq!(prefetched_step(&slow, 0.5, 1), 10.5);

    let cal = machine();
    let ranks = vec![std::array::from_fn(|_| counts(100.0)); 2];
    let dry = DryRun::uniform(1, 1, ranks);
    let all = ["gdp", "split", "dnp", "snp", "nfp"];
    let device = ModelShape {
        device: true,
        ..shape()
    };
    let plain = predict(&dry, &device, &cal, &all, "alltoallv_world");
    let prefetched = ModelShape {
        prefetch_workers: Some(1),
        ..device
    };
    let p = predict(&dry, &prefetched, &cal, &all, "alltoallv_world");
    // NFP prepares in its steps.
    assert_eq!(p.strategies["nfp"], plain.strategies["nfp"]);
    type CostFn = fn(&ModelShape, &Calibration, &Counts, &str) -> RankCost;
    let costs = [
        ("gdp", gdp as CostFn),
        ("split", split),
        ("dnp", dnp),
        ("snp", snp),
    ];
    for (name, cost) in costs {
        let (g, g0) = (&p.strategies[name], &plain.strategies[name]);
        assert_eq!(
            g.phases, g0.phases,
            "{name}: the phases stay what each costs"
        );
        assert!(
            g.step_seconds < g0.step_seconds,
            "{name}: {g:?} against {g0:?}"
        );
        let upload = cost(&prefetched, &cal, &counts(100.0), "alltoallv_world").upload;
        assert!(upload > 0.0, "{name}: a device copies the rows up");
        assert_eq!(g.step_seconds, prefetched_step(&g.phases, upload, 1));
        assert_eq!(g.epoch_seconds, g.step_seconds);
    }
    // On one rank split, DNP and SNP prepare in their steps (no communicator for workers).
    let one = DryRun::uniform(
        dry.batches,
        dry.epoch_batches,
        vec![std::array::from_fn(|_| counts(0.0))],
    );
    let p1 = predict(&one, &prefetched, &cal, &all, "alltoallv_world");
    for name in ["split", "dnp", "snp"] {
        let s1 = &p1.strategies[name];
        assert_eq!(s1.step_seconds, s1.phases.total(), "{name}");
    }
}

#[test]
fn the_optimizer_prices_the_parameters_a_rank_holds_and_staging_the_gradients_twice() {
    let cal = machine();
    let ranks = vec![std::array::from_fn(|_| counts(100.0)); 4];
    let dry = DryRun::uniform(1, 1, ranks);
    let mut sage = ModelShape {
        kind: ModelKind::Sage,
        params: 3000.0,
        ..shape()
    };
    let all = ["gdp", "split", "dnp", "snp", "nfp"];
    let p = predict(&dry, &sage, &cal, &all, "alltoallv_world");
    // GDP's ranks all update 3000 parameters; NFP's hold a quarter of SAGE's two first-
    // layer matrices (2 × 100 × 10 rows): 3000 − 2000 · 3/4 = 1500.
    let per_param = |n: f64| 1e-5 + n * 1e-8;
    assert!((p.strategies["gdp"].phases.optimizer - per_param(3000.0)).abs() < 1e-18);
    assert!((p.strategies["nfp"].phases.optimizer - per_param(1500.0)).abs() < 1e-18);
    let host_sync = p.strategies["gdp"].phases.sync;

    // On a device without CUDA-aware MPI the 12 kB of gradients go down and back up.
    sage.device = true;
    sage.staged_gradients = true;
    let p = predict(&dry, &sage, &cal, &all, "alltoallv_world");
    let staging = 2.0 * (1e-5 + 12_000.0 * 1e-10);
    assert!((p.strategies["gdp"].phases.sync - host_sync - staging).abs() < 1e-15);
    sage.staged_gradients = false;
    let p = predict(&dry, &sage, &cal, &all, "alltoallv_world");
    assert_eq!(p.strategies["gdp"].phases.sync, host_sync);
}

#[test]
fn gat_projects_every_source_and_pays_its_attention_per_edge() {
    // 4 heads of 8: a product 16 → 32 over 100 sources; 20 destinations, 300 edges.
    let w = layer_work(
        ModelKind::Gat,
        (16.0, 32.0),
        (20.0, 100.0, 300.0),
        true,
        Order::Cheaper,
    );
    // Projection, its weight gradient and its input gradient: 3 × 2·100·16·32 flops.
    assert_eq!(w.flops(), 3.0 * 2.0 * 100.0 * 16.0 * 32.0);
    assert_eq!(
        w.forward.bytes,
        4.0 * (100.0 * 16.0 + 16.0 * 32.0 + 100.0 * 32.0)
    );
    // The attention (forward and backward) over 300 edges × 32 columns, nothing as a
    // mean aggregation.
    assert_eq!(
        (w.attention_cols, w.aggregations.edge_cols()),
        (300.0 * 32.0, 0.0)
    );
    // The input layer has no input gradient; the order asked for does not matter.
    let first = layer_work(
        ModelKind::Gat,
        (16.0, 32.0),
        (20.0, 100.0, 300.0),
        false,
        Order::ProjectFirst,
    );
    assert_eq!(first.flops(), 2.0 * 2.0 * 100.0 * 16.0 * 32.0);
    assert_eq!(first.attention_cols, w.attention_cols);
}

/// A GCN layer pays its block's normalisation factors (`gcn_norm`, per source and
/// destination) on top of its products and aggregations; a SAGE layer has none.
#[test]
fn gcn_layers_pay_their_normalisation_per_vertex_and_sage_layers_none() {
    let mut cal = machine();
    let rows = (200.0, 1000.0, 2000.0);
    let gcn = shape();
    let sage = ModelShape {
        kind: ModelKind::Sage,
        ..shape()
    };
    let before = [&gcn, &sage].map(|s| layer(s, &cal, 0, rows, Order::Cheaper, false));
    let norm = cal.operators.get_mut("gcn_norm").unwrap();
    (norm.latency_s, norm.per_unit_s) = (1e-6, 2e-9);
    let after = [&gcn, &sage].map(|s| layer(s, &cal, 0, rows, Order::Cheaper, false));
    let want = 1e-6 + 1200.0 * 2e-9;
    assert!(
        (after[0] - before[0] - want).abs() < 1e-15,
        "{after:?} {before:?}"
    );
    assert_eq!(after[1], before[1]);
    // The sparse input layer pays it too.
    let sparse = ModelShape {
        input_nnz: Some(5.0),
        ..shape()
    };
    let with = layer(&sparse, &cal, 0, rows, Order::Cheaper, false);
    cal.operators.get_mut("gcn_norm").unwrap().per_unit_s = 0.0;
    let without = layer(&sparse, &cal, 0, rows, Order::Cheaper, false);
    assert!(
        (with - without - 1200.0 * 2e-9).abs() < 1e-15,
        "{with} {without}"
    );
}

/// A step pays its gradient allreduce, and a sixteenth of the one that sums the losses and
/// counters of 16 steps (`losses::READ_EVERY`), latency included.
#[test]
fn a_step_pays_its_share_of_the_grouped_loss_allreduce() {
    let mut cal = machine();
    let allreduce = cal.operators.get_mut("allreduce").expect("calibrated");
    allreduce.latency_s = 1e-5;
    let p = predict(
        &two_even_ranks(),
        &shape(),
        &cal,
        &["gdp"],
        "alltoallv_world",
    );
    let group = crate::train::losses::READ_EVERY as f64;
    let gradients = 1e-5 + 1000.0 * 4.0 * 5e-10;
    let losses = (1e-5 + 32.0 * group * 5e-10) / group;
    let sync = p.strategies["gdp"].phases.sync;
    assert!((sync - gradients - losses).abs() < 1e-15, "{sync}");
}

#[test]
fn the_sampler_is_priced_warm_where_the_step_leaves_the_graph_in_the_cache() {
    let mut cal = machine();
    // Back to back the sampler costs half as much an edge as from evicted caches.
    let warm_fit = cal.operators.get_mut("sample_warm").unwrap();
    (warm_fit.latency_s, warm_fit.per_unit_s) = (1e-4, 0.5e-6);
    let (cold, hot) = (1e-4 + 2200.0 * 1e-6, 1e-4 + 2200.0 * 0.5e-6);
    let c = counts(0.0);
    let exchange = cal.op("alltoallv_world").seconds(8000.0, 6.0);
    let build = |shape: &ModelShape| gdp(shape, &cal, &c, "alltoallv_world").phases.build;
    // The machine's 32 MiB cache, shared by its 2 ranks: 16 MiB a rank. The step touches
    // 1000 input rows of 100 columns (400 KB), outputs of 200 × 10 and 10 × 2 and their
    // gradients (16,160 B), and 1000 parameters with gradients and moments (16 KB).
    let step = 400_000.0 + 16_160.0 + 16_000.0;
    let share = 16.0 * 1024.0 * 1024.0;
    // A 4 MB adjacency beside that stays whole: priced back to back.
    let small = ModelShape {
        graph_bytes: 4e6,
        ..shape()
    };
    assert!(
        (build(&small) - hot - exchange).abs() < 1e-15,
        "{}",
        build(&small)
    );
    // An adjacency 4× the rank's share: a quarter of it (less the step's bytes) stays.
    let big = ModelShape {
        graph_bytes: 4.0 * share,
        ..shape()
    };
    let warm = (share - step) / (4.0 * share);
    let priced = cold - warm * (cold - hot) + exchange;
    assert!(
        (build(&big) - priced).abs() < 1e-15,
        "{} {priced}",
        build(&big)
    );
    // A model whose parameters alone fill the share leaves nothing of even a small graph.
    let wide = ModelShape {
        params: share / 16.0,
        ..small.clone()
    };
    assert!((build(&wide) - cold - exchange).abs() < 1e-15);
    // On a device the model's bytes stay there: only the input rows pass the host's cache.
    let device = ModelShape {
        device: true,
        ..wide.clone()
    };
    assert!((build(&device) - hot - exchange).abs() < 1e-15);
    // Without warm points (ranks sharing cores sample back to back anyway): the one price.
    let mut shared = machine();
    shared.operators.get_mut("sample").unwrap().per_unit_s = 1e-6;
    let one = gdp(&small, &shared, &c, "alltoallv_world").phases.build;
    assert!((one - cold - exchange).abs() < 1e-15);
}

#[test]
fn nfp_samples_warm_only_where_the_whole_graph_stays_in_the_cache() {
    let mut cal = machine();
    let warm_fit = cal.operators.get_mut("sample_warm").unwrap();
    (warm_fit.latency_s, warm_fit.per_unit_s) = (1e-4, 0.5e-6);
    let (a, b) = (counts(0.0), counts(0.0));
    let price = |whole: f64| {
        let s = ModelShape {
            graph_bytes: 1e6,
            whole_graph_bytes: whole,
            ..shape()
        };
        nfp(&s, &cal, &[&a, &b], 0, "alltoallv_world").phases.build
    };
    // Every NFP rank samples the whole graph: a part that fits says nothing of it. A whole
    // graph of 1 MB stays; of 1 GB, what the rank's 16 MiB less its step's 432,160 bytes
    // hold of it.
    let gap = 2200.0 * 0.5e-6;
    let warm = (16.0 * 1024.0 * 1024.0 - 432_160.0) / 1e9;
    assert!((price(1e9) - price(1e6) - (1.0 - warm) * gap).abs() < 1e-15);
}

#[test]
fn the_kernels_are_priced_warm_as_far_as_the_step_fits_the_cache() {
    let mut warm = machine();
    // Back to back the products and the aggregation take half their evicted time.
    warm.operators.get_mut("gemm_warm").unwrap().per_unit_s = 0.5e-9;
    warm.operators.get_mut("aggregate_warm").unwrap().per_byte_s = 0.5e-8 / 4.0;
    let c = counts(0.0);
    let train = |cal: &Calibration, s: &ModelShape| gdp(s, cal, &c, "alltoallv_world").phases.train;
    // Every kernel at its warm price: what the step costs all from the cache.
    let mut all_warm = machine();
    all_warm.operators.get_mut("gemm").unwrap().per_unit_s = 0.5e-9;
    all_warm.operators.get_mut("aggregate").unwrap().per_byte_s = 0.5e-8 / 4.0;
    let s = shape();
    let (cold, hot) = (train(&machine(), &s), train(&all_warm, &s));
    assert!(hot < cold);
    // The step touches 432,160 bytes (the sampler's test) of the rank's 16 MiB: that much
    // less than all of the way to the warm price, as the planner prices it.
    let share = 1.0 - 432_160.0 / (16.0 * 1024.0 * 1024.0);
    let dry = DryRun::uniform(1, 1, vec![std::array::from_fn(|_| counts(0.0)); 2]);
    let p = predict(&dry, &s, &warm, &["gdp"], "alltoallv_world");
    let want = cold - share * (cold - hot);
    let got = p.strategies["gdp"].phases.train;
    assert!((got - want).abs() < 1e-12 * want, "{got} {want}");
    // Parameters that fill the share leave nothing warm; nor does a device's step.
    let wide = ModelShape {
        params: 16.0 * 1024.0 * 1024.0 / 16.0,
        ..s.clone()
    };
    let p = predict(&dry, &wide, &warm, &["gdp"], "alltoallv_world");
    assert!((p.strategies["gdp"].phases.train - train(&machine(), &wide)).abs() < 1e-15);
    let device = ModelShape {
        device: true,
        ..s.clone()
    };
    let p = predict(&dry, &device, &warm, &["gdp"], "alltoallv_world");
    assert!((p.strategies["gdp"].phases.train - train(&machine(), &device)).abs() < 1e-15);
}

/// A gather's far share is read at the store's bytes and what the rest of the step touches
/// beside them (its other host bytes and the adjacency the sampler walks): a store the cache
/// holds alone is priced near, the same store beside a large graph as far.
#[test]
fn a_gather_is_priced_far_as_the_rest_of_the_step_crowds_the_store_out() {
    let mut cal = machine();
    let far_fit = cal.operators.get_mut("gather_far").unwrap();
    (far_fit.per_unit_s, far_fit.per_byte_s) = (3e-8, 1e-10);
    let mib = 1024.0 * 1024.0;
    cal.far_shares = vec![[16.0 * mib, 0.0], [256.0 * mib, 1.0]];
    let c = counts(0.0);
    let load = |graph_bytes: f64| {
        let s = ModelShape {
            store_bytes: mib,
            graph_bytes,
            ..shape()
        };
        gdp(&s, &cal, &c, "alltoallv_world").phases.load
    };
    let near = cal
        .op("gather")
        .seconds_touching(1000.0, 1000.0 * 400.0, 2.0);
    let far = cal
        .op("gather_far")
        .seconds_touching(1000.0, 1000.0 * 400.0, 2.0);
    assert!((load(0.0) - near).abs() < 1e-15, "{} {near}", load(0.0));
    assert!(
        (load(512.0 * mib) - far).abs() < 1e-15,
        "{} {far}",
        load(512.0 * mib)
    );
    let between = load(64.0 * mib);
    assert!(near < between && between < far, "{near} {between} {far}");
}
