//! The only module that calls MPI.
//!
//! gnnpar runs as one SPMD binary: under `mpirun`/`srun` every rank initialises MPI here; run
//! directly, it is a single rank and never touches MPI (so tools like `prepare` work on a
//! login node without a launcher). Any error on any rank ends the whole job through
//! `MPI_Abort` with a message naming the rank: a failure never leaves other ranks waiting.
//!
//! A [`World`] holds three [`Group`]s: every rank, the ranks of this node (`split_shared`, or
//! pretend nodes of a fixed size for tests), and the node leaders (rank 0 of each node).
//! Every call counts bytes and seconds per kind of operation ([`CommStats`]).

pub mod cuda_aware;
mod group;
pub mod launcher;
mod shared;
mod stats;

pub use group::Group;
pub use shared::HostShared;
pub use stats::{CommStats, OpStats};

use mpi::collective::Root;
use mpi::environment::Threading;
use mpi::topology::{Communicator, SimpleCommunicator};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static MPI_ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether the MPI library granted `MPI_THREAD_MULTIPLE` (any thread may call MPI).
static THREAD_MULTIPLE: AtomicBool = AtomicBool::new(false);

/// The MPI universe lives here rather than in a [`World`]: dropping it finalises MPI, and an
/// error must still be able to `MPI_Abort` the job after the command that hit it has dropped
/// its world. `main` finalises through [`finalize`] once the command succeeded.
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

/// Whether MPI is initialised and not yet finalised.
fn mpi_active() -> bool {
    MPI_ACTIVE.load(Ordering::SeqCst)
}

/// Finalise MPI (after a successful command). Does nothing when MPI was never initialised.
pub fn finalize() {
    let universe = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if universe.is_some() {
        MPI_ACTIVE.store(false, Ordering::SeqCst);
    }
    drop(universe);
}

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

/// Was this process started by an MPI launcher (mpirun, mpiexec, srun with PMI)?
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|k| std::env::var_os(k).is_some())
}

fn env_usize(keys: &[&str]) -> Option<usize> {
    keys.iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.parse().ok()))
}

/// The world of this job: all ranks, this node's ranks and the node leaders. Create one per
/// process (MPI can be initialised only once).
pub struct World {
    // Dropping the universe finalises MPI; it must outlive every communicator.
    world: Group,
    node: Group,
    leaders: Option<Group>,
    node_index: usize,
    num_nodes: usize,
    /// Ranks sharing this rank's physical host (MPI's shared-memory domain), whatever the
    /// node grouping: the cores (and GPUs) are shared among them.
    host_ranks: usize,
    /// This rank's index among them (its node-local rank).
    host_rank: usize,
    /// The world rank of its host's first rank: the same on every rank of a host, so it names
    /// the host.
    host_leader: usize,
    /// `Some(k)` when nodes are pretend groups of `k` consecutive ranks.
    pretend_ranks_per_node: Option<usize>,
    stats: Rc<CommStats>,
    /// Shared by every group: whether collectives may take device pointers.
    device_pointers: Rc<Cell<bool>>,
    /// The thread support MPI granted (`None` without MPI).
    threading: Option<Threading>,
}

impl std::ops::Deref for World {
    type Target = Group;
    fn deref(&self) -> &Group {
        &self.world
    }
}

impl World {
    /// Initialise MPI when launched by an MPI launcher, else a single-rank world. Nodes are
    /// the shared-memory domains MPI reports.
    pub fn init() -> anyhow::Result<World> {
        World::init_with_nodes(None, false)
    }

