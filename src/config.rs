//! The run configuration: TOML files in `inputs/`, overridden by command-line options, then
//! validated as a whole with errors that name the offending field.

pub use crate::kinds::{
    CacheSize, CudaAwareMpi, Device, InitKind, LrSchedule, ModelKind, NormKind, Precision,
    Prefetch, Strategy,
};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How input features are normalised before training.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FeatureNorm {
    /// Divide each row by the sum of its absolute values (Kipf & Welling's row normalisation
    /// for bag-of-words features; rows of zeros stay zero).
    Row,
    /// Use the features as stored.
    None,
}

/// Everything that defines a training run. Fields that change the trained model enter the
/// configuration hash stored in checkpoints; a resume with a different model is refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// `sage`, `gcn`, `gat`, or `mlp` (a graph-free baseline on the node's own features).
    pub model: ModelKind,
    pub layers: usize,
    pub hidden: usize,
    /// Attention heads (GAT only).
    pub heads: usize,
    /// Drop probability on the input of every layer but the first (between layers).
    pub dropout: f32,
    /// Drop probability on the first layer's input (the features, or their projection with
    /// `input_proj`); default: `dropout`. DGL's and PyG's GraphSAGE examples drop only between
    /// layers (0 here); PyG's GCN example drops the features too.
    pub input_dropout: Option<f32>,
    /// Residual connections on the hidden → hidden layers (needs `layers` ≥ 3).
    pub residual: bool,
    /// Normalisation of every layer's input except the first layer's: `none` or `layer`.
    pub norm: NormKind,
    /// Project the input features to `hidden` per row inside the first layer, so its
    /// convolution (and norm and residual) work on hidden rows (needs `layers` ≥ 2).
    pub input_proj: bool,
    /// The output layer is a per-row linear layer on each vertex's own hidden row instead of a
    /// convolution (needs `layers` ≥ 2; the first fanout then only picks the seeds).
    pub linear_output: bool,
    /// How weights and biases start: `glorot` (zero biases; PyG's and DGL's graph layers) or
    /// `fan-in` (PyTorch's `nn.Linear` default, as in the published heterophilous-benchmark
    /// and SliceGCN models).
    pub init: InitKind,
    /// Neighbours sampled per layer, from the seeds outward; -1 = all neighbours.
    pub fanouts: Vec<i32>,
    pub batch_size: usize,
    pub epochs: usize,
    pub lr: f32,
    /// How the learning rate moves over the epochs (`constant` or `cosine` annealing to 0).
    pub lr_schedule: LrSchedule,
    pub weight_decay: f32,
    pub seed: u64,
    /// Evaluate on validation and test every N epochs (0 = only at the end).
    pub eval_every: usize,
    /// Train on the whole graph at once (all nodes, all edges) instead of sampled mini-batches.
    pub full_batch: bool,
    pub feature_norm: FeatureNorm,
    /// Add a self-loop to every destination (GCN's A + I). Defaults to true for GCN.
    pub self_loops: Option<bool>,
    /// Stop after this many optimizer steps (tests and benchmarks).
    pub max_steps: Option<u64>,
    /// Write a checkpoint every N epochs (0 = only at the end).
    pub checkpoint_every: usize,
    /// Parallel strategy across ranks.
    pub strategy: Strategy,
    /// Where each rank computes: `cpu`, `cuda` (an error without a usable GPU) or `auto` (CUDA
    /// when a driver and a GPU are present, else the CPU; the log says which and why).
    pub device: Device,
    /// Arithmetic of a GPU's matrix products: `fp32` (default) or `tf32`.
    pub precision: Precision,
    /// Hand MPI device pointers (`on`: an error unless the MPI library is CUDA-aware), stage
    /// device rows through host memory (`off`), or `auto`: `on` when MPI says it is
    /// CUDA-aware. Matters only with a device backend on several ranks.
    pub cuda_aware_mpi: CudaAwareMpi,
    /// Rayon threads per rank (default: `SLURM_CPUS_PER_TASK` when set, else cores of the node
    /// / ranks on the node).
    pub threads: Option<usize>,
    /// Prepare the next GDP mini-batch on a second thread while one trains: `auto` (on with a
    /// device backend, off on the CPU), `on` or `off`. Changes no number: the batch key fixes
    /// every sample.
    pub prefetch: Prefetch,
    /// Threads that prepare prefetched batches at once, each a whole batch (default: a
    /// quarter of the rank's threads, at most 8, when the device gathers the input rows; one
    /// when the host gathers them, as every batch in flight holds its rows). Changes no number.
    pub prefetch_workers: Option<usize>,
    /// Where a rank samples its batches locally and in its steps (GDP on one rank, NFP; no
    /// prefetch): batches sampled at once, each whole batch on a thread of its own, ahead of
    /// their steps (default: the rank's threads from 4 threads on, at most 16 and as many as
    /// the sampling threads' id tables fit in 1 GiB; below 4 threads, 1: each batch sampled
    /// in its step). Changes no number.
    pub sample_ahead: Option<usize>,
    /// Group consecutive ranks into pretend nodes of this many ranks (tests of `hybrid` on
    /// one machine); default: the real nodes (MPI shared-memory domains).
    pub ranks_per_node: Option<usize>,
    /// Per-rank cache of remote feature rows, in MiB (0: no cache), or `auto`.
    pub cache_mb: CacheSize,
    /// Mini-batches sampled before training to rank remote rows by access frequency.
    pub cache_presample_batches: usize,
    /// Ranks of one host read each other's input feature rows in shared memory (`true`, the
    /// default) instead of fetching them by alltoallv as from ranks of other hosts. Changes
    /// no number.
    pub shared_features: bool,
    /// SliceGCN: add a learned per-rank vector to each rank's GCN output (slice encoding).
    pub slice_encoding: bool,
    /// SliceGCN: feed every rank's GCN a learned 2-layer MLP of all features (feature fusion)
    /// instead of its own column slice (direct slicing).
    pub feature_fusion: bool,
    /// SliceGCN: a rank's slice is `scale · ⌈d'/p⌉` columns wide (clipped to the features).
    pub slice_size_scale: f64,
    /// Which split of the synthetic default to use etc. is fixed by the dataset; this names the
    /// data set the config was written for (documentation only).
    pub dataset: Option<String>,
}

