//! How the ranks of a host share its cores while the calibration times a kernel.
//!
//! Where a host runs more rank threads than it has cores (4 ranks on the 2-core VM), timing a
//! kernel with every rank at it at once (as the communication operators are timed) gives
//! points that are not what a training step sees. A short call can finish within the time
//! slice the scheduler gives it and time at the speed of a core of its own, a long one is
//! shared with the other ranks: in the 4-rank calibration of the 2-core VM a 134 MFLOP product took
//! 3.0 ms (2.5 at 2 ranks) and an 8.6 GFLOP one 371 ms (173 at 2 ranks). The line fitted
//! through them follows the long points and prices short calls at twice what they cost
//! measured alone, and the 4-rank steps came out 15-19 % over their measured time. Over a whole
//! step, though, every rank's calls follow one another, and whatever their lengths each rank
//! gets its share of the cores.
//!
//! So on such a host the kernels are timed in turns, as many ranks at once as the host has
//! cores for ([`CoreShare::turns`]; the others wait asleep, not spinning in a barrier), and
//! priced at the rank's share of the cores: the time on cores of its own times
//! [`CoreShare::factor`] (ranks × their cores each / the host's cores).

use crate::comm::World;

/// How a rank's host shares its cores among its ranks while kernels are timed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CoreShare {
    /// Rounds the host's ranks take turns in (1: every rank at once, nothing to share).
    pub turns: usize,
    /// This rank's round, `0..turns`.
    pub round: usize,
    /// What a second on cores of its own costs a rank in a step, when every rank of the host
    /// wants its cores at once: ranks × the cores each can use / the host's cores, at least 1.
    pub factor: f64,
}

impl CoreShare {
    /// Nothing shared: every rank times at once and pays its own time.
    pub const NONE: CoreShare = CoreShare {
        turns: 1,
        round: 0,
        factor: 1.0,
    };

    /// The share of `host_ranks` ranks of `threads` threads each on `cores` cores, for the
    /// rank `host_rank` among them (its node-local rank).
    pub fn of(host_ranks: usize, host_rank: usize, threads: usize, cores: usize) -> CoreShare {
        let cores = cores.max(1);
        // A rank alone uses at most the host's cores, however many threads it runs.
        let each = threads.clamp(1, cores);
        let at_once = (cores / each).max(1);
        let turns = host_ranks.max(1).div_ceil(at_once);
        if turns <= 1 {
            return CoreShare::NONE;
        }
        CoreShare {
            turns,
            round: host_rank % turns,
            factor: (host_ranks * each) as f64 / cores as f64,
        }
    }

    /// This host's share for `world`'s layout with `threads` per rank, the turns the same on
    /// every rank (the most any host needs: the rounds are collective). Collective.
    pub fn measure(world: &World, threads: usize) -> CoreShare {
        let cores = host_cores(world);
        let mine = CoreShare::of(world.ranks_on_host(), world.host_rank(), threads, cores);
        let turns = world.allreduce_max_f64(mine.turns as f64) as usize;
        CoreShare {
            turns,
            round: world.host_rank() % turns,
            factor: mine.factor,
        }
    }
}

/// Words of a CPU mask exchanged between ranks: 1024 CPUs, glibc's `CPU_SETSIZE`.
const MASK_WORDS: usize = 16;

/// This rank's CPU affinity mask as [`MASK_WORDS`] words, `None` where it cannot be read.
#[cfg(target_os = "linux")]
fn affinity_mask() -> Option<[u64; MASK_WORDS]> {
    // SAFETY: `set` is a zeroed `cpu_set_t` of the size passed; the call only writes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    let mut words = [0u64; MASK_WORDS];
    for cpu in 0..MASK_WORDS * 64 {
        // SAFETY: `cpu` is below `CPU_SETSIZE` (1024), the bits `set` holds.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            words[cpu / 64] |= 1 << (cpu % 64);
        }
    }
    Some(words)
}

#[cfg(not(target_os = "linux"))]
fn affinity_mask() -> Option<[u64; MASK_WORDS]> {
    None
}

/// The cores this rank's host (MPI's shared-memory domain, [`World::host_leader`]) lets its
/// ranks run on: the union of their affinity masks (ranks bound to a core each see one core
/// apiece, unbound ranks all see every core), or, where a rank cannot read its mask, what the
/// standard library sees. Collective over `world`.
fn host_cores(world: &World) -> usize {
    let mask = affinity_mask();
    let mut mine = vec![world.host_leader() as u64, mask.is_some() as u64];
    mine.extend(mask.unwrap_or_default());
    let (all, _) = world.allgatherv("core_share", &mine);
    let entry = MASK_WORDS + 2;
    let same_host: Vec<&[u64]> = all.chunks(entry).filter(|e| e[0] == mine[0]).collect();
    if same_host.iter().any(|e| e[1] == 0) {
        return std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    let union = same_host.iter().fold([0u64; MASK_WORDS], |mut acc, e| {
        for (a, w) in acc.iter_mut().zip(&e[2..]) {
            *a |= w;
        }
        acc
    });
    (union.iter().map(|w| w.count_ones() as usize).sum::<usize>()).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_on_cores_of_their_own_share_nothing() {
        assert_eq!(CoreShare::of(2, 1, 1, 2), CoreShare::NONE);
        assert_eq!(CoreShare::of(4, 3, 4, 16), CoreShare::NONE);
        assert_eq!(CoreShare::of(1, 0, 1, 1), CoreShare::NONE);
    }

    #[test]
    fn oversubscribed_ranks_take_turns_and_pay_their_share() {
        // 4 ranks of a thread on 2 cores: two at a time, each step's second costs two.
        let s = CoreShare::of(4, 3, 1, 2);
        assert_eq!((s.turns, s.round, s.factor), (2, 1, 2.0));
        // 3 ranks on 2 cores: rounds of two and one, a second costs 1.5.
        let s = CoreShare::of(3, 2, 1, 2);
        assert_eq!((s.turns, s.round, s.factor), (2, 0, 1.5));
        // 4 ranks of 2 threads on 2 cores: one at a time, each has the host to itself then.
        let s = CoreShare::of(4, 2, 2, 2);
        assert_eq!((s.turns, s.round, s.factor), (4, 2, 4.0));
        // A rank of 8 threads on 2 cores alone is its own contention: nothing to share.
        assert_eq!(CoreShare::of(1, 0, 8, 2), CoreShare::NONE);
        // Two such ranks: one at a time, each using both cores.
        let s = CoreShare::of(2, 1, 8, 2);
        assert_eq!((s.turns, s.round, s.factor), (2, 1, 2.0));
    }

    #[test]
    fn a_single_rank_sees_at_least_one_core() {
        assert!(host_cores(&World::solo()) >= 1);
        assert_eq!(CoreShare::measure(&World::solo(), 1).turns, 1);
    }
}
