//! SliceGCN (`--strategy slicegcn`): at p = 1 without encoding or fusion it is a GCN with an MLP
//! head (the same parameters after a few steps as that model trained directly); a rank's
//! parameter count follows the layout's formula (the paper's Table III); 2 and 3 ranks train
//! deterministically through `mpirun`; a checkpoint resumes at the same rank count bit for bit
//! (with the cosine schedule) and is refused at another count; the CUDA emulator trains the
//! CPU's numbers. (Gradient checks of the encoding and the fusion: `tests/gradcheck.rs`.)

mod common;

use common::{max_rel_diff, run_with_timeout, s};
use gnnpar::backend::cpu::aggregate::LazyTranspose;
use gnnpar::backend::cpu::dropout::{derive_stream, mix64};
use gnnpar::backend::{Backend, Cpu, Cuda};
use gnnpar::comm::World;
use gnnpar::config::{LrSchedule, ModelKind, Strategy, TrainConfig};
use gnnpar::nn::{cross_entropy, Adam, DropoutCtx};
use gnnpar::sample::Block;
use gnnpar::train::slicegcn::{param_counts, SliceInput, SliceLayout, SliceModel, SliceTrainer};
use gnnpar::train::RunFiles;
use ndarray::{Array2, Axis};
use std::path::{Path, PathBuf};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(300);

fn slice_cfg(layers: usize, hidden: usize, dropout: f32) -> TrainConfig {
    TrainConfig {
        model: ModelKind::Gcn,
        strategy: Strategy::Slicegcn,
        layers,
        hidden,
        dropout,
        input_dropout: Some(dropout),
        full_batch: true,
        slice_encoding: false,
        feature_fusion: false,
        ..TrainConfig::default()
    }
}

/// A random undirected-ish graph of `n` vertices with self-loops, as one full-graph block.
fn graph(n: usize) -> Block {
    let (mut indptr, mut indices) = (vec![0], Vec::new());
    for v in 0..n {
        for e in 0..(mix64(v as u64) % 4 + 1) {
            indices.push((mix64(v as u64 * 16 + e + 7) % n as u64) as u32);
        }
        indptr.push(indices.len());
    }
    Block {
        num_dst: n,
        src_nodes: (0..n as u32).collect(),
        indptr,
        indices,
    }
    .with_self_loops()
}

