//! `gnnpar train`: train a GNN on a dataset, a partition, or the in-process synthetic default.

use crate::backend::{Backend, Cpu};
use crate::comm::World;
use crate::config::{
    CacheSize, CudaAwareMpi, Device, FeatureNorm, LrSchedule, ModelKind, Precision, Prefetch,
    Strategy, TrainConfig,
};
use crate::nn::init::InitKind;
use crate::nn::NormKind;
use crate::train::device::{self, Chosen};
use crate::train::slicegcn::SliceTrainer;
use crate::train::{RunFiles, Trainer};
use crate::util::atomic::refuse_overwriting_inputs;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gnnpar train`. Every model option overrides the `--config` file.
#[derive(Args, Debug, Default)]
pub struct TrainArgs {
    /// Dataset file or partition directory (default: a synthetic graph generated in-process).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Run configuration (TOML, see `inputs/`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model: sage, gcn, gat, or mlp (graph-free baseline).
    #[arg(long, value_enum)]
    pub model: Option<ModelKind>,
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Attention heads (GAT).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Drop probability on the input of every layer but the first.
    #[arg(long)]
    pub dropout: Option<f32>,
    /// Drop probability on the first layer's input (default: --dropout; 0 drops only
    /// between layers, as DGL's and PyG's GraphSAGE examples do).
    #[arg(long)]
    pub input_dropout: Option<f32>,
    /// Residual connections on the hidden → hidden layers: true or false (needs 3+ layers).
    #[arg(long, value_name = "BOOL")]
    pub residual: Option<bool>,
    /// Normalisation of every layer's input but the first layer's.
    #[arg(long, value_enum)]
    pub norm: Option<NormKind>,
    /// Per-row projection of the features to `hidden` inside the first layer: true or false.
    #[arg(long, value_name = "BOOL")]
    pub input_proj: Option<bool>,
    /// Per-row linear output layer instead of a convolution: true or false.
    #[arg(long, value_name = "BOOL")]
    pub linear_output: Option<bool>,
    /// How weights and biases start: glorot (zero biases) or fan-in (PyTorch's nn.Linear).
    #[arg(long, value_enum)]
    pub init: Option<InitKind>,
    /// Neighbours per layer from the seeds outward, e.g. `15,10,5`; -1 = all.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub fanouts: Option<Vec<i32>>,
    #[arg(long)]
    pub batch_size: Option<usize>,
    #[arg(long)]
    pub epochs: Option<usize>,
    #[arg(long)]
    pub lr: Option<f32>,
    /// Learning-rate schedule over the epochs: constant, or cosine (annealed to 0 at the
    /// last epoch, PyTorch's CosineAnnealingLR with T_max = epochs).
    #[arg(long, value_enum)]
    pub lr_schedule: Option<LrSchedule>,
    #[arg(long)]
    pub weight_decay: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Evaluate every N epochs (0: only at the end).
    #[arg(long)]
    pub eval_every: Option<usize>,
    /// Train on the whole graph at once (small graphs).
    #[arg(long)]
    pub full_batch: bool,
    /// Feature normalisation.
    #[arg(long, value_enum)]
    pub feature_norm: Option<FeatureNorm>,
    /// Stop after N optimizer steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Parallel strategy: gdp, split, dnp, snp, nfp (feature columns sliced over the ranks),
    /// hybrid (GDP across nodes, split inside a node), slicegcn (the SliceGCN model) or auto
    /// (hybrid on several nodes, else the cheapest by the calibrated planner's dry run).
    #[arg(long, value_enum)]
    pub strategy: Option<Strategy>,
    /// Where each rank computes: cpu, cuda (its node-local GPU), or auto (CUDA when a driver
    /// and a GPU are present, else the CPU).
    #[arg(long, value_enum)]
    pub device: Option<Device>,
    /// Arithmetic of a GPU's products: fp32 (default, as the CPU) or tf32 (tensor cores).
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Hand MPI device pointers: on (an error unless the MPI library is CUDA-aware), off
    /// (stage device rows through host memory), or auto (on when MPI says it is CUDA-aware).
    #[arg(long, value_enum, value_name = "on|off|auto")]
    pub cuda_aware_mpi: Option<CudaAwareMpi>,
    /// Rayon threads per rank (default: SLURM_CPUS_PER_TASK when set, else cores of the node
    /// / ranks on the node).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Mini-batches of every strategy but NFP (split, DNP, SNP and hybrid on several ranks):
    /// sample the next batch and gather its input rows on another thread while the current
    /// one trains: auto (on with a GPU, off on the CPU backend), on or off. Same numbers
    /// either way.
    #[arg(long, value_enum)]
    pub prefetch: Option<Prefetch>,
    /// Prefetched batches prepared at once, each by its own thread (default: threads / 4, at
    /// most 8, when the device gathers the input rows; 1 when the host gathers them). Same
    /// numbers either way.
    #[arg(long, value_name = "N")]
    pub prefetch_workers: Option<usize>,
    /// Without prefetch, where a rank samples locally (GDP on one rank, NFP): batches sampled
    /// at once ahead of their steps, each on a thread of its own (default: the threads from 4
    /// threads on, at most 16; 1: each batch in its step). Same numbers either way.
    #[arg(long, value_name = "N")]
    pub sample_ahead: Option<usize>,
    /// Group consecutive ranks into pretend nodes of K ranks (tests of hybrid on one
    /// machine; default: the real nodes). K must divide the number of ranks.
    #[arg(long, value_name = "K")]
    pub ranks_per_node: Option<usize>,
    /// Ranks of one host read each other's feature rows in shared memory instead of
    /// fetching them by alltoallv: on (default) or off. Same numbers either way.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub shared_features: Option<bool>,
    /// SliceGCN: add a learned per-rank vector to each slice's output: on or off.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub slice_encoding: Option<bool>,
    /// SliceGCN: feed each rank's GCN a learned 2-layer MLP of all features instead of its
    /// column slice: on or off.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub feature_fusion: Option<bool>,
    /// SliceGCN: a slice is this many times ⌈features / ranks⌉ columns wide (default 1.0).
    #[arg(long)]
    pub slice_size_scale: Option<f64>,
    /// Per-rank cache of the hottest remote feature rows, in MiB, or `auto` (every remote
    /// row the presampling reads, within a quarter of the node's available memory).
    #[arg(long, value_parser = parse_cache_size)]
    pub cache_mb: Option<CacheSize>,
    /// Debugging and tests: each rank writes the edges of every sampled block, keyed by
    /// original ids, to DIR/blocks-rank<R>.txt.
    #[arg(long, value_name = "DIR")]
    pub dump_blocks: Option<PathBuf>,
    /// Per-epoch JSON lines.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Checkpoint file (HDF5), written every `--checkpoint-every` epochs and at the end.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    #[arg(long)]
    pub checkpoint_every: Option<usize>,
    /// Continue from `--checkpoint`.
    #[arg(long)]
    pub resume: bool,
    /// Write the run summary JSON here.
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Calibration file of the planner (`auto`, `plan`, and predictions of fixed strategies;
    /// default: one per host and rank layout under `$XDG_CACHE_HOME/gnnpar` or
    /// `~/.cache/gnnpar`, or `$GNNPAR_CALIBRATION_DIR`).
    #[arg(long, value_name = "PATH")]
    pub calibration: Option<PathBuf>,
}

impl TrainArgs {
    /// The configuration file (or defaults) with the command-line overrides applied.
    pub fn resolve(&self) -> Result<TrainConfig> {
        let mut cfg = match &self.config {
            Some(p) => TrainConfig::from_file(p)?,
            None => TrainConfig::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = &self.$f { cfg.$f = v.clone(); } )* };
        }
        set!(
            model,
            layers,
            hidden,
            heads,
            dropout,
            residual,
            norm,
            input_proj,
            linear_output,
            init,
            fanouts,
            batch_size,
            epochs,
            lr,
            weight_decay,
            seed,
            eval_every,
            feature_norm,
            strategy,
            device,
            precision,
            cuda_aware_mpi,
            checkpoint_every,
            cache_mb,
            prefetch,
            lr_schedule,
            slice_encoding,
            shared_features,
            feature_fusion,
            slice_size_scale
        );
        if self.input_dropout.is_some() {
            cfg.input_dropout = self.input_dropout;
        }
        // Spelled out, so that the logged configuration says what the first layer drops.
        cfg.input_dropout = Some(cfg.first_layer_dropout());
        if self.full_batch {
            cfg.full_batch = true;
        }
        if self.max_steps.is_some() {
            cfg.max_steps = self.max_steps;
        }
        if self.prefetch_workers.is_some() {
            cfg.prefetch_workers = self.prefetch_workers;
        }
        if self.sample_ahead.is_some() {
            cfg.sample_ahead = self.sample_ahead;
        }
        if self.threads.is_some() {
            cfg.threads = self.threads;
        }
        if self.ranks_per_node.is_some() {
            cfg.ranks_per_node = self.ranks_per_node;
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

/// `on`/`off` (also `true`/`false`) for a switch.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("expected on or off, got '{s}'")),
    }
}

/// Log (rank 0) which node every rank belongs to and where the grouping came from.
/// Collective.
fn log_node_layout(world: &World) {
    let of_rank = world.allgather_u64(world.node_index().0 as u64);
    if world.rank() == 0 {
        log::info!(
            "node layout: {} node(s) of {} rank(s), node of each rank {:?} ({}); {} rank(s) \
             on this host; MPI thread support {}",
            world.node_index().1,
            world.node().size(),
            of_rank,
            match world.pretend_ranks_per_node() {
                Some(k) => format!("pretend nodes of {k} consecutive ranks, --ranks-per-node"),
                None => "MPI shared-memory domains".to_string(),
            },
            world.ranks_on_host(),
            world.mpi_threading()
        );
    }
}

/// What runs on the chosen backend once the world is up ([`with_backend`]).
pub(crate) trait Job {
    type Out;
    fn run<B: Backend>(self, backend: B, world: &World) -> Result<Self::Out>;
    /// The dataset file or partition directory the job reads (`None`: none, or the synthetic
    /// default), which every rank must share.
    fn data(&self) -> Option<&std::path::Path> {
        None
    }
}

/// Whether `cfg`'s run may prefetch mini-batches on several ranks, whose workers
/// call MPI (`train::prefetch`): `--prefetch on`, or `auto` where a device may train.
fn prefetch_may_call_mpi(cfg: &TrainConfig) -> bool {
    // The device is chosen after MPI starts: any but `cpu` may turn out to be one.
    crate::train::prefetch::prefetches(cfg, cfg.device != Device::Cpu)
        && matches!(
            cfg.strategy,
            Strategy::Gdp
                | Strategy::Split
                | Strategy::Hybrid
                | Strategy::Dnp
                | Strategy::Snp
                | Strategy::Auto
        )
}

/// Start the world and the thread pool for `cfg`, log the layout and the configuration, choose
/// the device and run `job` on it. Shared by `train`, `plan` and `calibrate`.
pub(crate) fn with_backend<J: Job>(cfg: &TrainConfig, job: J) -> Result<(J::Out, World)> {
    let world = World::init_with_nodes(cfg.ranks_per_node, prefetch_may_call_mpi(cfg))?;
    crate::train::agreement::refuse_disagreeing_ranks(&world, cfg, job.data())?;
    // Threads divide the cores of the real host, also when nodes are pretend groups.
    let threads = crate::comm::threads_per_rank(cfg.threads, world.ranks_on_host());
    log_node_layout(&world);
    // The calling thread (the process's main thread, which makes every MPI call but the
    // prefetch workers') becomes worker 0, so kernels run on it directly instead of being injected into the
    // pool while it sleeps. The global pool can only be built once per process; a second
    // build (the library called twice) keeps the first, which is fine.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .use_current_thread()
        .build_global();
    if world.rank() == 0 {
        // What this run uses where the config leaves it open; the device and an `auto`
        // strategy are chosen below, each with its own line.
        // Through the text, so that f32 settings read as written (0.003, not the f64 widening
        // `to_value` would give).
        let mut resolved: serde_json::Value = serde_json::from_str(&serde_json::to_string(cfg)?)?;
        resolved["threads"] = serde_json::json!(rayon::current_num_threads());
        resolved["self_loops"] = serde_json::json!(cfg.uses_self_loops());
        if let Some(d) = job.data() {
            resolved["data"] = serde_json::json!(d.display().to_string());
        }
        log::info!(
            "resolved config: {} ({} ranks on {} node(s), {} threads per rank{})",
            resolved,
            world.size(),
            world.node_index().1,
            rayon::current_num_threads(),
            if cfg.threads.is_some() {
                ", as requested"
            } else {
                ", cores / ranks on the host"
            }
        );
        log::info!("host memory: {}", crate::util::huge_pages::describe());
    }
    let out = match device::choose(cfg.device, cfg.precision, &world)? {
        Chosen::Cpu { why } => {
            if cfg.precision == Precision::Tf32 {
                log::warn!("--precision tf32 applies to a GPU's products; the CPU computes fp32");
            }
            log::info!("device: {} ({why})", Cpu.describe());
            job.run(Cpu, &world)?
        }
        Chosen::Cuda { backend, why } => {
            log::info!("device: {} ({why})", backend.describe());
            job.run(backend, &world)?
        }
    };
    Ok((out, world))
}

impl TrainArgs {
    /// Refuse an output option that names the dataset file or the configuration: the output
    /// would be renamed over it. (`--calibration` is read and rewritten by design; it is only
    /// checked against the inputs.)
    pub fn refuse_overwriting_inputs(&self) -> Result<()> {
        let inputs = [
            ("--data", self.data.as_deref()),
            ("--config", self.config.as_deref()),
        ];
        let outputs = [
            ("--checkpoint", &self.checkpoint),
            ("--summary", &self.summary),
            ("--metrics", &self.metrics),
            ("--dump-blocks", &self.dump_blocks),
            ("--calibration", &self.calibration),
        ];
        for (what, path) in outputs {
            if let Some(path) = path {
                refuse_overwriting_inputs(path, what, &inputs)?;
            }
        }
        Ok(())
    }

    /// Where the run reads and writes.
    pub fn files(&self) -> RunFiles {
        RunFiles {
            data: self.data.clone(),
            metrics: self.metrics.clone(),
            checkpoint: self.checkpoint.clone(),
            resume: self.resume,
            summary: self.summary.clone(),
            dump_blocks: self.dump_blocks.clone(),
            calibration: self.calibration.clone(),
            plan_only: false,
        }
    }
}

struct TrainJob {
    cfg: TrainConfig,
    files: RunFiles,
}

impl Job for TrainJob {
    type Out = crate::train::RunSummary;
    fn data(&self) -> Option<&std::path::Path> {
        self.files.data.as_deref()
    }
    fn run<B: Backend>(self, backend: B, world: &World) -> Result<Self::Out> {
        if self.cfg.strategy == Strategy::Slicegcn {
            SliceTrainer::on(backend, self.cfg, self.files, world)?.run()
        } else {
            Trainer::on(backend, self.cfg, self.files, world)?.run()
        }
    }
}

/// Run `gnnpar train`.
pub fn run(args: TrainArgs) -> Result<()> {
    args.refuse_overwriting_inputs()?;
    let cfg = args.resolve()?;
    let files = args.files();
    let (summary, world) = with_backend(&cfg.clone(), TrainJob { cfg, files })?;
    if world.rank() == 0 {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(())
}

/// `--cache-mb`: `auto` or a size in MiB.
fn parse_cache_size(s: &str) -> Result<CacheSize, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}
