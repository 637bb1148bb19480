//! Which program started this process (Open MPI's `mpirun`, Slurm's `srun`, a PMI launcher such
//! as MPICH's `mpiexec`, or none), read from the environment the launcher sets, and the checks
//! and hints that depend on it.
//!
//! Two reasons to know it. Error messages that suggest a command must suggest the one in use
//! (`srun --ntasks=3` under Slurm, not `mpirun -np 3`). And `srun` without an MPI plugin
//! (Slurm's default `MpiDefault=none`, or a site default that does not match the MPI library)
//! starts N independent processes that each see a world of one: every task would train the
//! whole graph alone and write the same outputs, and Slurm would report success. gnnpar
//! refuses that case ([`check_slurm_world`]).

use std::sync::OnceLock;

/// The program that started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Open MPI's `mpirun` / `mpiexec` (it sets `OMPI_COMM_WORLD_SIZE` before `exec`).
    Mpirun,
    /// A Slurm job step (`srun`), with or without an MPI plugin.
    Srun,
    /// Another PMI process manager (MPICH / Intel MPI `mpiexec`, hydra).
    Mpiexec,
    /// Started directly: a single process.
    Direct,
}

impl Launcher {
    /// Read from the environment, as the launcher left it before MPI was initialised.
    fn from_env(var: impl Fn(&str) -> Option<String>) -> Launcher {
        let set = |k: &str| var(k).is_some_and(|v| !v.is_empty());
        // Open MPI's mpirun first: inside a Slurm allocation its daemons are themselves a
        // Slurm step, so its ranks inherit SLURM_STEP_* as well.
        if set("OMPI_COMM_WORLD_SIZE") {
            Launcher::Mpirun
        } else if set("SLURM_STEP_ID") || set("SLURM_STEP_NUM_TASKS") {
            Launcher::Srun
        } else if set("PMI_SIZE") || set("PMI_RANK") || set("PMIX_RANK") || set("HYDRA_CONTROL_FD")
        {
            Launcher::Mpiexec
        } else {
            Launcher::Direct
        }
    }

    /// The launcher's program, for messages that name it ("not under srun").
    pub fn program(self) -> &'static str {
        match self {
            Launcher::Srun => "srun",
            Launcher::Mpiexec => "mpiexec",
            Launcher::Mpirun | Launcher::Direct => "mpirun",
        }
    }

    /// The command that runs `ranks` ranks with this launcher, for hints in messages.
    pub fn command_for(self, ranks: usize) -> String {
        match self {
            Launcher::Srun => {
                format!("srun --mpi=pmix --ntasks={ranks} (or sbatch --ntasks={ranks})")
            }
            Launcher::Mpiexec => format!("mpiexec -n {ranks}"),
            Launcher::Mpirun | Launcher::Direct => format!("mpirun -np {ranks}"),
        }
    }
}

static LAUNCHER: OnceLock<Launcher> = OnceLock::new();

/// The launcher of this process, read once (call it before MPI is initialised: MPI libraries
/// may add variables of their own to the environment).
pub fn launcher() -> Launcher {
    *LAUNCHER.get_or_init(|| Launcher::from_env(|k| std::env::var(k).ok()))
}

/// How to run `ranks` ranks with the launcher in use, e.g. "`srun --mpi=pmix --ntasks=3`".
pub fn run_hint(ranks: usize) -> String {
    format!("`{}`", launcher().command_for(ranks))
}

/// This process's rank and the job's size as the launcher set them, before (or without) MPI:
/// `None` when started directly. For messages of errors that happen before MPI starts (a bad
/// option fails on every rank alike) and to refuse one-process commands started as many.
pub fn env_rank_and_size() -> Option<(usize, usize)> {
    rank_and_size_with(launcher(), |k| std::env::var(k).ok())
}

fn rank_and_size_with(
    launcher: Launcher,
    var: impl Fn(&str) -> Option<String>,
) -> Option<(usize, usize)> {
    let num = |k: &str| var(k).and_then(|v| v.trim().parse::<usize>().ok());
    let pair = |rank: &str, size: &str| Some((num(rank)?, num(size)?));
    match launcher {
        Launcher::Mpirun => pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        Launcher::Srun => pair("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
        Launcher::Mpiexec => pair("PMI_RANK", "PMI_SIZE"),
        Launcher::Direct => None,
    }
}

/// Refuse to run `command`, a one-process command (it writes one output), as one of several
/// processes a launcher started: every rank would write the same file at once.
pub fn refuse_many_processes(command: &str) -> anyhow::Result<()> {
    match env_rank_and_size() {
        Some((_, size)) if size > 1 => anyhow::bail!(
            "`gnnpar {command}` runs as one process, but {} started {size} of it: each would \
             write the same output. Run it directly, once (only train, calibrate, plan and \
             info join an MPI job)",
            launcher().program()
        ),
        _ => Ok(()),
    }
}

/// Tasks Slurm started in this job step, when more than one.
fn slurm_step_tasks(var: impl Fn(&str) -> Option<String>) -> Option<usize> {
    var("SLURM_STEP_NUM_TASKS")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 1)
}

