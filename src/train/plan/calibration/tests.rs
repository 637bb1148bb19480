//! The fits' and the calibration's arithmetic, and the file's key and loading.

use super::*;

pub(crate) fn key() -> CalibrationKey {
    CalibrationKey {
        host: "h1".into(),
        ranks: 2,
        nodes: 1,
        ranks_per_node: 2,
        threads_per_rank: 1,
        device: "CPU".into(),
        version: "0.1.0".into(),
    }
}

fn calibration() -> Calibration {
    Calibration {
        format: FORMAT,
        key: key(),
        seconds_to_calibrate: 1.0,
        operators: OPERATORS
            .iter()
            .map(|(op, unit)| (op.to_string(), Fit::least_squares(unit, vec![[1.0, 2.0]])))
            .collect(),
        shared_cores: None,
        cache_bytes: 32.0 * 1024.0 * 1024.0,
        private_cache_bytes: 2.0 * 1024.0 * 1024.0,
        sample_window: 1,
        far_shares: vec![],
    }
}

#[test]
fn least_squares_recovers_a_line_and_never_goes_negative() {
    let pts = (1..6)
        .map(|i| [i as f64 * 1e6, 1e-5 + i as f64 * 1e6 / 5e9])
        .collect();
    let f = Fit::least_squares("byte", pts);
    assert!((f.latency_s - 1e-5).abs() < 1e-12, "{f:?}");
    assert!((f.per_unit_s - 2e-10).abs() < 1e-18, "{f:?}");
    // Decreasing noise: through the origin (Σxy / Σx² = 5 / 5), neither a negative slope
    // nor a flat line that prices more work as no dearer.
    let f = Fit::least_squares("byte", vec![[1.0, 3.0], [2.0, 1.0]]);
    assert_eq!((f.latency_s, f.per_unit_s), (0.0, 1.0));
    // One size only: its mean, as a latency.
    let f = Fit::least_squares("byte", vec![[2.0, 3.0], [2.0, 1.0]]);
    assert_eq!((f.latency_s, f.per_unit_s), (2.0, 0.0));
    // Negative intercept: refitted through the origin.
    let f = Fit::least_squares("byte", vec![[1.0, 0.5], [2.0, 2.0], [3.0, 3.5]]);
    assert_eq!(f.latency_s, 0.0);
    assert!(f.per_unit_s > 0.0);
}

#[test]
fn the_two_term_fit_recovers_flops_and_bytes_and_stays_non_negative() {
    // 1 µs a call, 10 GFLOP/s, 5 GB/s, on shapes where flops and bytes vary apart.
    let shapes = [
        (1e6, 1e5),
        (1e8, 1e6),
        (1e7, 4e7),
        (5e8, 2e6),
        (2e7, 1e7),
        (1e9, 3e7),
    ];
    let pts: Vec<[f64; 2]> = shapes
        .iter()
        .map(|&(f, b)| [f, 1e-6 + f * 1e-10 + b * 2e-10])
        .collect();
    let bytes = shapes.iter().map(|s| s.1).collect();
    let f = Fit::least_squares_with_bytes("flop", pts, bytes);
    assert!((f.latency_s - 1e-6).abs() < 1e-9, "{f:?}");
    assert!((f.per_unit_s / 1e-10 - 1.0).abs() < 1e-6, "{f:?}");
    assert!((f.per_byte_s / 2e-10 - 1.0).abs() < 1e-6, "{f:?}");
    assert!((f.seconds_touching(1e8, 1e6, 1.0) - (1e-6 + 1e-2 + 2e-4)).abs() < 1e-12);
    // Time falling with bytes (noise): the bytes term is dropped, not made negative.
    let pts = vec![[1e6, 3e-3], [2e6, 2e-3], [3e6, 4e-3], [4e6, 3e-3]];
    let f = Fit::least_squares_with_bytes("flop", pts, vec![1e6, 9e6, 2e6, 8e6]);
    assert!(
        f.latency_s >= 0.0 && f.per_unit_s >= 0.0 && f.per_byte_s >= 0.0,
        "{f:?}"
    );
}