/// The most batches `sample_ahead` (--sample-ahead) may ask for: each is a thread of its own.
pub const MAX_SAMPLE_AHEAD: usize = 256;

/// The most rayon threads per rank `validate` accepts, per core of the host.
pub const MAX_THREADS_PER_CORE: usize = 16;

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ModelKind::Sage,
            layers: 2,
            hidden: 128,
            heads: 4,
            dropout: 0.5,
            input_dropout: None,
            residual: false,
            norm: NormKind::None,
            input_proj: false,
            linear_output: false,
            init: InitKind::Glorot,
            fanouts: vec![10, 10],
            batch_size: 1024,
            epochs: 10,
            lr: 0.003,
            lr_schedule: LrSchedule::Constant,
            weight_decay: 0.0,
            seed: 0,
            eval_every: 1,
            full_batch: false,
            feature_norm: FeatureNorm::None,
            self_loops: None,
            max_steps: None,
            checkpoint_every: 0,
            strategy: Strategy::Gdp,
            device: Device::Auto,
            precision: Precision::Fp32,
            cuda_aware_mpi: CudaAwareMpi::Auto,
            threads: None,
            prefetch: Prefetch::Auto,
            prefetch_workers: None,
            sample_ahead: None,
            ranks_per_node: None,
            cache_mb: CacheSize::default(),
            cache_presample_batches: 8,
            slice_encoding: true,
            shared_features: true,
            feature_fusion: false,
            slice_size_scale: 1.0,
            dataset: None,
        }
    }
}