/// Refuse a Slurm step of N > 1 tasks whose MPI world has `world_size` = 1 rank: srun started
/// the tasks without an MPI plugin, so they cannot talk to each other.
pub fn check_slurm_world(world_size: usize) -> anyhow::Result<()> {
    check_slurm_world_with(launcher(), world_size, |k| std::env::var(k).ok())
}

fn check_slurm_world_with(
    launcher: Launcher,
    world_size: usize,
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    if launcher != Launcher::Srun || world_size > 1 {
        return Ok(());
    }
    let Some(tasks) = slurm_step_tasks(&var) else {
        return Ok(());
    };
    let plugin = var("SLURM_MPI_TYPE").unwrap_or_else(|| "none".into());
    anyhow::bail!(
        "Slurm started this job step as {tasks} tasks, but MPI sees a world of 1 rank: srun \
         connected the tasks with no MPI plugin (--mpi={plugin}; Slurm's default MpiDefault \
         is none). Each task would train the whole graph alone and overwrite the same \
         outputs. Launch with `srun --mpi=pmix` (or the plugin your site's MPI uses, e.g. \
         --mpi=pmi2; `srun --mpi=list` shows them); slurm/train.sh does this \
         (GNNPAR_SRUN_MPI overrides the plugin)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn launchers_are_told_apart() {
        assert_eq!(Launcher::from_env(env(&[])), Launcher::Direct);
        let srun = env(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("PMIX_RANK", "1"),
        ]);
        assert_eq!(Launcher::from_env(srun), Launcher::Srun);
        // mpirun inside an allocation: its ranks inherit the daemons' step variables.
        let mpirun = env(&[("OMPI_COMM_WORLD_SIZE", "4"), ("SLURM_STEP_ID", "0")]);
        assert_eq!(Launcher::from_env(mpirun), Launcher::Mpirun);
        assert_eq!(
            Launcher::from_env(env(&[("PMI_SIZE", "2"), ("PMI_RANK", "0")])),
            Launcher::Mpiexec
        );
    }

    #[test]
    fn rank_and_size_come_from_the_launcher_in_use() {
        let mpirun = env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        assert_eq!(rank_and_size_with(Launcher::Mpirun, mpirun), Some((1, 4)));
        let srun = env(&[("SLURM_PROCID", "2"), ("SLURM_STEP_NUM_TASKS", "3")]);
        assert_eq!(rank_and_size_with(Launcher::Srun, srun), Some((2, 3)));
        let hydra = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]);
        assert_eq!(rank_and_size_with(Launcher::Mpiexec, hydra), Some((0, 2)));
        assert_eq!(rank_and_size_with(Launcher::Direct, env(&[])), None);
        assert_eq!(rank_and_size_with(Launcher::Mpirun, env(&[])), None);
    }

    #[test]
    fn hints_name_the_launcher_in_use() {
        assert!(Launcher::Srun
            .command_for(3)
            .contains("srun --mpi=pmix --ntasks=3"));
        assert_eq!(Launcher::Mpirun.command_for(3), "mpirun -np 3");
        assert_eq!(Launcher::Direct.command_for(2), "mpirun -np 2");
        assert_eq!(Launcher::Mpiexec.command_for(2), "mpiexec -n 2");
        assert_eq!(Launcher::Srun.program(), "srun");
        assert_eq!(Launcher::Mpirun.program(), "mpirun");
        assert_eq!(Launcher::Mpiexec.program(), "mpiexec");
    }

    #[test]
    fn a_slurm_step_of_many_tasks_in_a_world_of_one_is_refused() {
        let two = env(&[("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_MPI_TYPE", "none")]);
        let err = check_slurm_world_with(Launcher::Srun, 1, &two)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 tasks") && err.contains("--mpi=pmix"),
            "{err}"
        );
        assert!(err.contains("--mpi=none"), "{err}");
        // Connected by a plugin: a world of 2 is fine.
        check_slurm_world_with(Launcher::Srun, 2, &two).unwrap();
        // One task, or not Slurm at all: nothing to check.
        check_slurm_world_with(Launcher::Srun, 1, env(&[("SLURM_STEP_NUM_TASKS", "1")])).unwrap();
        check_slurm_world_with(Launcher::Mpirun, 1, &two).unwrap();
        check_slurm_world_with(Launcher::Direct, 1, &two).unwrap();
    }
}
