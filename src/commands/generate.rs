//! `gnnpar generate sbm|rmat … -o <dataset.h5>`: write a synthetic dataset.
//!
//! `--edges M` counts stored (directed) edges: M/2 undirected pairs are drawn, both directions
//! stored, self-loops and repeated pairs dropped, so the final count can be slightly below M
//! (the summary says by how much). The last line on stdout is a JSON object
//! `{"generate": {…, "seconds": …, "peak_rss_mb": …}}` for benchmarks.

use crate::graph::format;
use crate::graph::generate::{
    self, features::DEFAULT_NOISE, sbm::DEFAULT_HOMOPHILY, CommonParams, Generated, RmatParams,
    SbmParams,
};
use crate::graph::summary::Summary;
use crate::util::{
    atomic::AtomicOutput,
    rss::{available_memory_mb, peak_rss_mb},
};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `gnnpar generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(subcommand)]
    pub model: Model,
}

/// The graph models.
#[derive(Subcommand, Debug)]
pub enum Model {
    /// Stochastic block model: one block per class, features = class centroid + noise.
    Sbm(SbmArgs),
    /// R-MAT power-law graph with scrambled ids, balanced random classes, class features.
    Rmat(RmatArgs),
}

/// Options shared by every model.
#[derive(Args, Debug)]
pub struct CommonArgs {
    /// Number of vertices (1 ..< 2^32).
    #[arg(long, default_value_t = 20_000, allow_negative_numbers = true)]
    pub nodes: i64,
    /// Stored (directed) edges to draw: M/2 undirected pairs, both directions stored; dropped
    /// self-loops and duplicates can leave slightly fewer.
    #[arg(long, default_value_t = 400_000, allow_negative_numbers = true)]
    pub edges: i64,
    /// Feature width.
    #[arg(long, default_value_t = 32)]
    pub features: usize,
    /// Number of classes.
    #[arg(long, default_value_t = 8)]
    pub classes: usize,
    /// Seed of every random choice; the output depends on nothing else (not the thread count).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fraction of vertices in the training split.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub train_frac: f64,
    /// Fraction of vertices in the validation split (the rest is the test split).
    #[arg(long, default_value_t = 0.25, allow_negative_numbers = true)]
    pub val_frac: f64,
    /// Standard deviation of the Gaussian feature noise per dimension (centroids have norm 1).
    #[arg(long, default_value_t = DEFAULT_NOISE, allow_negative_numbers = true)]
    pub noise: f64,
    /// Dataset name stored in the file (default: the output file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// Output dataset file (written under a temporary name, then renamed).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Options of `gnnpar generate sbm`.
#[derive(Args, Debug)]
pub struct SbmArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Fraction of pairs drawn inside one block (edge homophily), in [0, 1].
    #[arg(long, default_value_t = DEFAULT_HOMOPHILY, allow_negative_numbers = true)]
    pub homophily: f64,
}

/// Options of `gnnpar generate rmat`.
#[derive(Args, Debug)]
pub struct RmatArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Quadrant probabilities a,b,c,d (sum 1, `a` the largest).
    #[arg(
        long,
        value_parser = parse_abcd,
        default_value = "0.57,0.19,0.19,0.05",
        allow_hyphen_values = true
    )]
    pub abcd: [f64; 4],
}

/// Parse `a,b,c,d` into four numbers (range checks happen in `RmatParams::validate`).
fn parse_abcd(text: &str) -> std::result::Result<[f64; 4], String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() != 4 {
        return Err(format!(
            "expected four comma-separated probabilities a,b,c,d, got {} value(s)",
            parts.len()
        ));
    }
    let mut abcd = [0.0; 4];
    for (slot, part) in abcd.iter_mut().zip(&parts) {
        *slot = part
            .parse()
            .map_err(|_| format!("`{part}` is not a number"))?;
    }
    Ok(abcd)
}

impl CommonArgs {
    fn params(&self) -> Result<CommonParams> {
        let nodes = u64::try_from(self.nodes)
            .map_err(|_| anyhow::anyhow!("--nodes = {} must be at least 1", self.nodes))?;
        let edges = u64::try_from(self.edges)
            .map_err(|_| anyhow::anyhow!("--edges = {} must be ≥ 0", self.edges))?;
        let name = match &self.name {
            Some(n) => n.clone(),
            None => self
                .output
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "synthetic".to_string()),
        };
        Ok(CommonParams {
            name,
            nodes,
            edges,
            features: self.features,
            classes: self.classes,
            seed: self.seed,
            train_frac: self.train_frac,
            val_frac: self.val_frac,
            noise: self.noise,
        })
    }
}

/// A validated generator run.
enum Job {
    Sbm(SbmParams),
    Rmat(RmatParams),
}

impl Job {
    fn model(&self) -> &'static str {
        match self {
            Job::Sbm(_) => "sbm",
            Job::Rmat(_) => "rmat",
        }
    }

    fn common(&self) -> &CommonParams {
        match self {
            Job::Sbm(p) => &p.common,
            Job::Rmat(p) => &p.common,
        }
    }

    fn validate(&self) -> Result<()> {
        match self {
            Job::Sbm(p) => p.validate(),
            Job::Rmat(p) => p.validate(),
        }
    }

    fn generate(&self) -> Result<Generated> {
        match self {
            Job::Sbm(p) => generate::sbm::generate(p),
            Job::Rmat(p) => generate::rmat::generate(p),
        }
    }

    /// The model-specific parameters, for the JSON report.
    fn params_json(&self) -> serde_json::Value {
        match self {
            Job::Sbm(p) => {
                json!({ "homophily": p.homophily, "seed": p.common.seed, "noise": p.common.noise })
            }
            Job::Rmat(p) => {
                json!({ "abcd": p.abcd, "seed": p.common.seed, "noise": p.common.noise })
            }
        }
    }
}

/// Run `gnnpar generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let started = Instant::now();
    let (job, common) = match &args.model {
        Model::Sbm(a) => (
            Job::Sbm(SbmParams {
                common: a.common.params()?,
                homophily: a.homophily,
            }),
            &a.common,
        ),
        Model::Rmat(a) => (
            Job::Rmat(RmatParams {
                common: a.common.params()?,
                abcd: a.abcd,
            }),
            &a.common,
        ),
    };
    job.validate()?;
    check_memory(job.common())?;
    let output = &common.output;
    let out = open_output(output)?;
    let Generated { dataset, stats } = job.generate()?;
    let generate_seconds = started.elapsed().as_secs_f64();

    let write_started = Instant::now();
    format::write_dataset_to(&dataset, out.tmp_path())
        .with_context(|| format!("writing `{}`", output.display()))?;
    out.commit()?;
    let write_seconds = write_started.elapsed().as_secs_f64();
    let seconds = started.elapsed().as_secs_f64();

    let model = job.model();
    let summary = Summary::of(&dataset);
    println!("{}", summary.line());
    println!(
        "{model}: {} of {} requested stored edges ({} pairs drawn, {} self-loops and {} \
         duplicate edges dropped); generated in {generate_seconds:.2} s, wrote `{}` in \
         {write_seconds:.2} s",
        summary.edges,
        common.edges,
        stats.pairs_drawn,
        stats.self_loops_dropped,
        stats.duplicates_dropped,
        output.display()
    );
    let report = json!({ "generate": {
        "model": model,
        "output": output.display().to_string(),
        "params": job.params_json(),
        "edges_requested": common.edges,
        "stats": stats,
        "summary": summary,
        "generate_seconds": generate_seconds,
        "write_seconds": write_seconds,
        "seconds": seconds,
        "peak_rss_mb": peak_rss_mb(),
    }});
    println!("{report}");
    Ok(())
}

