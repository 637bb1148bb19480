//! Partitioning a dataset into `parts/`: METIS k-way (multi-constraint vertex weights, edge
//! weights from pre-sampling) or a random / hash baseline, then relabelling so every part owns
//! a contiguous id range, then writing `meta.h5` and one file per part.
//!
//! * [`symmetric`]: the undirected adjacency METIS needs;
//! * [`constraints`]: vertex weights (`--balance` or a weights file);
//! * [`metis`]: the METIS call; [`baseline`]: random and hash;
//! * [`relabel`]: new ids and per-part datasets; [`writer`]: the atomic `parts/` directory;
//! * [`repair`]: no part left empty, whatever the method;
//! * [`memory`]: the memory needed, stated before the arrays are read;
//! * [`stats`]: edge cut and balance; [`weights`]: the `weights.h5` file.

pub mod baseline;
pub mod constraints;
pub mod memory;
pub mod metis;
pub mod relabel;
pub mod repair;
pub mod stats;
pub mod symmetric;
pub mod weights;
pub mod writer;

use crate::graph::{format, Dataset};
use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use constraints::{Balance, Constraints};
use relabel::Relabeling;
use stats::PartitionStats;
use std::path::PathBuf;
use std::time::Instant;
use weights::VertexEdgeWeights;

/// How vertices are assigned to parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// METIS multilevel k-way, minimising the edge cut under balance constraints.
    Metis,
    /// A seeded random permutation cut into equal ranges.
    Random,
    /// A fixed hash of the vertex id modulo the number of parts.
    Hash,
}

impl Method {
    /// The name used on the command line and in `meta.h5`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Metis => "metis",
            Method::Random => "random",
            Method::Hash => "hash",
        }
    }
}

/// Balance used when neither `--balance` nor `--weights` is given (DistDGL's choice).
pub const DEFAULT_BALANCE: [Balance; 3] = [Balance::Vertices, Balance::Edges, Balance::Train];

/// Everything `partition_dataset` needs.
#[derive(Clone, Debug)]
pub struct PartitionOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub parts: usize,
    pub method: Method,
    /// Pre-sampling weights (METIS only).
    pub weights: Option<PathBuf>,
    /// Constraints to balance without a weights file (METIS only); `None`: [`DEFAULT_BALANCE`].
    pub balance: Option<Vec<Balance>>,
    pub seed: u64,
    /// METIS' allowed imbalance in thousandths; `None`: METIS' default.
    pub ufactor: Option<u32>,
}

/// Partition `opts.input` and write `opts.output`; returns what was measured. On any error
/// nothing is left at the output path (nor a temporary directory).
pub fn partition_dataset(opts: &PartitionOptions) -> Result<PartitionStats> {
    let started = Instant::now();
    check_options(opts)?;
    let out = writer::prepare_output(&opts.output)?;
    let header = format::read_header(&opts.input)?;
    header.require_whole(&opts.input, "partition the whole dataset")?;
    if opts.parts as u64 > header.num_nodes {
        bail!(
            "--parts {} exceeds the {} vertices of `{}` (every part needs a vertex)",
            opts.parts,
            header.num_nodes,
            opts.input.display()
        );
    }
    if opts.method == Method::Metis && opts.parts > 1 {
        // Fail before reading the arrays. The adjacency size is known here only as the
        // bound 2m: it is checked, exactly if the bound is over, before symmetrising.
        symmetric::check_metis_limit(header.num_nodes, "vertices")
            .with_context(|| format!("partitioning `{}`", opts.input.display()))?;
    }
    // State the memory needed before reading any array (the weights file's included).
    let job = memory::Job {
        method: opts.method,
        parts: opts.parts,
        ncon: match (&opts.weights, &opts.balance) {
            // Unreadable: `read_weights` says why just below.
            (Some(path), _) => memory::weights_constraints(path).unwrap_or(1),
            (None, Some(b)) => b.len() as u64,
            (None, None) => DEFAULT_BALANCE.len() as u64,
        },
        weights: opts.weights.is_some(),
    };
    let shape = memory::DatasetShape::read(&opts.input, &header)?;
    memory::report(&memory::estimate(&shape, &job), memory::available_bytes());
    let weights = match &opts.weights {
        Some(path) => {
            let w = weights::read_weights(path)?;
            w.check_fits(
                header.num_nodes,
                header.num_edges,
                &format!("`{}`", path.display()),
            )?;
            Some(w)
        }
        None => None,
    };
    let ds = format::read_dataset(&opts.input)?;
    log::info!(
        "read `{}`: {} vertices, {} edges in {:.2} s",
        opts.input.display(),
        ds.num_nodes,
        ds.local_edges(),
        started.elapsed().as_secs_f64()
    );

    let assign_started = Instant::now();
    let (mut part, constraints) = assign(&ds, opts, weights.as_ref())
        .with_context(|| format!("partitioning `{}`", opts.input.display()))?;
    // Training assumes every part owns a vertex; METIS (with parts nearly as many as the
    // vertices) and the hash baseline may leave some empty.
    let emptied = repair::fill_empty_parts(&ds.graph, &mut part, opts.parts);
    if emptied > 0 {
        log::warn!(
            "{} left {emptied} of {} parts empty; moved one vertex into each (from the largest \
             part, the vertex with the fewest edges inside it)",
            opts.method.name(),
            opts.parts
        );
    }
    let partition_seconds = assign_started.elapsed().as_secs_f64();
    drop(weights);

    let mut stats = PartitionStats::measure(&ds, &part, opts.parts, constraints.as_ref());
    stats.method = opts.method.name().to_string();
    stats.weights = opts
        .weights
        .as_ref()
        .map_or_else(|| "none".to_string(), |p| p.display().to_string());
    stats.partition_seconds = partition_seconds;
    drop(constraints);

    let relabel = Relabeling::from_parts(&part, opts.parts);
    drop(part);
    // The source's identity as its file records it (what `train --data` on that file sees);
    // a file from an older build has none, and gets the id of what was read.
    let source_id = header
        .content_id
        .unwrap_or_else(|| crate::graph::identity::content_id(&ds));
    writer::write_parts(out, &ds, &relabel, &stats, opts.seed, source_id)?;
    stats.total_seconds = started.elapsed().as_secs_f64();
    Ok(stats)
}