    /// Like [`World::init`], but with `ranks_per_node = Some(k)` ranks are grouped into
    /// pretend nodes of `k` consecutive ranks (tests of hybrid strategies on one machine).
    /// `k` must be at least 1 and divide the number of ranks (every node the same size).
    /// `threads_call_mpi`: other threads will call MPI ([`World::thread_comms`]), so ask for
    /// `MPI_THREAD_MULTIPLE`, which some libraries pay for on every call; else only the
    /// calling thread does.
    pub fn init_with_nodes(
        ranks_per_node: Option<usize>,
        threads_call_mpi: bool,
    ) -> anyhow::Result<World> {
        // Read before MPI_Init, which may add variables of its own.
        launcher::launcher();
        if !launched_by_mpi() {
            launcher::check_slurm_world(1)?;
            check_ranks_per_node(ranks_per_node, 1)?;
            let mut w = World::solo();
            w.pretend_ranks_per_node = ranks_per_node;
            return Ok(w);
        }
        // MPI_THREAD_MULTIPLE lets the trainer's prefetch workers sample and fetch rows on
        // communicators of their own while the main thread makes the step's collectives
        // (`World::thread_comms`); a library that offers less only loses that overlap.
        let wanted = if threads_call_mpi {
            Threading::Multiple
        } else {
            Threading::Funneled
        };
        let (universe, threading) = mpi::initialize_with_threading(wanted)
            .ok_or_else(|| anyhow::anyhow!("MPI was already initialised in this process"))?;
        MPI_ACTIVE.store(true, Ordering::SeqCst);
        THREAD_MULTIPLE.store(threading == Threading::Multiple, Ordering::SeqCst);
        install_panic_abort();
        let world_comm = universe.world();
        *UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(universe);
        let stats = Rc::new(CommStats::default());
        let device_pointers = Rc::new(Cell::new(false));
        let rank = world_comm.rank();
        // Every rank sees the same size, so every rank fails here alike (no rank is left
        // waiting in the splits below).
        launcher::check_slurm_world(world_comm.size() as usize)?;
        check_ranks_per_node(ranks_per_node, world_comm.size() as usize)?;
        let host_comm = world_comm.split_shared(rank);
        let host_ranks = host_comm.size() as usize;
        let host_rank = host_comm.rank() as usize;
        let mut host_leader = rank;
        host_comm
            .process_at_rank(0)
            .broadcast_into(&mut host_leader);
        let node_comm = match ranks_per_node {
            Some(k) => world_comm
                .split_by_color(mpi::topology::Color::with_value(rank / k as i32))
                .ok_or_else(|| anyhow::anyhow!("MPI_Comm_split for pretend nodes failed"))?,
            None => host_comm,
        };
        let is_leader = node_comm.rank() == 0;
        let leader_comm = world_comm.split_by_color(if is_leader {
            mpi::topology::Color::with_value(0)
        } else {
            mpi::topology::Color::undefined()
        });
        let world = Group::new(world_comm, stats.clone(), device_pointers.clone());
        let node = Group::new(node_comm, stats.clone(), device_pointers.clone());
        // Every rank learns its node's index and the node count from the leaders' numbering.
        let leaders = leader_comm.map(|c| Group::new(c, stats.clone(), device_pointers.clone()));
        let mut ids = [
            leaders.as_ref().map_or(0.0, |l| l.rank() as f64),
            leaders.as_ref().map_or(0.0, |l| l.size() as f64),
        ];
        node.broadcast_f64_from_root(&mut ids);
        Ok(World {
            world,
            node,
            leaders,
            node_index: ids[0] as usize,
            num_nodes: ids[1] as usize,
            host_ranks,
            host_rank,
            host_leader: host_leader as usize,
            pretend_ranks_per_node: ranks_per_node,
            stats,
            device_pointers,
            threading: Some(threading),
        })
    }

    /// A world of one rank that never calls MPI.
    pub fn solo() -> World {
        let stats = Rc::new(CommStats::default());
        let device_pointers = Rc::new(Cell::new(false));
        World {
            world: Group::solo(stats.clone(), device_pointers.clone()),
            node: Group::solo(stats.clone(), device_pointers.clone()),
            leaders: Some(Group::solo(stats.clone(), device_pointers.clone())),
            node_index: 0,
            num_nodes: 1,
            host_ranks: 1,
            host_rank: 0,
            host_leader: 0,
            pretend_ranks_per_node: None,
            stats,
            device_pointers,
            threading: None,
        }
    }

    /// The ranks of this node.
    pub fn node(&self) -> &Group {
        &self.node
    }

    /// The node leaders (rank 0 of each node); `None` on other ranks.
    pub fn leaders(&self) -> Option<&Group> {
        self.leaders.as_ref()
    }

    /// Index of this rank's node, and the number of nodes.
    pub fn node_index(&self) -> (usize, usize) {
        (self.node_index, self.num_nodes)
    }

    /// Ranks on this rank's physical host (the shared-memory domain), which share its cores.
    /// Equal to the node's size unless nodes are pretend groups.
    pub fn ranks_on_host(&self) -> usize {
        self.host_ranks
    }

    /// This rank's index among the ranks of its physical host (its node-local rank, from MPI's
    /// shared-memory communicator): it picks the rank's GPU.
    pub fn host_rank(&self) -> usize {
        self.host_rank
    }

    /// The world rank of the first rank of this rank's physical host: it names the host (the
    /// ranks sharing its cores), whatever the node grouping.
    pub fn host_leader(&self) -> usize {
        self.host_leader
    }

    /// `Some(k)` when nodes are pretend groups of `k` consecutive ranks (`--ranks-per-node`).
    pub fn pretend_ranks_per_node(&self) -> Option<usize> {
        self.pretend_ranks_per_node
    }

    /// Let every group's collectives take device pointers (a CUDA-aware MPI, decided by
    /// [`cuda_aware::decide`]), or not.
    pub fn set_device_pointers(&self, on: bool) {
        self.device_pointers.set(on);
    }

    /// Bytes and seconds of every communication call so far, by kind of operation.
    pub fn stats(&self) -> &CommStats {
        &self.stats
    }

