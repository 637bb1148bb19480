//! APT's calibrated planner: a [`calibration`] of this machine's operators (measured by
//! [`calibrate`], cached per host, layout, device and version), a [`dry_run`] of a sample of the
//! epoch's mini-batches counting what each strategy would move and compute, and the [`cost`]
//! model pricing those counts. `train --strategy auto` picks the cheapest; `gnnpar plan` prints
//! the table; every run whose calibration is at hand reports predicted against measured.
//!
//! Determinism: rank 0 reads (or every rank measures, then rank 0's numbers are broadcast) the
//! calibration, the dry run's counts are allgathered, and the cost model is pure arithmetic, so
//! every rank computes the same prediction and the same choice without a broadcast of it.

pub mod calibrate;
pub mod calibration;
pub mod core_share;
pub mod cost;
pub mod dry_run;
mod evict;
pub mod report;

use super::data::TrainData;
use super::prefetch::planned_workers;
use super::strategy::ResidentFeatures;
use crate::backend::Backend;
use crate::comm::{Group, World};
use crate::config::TrainConfig;
use crate::kinds::{ModelKind, Strategy};
use crate::nn::layer::Conv;
use crate::nn::Model;
use anyhow::Result;
use calibration::{Calibration, Loaded};
use cost::{ModelShape, Prediction};
use std::path::{Path, PathBuf};

/// What to do when no calibration of this run's key is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Measure one (seconds) and write it.
    Measure,
    /// Go without (fixed strategies: their start-up does not grow by a calibration).
    Skip,
}

/// A calibration and the file it came from or went to.
pub struct Calibrated {
    pub calibration: Calibration,
    pub path: PathBuf,
    /// For a cached calibration, how long a few of its products take on this host now against
    /// the time it holds for them ([`calibrate::products_against`]); `None` when just measured.
    pub products_now: Option<f64>,
    /// The same of a few of its feature gathers ([`calibrate::gathers_against`]): the caches
    /// and memory, which a host's neighbours share, against the cores.
    pub gathers_now: Option<f64>,
}

/// A run's plan: the prediction, the calibration file it priced with, and how that
/// calibration compared with the host when the run started ([`Calibrated::products_now`],
/// [`Calibrated::gathers_now`]).
#[derive(Clone, Debug)]
pub struct Planned {
    pub prediction: Prediction,
    pub calibration: PathBuf,
    pub products_now: Option<f64>,
    pub gathers_now: Option<f64>,
}

/// How far this host's products may be from a cached calibration's before the log warns that
/// the calibration no longer describes the host. The 2-core VM's calibrations of one hour
/// agreed within about 15 %; the one that misled a whole grid was 36 % off.
const STALE_RATIO: f64 = 1.25;

/// Say how the host runs a cached calibration's products and gathers now against the times
/// it holds (`calibration: checked: …`), and warn where either is beyond [`STALE_RATIO`]: the
/// calibration was measured in another state of the machine, and predictions from it will be
/// off by about as much.
fn log_host_check(path: &Path, products: Option<f64>, gathers: Option<f64>) {
    let checked: Vec<(&str, f64)> = [("products", products), ("gathers", gathers)]
        .into_iter()
        .filter_map(|(what, r)| Some((what, r?)))
        .collect();
    if checked.is_empty() {
        return;
    }
    let said = checked
        .iter()
        .map(|(what, r)| format!("its {what} in {r:.2}×"))
        .collect::<Vec<_>>()
        .join(" and ");
    let stale: Vec<&str> = checked
        .iter()
        .filter(|(_, r)| !(1.0 / STALE_RATIO..=STALE_RATIO).contains(r))
        .map(|(what, _)| *what)
        .collect();
    if stale.is_empty() {
        log::info!("calibration: checked: this host runs {said} the time it holds for them");
    } else {
        log::warn!(
            "calibration: this host now runs {said} the time `{}` holds for them: it was \
             measured on another state of the machine ({} off), and predictions from it will be \
             off by about as much (`gnnpar calibrate --calibration {}` on a quiet host measures \
             it again)",
            path.display(),
            stale.join(" and "),
            path.display()
        );
    }
}

