//! `gnnpar presample <dataset.h5> --epochs K --fanouts … --batch-size B -o weights.h5`: run the
//! training sampler K epochs and write the pre-sampling weights for `gnnpar partition
//! --weights` (column convention in `presample::counts` and docs/format.md "weights.h5").
//!
//! With `--evaluate parts/` the same sampled mini-batches also measure that partition's split
//! statistics (per hop: load imbalance and % cross-split edges). Give a different `--seed`
//! than the one the weights were made with to measure on epochs the partitioner never saw.
//!
//! The last stdout line is one JSON object `{"presample": {…}}` for scripts.

use crate::config::TrainConfig;
use crate::graph::{format, parts};
use crate::partition::weights::write_weights;
use crate::presample::{
    self, part_of_original_ids, LayerCounts, SamplerSpec, SplitStats, SplitStatsAccumulator,
};
use crate::util::atomic::refuse_overwriting_inputs;
use crate::util::rss::peak_rss_mb;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `gnnpar presample`. Sampler options override the `--config` file; without
/// either, training's defaults apply.
#[derive(Args, Debug, Default)]
pub struct PresampleArgs {
    /// The whole dataset to pre-sample (`dataset.h5`, not a part).
    pub input: PathBuf,
    /// Epochs to sample (the weights are the counts averaged over them).
    #[arg(long)]
    pub epochs: u64,
    /// Neighbours per layer from the seeds outward, e.g. `15,10,5`; -1 = all.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub fanouts: Option<Vec<i32>>,
    /// Training seeds per mini-batch.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Seed of the batch order and neighbour choice (as `gnnpar train --seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run configuration (TOML, see `inputs/`): its fanouts, batch_size and seed are used; the
    /// whole file is checked as `train` checks it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Output weights file (HDF5; written under a temporary name, then renamed).
    #[arg(long, short = 'o', value_name = "weights.h5")]
    pub output: Option<PathBuf>,
    /// Write every edge weight as 0 (METIS then minimises the plain edge cut): the
    /// "node weights only" variant of GSplit's partitioning ablation.
    #[arg(long, requires = "output")]
    pub no_edge_weights: bool,
    /// Batches sampled side by side, each on a thread of its own (default: the threads, at
    /// most 16; 1: one batch at a time). Same counts either way.
    #[arg(long, value_name = "N")]
    pub sample_ahead: Option<usize>,
    /// Measure the split statistics of this partition directory over the sampled batches.
    #[arg(long, value_name = "parts/")]
    pub evaluate: Option<PathBuf>,
}

/// What the command reports (the JSON line's `presample` object).
#[derive(Debug, Serialize)]
pub struct PresampleReport {
    pub dataset: String,
    pub num_nodes: u64,
    pub num_edges: u64,
    pub fanouts: Vec<i32>,
    pub batch_size: usize,
    pub epochs: u64,
    pub seed: u64,
    pub batches: u64,
    /// The weights file written, if any.
    pub weights: Option<String>,
    /// Whether its edge weights were zeroed (`--no-edge-weights`).
    pub edge_weights: bool,
    /// `weight = round(count / epochs · weight_scale)` (null without `-o`).
    pub weight_scale: Option<f64>,
    /// Per weight column (hops from the seeds outward, then input rows): mean count per epoch
    /// summed over vertices.
    pub vertex_count_per_epoch: Vec<f64>,
    /// Sampled edges per epoch, all hops.
    pub edges_per_epoch: f64,
    /// The partition evaluated, if any, and its statistics.
    pub evaluated: Option<String>,
    pub split_stats: Option<SplitStats>,
    pub seconds: f64,
    pub peak_rss_mb: Option<f64>,
}