impl TrainConfig {
    /// Read a TOML config file.
    pub fn from_file(path: &Path) -> Result<TrainConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config `{}`", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("config `{}`: {e}", path.display()))
    }

    /// The drop probability on the first layer's input.
    pub fn first_layer_dropout(&self) -> f32 {
        self.input_dropout.unwrap_or(self.dropout)
    }

    /// Whether GCN-style self-loops are added to every block.
    pub fn uses_self_loops(&self) -> bool {
        self.self_loops.unwrap_or(self.model == ModelKind::Gcn)
    }

    /// Check the whole configuration; errors name the field and what was expected.
    pub fn validate(&self) -> Result<()> {
        if self.layers == 0 {
            bail!("config: `layers` must be at least 1");
        }
        if self.hidden == 0 {
            bail!("config: `hidden` must be positive");
        }
        if self.model == ModelKind::Gat && self.heads == 0 {
            bail!("config: `heads` must be positive for GAT");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("config: `dropout` = {} must be in [0, 1)", self.dropout);
        }
        if let Some(p) = self.input_dropout {
            if !(0.0..1.0).contains(&p) {
                bail!("config: `input_dropout` = {p} must be in [0, 1)");
            }
        }
        if self.residual && self.layers < 3 && !(self.input_proj && self.layers == 2) {
            bail!(
                "config: `residual` needs `layers` ≥ 3, or 2 with `input_proj` (the first layer \
                 without a projection and the output layer change the width and get no \
                 residual), got {} layers",
                self.layers
            );
        }
        if self.linear_output && self.layers < 2 {
            bail!("config: `linear_output` needs `layers` ≥ 2 (one layer would ignore the graph)");
        }
        if self.norm != NormKind::None && self.layers < 2 {
            bail!(
                "config: `norm` = \"{}\" needs `layers` ≥ 2 (the first layer reads the raw \
                 features and is not normalised)",
                self.norm
            );
        }
        if self.input_proj && self.layers < 2 {
            bail!("config: `input_proj` needs `layers` ≥ 2 (the output layer is not projected)");
        }
        // SliceGCN always trains on the whole graph at once: no fanouts, no batches.
        if !self.full_batch && self.strategy != Strategy::Slicegcn {
            if self.fanouts.len() != self.layers {
                bail!(
                    "config: `fanouts` has {} entries ({:?}) but `layers` is {}; give one fanout per layer",
                    self.fanouts.len(),
                    self.fanouts,
                    self.layers
                );
            }
            if let Some(f) = self.fanouts.iter().find(|&&f| f == 0 || f < -1) {
                bail!(
                    "config: fanout {f} is invalid (use a positive count or -1 for all neighbours)"
                );
            }
            if self.batch_size == 0 {
                bail!("config: `batch_size` must be positive");
            }
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            bail!("config: `lr` = {} must be positive", self.lr);
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            bail!(
                "config: `weight_decay` = {} must be non-negative",
                self.weight_decay
            );
        }
        if self.epochs == 0 {
            bail!("config: `epochs` must be positive");
        }
        if self.max_steps == Some(0) {
            bail!("config: `max_steps` must be positive");
        }
        if let Some(why) = self.cache_mb.invalid() {
            bail!("config: `cache_mb` = {why}");
        }
        if self.threads == Some(0) {
            bail!("config: `threads` must be positive");
        }
        if let Some(t) = self.threads {
            // Oversubscribing a few times is a fair test; thousands of threads per rank are a
            // typo (5,000 on 2 cores did not start training within two minutes).
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let most = MAX_THREADS_PER_CORE * cores;
            if t > most {
                bail!(
                    "config: `threads` (--threads) is {t}, more than {MAX_THREADS_PER_CORE} per \
                     core of this host ({cores} cores, so at most {most})"
                );
            }
        }
        if self.prefetch_workers == Some(0) {
            bail!("config: `prefetch_workers` (--prefetch-workers) must be at least 1");
        }
        if let Some(n) = self.sample_ahead {
            let most = MAX_SAMPLE_AHEAD;
            if n == 0 || n > most {
                bail!(
                    "config: `sample_ahead` (--sample-ahead) is {n}; it must be 1 to {most} \
                     (batches sampled at once, each on a thread of its own; 1: each batch \
                     sampled in its step)"
                );
            }
        }
        if self.ranks_per_node == Some(0) {
            bail!("config: `ranks_per_node` (--ranks-per-node) must be at least 1");
        }
        if self.strategy == Strategy::Hybrid && self.full_batch {
            bail!(
                "config: `strategy` \"hybrid\" divides mini-batches among nodes and cannot run \
                 `full_batch` (one batch of the whole graph); use gdp (or auto) for full-batch \
                 training"
            );
        }
        if self.strategy == Strategy::Snp {
            self.check_snp()?;
        }
        if self.strategy == Strategy::Nfp {
            self.check_nfp()?;
        }
        if self.strategy == Strategy::Slicegcn {
            self.check_slicegcn()?;
        }
        Ok(())
    }

    /// What node-feature parallelism cannot run: it splits the input layer's product
    /// `x·W₁` by the columns of `x` (the rows of `W₁`) and adds the partial products, which is
    /// exact only where the input layer is linear in `x` before its bias and activation.
    pub fn check_nfp(&self) -> Result<()> {
        if self.model == ModelKind::Gat {
            bail!(
                "config: `strategy` \"nfp\" does not support `model` \"gat\": GAT's attention \
                 scores are a nonlinear function (LeakyReLU, then a softmax over each \
                 destination's sources) of the whole projected row `x·W`, so they cannot be \
                 computed from per-column-slice partial products; use --strategy gdp, split or \
                 dnp"
            );
        }
        if self.input_proj {
            bail!(
                "config: `strategy` \"nfp\" does not support `input_proj`: the projection's \
                 output feeds the first layer's norm and residual, which need whole rows, so the \
                 input layer does not decompose by feature columns; drop `input_proj`, or use \
                 --strategy gdp, split or dnp"
            );
        }
        if self.full_batch {
            bail!(
                "config: `strategy` \"nfp\" slices the input layer of sampled mini-batches and \
                 cannot run `full_batch` (one batch of the whole graph); use gdp (or auto) for \
                 full-batch training"
            );
        }
        Ok(())
    }

    /// What SliceGCN needs: a GCN per slice over the whole graph, and a positive slice scale.
    pub fn check_slicegcn(&self) -> Result<()> {
        if self.model != ModelKind::Gcn {
            bail!(
                "config: `strategy` \"slicegcn\" trains a GCN on every feature slice; `model` \
                 \"{}\" is not supported (use --model gcn, or another strategy)",
                self.model
            );
        }
        if !(self.slice_size_scale > 0.0 && self.slice_size_scale.is_finite()) {
            bail!(
                "config: `slice_size_scale` = {} must be a positive number (1.0: slices of \
                 ⌈features / ranks⌉ columns)",
                self.slice_size_scale
            );
        }
        Ok(())
    }

    /// What source-node parallelism cannot run: it sums the input layer's neighbour terms on
    /// the sources' owners straight from their feature rows.
    pub fn check_snp(&self) -> Result<()> {
        match self.model {
            ModelKind::Sage | ModelKind::Gcn => {}
            ModelKind::Gat => bail!(
                "config: `strategy` \"snp\" does not support `model` \"gat\": GAT's attention \
                 is a softmax over all sources of a destination, which live on several ranks, so \
                 SNP would need an extra exchange of per-destination maxima and sums; use \
                 --strategy gdp, split or dnp"
            ),
            ModelKind::Mlp => bail!(
                "config: `strategy` \"snp\" does not apply to `model` \"mlp\": an MLP \
                 aggregates no neighbours, so there are no source-side partial sums; use \
                 --strategy gdp or dnp"
            ),
        }
        if self.input_proj {
            bail!(
                "config: `strategy` \"snp\" does not support `input_proj`: SNP computes the \
                 input layer's neighbour sums on the sources' owners straight from their feature \
                 rows, and a projection (with its norm and residual) in front of the convolution \
                 is not split that way; drop `input_proj`, or use --strategy gdp, split or dnp"
            );
        }
        Ok(())
    }

    /// The settings that define the trained model and its data order, by name (the key of
    /// [`TrainConfig::model_hash`]); checkpoints store it, so a refused resume can name the
    /// settings that differ.
    pub fn model_settings(&self) -> serde_json::Value {
        let mut settings = serde_json::json!({
            "model": self.model, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
            "dropout": self.dropout, "input_dropout": self.first_layer_dropout(),
            "fanouts": self.fanouts, "batch_size": self.batch_size,
            "lr": self.lr, "weight_decay": self.weight_decay, "seed": self.seed,
            "full_batch": self.full_batch, "feature_norm": self.feature_norm,
            "self_loops": self.uses_self_loops(),
            "residual": self.residual, "norm": self.norm, "input_proj": self.input_proj,
            "linear_output": self.linear_output,
        });
        // Only where they matter, so that older checkpoints keep their hash.
        if self.lr_schedule != LrSchedule::Constant {
            settings["lr_schedule"] = serde_json::json!(self.lr_schedule);
        }
        if self.init != InitKind::Glorot {
            settings["init"] = serde_json::json!(self.init);
        }
        if self.strategy == Strategy::Slicegcn {
            settings["strategy"] = serde_json::json!(self.strategy);
            settings["slice_encoding"] = serde_json::json!(self.slice_encoding);
            settings["feature_fusion"] = serde_json::json!(self.feature_fusion);
            settings["slice_size_scale"] = serde_json::json!(self.slice_size_scale);
        }
        settings
    }

    /// A stable hash of the fields that define the trained model and its data order; stored
    /// in checkpoints so a resume with a different model or seed is refused.
    pub fn model_hash(&self) -> u64 {
        settings_hash(&self.model_settings())
    }
}