#[test]
fn points_price_between_neighbours_and_along_the_line_beyond() {
    // Cheap per unit while the work fits the caches, dearer beyond (x = bytes).
    let f = Fit::through_points("byte", vec![[4e6, 8e-3], [1e3, 4e-6], [1e5, 7e-5]]);
    assert!(f.by_points);
    assert_eq!(f.points[0], [1e3, 4e-6], "kept sorted");
    let per = f.per_unit_s;
    // One call at a point costs the point; between two, the straight line joining them.
    assert_eq!(f.seconds(1e5, 1.0), 7e-5);
    let mid = 7e-5 + (8e-3 - 7e-5) * (1e6 - 1e5) / (4e6 - 1e5);
    assert!((f.seconds(1e6, 1.0) - mid).abs() < 1e-15);
    // Calls share the units: two calls of 1e5 cost two points.
    assert_eq!(f.seconds(2e5, 2.0), 2.0 * 7e-5);
    // Below the smallest point, towards the line's latency at 0 (here 0: through the origin).
    assert_eq!(f.latency_s, 0.0);
    assert!((f.seconds(500.0, 1.0) - 2e-6).abs() < 1e-18);
    // Beyond the largest, the line's slope from it.
    assert!((f.seconds(5e6, 1.0) - (8e-3 + 1e6 * per)).abs() < 1e-15);
    // The line alone would price the middle point differently.
    let line = Fit {
        by_points: false,
        ..f.clone()
    };
    assert_ne!(line.seconds(1e5, 1.0), f.seconds(1e5, 1.0));
    // Work inside another call (no calls of its own): the points less a call's latency.
    assert_eq!(f.seconds(1e5, 0.0), 7e-5);
    // More work never prices cheaper, whatever the noise of the points.
    let noisy = Fit::through_points("byte", vec![[1.0, 5.0], [2.0, 3.0], [4.0, 6.0]]);
    assert_eq!(noisy.seconds(2.0, 1.0), 5.0);
    assert!(noisy.seconds(3.0, 1.0) >= 5.0);
}

#[test]
fn a_row_exchange_pays_per_row_beyond_its_calibrated_rows() {
    // 1 ns a byte through the points, 100 ns a row beyond rows of 64 columns (256 B).
    let mut f = Fit::through_points("byte", vec![[0.0, 0.0], [1e6, 1e-3]]);
    f.per_row_s = 1e-7;
    let bytes = 256_000.0;
    // Rows of the calibrated width: the bytes' price alone.
    assert!((f.seconds_rows(bytes, 1000.0, 1.0) - 256e-6).abs() < 1e-15);
    // 40-byte rows: 6400 rows, 5400 more than the calibrated 1000.
    let narrow = f.seconds_rows(bytes, 6400.0, 1.0);
    assert!(
        (narrow - (256e-6 + 5400.0 * 1e-7)).abs() < 1e-15,
        "{narrow}"
    );
    // Rows wider than the calibrated ones cost less, never under half the bytes' price.
    assert!((f.seconds_rows(bytes, 1.0, 1.0) - (256e-6 - 999.0 * 1e-7)).abs() < 1e-15);
    f.per_row_s = 1e-6;
    assert_eq!(f.seconds_rows(bytes, 1.0, 1.0), 128e-6);
    // No rows' cost without one measured.
    f.per_row_s = 0.0;
    assert_eq!(f.seconds_rows(bytes, 6400.0, 1.0), f.seconds(bytes, 1.0));
}