impl PresampleArgs {
    /// The sampler the options describe (config file, then command-line overrides).
    pub fn spec(&self) -> Result<SamplerSpec> {
        let cfg = match &self.config {
            Some(path) => {
                // The whole file, not only the sampler's keys: it is the one `train` will read,
                // and a mistake in it is better found before a long presampling pass.
                let cfg = TrainConfig::from_file(path)?;
                cfg.validate()
                    .with_context(|| format!("config `{}`", path.display()))?;
                cfg
            }
            None => TrainConfig::default(),
        };
        let spec = SamplerSpec {
            fanouts: self.fanouts.clone().unwrap_or(cfg.fanouts),
            batch_size: self.batch_size.unwrap_or(cfg.batch_size),
            epochs: self.epochs,
            seed: self.seed.unwrap_or(cfg.seed),
            sample_ahead: self.sample_ahead,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Run `gnnpar presample`.
pub fn run(args: PresampleArgs) -> Result<PresampleReport> {
    let started = Instant::now();
    if args.output.is_none() && args.evaluate.is_none() {
        bail!("nothing to do: give -o weights.h5, --evaluate parts/, or both");
    }
    if let Some(output) = &args.output {
        refuse_overwriting_inputs(
            output,
            "-o",
            &[
                ("the input", Some(args.input.as_path())),
                ("--config", args.config.as_deref()),
            ],
        )?;
    }
    let spec = args.spec()?;
    let header = format::read_header(&args.input)?;
    header.require_whole(&args.input, "pre-sample the whole dataset")?;
    // Check the partition before the (long) sampling.
    let part = match &args.evaluate {
        Some(dir) => {
            if !parts::is_parts_dir(dir) {
                bail!(
                    "--evaluate `{}`: not a partition directory (no `{}` in it)",
                    dir.display(),
                    parts::META_FILE
                );
            }
            let meta = parts::read_meta(dir)?;
            let what = format!("--evaluate `{}`", dir.display());
            Some((
                part_of_original_ids(&meta, header.num_nodes, &what)?,
                meta.num_parts,
            ))
        }
        None => None,
    };
    let mut ds = format::read_dataset(&args.input)?;
    // Sampling needs the topology and the training set only.
    ds.features = None;
    ds.labels = None;

    let hops = spec.hops();
    let mut counts = LayerCounts::new(ds.local_nodes(), ds.graph.indices.len(), hops);
    let mut split = part.map(|(p, n)| SplitStatsAccumulator::new(p, n, hops));
    let batches = presample::run_sampler(&ds, &spec, |blocks, positions| {
        counts.add_batch(blocks, positions);
        if let Some(acc) = split.as_mut() {
            acc.add_batch(blocks);
        }
    })?;

    let weight_scale = match &args.output {
        Some(path) => {
            let (mut weights, scale) = counts.to_weights(spec.epochs)?;
            if args.no_edge_weights {
                weights.edge_weights.iter_mut().for_each(|w| *w = 0);
            }
            write_weights(&weights, path)?;
            log::info!("wrote `{}`", path.display());
            Some(scale)
        }
        None => None,
    };
    let per_epoch = |x: u64| x as f64 / spec.epochs as f64;
    let split_stats = split.map(|acc| acc.finish());
    if let Some(s) = &split_stats {
        print!("{}", s.text());
    }
    let report = PresampleReport {
        dataset: args.input.display().to_string(),
        num_nodes: ds.num_nodes,
        num_edges: ds.local_edges(),
        fanouts: spec.fanouts.clone(),
        batch_size: spec.batch_size,
        epochs: spec.epochs,
        seed: spec.seed,
        batches,
        weights: args.output.as_ref().map(|p| p.display().to_string()),
        edge_weights: args.output.is_some() && !args.no_edge_weights,
        weight_scale,
        vertex_count_per_epoch: (0..counts.columns())
            .map(|c| per_epoch(counts.column_total(c)))
            .collect(),
        edges_per_epoch: per_epoch(counts.edge_total()),
        evaluated: args.evaluate.as_ref().map(|p| p.display().to_string()),
        split_stats,
        seconds: started.elapsed().as_secs_f64(),
        peak_rss_mb: peak_rss_mb(),
    };
    println!(
        "{}",
        serde_json::to_string(&serde_json::json!({ "presample": &report }))?
    );
    Ok(report)
}
