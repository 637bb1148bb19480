//! The only module that calls MPI.
//!
//! gnnpar runs as one SPMD binary: under `mpirun`/`srun` every rank initialises MPI here; run
//! directly, it is a single rank and never touches MPI (so tools like `prepare` work on a
//! login node without a launcher). Any error on any rank ends the whole job through
//! `MPI_Abort` with a message naming the rank: a failure never leaves other ranks waiting.

use mpi::collective::CommunicatorCollectives;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::sync::atomic::{AtomicBool, Ordering};

static MPI_ACTIVE: AtomicBool = AtomicBool::new(false);

/// Rank of this process as the launcher announces it, before MPI is initialised (for log
/// prefixes). `None` when not launched as part of a multi-rank job.
pub fn rank_from_env() -> Option<usize> {
    let size = env_usize(&[
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "SLURM_NTASKS",
    ]);
    if size.unwrap_or(1) <= 1 {
        return None;
    }
    env_usize(&[
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "SLURM_PROCID",
    ])
}

/// Was this process started by an MPI launcher (mpirun, mpiexec, srun)?
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|k| std::env::var_os(k).is_some())
}

fn env_usize(keys: &[&str]) -> Option<usize> {
    keys.iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.parse().ok()))
}

/// The world of this job: MPI's world communicator, or a single rank without MPI.
pub struct World {
    // Dropping the universe finalises MPI; keep it alive as long as the world.
    _universe: Option<mpi::environment::Universe>,
    comm: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
}

impl World {
    /// Initialise MPI when launched by an MPI launcher, else a single-rank world.
    pub fn init() -> anyhow::Result<World> {
        if !launched_by_mpi() {
            return Ok(World::solo());
        }
        let universe = mpi::initialize()
            .ok_or_else(|| anyhow::anyhow!("MPI was already initialised in this process"))?;
        let comm = universe.world();
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        MPI_ACTIVE.store(true, Ordering::SeqCst);
        install_panic_abort();
        Ok(World {
            _universe: Some(universe),
            comm: Some(comm),
            rank,
            size,
        })
    }

    /// A world of one rank that never calls MPI.
    pub fn solo() -> World {
        World {
            _universe: None,
            comm: None,
            rank: 0,
            size: 1,
        }
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Wait for every rank.
    pub fn barrier(&self) {
        if let Some(c) = &self.comm {
            c.barrier();
        }
    }

    /// Gather one string per rank on rank 0 (others get an empty vector).
    pub fn gather_strings(&self, s: &str) -> Vec<String> {
        use mpi::collective::Root;
        use mpi::datatype::PartitionMut;
        let Some(c) = &self.comm else {
            return vec![s.to_string()];
        };
        let root = c.process_at_rank(0);
        let bytes = s.as_bytes();
        let len = bytes.len() as i32;
        if self.rank != 0 {
            root.gather_into(&len);
            root.gather_varcount_into(bytes);
            return Vec::new();
        }
        let mut lens = vec![0i32; self.size];
        root.gather_into_root(&len, &mut lens[..]);
        let displs: Vec<i32> = lens
            .iter()
            .scan(0, |acc, &l| {
                let d = *acc;
                *acc += l;
                Some(d)
            })
            .collect();
        let mut buf = vec![0u8; lens.iter().sum::<i32>() as usize];
        {
            let mut part = PartitionMut::new(&mut buf[..], &lens[..], &displs[..]);
            root.gather_varcount_into_root(bytes, &mut part);
        }
        lens.iter()
            .zip(&displs)
            .map(|(&l, &d)| {
                String::from_utf8_lossy(&buf[d as usize..(d + l) as usize]).into_owned()
            })
            .collect()
    }
}

/// Report `err` and end the process; under MPI, abort the whole job so no rank hangs.
pub fn fail_job(err: &anyhow::Error) -> ! {
    if MPI_ACTIVE.load(Ordering::SeqCst) {
        let comm = SimpleCommunicator::world();
        eprintln!(
            "gnnpar: error on rank {} of {}: {err:#}",
            comm.rank(),
            comm.size()
        );
        comm.abort(1);
    }
    eprintln!("gnnpar: error: {err:#}");
    std::process::exit(1);
}

/// Under MPI a panic on one rank must end the job, not leave the others blocked in a
/// collective: print the panic with the rank, then `MPI_Abort`.
fn install_panic_abort() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        if MPI_ACTIVE.load(Ordering::SeqCst) {
            let comm = SimpleCommunicator::world();
            eprintln!(
                "gnnpar: rank {} of {} panicked; aborting the job",
                comm.rank(),
                comm.size()
            );
            comm.abort(2);
        }
    }));
}