/// Refuse, before allocating anything, a graph that cannot fit in the available memory (an
/// allocation failure would abort the process without a message).
fn check_memory(params: &CommonParams) -> Result<()> {
    let need_mb = params.estimated_peak_bytes() as f64 / (1024.0 * 1024.0);
    if let Some(available_mb) = available_memory_mb() {
        if need_mb > available_mb {
            bail!(
                "generating --nodes {} --edges {} --features {} needs about {need_mb:.0} MiB but \
                 only {available_mb:.0} MiB of memory are available; lower --nodes, --edges or \
                 --features",
                params.nodes,
                params.edges,
                params.features
            );
        }
    }
    Ok(())
}

/// Prepare the output before any work, so a bad path fails in a second, not after the graph.
fn open_output(path: &std::path::Path) -> Result<AtomicOutput> {
    if path.is_dir() {
        bail!(
            "output `{}` is a directory, expected a file name",
            path.display()
        );
    }
    AtomicOutput::new(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::generate::rmat::DEFAULT_ABCD;

    #[test]
    fn abcd_default_matches_the_library() {
        assert_eq!(parse_abcd("0.57,0.19,0.19,0.05").unwrap(), DEFAULT_ABCD);
    }

    #[test]
    fn abcd_parse_errors_say_what_is_wrong() {
        assert!(parse_abcd("0.5,0.5").unwrap_err().contains("four"));
        assert!(parse_abcd("0.5,x,0.2,0.3").unwrap_err().contains("`x`"));
        assert_eq!(
            parse_abcd(" 0.4, 0.3 ,0.2,0.1").unwrap(),
            [0.4, 0.3, 0.2, 0.1]
        );
    }
}
