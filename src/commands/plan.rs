//! `gnnpar plan`: run the calibrated planner for a training configuration (under `mpirun` with
//! the rank count to plan for) and print its table and choice, without training.

use super::train::{with_backend, Job, TrainArgs};
use crate::backend::Backend;
use crate::comm::World;
use crate::config::Strategy;
use crate::train::{RunFiles, Trainer};
use anyhow::Result;

struct PlanJob {
    cfg: crate::config::TrainConfig,
    files: RunFiles,
}

impl Job for PlanJob {
    type Out = Option<crate::train::plan::Planned>;
    fn data(&self) -> Option<&std::path::Path> {
        self.files.data.as_deref()
    }
    fn run<B: Backend>(self, backend: B, world: &World) -> Result<Self::Out> {
        Trainer::plan_only(backend, self.cfg, self.files, world)
    }
}

/// Run `gnnpar plan`: the same data and configuration options as `train` (the strategy is
/// the planner's to choose). Prints the table, then the prediction as one JSON line.
pub fn run(args: TrainArgs) -> Result<()> {
    args.refuse_overwriting_inputs()?;
    let mut cfg = args.resolve()?;
    cfg.strategy = Strategy::Auto;
    let mut files = args.files();
    files.plan_only = true;
    let (planned, world) = with_backend(&cfg.clone(), PlanJob { cfg, files })?;
    if world.rank() == 0 {
        match planned {
            Some(planned) => {
                let (p, path) = (&planned.prediction, &planned.calibration);
                print!("{}", crate::train::plan::table(p, path));
                match &p.scope {
                    // Its split row is hybrid: split inside each node.
                    Some(_) => println!("choice: hybrid"),
                    None => println!("choice: {}", p.choice),
                }
                // The calibration's check against the host is in the log, not here: this
                // line is the same for the same seed, data and calibration, bit for bit.
                println!("{}", serde_json::json!({ "plan": p, "calibration": path }));
            }
            None => println!("not planned (see the log for why)"),
        }
    }
    Ok(())
}