#[test]
fn p1_without_encoding_or_fusion_is_a_gcn_with_an_mlp_head() {
    let n = 40;
    let block = graph(n);
    let degrees: Vec<u32> = (0..n)
        .map(|v| block.indices.iter().filter(|&&u| u as usize == v).count() as u32)
        .collect();
    let x = Array2::from_shape_fn((n, 6), |(i, j)| {
        (mix64((i * 6 + j) as u64) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    });
    let keys: Vec<u64> = (0..n as u64).collect();
    let rows: Vec<usize> = (0..n).filter(|v| v % 3 != 1).collect();
    let labels: Vec<i64> = rows.iter().map(|&r| (r % 3) as i64).collect();
    let cfg = slice_cfg(3, 16, 0.3);
    let layout = SliceLayout::new(0, 1, 6, 16, 1.0, false).unwrap();
    let mut slice = SliceModel::new(layout, &cfg, 3, 9).unwrap();
    assert!(slice.encoding.is_none() && slice.fusion.is_none());
    // The reference: the same initial GCN and head, trained as one model.
    let mut gcn = slice.gcn.clone();
    let head = slice.head.clone();
    let mut head_params = slice.shared.clone();
    let world = World::solo();
    let transpose = LazyTranspose::default();
    let input = SliceInput {
        graph: &block,
        transpose: &transpose,
        x: &x,
        keys: &keys,
        gcn_degrees: Some(&degrees),
    };
    let mut opt = (
        Adam::new(slice.shared.len(), 0.01, 0.0),
        Adam::new(slice.gcn.params.len(), 0.01, 0.0),
    );
    let mut ref_opt = (
        Adam::new(head_params.len(), 0.01, 0.0),
        Adam::new(gcn.params.len(), 0.01, 0.0),
    );
    let blocks = vec![&block; 3];
    for step in 0..4u64 {
        let stream = 1000 + step;
        let loss = slice.train_step(&world, &input, &rows, &labels, stream);
        opt.0.step(&mut slice.shared.values, &slice.shared.grads);
        opt.1
            .step(&mut slice.gcn.params.values, &slice.gcn.params.grads);

        gcn.params.zero_grads();
        head_params.zero_grads();
        let gcn_ctx = DropoutCtx {
            training: true,
            keep_for_backward: true,
            stream: derive_stream(stream, 0),
            orig_ids: None,
            gcn_degrees: Some(&degrees),
        };
        let head_ctx = DropoutCtx {
            stream,
            gcn_degrees: None,
            ..gcn_ctx
        };
        let (h, cache) = gcn.forward(&blocks, x.view(), &gcn_ctx);
        let picked = h.select(Axis(0), &rows);
        let row_keys: Vec<u64> = rows.iter().map(|&r| r as u64).collect();
        let (logits, hc) = head.forward(&head_params, picked.view(), &row_keys, &head_ctx);
        let (ref_loss, mut d) = cross_entropy(&logits, &labels);
        d /= rows.len() as f32;
        let dz = head.backward(&mut head_params, hc, d, true).unwrap();
        let mut dh = Array2::<f32>::zeros((n, 16));
        for (i, &r) in rows.iter().enumerate() {
            dh.row_mut(r).assign(&dz.row(i));
        }
        gcn.backward(&blocks, cache, dh);
        ref_opt.0.step(&mut head_params.values, &head_params.grads);
        ref_opt.1.step(&mut gcn.params.values, &gcn.params.grads);
        assert!(
            (loss - ref_loss).abs() <= 1e-5 * ref_loss.abs(),
            "step {step}: loss {loss} vs {ref_loss}"
        );
    }
    let d_gcn = max_rel_diff(&slice.gcn.params.values, &gcn.params.values, 1e-3);
    let d_head = max_rel_diff(&slice.shared.values, &head_params.values, 1e-3);
    assert!(d_gcn <= 1e-5 && d_head <= 1e-5, "{d_gcn:.2e} {d_head:.2e}");
    assert!(slice.gcn.params.values != slice.gcn.params.grads); // (trained, not untouched)
}

/// The paper's Table III: a rank's GCN has `gcn_in·w + w + (L-1)(w² + w)` parameters with
/// `w = ⌈hidden/p⌉`, so its hidden layers shrink as 1/p²; the built model has exactly the
/// formula's counts (shared parts included), here on Minesweeper's shape (7 features,
/// 7 layers, hidden 128, 2 classes).
#[test]
fn per_rank_parameters_shrink_as_in_table_iii() {
    // (p, rank 0's GCN parameters), worked out by hand from the formula.
    let expected = [
        (1, 7 * 128 + 128 + 6 * (128 * 128 + 128)),
        (2, 25_280),
        (3, 11_524),
        (4, 6_432),
    ];
    for (p, want) in expected {
        for encoding in [false, true] {
            for fusion in [false, true] {
                let mut cfg = slice_cfg(7, 128, 0.5);
                cfg.slice_encoding = encoding;
                cfg.feature_fusion = fusion;
                for rank in 0..p {
                    let layout = SliceLayout::new(rank, p, 7, 128, 1.0, fusion).unwrap();
                    let model = SliceModel::new(layout.clone(), &cfg, 2, 0).unwrap();
                    let formula = param_counts(&layout, 7, 128, 2, encoding);
                    assert_eq!(model.num_params(), formula, "p {p} rank {rank}");
                    if rank == 0 && !fusion {
                        assert_eq!(formula.0, want, "p {p}");
                    }
                }
            }
        }
    }
    // The hidden layers: 1/p² of the 1-rank model's.
    let hidden = |p: usize| {
        let w = 128usize.div_ceil(p);
        6 * (w * w + w)
    };
    assert_eq!(hidden(2) * 4, 6 * (128 * 128 + 4 * 64));
    assert!(hidden(4) * 16 <= hidden(1) + 6 * 16 * 32);
}

fn mpirun(np: usize, args: &[&str]) -> common::Outcome {
    let train: Vec<&str> = std::iter::once("train")
        .chain(args.iter().copied())
        .collect();
    run_with_timeout(common::mpirun_command(np, &train), TIMEOUT)
}

fn read_params(path: &Path) -> Vec<f32> {
    common::read_f32s(path, "params")
}

const SMALL: [&str; 14] = [
    "--strategy",
    "slicegcn",
    "--model",
    "gcn",
    "--layers",
    "2",
    "--hidden",
    "16",
    "--lr",
    "0.01",
    "--lr-schedule",
    "cosine",
    "--seed",
    "3",
];

#[test]
fn two_and_three_ranks_train_deterministically() {
    if !common::have_mpirun("two_and_three_ranks_train_deterministically") {
        return;
    }
    let tmp = common::tempdir();
    for np in [2, 3] {
        let mut runs = Vec::new();
        for attempt in 0..2 {
            let ck = tmp.path().join(format!("ck-{np}-{attempt}.h5"));
            let metrics = tmp.path().join(format!("m-{np}-{attempt}.jsonl"));
            let mut args = SMALL.to_vec();
            // SMALL's lr 0.01 is for short runs; 10 epochs at 0.03 bring the loss under chance.
            let lr = args.iter().position(|a| *a == "--lr").unwrap() + 1;
            args[lr] = "0.03";
            args.extend([
                "--epochs",
                "10",
                "--feature-fusion",
                "on",
                "--checkpoint",
                s(&ck),
                "--metrics",
                s(&metrics),
            ]);
            let out = mpirun(np, &args).expect_ok(&format!("slicegcn on {np} ranks"));
            // Every epoch's line has the step's phases (the exchanges of slice outputs and
            // their gradients as `shuffle`, the shared gradients' allreduce) and the per-rank
            // report of bytes moved.
            let text = std::fs::read_to_string(&metrics).unwrap();
            let last: serde_json::Value =
                serde_json::from_str(text.lines().last().unwrap()).unwrap();
            for phase in ["forward", "backward", "shuffle", "allreduce"] {
                assert!(
                    last["seconds"][phase].as_f64().unwrap() > 0.0,
                    "{phase}: {last}"
                );
            }
            let ranks = &last["ranks"];
            assert_eq!(ranks["ranks"].as_array().unwrap().len(), np, "{last}");
            assert!(
                ranks["max"]["comm.slice_grads.bytes_sent"]
                    .as_f64()
                    .unwrap()
                    > 0.0,
                "{last}"
            );
            let summary = out.last_json();
            assert_eq!(summary["ranks"], np);
            assert_eq!(
                summary["memory"]["host_peak_mb"].as_array().unwrap().len(),
                np
            );
            assert!(summary["memory"]["host_peak_mb_max"].as_f64().unwrap() > 0.0);
            runs.push((read_params(&ck), summary));
        }
        assert_eq!(
            runs[0].0, runs[1].0,
            "{np} ranks: parameters differ between runs"
        );
        assert_eq!(runs[0].1["final_loss"], runs[1].1["final_loss"]);
        // It learned: the loss fell below chance level (ln 8 = 2.079 for 8 classes).
        let loss = runs[0].1["final_loss"].as_f64().unwrap();
        assert!(loss < 2.0, "{np} ranks: final loss {loss}");
        let ck = tmp.path().join(format!("ck-{np}-0.h5"));
        assert_eq!(common::read_u64_attr(&ck, "slice_ranks"), np as u64);
    }
}

/// 2 epochs, then a resume for 2 more, gives the parameters of 4 epochs straight (the cosine
/// rate follows the epoch); resuming on 3 ranks is refused, naming both counts.
#[test]
fn resume_at_the_same_rank_count_only() {
    if !common::have_mpirun("resume_at_the_same_rank_count_only") {
        return;
    }
    let tmp = common::tempdir();
    let (whole, part) = (tmp.path().join("whole.h5"), tmp.path().join("part.h5"));
    let mut args = SMALL.to_vec();
    args.extend(["--epochs", "4", "--checkpoint"]);
    let run = |extra: &[&str], ck: &Path, np: usize| {
        let mut a = args.clone();
        a.push(s(ck));
        a.extend_from_slice(extra);
        mpirun(np, &a)
    };
    run(&[], &whole, 2).expect_ok("4 epochs");
    run(&["--max-steps", "2"], &part, 2).expect_ok("2 epochs");
    let halfway = read_params(&part);
    run(&["--resume"], &part, 2).expect_ok("resume");
    let (a, b) = (read_params(&whole), read_params(&part));
    assert_ne!(halfway, b, "the resumed run trained");
    assert_eq!(
        a, b,
        "resumed parameters differ from the uninterrupted run's"
    );
    let out = run(&["--resume"], &part, 3);
    assert!(!out.success, "a resume on 3 ranks must be refused");
    assert!(
        out.stderr.contains("2 ranks") && out.stderr.contains("3 ranks"),
        "{}",
        out.stderr
    );
}

/// A small SBM written by `gnnpar generate`.
fn small_sbm(dir: &Path) -> PathBuf {
    let sbm = common::Sbm {
        nodes: 600,
        edges: 6000,
        features: 12,
        classes: 3,
        seed: 5,
    };
    common::generate_sbm(dir, "sbm.h5", sbm)
}

fn train_on<B: Backend>(backend: B, cfg: &TrainConfig, data: &Path) -> (Vec<f32>, f64) {
    let world = World::solo();
    let files = RunFiles {
        data: Some(data.to_path_buf()),
        ..Default::default()
    };
    let mut t = SliceTrainer::on(backend, cfg.clone(), files, &world).expect("trainer");
    let summary = t.run().expect("training");
    let mut params = t.model.shared.values_on_host();
    params.extend(t.model.gcn.params.values_on_host());
    (params, summary.final_loss)
}

/// The CUDA backend (on its emulator, `GNNPAR_CUDA_EMULATOR`'s device) trains the CPU's
/// numbers: 4 steps with encoding, fusion, dropout and the cosine schedule, within 1e-4.
#[test]
fn cuda_emulator_gives_the_cpu_numbers() {
    let tmp = common::tempdir();
    let data = small_sbm(tmp.path());
    let mut cfg = slice_cfg(2, 16, 0.3);
    cfg.slice_encoding = true;
    cfg.feature_fusion = true;
    cfg.epochs = 4;
    cfg.lr = 0.01;
    cfg.lr_schedule = LrSchedule::Cosine;
    let (cpu, cpu_loss) = train_on(Cpu, &cfg, &data);
    let (gpu, gpu_loss) = train_on(Cuda::emulated().expect("emulator"), &cfg, &data);
    let d = max_rel_diff(&cpu, &gpu, 1e-3);
    assert!(d <= 1e-4, "parameters differ by {d:.2e}");
    assert!((cpu_loss - gpu_loss).abs() <= 1e-4 * cpu_loss.abs().max(1.0));
}