fn check_options(opts: &PartitionOptions) -> Result<()> {
    if opts.parts == 0 {
        bail!("--parts must be at least 1 (got 0)");
    }
    if opts.ufactor == Some(0) {
        // METIS answers a zero imbalance with a bare "invalid input".
        bail!("--ufactor must be at least 1 (the allowed imbalance is 1 + ufactor/1000)");
    }
    if opts.method != Method::Metis {
        if opts.weights.is_some() {
            bail!(
                "--weights applies to --method metis only (got --method {})",
                opts.method.name()
            );
        }
        if opts.balance.is_some() {
            bail!(
                "--balance applies to --method metis only (got --method {})",
                opts.method.name()
            );
        }
    }
    if opts.weights.is_some() && opts.balance.is_some() {
        bail!("give --weights or --balance, not both (the weights file defines the constraints)");
    }
    Ok(())
}

/// The part of every vertex, and the constraints METIS balanced (METIS only).
fn assign(
    ds: &Dataset,
    opts: &PartitionOptions,
    weights: Option<&VertexEdgeWeights>,
) -> Result<(Vec<u32>, Option<Constraints>)> {
    let n = ds.local_nodes();
    Ok(match opts.method {
        Method::Random => (baseline::random(n, opts.parts, opts.seed), None),
        Method::Hash => (baseline::hash(n, opts.parts), None),
        Method::Metis => {
            let constraints = match weights {
                Some(w) => constraints::from_weights(w),
                None => constraints::from_balance(
                    ds,
                    opts.balance.as_deref().unwrap_or(&DEFAULT_BALANCE),
                )?,
            };
            if opts.parts == 1 {
                return Ok((vec![0; n], Some(constraints)));
            }
            // Refused here, before the symmetrised arrays are allocated (the vertex count
            // was checked before reading).
            symmetric::check_adjacency_limit(&ds.graph)?;
            let t = Instant::now();
            let graph =
                symmetric::symmetrize(&ds.graph, weights.map(|w| w.edge_weights.as_slice()))?;
            log::info!(
                "symmetrised adjacency: {} entries in {:.2} s",
                graph.adjncy.len(),
                t.elapsed().as_secs_f64()
            );
            let t = Instant::now();
            let part = metis::kway(
                &graph,
                &constraints,
                opts.parts,
                metis::MetisOptions {
                    seed: opts.seed,
                    ufactor: opts.ufactor,
                },
            )?;
            log::info!("METIS k-way: {:.2} s", t.elapsed().as_secs_f64());
            (part, Some(constraints))
        }
    })
}