/// FNV-1a of the settings' JSON (keys sorted): stable across builds and platforms (unlike
/// std's SipHash keys).
pub fn settings_hash(settings: &serde_json::Value) -> u64 {
    crate::util::hash::fnv1a(settings.to_string().bytes())
}

/// The settings whose values differ between `stored` and `current` (both
/// [`TrainConfig::model_settings`]), as "`name`: checkpoint X, this run Y", sorted by name.
pub fn differing_settings(stored: &serde_json::Value, current: &serde_json::Value) -> Vec<String> {
    differing_between(stored, "checkpoint", current, "this run")
}

/// The settings whose values differ between `a` and `b` (JSON objects of settings by name),
/// as "`name`: <a_name> X, <b_name> Y", sorted by name. A setting [`TrainConfig::model_settings`]
/// leaves out at its default shows as that default.
pub fn differing_between(
    a: &serde_json::Value,
    a_name: &str,
    b: &serde_json::Value,
    b_name: &str,
) -> Vec<String> {
    let empty = serde_json::Map::new();
    let a = a.as_object().unwrap_or(&empty);
    let b = b.as_object().unwrap_or(&empty);
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    let show = |k: &str, v: Option<&serde_json::Value>| match v {
        Some(v) => show_setting(v),
        None => match k {
            "lr_schedule" => "\"constant\"".to_string(),
            "init" => "\"glorot\"".to_string(),
            "strategy" | "slice_encoding" | "feature_fusion" | "slice_size_scale" => {
                "(not slicegcn)".to_string()
            }
            _ => "(absent)".to_string(),
        },
    };
    names
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            format!(
                "`{k}`: {a_name} {}, {b_name} {}",
                show(k, a.get(k)),
                show(k, b.get(k))
            )
        })
        .collect()
}

