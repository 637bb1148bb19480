//! A group of ranks (world, node, leaders) and the typed collectives gnnpar uses on it.
//! A solo group (no MPI) implements every collective as the identity.

use super::stats::CommStats;
use crate::backend::DeviceSpan;
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::Count;
use std::cell::Cell;
use std::ffi::c_void;
use std::rc::Rc;
use std::time::Instant;

/// A communicator with byte/time accounting.
pub struct Group {
    comm: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
    stats: Rc<CommStats>,
    /// Whether MPI may be handed device memory (a CUDA-aware MPI, `--cuda-aware-mpi`); one
    /// setting shared by every group of the world.
    device_pointers: Rc<Cell<bool>>,
}

extern "C" {
    /// `MPI_IN_PLACE` of the MPI gnnpar is built against (`src/comm/mpi_constants.c`).
    static gnnpar_mpi_in_place: *mut c_void;
}

/// `buf` summed over `comm`'s ranks, in place (`MPI_IN_PLACE`). Reducing from a copy added a
/// pass over the gradients every step (training keeps freed memory, so the copy reused its
/// pages; the pass itself cost, and ranks sharing cores make it at once): on the 2-core VM,
/// Facebook with SAGE at hidden 1024 (39 MB of gradients) spent 39-41 ms a step in the
/// allreduce at 2 ranks and 155 at 4; in place 20-31 and 66, with the same sums bit for bit.
fn allreduce_sum_in_place<T: Equivalence>(comm: &SimpleCommunicator, buf: &mut [T]) {
    let len = buf.len();
    let count = Count::try_from(len)
        .unwrap_or_else(|_| panic!("allreduce of {len} values exceeds MPI's 32-bit count"));
    // SAFETY: `buf` is `count` live, initialised values of `T`'s MPI datatype for the whole
    // (blocking) call; `gnnpar_mpi_in_place` is a constant of the C shim.
    let rc = unsafe {
        mpi::ffi::MPI_Allreduce(
            gnnpar_mpi_in_place,
            buf.as_mut_ptr().cast(),
            count,
            T::equivalent_datatype().as_raw(),
            mpi::ffi::RSMPI_SUM,
            comm.as_raw(),
        )
    };
    assert_eq!(rc, 0, "MPI_Allreduce in place failed ({rc})");
}

