//! Synthetic graphs: a stochastic block model whose features carry class signal (a GNN that
//! averages neighbours clearly beats a classifier on features alone) and an R-MAT power-law
//! graph, both deterministic for a seed and built in streaming chunks.
//!
//! Conventions shared by both generators:
//!
//! * graphs are undirected and stored with both directions (`directed = false`);
//! * `edges` counts **stored** (directed) edges: `edges / 2` undirected pairs are drawn. Drawn
//!   self-loops are dropped and repeated pairs kept once, so the final count can be slightly
//!   below `edges` (noticeably so for skewed R-MAT parameters, whose hubs attract repeats);
//!   [`EdgeStats`] says how many of each were dropped;
//! * neighbour lists are sorted by id;
//! * every random quantity comes from a generator seeded by `(seed, purpose, index)` (see
//!   [`rng`]), so the output is the same whatever the number of rayon threads;
//! * labels are balanced classes (sizes equal ± 1), features are unit-norm class centroids plus
//!   Gaussian noise of standard deviation `noise` per dimension, and splits are seeded random
//!   subsets of exact size (`round(train_frac · n)`, `round(val_frac · n)`, the rest for test).

pub mod bijection;
pub mod blocks;
pub mod features;
pub mod rmat;
pub mod rng;
pub mod sbm;
pub mod splits;
pub mod stream;

pub use rmat::RmatParams;
pub use sbm::SbmParams;
pub use stream::EdgeStats;

use super::{Csr, Dataset, Labels};
use anyhow::{bail, Result};

/// Sizes, seed, features and splits common to every generator.
#[derive(Clone, Debug, PartialEq)]
pub struct CommonParams {
    /// Dataset name stored in the file.
    pub name: String,
    /// Number of vertices (`--nodes`, 1 ..< 2^32).
    pub nodes: u64,
    /// Number of stored (directed) edges requested (`--edges`); `edges / 2` pairs are drawn.
    pub edges: u64,
    /// Feature width (`--features`, ≥ 1).
    pub features: usize,
    /// Number of classes (`--classes`, 1 ..= nodes).
    pub classes: usize,
    /// Seed of every random choice (`--seed`).
    pub seed: u64,
    /// Fraction of vertices in the training split (`--train-frac`, in (0, 1]).
    pub train_frac: f64,
    /// Fraction of vertices in the validation split (`--val-frac`); the rest is the test split.
    pub val_frac: f64,
    /// Standard deviation of the feature noise per dimension (`--noise`, ≥ 0).
    pub noise: f64,
}

impl CommonParams {
    /// Parameters with the default features (32), classes (8), splits (50/25/25) and noise.
    pub fn new(name: &str, nodes: u64, edges: u64, seed: u64) -> Self {
        CommonParams {
            name: name.to_string(),
            nodes,
            edges,
            features: 32,
            classes: 8,
            seed,
            train_frac: 0.5,
            val_frac: 0.25,
            noise: features::DEFAULT_NOISE,
        }
    }

    /// Check every option; errors name the option and say what was expected.
    pub fn validate(&self) -> Result<()> {
        let n = self.nodes;
        if n == 0 {
            bail!("--nodes must be at least 1");
        }
        if n > u32::MAX as u64 {
            bail!("--nodes = {n} is 2^32 or more; gnnpar keeps vertex ids in 32 bits");
        }
        let most = n * (n - 1);
        if self.edges > most {
            bail!(
                "--edges = {} exceeds N·(N−1) = {most}, the most stored edges (both directions) \
                 of a simple undirected graph on --nodes = {n} vertices",
                self.edges
            );
        }
        if self.classes == 0 {
            bail!("--classes must be at least 1");
        }
        if self.classes as u64 > n {
            bail!(
                "--classes = {} exceeds --nodes = {n}; every class needs a vertex",
                self.classes
            );
        }
        if self.features == 0 {
            bail!(
                "--features must be at least 1: the {} classes are carried by the features",
                self.classes
            );
        }
        if (n as usize).checked_mul(self.features).is_none() {
            bail!(
                "--nodes × --features = {n} × {} does not fit in memory addresses",
                self.features
            );
        }
        if !self.noise.is_finite() || self.noise < 0.0 {
            bail!(
                "--noise = {} must be a finite standard deviation ≥ 0",
                self.noise
            );
        }
        if !(self.train_frac > 0.0 && self.train_frac <= 1.0) {
            bail!("--train-frac = {} must be in (0, 1]", self.train_frac);
        }
        if !(0.0..=1.0).contains(&self.val_frac) {
            bail!("--val-frac = {} must be in [0, 1]", self.val_frac);
        }
        if self.train_frac + self.val_frac > 1.0 + 1e-9 {
            bail!(
                "--train-frac + --val-frac = {} + {} exceeds 1",
                self.train_frac,
                self.val_frac
            );
        }
        if splits::split_sizes(n, self.train_frac, self.val_frac).0 == 0 {
            bail!(
                "--train-frac = {} of --nodes = {n} leaves the training split empty",
                self.train_frac
            );
        }
        Ok(())
    }
}

impl CommonParams {
    /// Peak memory of generating these parameters, in bytes (close to what is measured): the
    /// CSR (8 bytes per vertex, 4 per stored edge), per-vertex degree cursors or labels
    /// (8 bytes), features (4 bytes per value) and the split lists, plus 8 bytes per vertex of
    /// slack for the HDF5 writer's widened ids.
    pub fn estimated_peak_bytes(&self) -> u128 {
        let n = self.nodes as u128;
        4 * self.edges as u128 + n * (40 + 4 * self.features as u128)
    }
}

/// A generated dataset and what happened to the drawn pairs on the way.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub dataset: Dataset,
    pub stats: EdgeStats,
}

/// Generate a stochastic block model.
pub fn sbm(params: &SbmParams) -> Result<Dataset> {
    sbm::generate(params).map(|g| g.dataset)
}

/// Generate an R-MAT graph.
pub fn rmat(params: &RmatParams) -> Result<Dataset> {
    rmat::generate(params).map(|g| g.dataset)
}

/// Parameters of the built-in synthetic dataset: an SBM of 20 000 vertices, 400 000 stored
/// edges (average degree 20), 32 features, 8 classes, homophily 0.8, splits 50/25/25.
pub fn synthetic_default_params(seed: u64) -> SbmParams {
    SbmParams::new(CommonParams::new("synthetic-sbm", 20_000, 400_000, seed))
}

/// The built-in synthetic dataset (see [`synthetic_default_params`]), used when `gnnpar train`
/// is given no `--data`.
pub fn synthetic_default(seed: u64) -> Dataset {
    sbm(&synthetic_default_params(seed)).expect("the built-in synthetic parameters are valid")
}

/// Attach labels, class features and splits to a generated graph.
fn finish_dataset(c: &CommonParams, graph: Csr, labels: Vec<i64>, stats: EdgeStats) -> Generated {
    let started = std::time::Instant::now();
    let centroids = features::centroids(c.seed, c.classes, c.features);
    let features = features::class_features(c.seed, &labels, &centroids, c.noise);
    log::debug!("features drawn in {:.2} s", started.elapsed().as_secs_f64());
    let dataset = Dataset {
        name: c.name.clone(),
        num_nodes: c.nodes,
        first_node: 0,
        graph,
        features: Some(features),
        labels: Some(Labels::Class(labels)),
        num_classes: c.classes,
        splits: splits::random_splits(c.nodes, c.train_frac, c.val_frac, c.seed),
        directed: false,
    };
    Generated { dataset, stats }
}