#[test]
fn products_pay_only_for_the_bytes_each_call_cannot_keep_in_the_cores_caches() {
    let mut cal = calibration();
    cal.private_cache_bytes = 1000.0;
    let gemm = cal.operators.get_mut("gemm").unwrap();
    (gemm.latency_s, gemm.per_unit_s, gemm.per_byte_s) = (1e-6, 1e-9, 1e-8);
    // Two calls of 600 bytes each: within the cache, the flops and latencies alone.
    let small = cal.products(Product::Forward, &products(5000.0, 1200.0, 2.0));
    assert!((small - (2e-6 + 5e-6)).abs() < 1e-18, "{small}");
    // Two calls of 1500 bytes: 500 beyond the cache each.
    let large = cal.products(Product::Forward, &products(5000.0, 3000.0, 2.0));
    assert!(
        (large - (2e-6 + 5e-6 + 1000.0 * 1e-8)).abs() < 1e-18,
        "{large}"
    );
    // Without a private cache (a device's calibration) every byte is priced.
    cal.private_cache_bytes = 0.0;
    let all = cal.products(Product::Forward, &products(5000.0, 3000.0, 2.0));
    assert!((all - (2e-6 + 5e-6 + 3000.0 * 1e-8)).abs() < 1e-18, "{all}");
}

fn products(flops: f64, bytes: f64, calls: f64) -> Products {
    Products {
        flops,
        bytes,
        calls,
        inner: 64.0,
        cols: 64.0,
    }
}

#[test]
fn a_backward_form_costs_the_forward_times_its_ratio_at_the_nearest_shapes() {
    let mut cal = calibration();
    // The forward at 1 ns a flop; the weight gradient 3× it at the shapes of 4096
    // columns, 1× elsewhere; the input gradient 2× everywhere.
    let timed = |ratio: &dyn Fn(usize) -> f64| -> Vec<[f64; 2]> {
        GEMM_SHAPES
            .iter()
            .map(|&(m, k, n)| {
                let flops = (2 * m * k * n) as f64;
                [flops, flops * 1e-9 * ratio(k)]
            })
            .collect()
    };
    for (op, ratio) in [
        ("gemm", &(|_| 1.0) as &dyn Fn(usize) -> f64),
        ("gemm_tn", &|k| if k == 4096 { 3.0 } else { 1.0 }),
        ("gemm_nt", &|_| 2.0),
    ] {
        let fit = cal.operators.get_mut(op).unwrap();
        fit.points = timed(ratio);
        (fit.latency_s, fit.per_unit_s, fit.per_byte_s) = (0.0, 1e-9, 0.0);
    }
    cal.private_cache_bytes = f64::INFINITY;
    let at = |inner: f64, cols: f64| Products {
        flops: 1e6,
        bytes: 0.0,
        calls: 1.0,
        inner,
        cols,
    };
    let priced = |p: &Products| Product::ALL.map(|form| cal.products(form, p));
    // At a calibrated shape: exactly its ratios.
    let wide = priced(&at(4096.0, 64.0));
    assert!(
        (wide[0] - 1e-3).abs() < 1e-15 && (wide[1] - 3e-3).abs() < 1e-15,
        "{wide:?}"
    );
    assert!((wide[2] - 2e-3).abs() < 1e-15, "{wide:?}");
    // Between shapes: a blend of the nearest ones' ratios, within theirs.
    let between = priced(&at(2048.0, 128.0))[1] / 1e-3;
    assert!(between > 1.0 && between < 3.0, "{between}");
    // Far from the wide shapes: the forward's price.
    let narrow = priced(&at(64.0, 64.0));
    assert!((narrow[1] - 1e-3).abs() < 1e-15, "{narrow:?}");
    // A calibration without points of the forms (a synthetic one) prices them as forward.
    assert_eq!(
        calibration().form_ratio(Product::WeightGradient, 4096.0, 64.0),
        1.0
    );
}

