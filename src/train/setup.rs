//! A run's set-up before its first step: the configuration checked, the data loaded (rows
//! shared on the host where that pays), the model initialised, and the run planned — with
//! `auto`, the strategy chosen. `gnnpar plan` stops here.

use super::data::TrainData;
use super::files::RunFiles;
use super::{auto, cache, hybrid, model_config, plan};
use crate::backend::Backend;
use crate::comm::{Group, World};
use crate::config::TrainConfig;
use crate::kinds::{ModelKind, Strategy};
use crate::nn::Model;
use anyhow::Result;
use std::time::Instant;

/// What a run has once its data is loaded and its strategy decided: the stage `gnnpar plan`
/// stops at.
pub(super) struct Planning {
    pub(super) cfg: TrainConfig,
    pub(super) data: TrainData,
    /// The model as initialised on the host (every strategy starts from it).
    pub(super) host_model: Model,
    pub(super) planned: Option<plan::Planned>,
    pub(super) unplanned: Option<String>,
    pub(super) cache_budget: usize,
}

impl Planning {
    /// Validate `cfg`, load the data, and plan the run (with `auto`, the strategy is chosen
    /// here). Collective.
    pub(super) fn on<B: Backend>(
        backend: &B,
        mut cfg: TrainConfig,
        files: &RunFiles,
        world: &World,
    ) -> Result<Planning> {
        cfg.validate()?;
        // `auto` asks for a calibration even where it is decided without one (hybrid on
        // several nodes), so that the run still reports its predicted time.
        let asked_auto = cfg.strategy == Strategy::Auto;
        auto::resolve_without_data(&mut cfg, world);
        // Before the data loads, so a refused `on` fails fast. Every rank decides alike (same
        // setting, backend and library), and an error on one ends the job.
        let (device_pointers, why) = crate::comm::cuda_aware::decide(
            cfg.cuda_aware_mpi,
            B::IS_HOST,
            world.size(),
            crate::comm::cuda_aware::detect,
        )?;
        world.set_device_pointers(device_pointers);
        if world.rank() == 0 {
            log::info!("MPI and device memory: {why}");
        }
        files.check_checkpoint(&cfg)?;
        files.check_reports(world)?;
        let group = hybrid::data_group(world, cfg.strategy);
        let mut data = load_data(files, &cfg, group)?;
        share_rows_on_host(&cfg, &mut data, world, group);
        let host_model = Model::new(
            model_config(&cfg, data.feature_dim(), data.num_classes),
            cfg.seed,
        )?;
        let cache_budget = cache::budget_bytes(cfg.cache_mb, group, world.node().size());
        let (planned, unplanned) = plan_run(
            asked_auto,
            backend,
            &mut cfg,
            files,
            &data,
            &host_model,
            world,
            group,
            cache_budget,
        )?;
        if cfg.strategy == Strategy::Nfp && data.sliced.is_none() && !files.plan_only {
            // `auto` chose NFP from a dry run over rows; NFP's ranks hold column slices of
            // every vertex instead, so the data is read again in that layout (the rows are
            // let go first: a rank never holds both).
            let t = Instant::now();
            drop(data);
            data = load_data(files, &cfg, group)?;
            if world.rank() == 0 {
                log::info!(
                    "strategy auto: nfp's ranks hold column slices: data loaded again as \
                     slices in {:.2} s",
                    t.elapsed().as_secs_f64()
                );
            }
        }
        Ok(Planning {
            cfg,
            data,
            host_model,
            planned,
            unplanned,
            cache_budget,
        })
    }
}