/// A setting's value as the user wrote it. The f32 settings (`lr`, `dropout`, …) reach the
/// JSON widened to f64 (0.003 is stored as 0.003000000026077032, and must stay so: the
/// checkpoint's hash is of that text); a number that is exactly an f32 is shown as that f32's
/// shortest form (0.003). An f64 setting shows the same unless its value happens to be an
/// exact f32 with a longer f64 form, which no setting a person types is.
fn show_setting(v: &serde_json::Value) -> String {
    match v.as_f64() {
        Some(x) if !v.is_i64() && !v.is_u64() && (x as f32) as f64 == x => {
            format!("{:?}", x as f32)
        }
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fanouts_must_match_layers() {
        let cfg = TrainConfig {
            layers: 3,
            fanouts: vec![10, 5],
            ..Default::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("fanouts"), "{err}");
    }

    #[test]
    fn bad_fields_are_named() {
        for (cfg, field) in [
            (
                TrainConfig {
                    hidden: 0,
                    ..Default::default()
                },
                "hidden",
            ),
            (
                TrainConfig {
                    lr: 0.0,
                    ..Default::default()
                },
                "lr",
            ),
            (
                TrainConfig {
                    dropout: 1.0,
                    ..Default::default()
                },
                "dropout",
            ),
            (
                TrainConfig {
                    input_dropout: Some(-0.1),
                    ..Default::default()
                },
                "input_dropout",
            ),
        ] {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    /// `init` parses by its names, is part of the model's hash, and stays out of the hashed
    /// settings at its default so checkpoints written before it existed keep their hash.
    #[test]
    fn init_is_parsed_and_hashed_only_when_not_the_default() {
        let cfg: TrainConfig = toml::from_str("init = \"fan-in\"").unwrap();
        assert_eq!(cfg.init, InitKind::FanIn);
        assert_eq!(cfg.model_settings()["init"], "fan-in");
        assert_ne!(cfg.model_hash(), TrainConfig::default().model_hash());
        assert!(TrainConfig::default()
            .model_settings()
            .get("init")
            .is_none());
        let err = toml::from_str::<TrainConfig>("init = \"kaiming\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kaiming") && err.contains("fan-in"), "{err}");
    }

    #[test]
    fn residual_and_norm_are_validated_and_hashed() {
        let cfg = TrainConfig {
            residual: true,
            layers: 2,
            fanouts: vec![5, 5],
            ..Default::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("residual") && err.contains('3'), "{err}");
        let cfg = TrainConfig {
            norm: NormKind::Layer,
            layers: 1,
            fanouts: vec![5],
            ..Default::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("norm"), "{err}");
        let err = toml::from_str::<TrainConfig>("norm = \"batch\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("batch"), "{err}");
        let cfg: TrainConfig =
            toml::from_str("residual = true\nnorm = \"layer\"\nlayers = 3\nfanouts = [5, 5, 5]")
                .unwrap();
        cfg.validate().unwrap();
        let plain = TrainConfig {
            layers: 3,
            fanouts: vec![5, 5, 5],
            ..Default::default()
        };
        assert_ne!(cfg.model_hash(), plain.model_hash());
        let res_only = TrainConfig {
            residual: true,
            ..plain.clone()
        };
        assert_ne!(res_only.model_hash(), plain.model_hash());
        assert_ne!(res_only.model_hash(), cfg.model_hash());
    }

    #[test]
    fn unknown_names_are_refused_by_the_parser() {
        let err = toml::from_str::<TrainConfig>("model = \"transformer\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("transformer") && err.contains("sage"), "{err}");
        let err = toml::from_str::<TrainConfig>("strategy = \"magic\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("magic") && err.contains("gdp"), "{err}");
    }

    #[test]
    fn snp_refuses_what_it_cannot_split() {
        for (cfg, needle) in [
            (
                TrainConfig {
                    model: ModelKind::Gat,
                    ..Default::default()
                },
                "gat",
            ),
            (
                TrainConfig {
                    model: ModelKind::Mlp,
                    ..Default::default()
                },
                "mlp",
            ),
            (
                TrainConfig {
                    input_proj: true,
                    ..Default::default()
                },
                "input_proj",
            ),
        ] {
            let cfg = TrainConfig {
                strategy: Strategy::Snp,
                ..cfg
            };
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains("snp") && err.contains(needle), "{err}");
        }
        TrainConfig {
            strategy: Strategy::Snp,
            ..Default::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn batches_sampled_ahead_are_one_to_the_most_threads_a_window_may_start() {
        let with = |n| TrainConfig {
            sample_ahead: Some(n),
            ..TrainConfig::default()
        };
        for n in [1, 2, MAX_SAMPLE_AHEAD] {
            with(n).validate().unwrap();
        }
        for n in [0, MAX_SAMPLE_AHEAD + 1] {
            let err = with(n).validate().unwrap_err().to_string();
            assert!(err.contains("`sample_ahead` (--sample-ahead) is"), "{err}");
        }
    }

    #[test]
    fn unknown_toml_keys_are_refused() {
        let err = toml::from_str::<TrainConfig>("hiden = 3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("hiden"), "{err}");
    }

    #[test]
    fn hash_ignores_epochs_but_not_seed() {
        let a = TrainConfig::default();
        let b = TrainConfig {
            epochs: 99,
            ..a.clone()
        };
        let c = TrainConfig {
            seed: 1,
            ..a.clone()
        };
        assert_eq!(a.model_hash(), b.model_hash());
        assert_ne!(a.model_hash(), c.model_hash());
    }

    /// The first layer's dropout defaults to `dropout`; the hash follows the value in force,
    /// so spelling out the default changes nothing and another value is another model.
    #[test]
    fn input_dropout_defaults_to_dropout_and_is_hashed() {
        let a = TrainConfig::default();
        assert_eq!(a.first_layer_dropout(), a.dropout);
        let same = TrainConfig {
            input_dropout: Some(a.dropout),
            ..a.clone()
        };
        let other = TrainConfig {
            input_dropout: Some(0.0),
            ..a.clone()
        };
        assert_eq!(a.model_hash(), same.model_hash());
        assert_ne!(a.model_hash(), other.model_hash());
        assert_eq!(other.first_layer_dropout(), 0.0);
    }

    #[test]
    fn differing_settings_are_named() {
        let a = TrainConfig::default();
        let b = TrainConfig {
            model: ModelKind::Gcn,
            lr: 0.01,
            epochs: 99,
            ..a.clone()
        };
        let diff = differing_settings(&a.model_settings(), &b.model_settings());
        // GCN also turns self-loops on by default; epochs do not define the model.
        assert_eq!(diff.len(), 3, "{diff:?}");
        // f32 settings as f32, not widened (0.003000000026077032).
        assert_eq!(diff[0], "`lr`: checkpoint 0.003, this run 0.01", "{diff:?}");
        assert!(
            diff[1].contains("`model`: checkpoint \"sage\", this run \"gcn\""),
            "{diff:?}"
        );
        assert!(diff[2].starts_with("`self_loops`"), "{diff:?}");
        assert!(differing_settings(&a.model_settings(), &a.model_settings()).is_empty());
        assert_eq!(settings_hash(&a.model_settings()), a.model_hash());
    }

    #[test]
    fn settings_show_as_written() {
        use serde_json::json;
        assert_eq!(show_setting(&json!(0.003f32)), "0.003");
        assert_eq!(show_setting(&json!(0.5f32)), "0.5");
        assert_eq!(show_setting(&json!(0.0f32)), "0.0");
        assert_eq!(show_setting(&json!(1e30f32)), "1e30");
        // f64 values that are not exact f32s, integers, and the rest as JSON.
        assert_eq!(show_setting(&json!(0.1f64)), "0.1");
        assert_eq!(show_setting(&json!(1.25f64)), "1.25");
        assert_eq!(show_setting(&json!(128)), "128");
        assert_eq!(show_setting(&json!(u64::MAX)), u64::MAX.to_string());
        assert_eq!(show_setting(&json!("gcn")), "\"gcn\"");
        assert_eq!(show_setting(&json!([15, 10])), "[15,10]");
        assert_eq!(show_setting(&json!(true)), "true");
    }
}