#[test]
fn the_wire_carries_every_operators_pricing() {
    let mut cal = calibration();
    cal.operators.insert(
        "aggregate".into(),
        Fit::through_points("edge", vec![[1.0, 2.0], [4.0, 3.0]]),
    );
    cal.operators.get_mut("alltoallv_world").unwrap().per_row_s = 1e-7;
    cal.operators.insert("gather".into(), gather_grid());
    cal.far_shares = vec![[16e6, 0.0], [64e6, 0.4], [512e6, 1.0]];
    let mut other = Calibration {
        operators: BTreeMap::new(),
        cache_bytes: 0.0,
        private_cache_bytes: 0.0,
        sample_window: 1,
        far_shares: vec![],
        ..cal.clone()
    };
    other.set_wire(&cal.wire());
    assert_eq!(other.cache_bytes, cal.cache_bytes);
    assert_eq!(other.private_cache_bytes, cal.private_cache_bytes);
    assert_eq!(other.far_shares, cal.far_shares);
    for (op, _) in OPERATORS {
        let (a, b) = (cal.op(op), other.op(op));
        assert_eq!(
            (
                a.latency_s,
                a.per_unit_s,
                a.per_byte_s,
                a.per_row_s,
                a.by_points
            ),
            (
                b.latency_s,
                b.per_unit_s,
                b.per_byte_s,
                b.per_row_s,
                b.by_points
            ),
            "{op}"
        );
        assert_eq!(a.points, b.points, "{op}");
        assert_eq!(a.point_bytes, b.point_bytes, "{op}");
        assert_eq!(a.seconds(3.0, 1.0), b.seconds(3.0, 1.0), "{op}");
        assert_eq!(
            a.seconds_touching(300.0, 3e4, 1.0),
            b.seconds_touching(300.0, 3e4, 1.0),
            "{op}"
        );
    }
}

/// A gather measured at 32- and 512-byte rows over 100 and 1000 rows, 512-byte rows
/// dearer per row in the larger gather (its batch matrix no longer in the caches).
fn gather_grid() -> Fit {
    let points = vec![
        [100.0, 3e-6],
        [1000.0, 3e-5],
        [100.0, 1e-5],
        [1000.0, 1.5e-4],
    ];
    let bytes = vec![3200.0, 32000.0, 51200.0, 512000.0];
    Fit {
        by_points: true,
        ..Fit::least_squares_relative_with_bytes("row", points, bytes)
    }
}

#[test]
fn gathers_price_through_their_points_by_rows_and_row_size() {
    let f = gather_grid();
    assert!(f.by_grid());
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-9);
    // A measured point costs what it measured, in one call or shared by calls.
    assert!(close(f.seconds_touching(1000.0, 512000.0, 1.0), 1.5e-4));
    assert!(close(f.seconds_touching(200.0, 6400.0, 2.0), 6e-6));
    // Between two counts of one row size, the straight line joining them.
    let mid = 1e-5 + (1.5e-4 - 1e-5) * 400.0 / 900.0;
    assert!(close(f.seconds_touching(500.0, 256000.0, 1.0), mid));
    // Beyond the largest count, along the last segment (the large gathers' own cost per
    // row, 155 ns here), not the line through every point.
    let beyond = 1.5e-4 + 9000.0 * (1.5e-4 - 1e-5) / 900.0;
    assert!(close(f.seconds_touching(1e4, 5.12e6, 1.0), beyond));
    let line = Fit {
        by_points: false,
        ..f.clone()
    };
    assert!(line.seconds_touching(1e4, 5.12e6, 1.0) < 0.8 * beyond);
    // Between two row sizes, linear in the row's bytes.
    let (small, large) = (3e-5, 1.5e-4);
    let t = (272.0 - 32.0) / (512.0 - 32.0);
    assert!(close(
        f.seconds_touching(1000.0, 272000.0, 1.0),
        small + (large - small) * t
    ));
    // Beyond the largest size, along the two largest; below the smallest, never under it.
    let wide = small + (large - small) * (1024.0 - 32.0) / 480.0;
    assert!(close(f.seconds_touching(1000.0, 1024000.0, 1.0), wide));
    assert!(close(f.seconds_touching(1000.0, 8000.0, 1.0), small));
    // Nothing gathered costs nothing; bytes without rows are priced by the line; work
    // inside another call pays no latency of its own.
    assert_eq!(f.seconds_touching(0.0, 0.0, 0.0), 0.0);
    assert_eq!(f.seconds_touching(0.0, 1e6, 0.0), 1e6 * f.per_byte_s);
    let inside = f.seconds_touching(1000.0, 32000.0, 0.0);
    assert!(close(inside, 3e-5 - f.latency_s.min(3e-6)));
    // A calibration whose bytes do not match its points is refused.
    let mut cal = calibration();
    let mut broken = gather_grid();
    broken.point_bytes.pop();
    cal.operators.insert("gather".into(), broken);
    let err = cal.check("c.json").unwrap_err().to_string();
    assert!(err.contains("operators.gather.points"), "{err}");
}