/// This run's calibration: the file at `path` (default: [`calibration::default_path`]) when
/// its key matches, else measured and written there (`Missing::Measure`), else none.
/// Collective over `world`; every rank gets rank 0's numbers.
pub fn obtain<B: Backend>(
    be: &B,
    world: &World,
    path: Option<&Path>,
    missing: Missing,
) -> Result<Option<Calibrated>> {
    let key = calibrate::run_key(world, be.describe(), rayon::current_num_threads());
    let explicit = path.is_some();
    let path = path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| calibration::default_path(&key));
    // Rank 0 reads; a bad file is an error there, which ends the whole job.
    let mut found = None;
    if world.rank() == 0 {
        match calibration::load(&path, &key)? {
            Loaded::Usable(c) => {
                log::info!(
                    "calibration: using cached `{}` (measured in {:.1} s)",
                    path.display(),
                    c.seconds_to_calibrate
                );
                found = Some(c);
            }
            Loaded::Foreign(why) => log::info!("calibration: ignoring `{}`: {why}", path.display()),
            Loaded::Missing => log::info!("calibration: none at `{}`", path.display()),
        }
    }
    let mut flag = [found.is_some() as u8 as f64];
    world.broadcast_f64_from_root(&mut flag);
    if flag[0] == 1.0 {
        let mut cal = found.unwrap_or_else(|| Calibration {
            format: calibration::FORMAT,
            key: key.clone(),
            seconds_to_calibrate: 0.0,
            operators: Default::default(),
            shared_cores: None,
            cache_bytes: 0.0,
            private_cache_bytes: 0.0,
            sample_window: 1,
            far_shares: vec![],
        });
        calibrate::share_from_root(world, &mut cal);
        let products_now = calibrate::products_against(be, world, &cal);
        let gathers_now = calibrate::gathers_against(world, &cal);
        if world.rank() == 0 {
            log_host_check(&path, products_now, gathers_now);
        }
        return Ok(Some(Calibrated {
            calibration: cal,
            path,
            products_now,
            gathers_now,
        }));
    }
    if missing == Missing::Skip {
        return Ok(None);
    }
    let cal = calibrate::calibrate(be, world, key);
    if world.rank() == 0 {
        match cal.save(&path) {
            Ok(()) => log::info!(
                "calibration: measured in {:.1} s, written to `{}`",
                cal.seconds_to_calibrate,
                path.display()
            ),
            // The default cache directory may be read-only (a job's sandbox): plan anyway.
            Err(e) if !explicit => log::warn!("calibration: measured but not cached: {e:#}"),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(Calibrated {
        calibration: cal,
        path,
        products_now: None,
        gathers_now: None,
    }))
}

/// The cost model's view of `model` (built on the host, before it moves) under `cfg`, to be
/// trained on `be`. Collective over `group` (the input features' density is agreed on by
/// every rank).
pub fn shape_of<B: Backend, M: Backend>(
    cfg: &TrainConfig,
    model: &Model<M>,
    be: &B,
    data: &TrainData,
    group: &Group,
    world_ranks: usize,
) -> ModelShape {
    let in_w: Vec<f64> = model
        .layers
        .iter()
        .map(|l| l.conv.in_dim() as f64)
        .collect();
    let (density, sparse_input, csr_everywhere) = input_density(model, be, data, group);
    let input_nnz = sparse_input.then_some(density * in_w[0]);
    let mostly_zeros = density <= crate::backend::cpu::sparse::MAX_SPARSE_DENSITY;
    let bounds = crate::train::columns::planned_bounds(group, data, mostly_zeros);
    let widths: Vec<usize> = bounds.windows(2).map(|b| b[1] - b[0]).collect();
    // Even slices differ by a column at most.
    let uneven = widths
        .iter()
        .max()
        .zip(widths.iter().min())
        .is_some_and(|(hi, lo)| hi - lo > 1);
    if group.rank() == 0 && uneven {
        log::info!(
            "planner: nfp's column slices as its loader cuts them (equal non-zeros): bounds \
             {bounds:?}"
        );
    }
    let nfp_columns = widths.into_iter().map(|w| w as f64).collect();
    // Batches sampled side by side ahead of their steps (`Trainer::sample_window`): NFP
    // always, GDP without prefetch workers, its ranks all in the fewest any would sample
    // (they sample their windows together).
    let window = crate::train::own_sample_window(cfg, data);
    let agreed = group.allreduce_min_usize(window);
    let gdp_prefetched = crate::train::prefetch::prefetches(cfg, !B::IS_HOST);
    let graph_bytes = data.part.graph.bytes() as f64;
    ModelShape {
        gdp_sample_window: if gdp_prefetched { 1 } else { agreed },
        nfp_sample_window: window,
        packed_row_bytes: ModelShape::packed_row_bytes(in_w[0], density),
        kind: cfg.model,
        in_w,
        out_w: model
            .layers
            .iter()
            .map(|l| match &l.conv {
                // The product's width: every head, before a last layer averages them.
                Conv::Gat(c) => (c.heads * c.head_dim) as f64,
                conv => conv.out_dim() as f64,
            })
            .collect(),
        params: model.params.len() as f64,
        device: !B::IS_HOST,
        staged_gradients: !B::IS_HOST && !group.device_pointers(),
        input_nnz,
        csr_batches: sparse_input && csr_everywhere,
        // Overlap is priced only on a device: on the CPU backend the workers share the cores
        // that train. One rank on a device gathers rows there from its resident features.
        // The ranks keep their own rows on the device as the trainer decides.
        resident_rows: ResidentFeatures::fit_on_every_rank(
            be,
            data,
            group,
            sparse_input && csr_everywhere,
        ),
        sync_ranks: world_ranks,
        nfp_columns,
        store_bytes: group.allreduce_max_f64(data.store.dense_bytes() as f64),
        graph_bytes: group.allreduce_max_f64(graph_bytes),
        whole_graph_bytes: {
            let mut sum = [graph_bytes];
            group.allreduce_sum_f64(&mut sum);
            sum[0]
        },
        // (Whether the host gathers dense rows sets the default worker count.)
        prefetch_workers: planned_workers(
            cfg,
            !B::IS_HOST,
            group.size() > 1 && !(sparse_input && csr_everywhere),
            rayon::current_num_threads(),
        )
        .filter(|_| !B::IS_HOST),
    }
}

