//! The products of one GraphSAGE training step (`inputs/sage-bench.toml`: 3 layers, hidden
//! 256, fanouts 15,10,5 from the seeds outward, batch 1024, seed 0), with the row counts of a
//! real sampled mini-batch: the first batch of epoch 0, drawn by gnnpar's own sampler exactly
//! as `gnnpar train` draws it on one rank.

use std::path::Path;

use gnnpar::backend::cpu::sparse::prefers_sparse;
use gnnpar::graph::format::read_dataset;
use gnnpar::sample::{epoch_batches, sample_blocks, BatchKey, LocalGraph};
use ndarray::Axis;

pub const HIDDEN: usize = 256;
pub const FANOUTS: [i32; 3] = [15, 10, 5];
pub const BATCH: usize = 1024;
pub const SEED: u64 = 0;

/// One SAGE layer of the step: `nd` destinations, `ns` sources, `e` sampled edges,
/// `in_dim → out_dim`.
#[derive(Clone, Debug)]
pub struct LayerShape {
    pub nd: usize,
    pub ns: usize,
    pub e: usize,
    pub in_dim: usize,
    pub out_dim: usize,
}

/// A dataset's step: its layers (input layer first), whether the input features take the
/// sparse path (`prefers_sparse`: then the first layer runs no dense GEMM), and where the
/// numbers came from.
#[derive(Clone, Debug)]
pub struct StepShape {
    pub dataset: String,
    pub layers: Vec<LayerShape>,
    pub sparse_input: bool,
    pub source: String,
}

impl StepShape {
    /// Does layer `l` aggregate before projecting (one product `[h_dst | mean]·[W_self;
    /// W_neigh]`)? The rule of `nn::sage::SageConv::aggregate_first`, copied here.
    pub fn aggregate_first(&self, l: usize) -> bool {
        let s = &self.layers[l];
        let (i, o) = (s.in_dim, s.out_dim);
        s.e * i + s.nd * i * o <= s.ns * i * o + s.e * o
    }
}

/// The step on a prepared dataset file.
pub fn sample_step(name: &str, path: &Path) -> Result<StepShape, String> {
    let ds = read_dataset(path).map_err(|e| format!("{}: {e:#}", path.display()))?;
    let mut train = ds.splits.train.clone();
    train.sort_unstable();
    let batches = epoch_batches(&train, |v| v as u64, SEED, 0, BATCH);
    let seeds = batches.first().ok_or("no training vertices")?;
    let graph = LocalGraph::new(&ds, None);
    let key = BatchKey {
        seed: SEED,
        epoch: 0,
        batch: 0,
    };
    let blocks = sample_blocks(&graph, seeds, &FANOUTS, key);
    let features = ds.features.as_ref().ok_or("dataset without features")?;
    let idx: Vec<usize> = blocks[0].src_nodes.iter().map(|&v| v as usize).collect();
    let x = features.select(Axis(0), &idx);
    let sparse_input = prefers_sparse(x.view());
    let classes = ds.num_classes;
    let n_layers = blocks.len();
    let layers = blocks
        .iter()
        .enumerate()
        .map(|(l, b)| LayerShape {
            nd: b.num_dst,
            ns: b.num_src(),
            e: b.num_edges(),
            in_dim: if l == 0 { ds.feature_dim() } else { HIDDEN },
            out_dim: if l + 1 == n_layers { classes } else { HIDDEN },
        })
        .collect();
    Ok(StepShape {
        dataset: name.to_string(),
        layers,
        sparse_input,
        source: format!("sampled from {}", path.display()),
    })
}

/// The numbers `sample_step` gave on the datasets of `benchmarks/gemm.sh` when this file was
/// written (Tolokers and Facebook prepared from `shared/datasets`, the SBM generated with
/// `--nodes 200000 --edges 8000000 --features 128 --classes 16 --seed 1`), for a run without
/// the data. Each tuple: `(nd, ns, e)` per layer, input layer first.
pub fn recorded(name: &str) -> Option<StepShape> {
    let (feat, classes, sparse, blocks): (usize, usize, bool, [(usize, usize, usize); 3]) =
        match name {
            "tolokers" => (10, 2, false, RECORDED_TOLOKERS),
            "facebook" => (4714, 4, true, RECORDED_FACEBOOK),
            "sbm200k" => (128, 16, false, RECORDED_SBM),
            _ => return None,
        };
    let layers = blocks
        .iter()
        .enumerate()
        .map(|(l, &(nd, ns, e))| LayerShape {
            nd,
            ns,
            e,
            in_dim: if l == 0 { feat } else { HIDDEN },
            out_dim: if l == 2 { classes } else { HIDDEN },
        })
        .collect();
    Some(StepShape {
        dataset: name.to_string(),
        layers,
        sparse_input: sparse,
        source: "recorded (dataset not found)".to_string(),
    })
}

// From `sample_step` (the same counts `gnnpar train --max-steps 1` reports as `nodes`,
// `edges` and `input_rows`).
const RECORDED_TOLOKERS: [(usize, usize, usize); 3] = [
    (8519, 9483, 41451),
    (5197, 8519, 49335),
    (1024, 5197, 12238),
];
const RECORDED_FACEBOOK: [(usize, usize, usize); 3] = [
    (14991, 18404, 67351),
    (6567, 14991, 54456),
    (1024, 6567, 8353),
];
const RECORDED_SBM: [(usize, usize, usize); 3] = [
    (112777, 193892, 563885),
    (15726, 112777, 157260),
    (1024, 15726, 15360),
];