/// Where `cfg`'s strategy reads other ranks' input rows through the feature store (GDP,
/// split, DNP, hybrid, and `auto`, which may pick them), move each rank's rows into memory
/// its host's other ranks read directly (`--shared-features`), and log what is shared (rank
/// 0). SNP and NFP read only their own rows, and full-batch training exchanges a halo: those
/// keep their rows private. Collective over `group`.
fn share_rows_on_host(cfg: &TrainConfig, data: &mut TrainData, world: &World, group: &Group) {
    let reads_through_store = matches!(
        cfg.strategy,
        Strategy::Gdp | Strategy::Split | Strategy::Dnp | Strategy::Hybrid | Strategy::Auto
    );
    if !cfg.shared_features || cfg.full_batch || !reads_through_store || group.size() == 1 {
        return;
    }
    // Mostly-zero rows (bag-of-words) travel as their few non-zeros from the owner's CSR
    // copy (~100 bytes a Facebook row), while a peer would scan the whole dense row for them
    // (18.9 KB): on Facebook at 2 ranks of the 2-core VM, shared rows made the gather 0.50 s
    // for 6 steps against 0.016 fetched. Those stay fetched.
    if group.allreduce_max_f64(f64::from(u8::from(data.store.has_sparse_copy()))) > 0.0 {
        if group.rank() == 0 {
            log::info!(
                "feature store: rows are mostly zeros and travel as their non-zeros; not \
                 shared on the host"
            );
        }
        return;
    }
    let t = Instant::now();
    let peers = data.store.share_on_host(group, world.node_index().0);
    let most = group.allreduce_max_f64(peers as f64) as usize;
    if group.rank() == 0 {
        if most == 0 {
            log::info!(
                "feature store: no rank shares its host (and node) with another: rows of \
                 other ranks are fetched"
            );
        } else {
            log::info!(
                "feature store: ranks read the rows of up to {most} other rank(s) of their \
                 host in shared memory ({:.2} s to share); rows of other hosts are fetched",
                t.elapsed().as_secs_f64()
            );
        }
    }
}

/// Load this rank's data for `cfg`'s strategy, with GCN's degree table. Collective over `group`.
fn load_data(files: &RunFiles, cfg: &TrainConfig, group: &crate::comm::Group) -> Result<TrainData> {
    let mut data = TrainData::load(files.data.as_deref(), cfg, group)?;
    if cfg.model == ModelKind::Gcn {
        data.build_gcn_degrees(group, cfg.uses_self_loops())?;
    }
    Ok(data)
}

/// Plan the run when the planner applies: with `auto` (or `gnnpar plan`) a calibration is
/// read or measured and the cheapest candidate replaces `auto`; with a fixed strategy the run
/// is predicted only when a calibration of this layout is already cached (a fixed strategy's
/// start-up does not grow by a calibration). Returns the prediction and its calibration file,
/// or why there is none; the candidates are priced with a feature cache of `cache_budget`
/// bytes per rank. Collective: every rank takes the same branch (the calibration's presence
/// is rank 0's, broadcast).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn plan_run<B: Backend>(
    asked_auto: bool,
    backend: &B,
    cfg: &mut TrainConfig,
    files: &RunFiles,
    data: &TrainData,
    model: &Model,
    world: &World,
    group: &crate::comm::Group,
    cache_budget: usize,
) -> Result<(Option<plan::Planned>, Option<String>)> {
    let (node, nodes) = world.node_index();
    let why_not = plan::applies(cfg);
    if let Err(why) = why_not {
        if cfg.strategy == Strategy::Auto {
            // Only the MLP baseline reaches here: it has no exchange, every strategy is GDP.
            cfg.strategy = Strategy::Gdp;
        }
        if world.rank() == 0 {
            log::info!("planner: not planned: {why}");
        }
        return Ok((None, Some(why)));
    }
    let wanted = asked_auto || files.plan_only;
    let missing = if wanted {
        plan::Missing::Measure
    } else {
        plan::Missing::Skip
    };
    let Some(cal) = plan::obtain(backend, world, files.calibration.as_deref(), missing)? else {
        let why = "no calibration of this host and layout is cached (`gnnpar calibrate` or \
                   `--strategy auto` makes one)"
            .to_string();
        if world.rank() == 0 {
            log::info!("planner: {why}; the summary will hold no prediction");
        }
        return Ok((None, Some(why)));
    };
    let shape = plan::shape_of(cfg, model, backend, data, group, world.size());
    // On several nodes `auto` is already hybrid (`auto::resolve_without_data`); a fixed
    // strategy over the world is priced as on one node, with the world's alltoallv.
    let scope = if cfg.strategy == Strategy::Hybrid && nodes > 1 {
        plan::Scope::Hybrid { node, nodes }
    } else {
        plan::Scope::World
    };
    let mut p = plan::predict(
        cfg,
        data,
        &shape,
        group,
        scope,
        &cal.calibration,
        cache_budget,
    );
    if let plan::Scope::Hybrid { .. } = scope {
        plan::slowest_node(world, &shape, &mut p);
    }
    if cfg.strategy == Strategy::Auto {
        cfg.strategy = p.choice.parse()?;
        // Every rank says what it chose: the tests check that all agree.
        log::info!("strategy auto: chose {} (calibrated planner)", p.choice);
    }
    Ok((
        Some(plan::Planned {
            prediction: p,
            calibration: cal.path,
            products_now: cal.products_now,
            gathers_now: cal.gathers_now,
        }),
        None,
    ))
}