/// Rows of each rank's own features looked at to estimate their density.
const DENSITY_SAMPLE_ROWS: usize = 1024;

/// The input features' density (non-zeros over values, on a spread of each rank's rows), and
/// whether the input layer will multiply them as sparse rows (the backend's own test,
/// [`Backend::sparse_from_dense`], on every rank's rows, and a first layer with a sparse path:
/// no GAT, normalisation, residual or input projection), and whether every rank's store keeps
/// a CSR copy of its rows (GDP's batches then come as CSR). Collective over `group`; rank 0's
/// numbers everywhere.
fn input_density<B: Backend, M: Backend>(
    model: &Model<M>,
    be: &B,
    data: &TrainData,
    group: &Group,
) -> (f64, bool, bool) {
    let layer_takes_sparse = model.layers.first().is_some_and(|l| l.takes_sparse_input());
    let rows = data.store.own_rows();
    let take = rows.nrows().min(DENSITY_SAMPLE_ROWS);
    let picked: Vec<usize> = (0..take).map(|t| t * rows.nrows() / take.max(1)).collect();
    let sample = rows.select(ndarray::Axis(0), &picked);
    let sparse = take > 0 && {
        let m = be.upload(sample.view());
        be.sparse_from_dense(be.view(&m)).is_some()
    };
    let nonzeros = sample.iter().filter(|&&v| v != 0.0).count();
    // [ranks whose rows look sparse, ranks with rows, non-zeros, entries, ranks with a CSR
    // copy]
    let mut agg = [
        sparse as u8 as f64,
        (take > 0) as u8 as f64,
        nonzeros as f64,
        sample.len() as f64,
        data.store.has_sparse_copy() as u8 as f64,
    ];
    group.allreduce_sum_f64(&mut agg);
    group.broadcast_f64_from_root(&mut agg);
    let density = if agg[3] > 0.0 { agg[2] / agg[3] } else { 1.0 };
    let sparse = layer_takes_sparse && agg[1] > 0.0 && agg[0] == agg[1] && agg[3] > 0.0;
    let csr_everywhere = agg[4] == group.size() as f64;
    (density, sparse, csr_everywhere)
}

