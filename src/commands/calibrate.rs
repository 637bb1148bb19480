//! `gnnpar calibrate`: measure this machine's communication operators and compute kernels for
//! the rank layout it runs with (under `mpirun`), and write the planner's calibration file.

use super::train::{with_backend, Job, TrainArgs};
use crate::backend::Backend;
use crate::comm::World;
use crate::train::plan::{calibrate, calibration};
use anyhow::Result;
use std::path::PathBuf;

struct CalibrateJob {
    path: Option<PathBuf>,
}

impl Job for CalibrateJob {
    type Out = (calibration::Calibration, PathBuf);
    fn run<B: Backend>(self, backend: B, world: &World) -> Result<Self::Out> {
        let key = calibrate::run_key(world, backend.describe(), rayon::current_num_threads());
        let path = self.path.unwrap_or_else(|| calibration::default_path(&key));
        let cal = calibrate::calibrate(&backend, world, key);
        if world.rank() == 0 {
            cal.save(&path)?;
            log::info!(
                "calibration: measured in {:.1} s, written to `{}`",
                cal.seconds_to_calibrate,
                path.display()
            );
        }
        Ok((cal, path))
    }
}

/// Run `gnnpar calibrate` (the device, thread and node options of `train` apply; the data and
/// model options are not used).
pub fn run(args: TrainArgs) -> Result<()> {
    args.refuse_overwriting_inputs()?;
    let cfg = args.resolve()?;
    let ((cal, path), world) = with_backend(
        &cfg,
        CalibrateJob {
            path: args.calibration.clone(),
        },
    )?;
    if world.rank() == 0 {
        println!("calibration `{}`", path.display());
        println!(
            "{:<18} {:>12} {:>14}  unit",
            "operator", "latency (s)", "s per unit"
        );
        for (op, f) in &cal.operators {
            println!(
                "{op:<18} {:>12.3e} {:>14.3e}  {}",
                f.latency_s, f.per_unit_s, f.unit
            );
        }
    }
    Ok(())
}