#[test]
fn files_round_trip_and_foreign_keys_are_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("cal.json");
    assert!(matches!(load(&path, &key()).unwrap(), Loaded::Missing));
    let cal = calibration();
    cal.save(&path).unwrap();
    match load(&path, &key()).unwrap() {
        Loaded::Usable(c) => assert_eq!(c, cal),
        other => panic!("{other:?}"),
    }
    for (field, value) in [("host", "h2"), ("version", "9.9.9")] {
        let mut other = key();
        match field {
            "host" => other.host = value.into(),
            _ => other.version = value.into(),
        }
        match load(&path, &other).unwrap() {
            Loaded::Foreign(why) => assert!(why.contains(field), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn bad_files_name_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cal.json");
    std::fs::write(&path, "{not json").unwrap();
    let err = format!("{:#}", load(&path, &key()).unwrap_err());
    assert!(err.contains("cal.json") && err.contains("JSON"), "{err}");

    let mut unsorted = calibration();
    unsorted.operators.insert(
        "allreduce".into(),
        Fit::through_points("byte", vec![[1.0, 1.0], [2.0, 2.0]]),
    );
    unsorted
        .operators
        .get_mut("allreduce")
        .unwrap()
        .points
        .reverse();
    std::fs::write(&path, serde_json::to_string(&unsorted).unwrap()).unwrap();
    let err = format!("{:#}", load(&path, &key()).unwrap_err());
    assert!(
        err.contains("cal.json") && err.contains("operators.allreduce.points"),
        "{err}"
    );

    let mut v = serde_json::to_value(calibration()).unwrap();
    v["operators"]["gemm"]
        .as_object_mut()
        .unwrap()
        .remove("per_unit_s");
    std::fs::write(&path, v.to_string()).unwrap();
    let err = format!("{:#}", load(&path, &key()).unwrap_err());
    assert!(
        err.contains("cal.json") && err.contains("per_unit_s"),
        "{err}"
    );

    let mut v = serde_json::to_value(calibration()).unwrap();
    v["operators"]["allreduce"]["latency_s"] = serde_json::json!(-1.0);
    std::fs::write(&path, v.to_string()).unwrap();
    let err = format!("{:#}", load(&path, &key()).unwrap_err());
    assert!(
        err.contains("cal.json") && err.contains("operators.allreduce.latency_s"),
        "{err}"
    );

    let mut v = serde_json::to_value(calibration()).unwrap();
    v["operators"].as_object_mut().unwrap().remove("h2d");
    std::fs::write(&path, v.to_string()).unwrap();
    let err = format!("{:#}", load(&path, &key()).unwrap_err());
    assert!(err.contains("operators.h2d"), "{err}");

    // JSON that is no calibration at all is an error, not a foreign calibration to
    // measure again over it.
    for text in ["[1, 2, 3]", r#"{"format": "15"}"#, r#"{"name": "x"}"#] {
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", load(&path, &key()).unwrap_err());
        assert!(
            err.contains("cal.json") && err.contains("not a gnnpar calibration"),
            "{text}: {err}"
        );
    }
    // A damaged file is reported even when it was measured for another layout.
    let mut other = key();
    other.ranks += 1;
    let mut v = serde_json::to_value(calibration()).unwrap();
    v["operators"]["allreduce"]["latency_s"] = serde_json::json!(-1.0);
    std::fs::write(&path, v.to_string()).unwrap();
    let err = format!("{:#}", load(&path, &other).unwrap_err());
    assert!(err.contains("latency_s"), "{err}");
    // Another format number is a foreign file, said in a sentence.
    let mut v = serde_json::to_value(calibration()).unwrap();
    v["format"] = serde_json::json!(3);
    std::fs::write(&path, v.to_string()).unwrap();
    match load(&path, &key()).unwrap() {
        Loaded::Foreign(why) => assert!(why.contains("calibration format 3"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn default_paths_differ_by_layout() {
    let mut other = key();
    other.ranks = 4;
    assert_ne!(default_path(&key()), default_path(&other));
}

#[test]
fn the_far_share_is_what_of_a_store_the_ranks_share_of_the_cache_cannot_hold() {
    // 32 MiB among the key's 2 ranks: 16 MiB each.
    let cal = calibration();
    let mib = 1024.0 * 1024.0;
    assert_eq!(cal.far_share(0.0), 0.0);
    assert_eq!(cal.far_share(16.0 * mib), 0.0);
    assert!((cal.far_share(64.0 * mib) - 0.75).abs() < 1e-12);
    assert!(cal.far_share(1e12) < 1.0);
    let alone = Calibration {
        key: CalibrationKey {
            ranks_per_node: 1,
            ..key()
        },
        ..calibration()
    };
    assert!((alone.far_share(64.0 * mib) - 0.5).abs() < 1e-12);
}

#[test]
fn the_far_share_follows_the_measured_tables_in_log_bytes_and_bad_points_are_refused() {
    let mib = 1024.0 * 1024.0;
    let cal = Calibration {
        far_shares: vec![[16.0 * mib, 0.0], [64.0 * mib, 0.5], [512.0 * mib, 1.0]],
        ..calibration()
    };
    // Not the cache size's rule (16 MiB a rank there: 0.75 at 64 MiB) but the points.
    assert_eq!(cal.far_share(8.0 * mib), 0.0);
    assert!((cal.far_share(32.0 * mib) - 0.25).abs() < 1e-12);
    assert!((cal.far_share(64.0 * mib) - 0.5).abs() < 1e-12);
    assert!((cal.far_share(128.0 * mib) - 0.5 - 0.5 / 3.0).abs() < 1e-12);
    assert_eq!(cal.far_share(4096.0 * mib), 1.0);
    cal.check("test").unwrap();
    for bad in [
        vec![[64.0 * mib, 0.5], [16.0 * mib, 0.0]],
        vec![[16.0 * mib, 1.5]],
        vec![[f64::NAN, 0.0]],
        vec![[0.0, 0.0]],
    ] {
        let c = Calibration {
            far_shares: bad,
            ..calibration()
        };
        let e = c.check("cal.json").unwrap_err().to_string();
        assert!(e.contains("far_shares"), "{e}");
    }
}

#[test]
fn the_sampler_is_priced_between_its_evicted_and_back_to_back_points() {
    let mut cal = calibration();
    let line = |latency: f64, per_edge: f64| {
        let mut f = Fit::free("edge");
        (f.latency_s, f.per_unit_s) = (latency, per_edge);
        f
    };
    cal.operators.insert("sample".into(), line(1e-4, 2e-8));
    cal.operators.insert("sample_warm".into(), line(1e-4, 1e-8));
    let (cold, hot) = (1e-4 + 1e4 * 2e-8, 1e-4 + 1e4 * 1e-8);
    for (warm, want) in [(0.0, cold), (1.0, hot), (0.25, cold - 0.25 * (cold - hot))] {
        let got = cal.sampling(1e4, 2e3, warm);
        assert!(
            (got - want).abs() < 1e-15,
            "warm {warm}: {got} against {want}"
        );
    }
    // A window timed from evicted caches is scaled as a batch is.
    cal.operators
        .insert("sample_ahead".into(), line(1e-3, 2e-8));
    cal.sample_window = 4;
    let windowed = |warm: f64| cal.local_sampling(1e4, 2e3, 4, warm);
    let ratio = cal.sampling(1e4, 2e3, 0.5) / cold;
    assert!((windowed(0.5) - ratio * windowed(0.0)).abs() < 1e-15);
    // A rank with nothing to sample in a batch: a price, not a NaN.
    assert!(cal.local_sampling(0.0, 0.0, 4, 0.0).is_finite());
    assert!(windowed(0.5) < windowed(0.0));
    // Back-to-back points dearer than the evicted ones (noise) never raise the price, and
    // without them the evicted price holds whatever the share.
    cal.operators.insert("sample_warm".into(), line(1e-4, 3e-8));
    assert_eq!(cal.sampling(1e4, 2e3, 1.0), cold);
    cal.operators
        .insert("sample_warm".into(), Fit::free("edge"));
    assert_eq!(cal.sampling(1e4, 2e3, 1.0), cold);
}

#[test]
fn the_sampler_is_priced_by_its_edges_and_the_vertices_it_reads() {
    // Points of two synthetic graphs, 0.2 and 0.5 vertices an edge, timed at exactly
    // 10 µs + 0.3 ns an edge + 100 ns a vertex.
    let time = |e: f64, v: f64| 1e-5 + 3e-10 * e + 1e-7 * v;
    let (mut points, mut vertices) = (Vec::new(), Vec::new());
    for per_edge in [0.2, 0.5] {
        for e in [8e3f64, 3.2e4, 6.4e4, 1.28e5] {
            // The batches' own counts wobble a little about their graph's ratio.
            let v = e * per_edge * (1.0 + 0.005 * (e / 8e3).log2());
            points.push([e, time(e, v)]);
            vertices.push(v);
        }
    }
    let mut cal = calibration();
    let fit = Fit {
        by_points: true,
        ..Fit::least_squares_relative_with_bytes("edge", points, vertices)
    };
    cal.operators.insert("sample".into(), fit);
    cal.operators
        .insert("sample_warm".into(), Fit::free("edge"));
    // On either graph's points (within what the wobble moves a series off its first
    // point's ratio).
    for (e, v) in [(3.2e4, 3.2e4 * 0.2 * 1.01), (6.4e4, 6.4e4 * 0.5 * 1.015)] {
        let got = cal.sampling(e, v, 0.0);
        assert!(
            (got - time(e, v)).abs() < 0.02 * got,
            "{got} {}",
            time(e, v)
        );
    }
    // R-MAT's batches: 16k edges and 4.3k vertices, a batch of the dense graph's shape
    // with more vertices; dearer than the same edges at the dense graph's ratio.
    let (e, v) = (1.6e4, 4.3e3);
    let rmat = cal.sampling(e, v, 0.0);
    let dense = cal.sampling(e, e * 0.2, 0.0);
    assert!(rmat > 1.2 * dense, "{rmat} {dense}");
    assert!(
        (rmat - time(e, v)).abs() < 0.05 * rmat,
        "{rmat} {}",
        time(e, v)
    );
    // A window, timed over the dense graph, is scaled by what the vertices add.
    let mut line = Fit::free("edge");
    (line.latency_s, line.per_unit_s) = (1e-3, 2e-8);
    cal.operators.insert("sample_ahead".into(), line);
    cal.sample_window = 4;
    let ratio = cal.local_sampling(e, v, 4, 0.0) / cal.local_sampling(e, e * 0.2, 4, 0.0);
    assert!(
        (ratio - rmat / dense).abs() < 1e-9,
        "{ratio} {}",
        rmat / dense
    );
}

#[test]
fn a_fit_moves_toward_another_by_its_share() {
    let line = |latency: f64, per_unit: f64, per_byte: f64| Fit {
        latency_s: latency,
        per_unit_s: per_unit,
        per_byte_s: per_byte,
        points: vec![[1.0, 4.0], [2.0, 8.0]],
        ..Fit::free("flop")
    };
    let (cold, warm) = (line(4.0, 2.0, 1.0), line(2.0, 1.0, 0.0));
    let mid = cold.toward(&warm, 0.25);
    assert_eq!(
        (mid.latency_s, mid.per_unit_s, mid.per_byte_s),
        (3.5, 1.75, 0.75)
    );
    // A line's points are the record: left as measured.
    assert_eq!(mid.points, cold.points);
    assert_eq!(cold.toward(&warm, 0.0), cold);
    // Priced through its points, with the same points timed warm: each point moves, and one
    // timed dearer warm (noise) does not rise.
    let grid = |times: [f64; 3]| Fit {
        by_points: true,
        points: vec![[10.0, times[0]], [20.0, times[1]], [40.0, times[2]]],
        point_bytes: vec![40.0, 80.0, 160.0],
        ..Fit::free("edge")
    };
    let moved = grid([4.0, 8.0, 16.0]).toward(&grid([2.0, 10.0, 8.0]), 0.5);
    let seconds: Vec<f64> = moved.points.iter().map(|p| p[1]).collect();
    assert_eq!(seconds, vec![3.0, 8.0, 12.0]);
    // Other points (another machine's file, edited): the points stay.
    let mut other = grid([2.0, 2.0, 2.0]);
    other.point_bytes[0] = 44.0;
    assert_eq!(
        grid([4.0, 8.0, 16.0]).toward(&other, 0.5).points,
        grid([4.0, 8.0, 16.0]).points
    );
}

#[test]
fn warm_kernels_move_the_products_line_and_the_aggregations_points() {
    let mut cal = calibration();
    let fit = |per_unit: f64, times: [f64; 2]| Fit {
        per_unit_s: per_unit,
        points: vec![[1e6, times[0]], [2e6, times[1]]],
        point_bytes: vec![4e6, 8e6],
        ..Fit::free("edge")
    };
    // The aggregation is priced through its points.
    let grid = |per_unit: f64, times: [f64; 2]| Fit {
        by_points: true,
        ..fit(per_unit, times)
    };
    cal.operators
        .insert("gemm".into(), fit(2e-11, [2e-5, 4e-5]));
    cal.operators
        .insert("aggregate".into(), grid(4e-10, [4e-4, 8e-4]));
    // Without warm points (a device), any share leaves the calibration as it is.
    cal.operators.insert("gemm_warm".into(), Fit::free("flop"));
    cal.operators
        .insert("aggregate_warm".into(), Fit::free("edge"));
    assert_eq!(*cal.with_warm_kernels(1.0), cal);
    cal.operators
        .insert("gemm_warm".into(), fit(1e-11, [1e-5, 2e-5]));
    cal.operators
        .insert("aggregate_warm".into(), grid(2e-10, [2e-4, 4e-4]));
    assert_eq!(*cal.with_warm_kernels(0.0), cal);
    let half = cal.with_warm_kernels(0.5);
    assert!((half.op("gemm").per_unit_s - 1.5e-11).abs() < 1e-24);
    // The products' points stay (the backward forms' ratios come from them).
    assert_eq!(half.op("gemm").points, cal.op("gemm").points);
    for (p, want) in half.op("aggregate").points.iter().zip([3e-4, 6e-4]) {
        assert!((p[1] - want).abs() < 1e-18, "{p:?}");
    }
    // The transposed aggregation, timed cold only, moves as far as the forward's points.
    cal.operators
        .insert("aggregate_transpose".into(), grid(8e-10, [1e-3, 2e-3]));
    let half = cal.with_warm_kernels(0.5);
    for (p, want) in half
        .op("aggregate_transpose")
        .points
        .iter()
        .zip([7.5e-4, 1.5e-3])
    {
        assert!((p[1] - want).abs() < 1e-18, "{p:?}");
    }
    // The rest is untouched, and a share beyond 1 is 1.
    assert_eq!(half.op("sample"), cal.op("sample"));
    assert_eq!(cal.with_warm_kernels(3.0).op("gemm").per_unit_s, 1e-11);
}