    /// The thread support MPI granted, for the log: `multiple` (any thread may call MPI),
    /// `funneled`, … or `none` without MPI.
    pub fn mpi_threading(&self) -> &'static str {
        match self.threading {
            None => "none",
            Some(Threading::Single) => "single",
            Some(Threading::Funneled) => "funneled",
            Some(Threading::Serialized) => "serialized",
            Some(Threading::Multiple) => "multiple",
        }
    }

    /// `wanted` communicators over the ranks of `of` (the world, or this rank's node) for
    /// other threads (prefetch workers), or none: the fewest any rank wanted, and none at all
    /// unless every rank's MPI granted `MPI_THREAD_MULTIPLE`. Collective over the world; every
    /// rank gets the same count. Each is a duplicate of `of`'s communicator, so its
    /// collectives never match the main thread's.
    pub fn thread_comms(&self, of: &Group, wanted: usize) -> Vec<ThreadComm> {
        let (Some(_), Some(comm)) = (self.world.mpi_comm(), of.mpi_comm()) else {
            return Vec::new();
        };
        let granted = if THREAD_MULTIPLE.load(Ordering::SeqCst) {
            wanted
        } else {
            0
        };
        // The fewest: minus the largest of the negated counts.
        let agreed = -self.world.allreduce_max_f64(-(granted as f64));
        (0..agreed as usize)
            .map(|_| ThreadComm(comm.duplicate()))
            .collect()
    }
}

/// A communicator over a group's ranks that one other thread may own and call MPI on
/// ([`World::thread_comms`]); it counts its bytes apart from the world's
/// ([`ThreadComm::into_group`]) and is freed where it is dropped.
pub struct ThreadComm(SimpleCommunicator);

// SAFETY: a ThreadComm is made only where MPI granted MPI_THREAD_MULTIPLE, under which any
// thread may call MPI on any communicator; it is used by one thread at a time (it moves, it is
// not shared), and its collectives run on it alone, in the same order on every rank.
unsafe impl Send for ThreadComm {}

impl ThreadComm {
    /// A [`Group`] over this communicator for the thread that owns it, with its own byte and
    /// second counts (read them with `group.stats().snapshot()` and add them to the world's
    /// with [`CommStats::add`]) and host buffers only.
    pub fn into_group(self) -> Group {
        Group::new(
            self.0,
            Rc::new(CommStats::default()),
            Rc::new(Cell::new(false)),
        )
    }
}

/// Pretend nodes must all have the same number of ranks: `k` ≥ 1 dividing `ranks`.
fn check_ranks_per_node(ranks_per_node: Option<usize>, ranks: usize) -> anyhow::Result<()> {
    match ranks_per_node {
        Some(k) if k == 0 || !ranks.is_multiple_of(k) => anyhow::bail!(
            "--ranks-per-node (config `ranks_per_node`) = {k} must be at least 1 and divide \
             the {ranks} rank(s) of the job, so that every node has the same number of ranks"
        ),
        _ => Ok(()),
    }
}

/// Report `err` and end the process; under MPI, abort the whole job so no rank hangs.
pub fn fail_job(err: &anyhow::Error) -> ! {
    if MPI_ACTIVE.load(Ordering::SeqCst) {
        let comm = SimpleCommunicator::world();
        say(&format!(
            "gnnpar: error on rank {} of {}: {err:#}\n",
            comm.rank(),
            comm.size()
        ));
        comm.abort(1);
    }
    // Before MPI started (a bad option or file, the same on every rank) the launcher's
    // variables still say which rank this is.
    match launcher::env_rank_and_size() {
        Some((rank, size)) if size > 1 => say(&format!(
            "gnnpar: error on rank {rank} of {size} (before MPI started): {err:#}\n"
        )),
        _ => say(&format!("gnnpar: error: {err:#}\n")),
    }
    std::process::exit(1);
}

/// Write `text` to stderr in one call, so lines of other ranks sharing the launcher's stderr
/// cannot land in the middle of it.
fn say(text: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// Under MPI a panic on one rank must end the job, not leave the others blocked in a
/// collective: print the panic with the rank, then `MPI_Abort`.
fn install_panic_abort() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        if MPI_ACTIVE.load(Ordering::SeqCst) {
            let comm = SimpleCommunicator::world();
            say(&format!(
                "gnnpar: rank {} of {} panicked; aborting the job\n",
                comm.rank(),
                comm.size()
            ));
            comm.abort(2);
        }
    }));
}

/// Rayon threads for this rank: `requested` if given, else `SLURM_CPUS_PER_TASK`, else the
/// cores of this host divided by `ranks_on_node` (the ranks sharing the host: the real node,
/// not a pretend one, so pretend nodes do not oversubscribe the cores), at least 1.
pub fn threads_per_rank(requested: Option<usize>, ranks_on_node: usize) -> usize {
    if let Some(t) = requested {
        return t;
    }
    if let Some(t) = env_usize(&["SLURM_CPUS_PER_TASK"]) {
        return t.max(1);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks_on_node.max(1)).max(1)
}