/// Why `auto` may not pick candidate `name` in a run of `cfg` on `ranks` ranks over `data`,
/// in a few words for the planner's table; `None` where it may. Every rank decides alike (the
/// same settings, rank count and kind of data source).
///
/// NFP's ranks hold column slices of every vertex rather than the rows the other strategies
/// (and the dry run) read, so a run that picks it loads its data again as slices
/// (`Trainer::on`): that needs the unpartitioned dataset file or the synthetic default.
pub fn refusal(name: &str, cfg: &TrainConfig, data: &TrainData, ranks: usize) -> Option<String> {
    // What `check_snp` and `check_nfp` refuse, in short.
    let model = || {
        if cfg.input_proj {
            "not with input_proj".to_string()
        } else {
            format!("not for {}", cfg.model)
        }
    };
    match name {
        "snp" if cfg.check_snp().is_err() => Some(model()),
        "nfp" => {
            let columns = data.feature_dim();
            if ranks < 2 {
                Some("on one rank nfp is gdp".into())
            } else if cfg.check_nfp().is_err() {
                Some(model())
            } else if data.from_parts {
                Some("reads column slices of the dataset file, not a partition directory".into())
            } else if columns < ranks {
                Some(format!("{columns} feature columns for {ranks} ranks"))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Which ranks share each mini-batch, as the planner prices a run.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    /// Every rank of the group the graph is partitioned over (one node, or a fixed strategy
    /// over several): exchanges are the world's alltoallv.
    World,
    /// Hybrid over several nodes: this rank's node (`node` of `nodes`) splits its share of
    /// every batch over its ranks, exchanging with the node's alltoallv; gradients are summed
    /// over the world.
    Hybrid { node: usize, nodes: usize },
}

/// Dry-run and price every candidate with `cal` over `scope`, each with a feature cache of
/// `cache_bytes` per rank (`train::cache::budget_bytes`); log the prediction as one JSON line
/// (rank 0; under hybrid [`slowest_node`] does, once the nodes agree). Collective over
/// `group` (the ranks the graph is partitioned over).
pub fn predict(
    cfg: &TrainConfig,
    data: &TrainData,
    shape: &ModelShape,
    group: &Group,
    scope: Scope,
    cal: &Calibration,
    cache_bytes: usize,
) -> Prediction {
    let row_bytes = (data.feature_dim() * 4).max(1);
    let cache_rows = if group.size() > 1 {
        cache_bytes / row_bytes
    } else {
        0
    };
    let share = match scope {
        Scope::World => None,
        Scope::Hybrid { node, nodes } => Some((node, nodes)),
    };
    let dry = dry_run::dry_run(
        group,
        data,
        &cfg.fanouts,
        cfg.seed,
        cfg.batch_size,
        cfg.uses_self_loops(),
        cache_rows,
        share,
    );
    let prediction = match scope {
        Scope::World => {
            let refused: Vec<(&str, String)> = cost::CANDIDATES
                .iter()
                .filter_map(|&name| Some((name, refusal(name, cfg, data, group.size())?)))
                .collect();
            let allowed: Vec<&str> = cost::CANDIDATES
                .iter()
                .copied()
                .filter(|name| refused.iter().all(|(r, _)| r != name))
                .collect();
            let mut p = cost::predict(&dry, shape, cal, &allowed, "alltoallv_world");
            for (name, why) in refused {
                if let Some(s) = p.strategies.get_mut(name) {
                    s.note = Some(why);
                }
            }
            p
        }
        Scope::Hybrid { nodes, .. } => {
            // Hybrid runs split inside each node; the other rows price the same node's work
            // under the other strategies, which this build does not run as hybrids.
            let mut p = cost::predict(&dry, shape, cal, &["split"], "alltoallv_node");
            p.scope = Some(format!(
                "hybrid over {nodes} nodes: each node's {} rank(s) share its 1/{nodes} of every \
                 batch (node alltoallv), gradients are summed over all {} ranks; the split row \
                 is hybrid",
                group.size(),
                shape.sync_ranks
            ));
            for (name, s) in p.strategies.iter_mut() {
                if name != "split" {
                    s.note = Some("inside one node; not a hybrid this build runs".into());
                }
            }
            p
        }
    };
    // Hybrid's nodes agree on one prediction first ([`slowest_node`]), which logs it.
    if group.rank() == 0 && matches!(scope, Scope::World) {
        log::info!("planner: {}", serde_json::json!({ "plan": &prediction }));
    }
    prediction
}

/// Hybrid over several nodes: each node priced its own share of the batches; the step waits
/// for the slowest node (the gradient allreduce joins them), so every entry takes, phase by
/// phase and for the step, the largest over the nodes, and every rank holds the same
/// prediction. Collective over `world`.
pub fn slowest_node(world: &Group, shape: &ModelShape, p: &mut Prediction) {
    // Each node's bytes hold its own exchanges and the world's gradient allreduce.
    let allreduce = if shape.sync_ranks > 1 {
        shape.sync_ranks as f64 * shape.params * 4.0
    } else {
        0.0
    };
    let node_ranks = p.ranks.max(1) as f64;
    for s in p.strategies.values_mut() {
        let ph = &mut s.phases;
        for v in [
            &mut ph.build,
            &mut ph.load,
            &mut ph.shuffle,
            &mut ph.train,
            &mut ph.sync,
            &mut ph.optimizer,
            &mut s.step_seconds,
        ] {
            *v = world.allreduce_max_f64(*v);
        }
        // The nodes' exchanges add up (every rank adds its node's share of them once), the
        // allreduce counts once.
        let mut exchanged = [(s.bytes_per_step - allreduce) / node_ranks];
        world.allreduce_sum_f64(&mut exchanged);
        s.bytes_per_step = exchanged[0] + allreduce;
        s.epoch_seconds = s.step_seconds * p.epoch_batches as f64;
    }
    if world.rank() == 0 {
        log::info!("planner: {}", serde_json::json!({ "plan": &*p }));
    }
}

/// The strategy a prediction's entry stands for: hybrid on one node is split over the node.
/// SliceGCN trains another model and is not priced.
pub fn entry_of(strategy: Strategy) -> Option<&'static str> {
    match strategy {
        Strategy::Gdp | Strategy::Auto => Some("gdp"),
        Strategy::Split | Strategy::Hybrid => Some("split"),
        Strategy::Dnp => Some("dnp"),
        Strategy::Snp => Some("snp"),
        Strategy::Nfp => Some("nfp"),
        Strategy::Slicegcn => None,
    }
}

/// The prediction as a table: one row per candidate, predicted seconds per phase and step,
/// per epoch, and bytes per step; the choice marked.
pub fn table(p: &Prediction, cal_path: &Path) -> String {
    let mut out = format!(
        "plan for {} rank(s), from {} dry-run mini-batch(es) of {} per epoch; calibration `{}`\n",
        p.ranks,
        p.batches,
        p.epoch_batches,
        cal_path.display()
    );
    if let Some(scope) = &p.scope {
        out += &format!("{scope}\n");
    }
    out += &format!(
        "{:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>12}\n",
        "strategy",
        "build",
        "load",
        "shuffle",
        "train",
        "sync",
        "optimizer",
        "step (s)",
        "epoch (s)",
        "MB/step"
    );
    for name in cost::CANDIDATES {
        let s = &p.strategies[*name];
        let ph = &s.phases;
        out += &format!(
            "{:<8} {:>10.5} {:>10.5} {:>10.5} {:>10.5} {:>10.5} {:>10.5} {:>11.5} {:>11.3} {:>12.3}{}\n",
            name,
            ph.build,
            ph.load,
            ph.shuffle,
            ph.train,
            ph.sync,
            ph.optimizer,
            s.step_seconds,
            s.epoch_seconds,
            s.bytes_per_step / 1e6,
            if *name == p.choice {
                "  <- choice".to_string()
            } else {
                s.note
                    .as_ref()
                    .map(|n| format!("  ({n})"))
                    .unwrap_or_default()
            }
        );
    }
    out
}

/// Whether the planner can model `cfg`'s run: mini-batches (full-batch is one graph-wide step,
/// whatever the strategy) and a model with graph convolutions.
pub fn applies(cfg: &TrainConfig) -> Result<(), String> {
    if cfg.full_batch {
        return Err("full-batch training is not planned (one graph-wide step)".into());
    }
    if cfg.model == ModelKind::Mlp {
        return Err("the MLP baseline has no graph exchange to plan".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::World;

    /// The synthetic default's data, as one rank loads it.
    fn data(cfg: &TrainConfig) -> TrainData {
        TrainData::load(None, cfg, &World::solo()).unwrap()
    }

    #[test]
    fn auto_may_pick_nfp_on_several_ranks_over_a_dataset_file_and_says_why_not_elsewhere() {
        let cfg = TrainConfig::default();
        let mut d = data(&cfg);
        let columns = d.feature_dim();
        for name in cost::CANDIDATES {
            assert_eq!(refusal(name, &cfg, &d, 2), None, "{name}");
        }
        assert_eq!(
            refusal("nfp", &cfg, &d, 1).as_deref(),
            Some("on one rank nfp is gdp")
        );
        assert_eq!(
            refusal("nfp", &cfg, &d, columns + 1),
            Some(format!(
                "{columns} feature columns for {} ranks",
                columns + 1
            ))
        );
        let gat = TrainConfig {
            model: ModelKind::Gat,
            ..cfg.clone()
        };
        for name in ["snp", "nfp"] {
            assert_eq!(refusal(name, &gat, &d, 2).as_deref(), Some("not for gat"));
        }
        let proj = TrainConfig {
            input_proj: true,
            ..cfg.clone()
        };
        assert_eq!(
            refusal("nfp", &proj, &d, 2).as_deref(),
            Some("not with input_proj")
        );
        d.from_parts = true;
        assert!(refusal("nfp", &cfg, &d, 2)
            .unwrap()
            .contains("not a partition directory"));
        assert_eq!(refusal("gdp", &cfg, &d, 2), None);
    }
}
