//! `gnnpar info <dataset.h5|parts/>`: describe a dataset or a partition. Under `mpirun -np P`
//! every rank opens only its own part file and reports its counts; rank 0 prints them all.

use crate::comm::World;
use crate::graph::{format, parts, summary::Summary};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `gnnpar info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// A dataset file (`dataset.h5`) or a partition directory (`parts/`).
    pub path: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `gnnpar info`.
pub fn run(args: InfoArgs) -> Result<()> {
    let world = World::init()?;
    if parts::is_parts_dir(&args.path) {
        return info_parts(&args, &world);
    }
    if args.path.is_dir() {
        bail!(
            "`{}` is a directory without `{}`: not a partition directory",
            args.path.display(),
            parts::META_FILE
        );
    }
    if world.size() > 1 {
        bail!(
            "`{}` is a single dataset file; run `gnnpar info` on it as one process, not \
             under {}, or partition it first (`gnnpar partition … --parts {}`)",
            args.path.display(),
            crate::comm::launcher::launcher().program(),
            world.size()
        );
    }
    let ds = format::read_dataset(&args.path)?;
    let summary = Summary::of(&ds);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("{}", summary.line());
    }
    Ok(())
}

fn info_parts(args: &InfoArgs, world: &World) -> Result<()> {
    let meta = parts::read_meta(&args.path)?;
    let ranks = world.size();
    if ranks > 1 && ranks != meta.num_parts {
        bail!(
            "`{}` has {} parts but the job has {ranks} ranks; run {} ranks ({})",
            args.path.display(),
            meta.num_parts,
            meta.num_parts,
            crate::comm::launcher::run_hint(meta.num_parts)
        );
    }
    // One rank reads its own part only; a single process walks through all parts in turn.
    let mine: Vec<usize> = if ranks > 1 {
        vec![world.rank()]
    } else {
        (0..meta.num_parts).collect()
    };
    let mut lines = Vec::new();
    for p in mine {
        let ds = parts::read_part(&args.path, &meta, p)?;
        let s = Summary::of(&ds);
        let line = if args.json {
            let mut v = serde_json::to_value(&s)?;
            v["part"] = p.into();
            v["rank"] = world.rank().into();
            v["first_node"] = ds.first_node.into();
            serde_json::to_string(&v)?
        } else {
            format!(
                "part {p} (rank {}): vertices {}..{} ({}), {} edges, {} train / {} val / {} test",
                world.rank(),
                ds.first_node,
                ds.first_node + ds.local_nodes() as u64,
                s.local_nodes,
                s.edges,
                s.train,
                s.val,
                s.test
            )
        };
        lines.push(line);
    }
    let all = world.gather_strings(&lines.join("\n"));
    if world.rank() == 0 {
        if !args.json {
            println!(
                "{}: {} parts of {} vertices, {} edges, method {}, weights {}, edge cut {} ({:.2}%)",
                args.path.display(),
                meta.num_parts,
                meta.num_nodes(),
                meta.num_edges,
                meta.method,
                meta.weights,
                meta.edge_cut,
                100.0 * meta.edge_cut as f64 / meta.num_edges.max(1) as f64
            );
        }
        for l in all {
            println!("{l}");
        }
    }
    Ok(())
}