fn displacements(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// `send` holds exactly the elements `send_counts` sends.
fn check_counts<T>(kind: &str, send: &[T], send_counts: &[usize]) {
    assert_eq!(
        send_counts.iter().sum::<usize>(),
        send.len(),
        "{kind}: counts sum"
    );
}

fn to_counts(counts: &[usize], what: &str) -> Vec<Count> {
    counts
        .iter()
        .map(|&c| {
            Count::try_from(c).unwrap_or_else(|_| {
                panic!("{what}: {c} elements exceed MPI's 32-bit count; use more ranks")
            })
        })
        .collect()
}

impl Group {
    pub(super) fn new(
        comm: SimpleCommunicator,
        stats: Rc<CommStats>,
        device_pointers: Rc<Cell<bool>>,
    ) -> Group {
        Group {
            rank: comm.rank() as usize,
            size: comm.size() as usize,
            comm: Some(comm),
            stats,
            device_pointers,
        }
    }

    /// The MPI communicator, `None` for a solo group.
    pub(super) fn mpi_comm(&self) -> Option<&SimpleCommunicator> {
        self.comm.as_ref()
    }

    /// Bytes and seconds of every communication call so far (shared by every group of the
    /// world), by kind of operation.
    pub fn stats(&self) -> &CommStats {
        &self.stats
    }

    pub(super) fn solo(stats: Rc<CommStats>, device_pointers: Rc<Cell<bool>>) -> Group {
        Group {
            comm: None,
            rank: 0,
            size: 1,
            stats,
            device_pointers,
        }
    }

    /// Whether collectives may be handed device memory ([`Group::alltoallv_rows_device`],
    /// [`Group::allreduce_sum_device`]): set once per run from `--cuda-aware-mpi`.
    pub fn device_pointers(&self) -> bool {
        self.device_pointers.get()
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Wait for every rank of the group.
    pub fn barrier(&self) {
        if let Some(c) = &self.comm {
            c.barrier();
        }
    }

    /// Wait for every rank of the group asleep: test a non-blocking barrier every `poll`.
    /// MPI's blocking calls wait spinning, which on cores the ranks share takes them from the
    /// ranks still working (the calibration's turns, [`crate::train::plan::core_share`]).
    pub fn barrier_sleeping(&self, poll: std::time::Duration) {
        let Some(c) = &self.comm else { return };
        let mut request = c.immediate_barrier();
        loop {
            match request.test() {
                Ok(_) => return,
                Err(pending) => {
                    request = pending;
                    std::thread::sleep(poll);
                }
            }
        }
    }

    /// Sum `buf` element-wise over the group, in place (gradient allreduce).
    pub fn allreduce_sum_f32(&self, buf: &mut [f32]) {
        let Some(c) = &self.comm else { return };
        if self.size == 1 {
            return; // nothing to move; recording bytes here would mislead the reports
        }
        let t = Instant::now();
        allreduce_sum_in_place(c, buf);
        let bytes = std::mem::size_of_val(buf);
        self.stats.record("allreduce", t, bytes, bytes);
    }

    /// Sum `buf` element-wise over the group, in place (loss sums, counts, metrics).
    pub fn allreduce_sum_f64(&self, buf: &mut [f64]) {
        let Some(c) = &self.comm else { return };
        if self.size == 1 {
            return;
        }
        let t = Instant::now();
        allreduce_sum_in_place(c, buf);
        let bytes = std::mem::size_of_val(buf);
        self.stats.record("allreduce_small", t, bytes, bytes);
    }

    /// Maximum of `v` over the group.
    pub fn allreduce_max_f64(&self, v: f64) -> f64 {
        let Some(c) = &self.comm else { return v };
        let mut out = v;
        c.all_reduce_into(&v, &mut out, SystemOperation::max());
        out
    }

    /// Minimum of `v` over the group (what every rank can agree to, e.g. the fewest
    /// batches any rank samples ahead at once).
    pub fn allreduce_min_usize(&self, v: usize) -> usize {
        let Some(c) = &self.comm else { return v };
        let mut out = v as u64;
        c.all_reduce_into(&(v as u64), &mut out, SystemOperation::min());
        out as usize
    }

    /// Broadcast `buf` from the group's rank 0.
    pub fn broadcast_f64_from_root(&self, buf: &mut [f64]) {
        if let Some(c) = &self.comm {
            c.process_at_rank(0).broadcast_into(buf);
        }
    }

    /// Gather one `u64` from every rank, on every rank.
    pub fn allgather_u64(&self, v: u64) -> Vec<u64> {
        let Some(c) = &self.comm else { return vec![v] };
        let mut out = vec![0u64; self.size];
        c.all_gather_into(&v, &mut out[..]);
        out
    }

    /// Gather a variable-length vector from every rank, on every rank (concatenated in rank
    /// order) with each rank's count.
    pub fn allgatherv<T: Equivalence + Copy + Default>(
        &self,
        kind: &'static str,
        mine: &[T],
    ) -> (Vec<T>, Vec<usize>) {
        let Some(c) = &self.comm else {
            return (mine.to_vec(), vec![mine.len()]);
        };
        let t = Instant::now();
        let counts_u64 = self.allgather_u64(mine.len() as u64);
        let counts: Vec<usize> = counts_u64.iter().map(|&n| n as usize).collect();
        let counts_c = to_counts(&counts, kind);
        let displs = displacements(&counts_c);
        let mut out = vec![T::default(); counts.iter().sum()];
        {
            let mut part = PartitionMut::new(&mut out[..], &counts_c[..], &displs[..]);
            c.all_gather_varcount_into(mine, &mut part);
        }
        let elem = std::mem::size_of::<T>();
        self.stats.record(
            kind,
            t,
            std::mem::size_of_val(mine) * (self.size - 1),
            out.len() * elem,
        );
        (out, counts)
    }

    /// All-to-all of variable-length pieces: `send[send_offsets(r)..]` of `send_counts[r]`
    /// elements goes to rank `r`. Returns the received elements (concatenated in rank order)
    /// and how many came from each rank (learnt from the ranks first, one small all-to-all;
    /// [`Group::alltoallv_known`] skips it where a plan knows them).
    pub fn alltoallv<T: Equivalence + Copy>(
        &self,
        kind: &'static str,
        send: &[T],
        send_counts: &[usize],
    ) -> (Vec<T>, Vec<usize>) {
        assert_eq!(send_counts.len(), self.size, "{kind}: one count per rank");
        let Some(c) = &self.comm else {
            check_counts(kind, send, send_counts);
            return (send.to_vec(), send_counts.to_vec());
        };
        let t = Instant::now();
        let sc = to_counts(send_counts, kind);
        let mut rc: Vec<Count> = vec![0; self.size];
        c.all_to_all_into(&sc[..], &mut rc[..]);
        let recv_counts: Vec<usize> = rc.iter().map(|&x| x as usize).collect();
        let recv = self.alltoallv_timed(kind, t, send, send_counts, &recv_counts);
        (recv, recv_counts)
    }

    /// [`Group::alltoallv`] where every rank knows what it receives from each rank
    /// (`recv_counts[r]` is rank `r`'s `send_counts` entry for this rank: both sides of one
    /// plan), so no counts are exchanged first. Returns the received elements in rank order.
    ///
    /// Crate-internal: the receive buffer is not zeroed, so the counts must agree across
    /// ranks (every caller derives both sides from one plan or from counts it received); a
    /// disagreement is an erroneous MPI program, not a recoverable input error.
    pub(crate) fn alltoallv_known<T: Equivalence + Copy>(
        &self,
        kind: &'static str,
        send: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Vec<T> {
        self.alltoallv_timed(kind, Instant::now(), send, send_counts, recv_counts)
    }

    /// The exchange of [`Group::alltoallv_known`], accounted from `started`. The receive
    /// buffer is written by MPI before anything reads it, so it is not zeroed first: at the
    /// sizes of a hidden layer's rows, zeroing it was a tenth of a CPU step (`memset` under
    /// `alltoallv` in a profile of SNP at hidden 1024).
    fn alltoallv_timed<T: Equivalence + Copy>(
        &self,
        kind: &'static str,
        started: Instant,
        send: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Vec<T> {
        check_counts(kind, send, send_counts);
        assert_eq!(recv_counts.len(), self.size, "{kind}: one count per rank");
        let Some(c) = &self.comm else {
            assert_eq!(
                send_counts, recv_counts,
                "{kind}: a solo rank receives what it sends"
            );
            return send.to_vec();
        };
        let mut sc = to_counts(send_counts, kind);
        let mut rc = to_counts(recv_counts, kind);
        let sd = displacements(&sc);
        let rd = displacements(&rc);
        let total: usize = recv_counts.iter().sum();
        let _ = to_counts(&[total], kind); // displacements are 32-bit too
        let me = self.rank;
        assert_eq!(
            sc[me], rc[me],
            "{kind}: a rank receives what it sends itself"
        );
        let mut recv: Vec<T> = Vec::with_capacity(total);
        // This rank's own piece is one copy here, not a message to itself: Open MPI's
        // pairwise algorithm sends it through its point-to-point layer, which copies it more
        // than once (a profile of SNP at hidden 1024: `mca_pml_ob1_send` under `alltoallv`).
        // SAFETY: the piece is `sc[me]` elements of `send` at `sd[me]` (within it: the counts
        // sum to its length), written at `rd[me]` of `recv`, within its capacity (the counts
        // sum to `total`); the two buffers do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                send.as_ptr().add(sd[me] as usize),
                recv.as_mut_ptr().add(rd[me] as usize),
                sc[me] as usize,
            );
        }
        (sc[me], rc[me]) = (0, 0);
        // SAFETY: `send` holds Σ send_counts elements (checked) and `recv` has room for
        // Σ recv_counts; the datatype is `T`'s own; MPI writes every element received from
        // another rank (the counts of all ranks come from one plan or from the count
        // exchange), and this rank's own piece is written above, before the length covers
        // them.
        let code = unsafe {
            mpi::ffi::MPI_Alltoallv(
                send.as_ptr() as *const std::ffi::c_void,
                sc.as_ptr(),
                sd.as_ptr(),
                T::equivalent_datatype().as_raw(),
                recv.as_mut_ptr() as *mut std::ffi::c_void,
                rc.as_ptr(),
                rd.as_ptr(),
                T::equivalent_datatype().as_raw(),
                c.as_raw(),
            )
        };
        assert_eq!(code, 0, "{kind}: MPI_Alltoallv failed ({code})");
        // SAFETY: MPI and the copy above wrote the first `total` elements.
        unsafe { recv.set_len(total) };
        let elem = std::mem::size_of::<T>();
        // Bytes that stay on this rank are not counted as moved.
        let own_sent = send_counts[me] * elem;
        let own_recv = recv_counts[me] * elem;
        self.stats.record(
            kind,
            started,
            std::mem::size_of_val(send) - own_sent,
            total * elem - own_recv,
        );
        recv
    }

    /// All-to-all of f32 row blocks of width `dim`: `send_rows[r]` rows go to rank `r`.
    /// Returns the received rows (row-major, rank order) and the row count from each rank.
    pub fn alltoallv_rows(
        &self,
        kind: &'static str,
        send: &[f32],
        dim: usize,
        send_rows: &[usize],
    ) -> (Vec<f32>, Vec<usize>) {
        let counts: Vec<usize> = send_rows.iter().map(|&r| r * dim).collect();
        let (recv, rc) = self.alltoallv(kind, send, &counts);
        let rows = rc.iter().map(|&c| c / dim.max(1)).collect();
        (recv, rows)
    }

    /// [`Group::alltoallv_rows`] with the rows from each rank known (`recv_rows`, from the
    /// same plan as every rank's `send_rows`). Returns the received rows, row-major, rank order.
    pub(crate) fn alltoallv_rows_known(
        &self,
        kind: &'static str,
        send: &[f32],
        dim: usize,
        send_rows: &[usize],
        recv_rows: &[usize],
    ) -> Vec<f32> {
        let elems = |rows: &[usize]| -> Vec<usize> { rows.iter().map(|&r| r * dim).collect() };
        self.alltoallv_known(kind, send, &elems(send_rows), &elems(recv_rows))
    }

    /// [`Group::allreduce_sum_f32`] on device memory, which a CUDA-aware MPI reads and writes
    /// directly: `recv = Σ_ranks send` (`send` and `recv` of equal length, not overlapping).
    ///
    /// # Safety
    /// Both spans must be live device (or host) memory of `len` `f32`s for the whole call, with
    /// no work queued on them ([`crate::backend::Backend::device_span`] waits for it), and the
    /// MPI library must accept device pointers ([`Group::device_pointers`]).
    pub unsafe fn allreduce_sum_device(&self, send: DeviceSpan, recv: DeviceSpan) {
        assert_eq!(send.len, recv.len, "allreduce: send and receive lengths");
        let Some(c) = &self.comm else {
            panic!("allreduce_sum_device needs a communicator (one rank has nothing to sum)")
        };
        let t = Instant::now();
        let count = Count::try_from(send.len).expect("allreduce past MPI's 32-bit count");
        // SAFETY: the caller guarantees both spans; MPI reads `send` and writes `recv`.
        let rc = unsafe {
            mpi::ffi::MPI_Allreduce(
                send.addr as *const std::ffi::c_void,
                recv.addr as *mut std::ffi::c_void,
                count,
                mpi::ffi::RSMPI_FLOAT,
                mpi::ffi::RSMPI_SUM,
                c.as_raw(),
            )
        };
        assert_eq!(rc, 0, "MPI_Allreduce on device memory failed ({rc})");
        let bytes = send.len * std::mem::size_of::<f32>();
        self.stats.record("allreduce", t, bytes, bytes);
        self.stats.record_device_pointers();
    }

    /// [`Group::alltoallv_rows`] on device memory, which a CUDA-aware MPI reads and writes
    /// directly: `send_rows[r]` rows of `send` go to rank `r`, `recv_rows[r]` rows from rank `r`
    /// land in `recv` (rank order). Both sides know the counts from the same plan, so no counts
    /// are exchanged.
    ///
    /// # Safety
    /// As [`Group::allreduce_sum_device`]; `send` holds `Σ send_rows · dim` values and `recv`
    /// `Σ recv_rows · dim`, and every rank's `recv_rows[r]` equals rank `r`'s `send_rows` for it.
    pub unsafe fn alltoallv_rows_device(
        &self,
        kind: &'static str,
        send: DeviceSpan,
        recv: DeviceSpan,
        dim: usize,
        send_rows: &[usize],
        recv_rows: &[usize],
    ) {
        assert_eq!(send_rows.len(), self.size, "{kind}: one count per rank");
        assert_eq!(recv_rows.len(), self.size, "{kind}: one count per rank");
        assert_eq!(
            send.len,
            send_rows.iter().sum::<usize>() * dim,
            "{kind}: send rows"
        );
        assert_eq!(
            recv.len,
            recv_rows.iter().sum::<usize>() * dim,
            "{kind}: receive rows"
        );
        let Some(c) = &self.comm else {
            panic!("{kind}: alltoallv_rows_device needs a communicator")
        };
        let t = Instant::now();
        let elems = |rows: &[usize]| -> Vec<usize> { rows.iter().map(|&r| r * dim).collect() };
        let sc = to_counts(&elems(send_rows), kind);
        let rc = to_counts(&elems(recv_rows), kind);
        let sd = displacements(&sc);
        let rd = displacements(&rc);
        // SAFETY: the caller guarantees both spans and counts that agree across ranks.
        let code = unsafe {
            mpi::ffi::MPI_Alltoallv(
                send.addr as *const std::ffi::c_void,
                sc.as_ptr(),
                sd.as_ptr(),
                mpi::ffi::RSMPI_FLOAT,
                recv.addr as *mut std::ffi::c_void,
                rc.as_ptr(),
                rd.as_ptr(),
                mpi::ffi::RSMPI_FLOAT,
                c.as_raw(),
            )
        };
        assert_eq!(
            code, 0,
            "{kind}: MPI_Alltoallv on device memory failed ({code})"
        );
        let row = dim * std::mem::size_of::<f32>();
        let own_sent = send_rows[self.rank] * row;
        let own_recv = recv_rows[self.rank] * row;
        self.stats
            .record(kind, t, send.len * 4 - own_sent, recv.len * 4 - own_recv);
        self.stats.record_device_pointers();
    }

    /// Gather one string per rank on rank 0 (others get an empty vector).
    pub fn gather_strings(&self, s: &str) -> Vec<String> {
        let Some(c) = &self.comm else {
            return vec![s.to_string()];
        };
        let root = c.process_at_rank(0);
        let bytes = s.as_bytes();
        let len = bytes.len() as Count;
        if self.rank != 0 {
            root.gather_into(&len);
            root.gather_varcount_into(bytes);
            return Vec::new();
        }
        let mut lens = vec![0 as Count; self.size];
        root.gather_into_root(&len, &mut lens[..]);
        let displs = displacements(&lens);
        let mut buf = vec![0u8; lens.iter().sum::<Count>() as usize];
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
