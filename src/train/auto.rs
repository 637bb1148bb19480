//! `--strategy auto`: pick a strategy before training.
//!
//! On several nodes `auto` is `hybrid` (only gradients cross nodes), and full-batch training is
//! one graph-wide step whatever the strategy (gdp): both are decided here, before any data
//! loads. On one node the calibrated planner ([`super::plan`]) compares the candidates with a
//! dry run priced by this machine's measured operators and picks the cheapest. Every strategy
//! trains the same model (invariant 4), so the choice changes the speed only, never the
//! parameters.

use crate::comm::World;
use crate::config::TrainConfig;
use crate::kinds::Strategy;

/// Resolve `auto` where no data is needed: full-batch training runs the same full-graph step
/// whatever the strategy (gdp); on several nodes, hybrid. Otherwise leaves `auto` for
/// [`choose`]. Every rank decides alike (the node count is the same everywhere).
pub fn resolve_without_data(cfg: &mut TrainConfig, world: &World) {
    if cfg.strategy != Strategy::Auto {
        return;
    }
    let nodes = world.node_index().1;
    let (choice, why) = if cfg.full_batch {
        (
            Strategy::Gdp,
            "full-batch training runs one full-graph step whatever the strategy".into(),
        )
    } else if nodes > 1 {
        (
            Strategy::Hybrid,
            format!("{nodes} nodes: only gradients cross nodes"),
        )
    } else {
        return;
    };
    if world.rank() == 0 {
        log::info!("strategy auto: {choice} ({why})");
    }
    cfg.strategy = choice;
}
