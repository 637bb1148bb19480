//! Memory that the ranks of one host share: an MPI-3 shared-memory window
//! (`MPI_Win_allocate_shared`), one segment per rank, which every rank of the host reads with
//! plain loads.
//!
//! Why MPI's window and not a file in `/dev/shm`: the MPI library names, sizes and removes
//! the backing memory itself (also when the job is killed), places it where the launcher and
//! the batch system allow, and knows which ranks can share memory at all (`split_shared`).

use super::group::Group;
use mpi::raw::AsRaw;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use std::ffi::{c_int, c_void, CString};

/// The segments of the ranks of a group that share a host: each rank writes its own segment
/// once ([`HostShared::mine_mut`]), then [`HostShared::publish`] makes every segment readable
/// by every member, read-only from then on.
pub struct HostShared {
    /// The members' communicator, kept until the window over it is freed.
    _comm: SimpleCommunicator,
    win: mpi::ffi::MPI_Win,
    /// Every member's segment, in member order; `mine` is this rank's.
    segments: Vec<Segment>,
    mine: usize,
    published: bool,
}

/// One member's segment: `len` floats at `ptr`, owned by rank `rank` of the group the
/// segments were made over.
struct Segment {
    rank: usize,
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the segments are written only by their owner through `mine_mut` (which needs
// `&mut`) before `publish`, and only read afterwards (`segment`, which needs it published);
// the window and the communicator are used only by `publish` (`&mut`) and `Drop`, on the
// thread that owns the value.
unsafe impl Send for HostShared {}
unsafe impl Sync for HostShared {}

impl Group {
    /// Give each rank of this group a segment of `len` floats that the group's other ranks on
    /// the same host — and with the same `node` (pretend nodes of a test share a host but not
    /// memory) — can read. Collective over the group. `None` on a rank that shares its host
    /// with no other rank of the group (or without MPI).
    pub fn share_on_host(&self, node: usize, len: usize) -> Option<HostShared> {
        let comm = self.mpi_comm()?;
        let same_node = comm
            .split_by_color(Color::with_value(node as c_int))
            .expect("every rank gave a colour");
        let host = same_node.split_shared(comm.rank());
        if host.size() == 1 {
            return None;
        }
        // Each member's rank in this group and its segment's length: MPI may round a
        // segment up (to pages), so the length asked for is what the owner writes.
        let mut members = vec![[0u64; 2]; host.size() as usize];
        mpi::collective::CommunicatorCollectives::all_gather_into(
            &host,
            &[comm.rank() as u64, len as u64][..],
            &mut members.as_flattened_mut()[..],
        );
        Some(HostShared::allocate(host, &members, len))
    }
}

impl HostShared {
    /// Allocate the window over `comm` (this rank `len` floats of its own); `members[i]` is
    /// member `i`'s rank in the group the caller numbers ranks by and its length.
    fn allocate(comm: SimpleCommunicator, members: &[[u64; 2]], len: usize) -> HostShared {
        let bytes = mpi::ffi::MPI_Aint::try_from(len * std::mem::size_of::<f32>())
            .expect("a segment's size fits MPI_Aint");
        let mut win: mpi::ffi::MPI_Win = unsafe { mpi::ffi::RSMPI_WIN_NULL };
        let mut base: *mut c_void = std::ptr::null_mut();
        // Each segment placed on its own pages, first touched by its owner, so on a host of
        // several sockets a rank's rows sit in its own socket's memory.
        let info = NoncontigInfo::new();
        // SAFETY: `base` and `win` are out-parameters of the right types; `comm` is live.
        let rc = unsafe {
            mpi::ffi::MPI_Win_allocate_shared(
                bytes,
                std::mem::size_of::<f32>() as c_int,
                info.0,
                comm.as_raw(),
                (&mut base as *mut *mut c_void).cast(),
                &mut win,
            )
        };
        assert_eq!(rc, 0, "MPI_Win_allocate_shared failed ({rc})");
        drop(info);
        let mine = comm.rank() as usize;
        let segments = members
            .iter()
            .enumerate()
            .map(|(i, &[rank, len])| {
                let mut size: mpi::ffi::MPI_Aint = 0;
                let mut unit: c_int = 0;
                let mut ptr: *mut c_void = std::ptr::null_mut();
                // SAFETY: out-parameters of the right types for a live shared window.
                let rc = unsafe {
                    mpi::ffi::MPI_Win_shared_query(
                        win,
                        i as c_int,
                        &mut size,
                        &mut unit,
                        (&mut ptr as *mut *mut c_void).cast(),
                    )
                };
                assert_eq!(rc, 0, "MPI_Win_shared_query failed ({rc})");
                let len = len as usize;
                assert!(
                    size as usize >= len * std::mem::size_of::<f32>(),
                    "member {i}'s segment holds {size} bytes, not the {len} floats it asked for"
                );
                Segment {
                    rank: rank as usize,
                    ptr: if len == 0 {
                        std::ptr::NonNull::dangling().as_ptr()
                    } else {
                        ptr.cast()
                    },
                    len,
                }
            })
            .collect();
        HostShared {
            _comm: comm,
            win,
            segments,
            mine,
            published: false,
        }
    }

    /// This rank's segment, to fill before [`HostShared::publish`].
    ///
    /// # Panics
    /// After `publish` (the segment is read-only then).
    pub fn mine_mut(&mut self) -> &mut [f32] {
        assert!(!self.published, "a published segment is read-only");
        let s = &self.segments[self.mine];
        // SAFETY: `len` floats of the window at `ptr` are this rank's; nothing reads them
        // before `publish` and `&mut self` excludes other borrows here.
        unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) }
    }

    /// Make every member's writes visible to every member (a fence on the window, which
    /// orders memory and waits for all members). Collective over the members.
    pub fn publish(&mut self) {
        // SAFETY: a live window; the fence is collective over its members, who all call it.
        let rc = unsafe { mpi::ffi::MPI_Win_fence(0, self.win) };
        assert_eq!(rc, 0, "MPI_Win_fence failed ({rc})");
        self.published = true;
    }

    /// Members, each as (its rank in the group the segments were made over, its segment).
    ///
    /// # Panics
    /// Before [`HostShared::publish`].
    pub fn segments(&self) -> impl Iterator<Item = (usize, &[f32])> + '_ {
        assert!(self.published, "segments are read once published");
        // SAFETY: published segments are never written again and live as long as `self`.
        self.segments
            .iter()
            .map(|s| (s.rank, unsafe { std::slice::from_raw_parts(s.ptr, s.len) }))
    }

    /// Member `i`'s segment (the `i`-th of [`HostShared::segments`]).
    ///
    /// # Panics
    /// Before [`HostShared::publish`].
    pub fn segment(&self, i: usize) -> &[f32] {
        assert!(self.published, "segments are read once published");
        let s = &self.segments[i];
        // SAFETY: as in `segments`.
        unsafe { std::slice::from_raw_parts(s.ptr, s.len) }
    }

    /// This rank's own segment (readable before and after publishing).
    pub fn mine(&self) -> &[f32] {
        let s = &self.segments[self.mine];
        // SAFETY: this rank's floats; writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(s.ptr, s.len) }
    }
}

impl Drop for HostShared {
    /// Free the window (the communicator field drops after this): collective over the
    /// members, who drop it at the same point of the same program (an error on one rank
    /// aborts them all instead). Nothing once MPI is finalised.
    fn drop(&mut self) {
        if !super::mpi_active() {
            return;
        }
        // SAFETY: a live window, freed once; the communicator outlives this call.
        unsafe { mpi::ffi::MPI_Win_free(&mut self.win) };
    }
}

/// An `MPI_Info` asking for one segment per rank (`alloc_shared_noncontig`), freed on drop.
struct NoncontigInfo(mpi::ffi::MPI_Info);

impl NoncontigInfo {
    fn new() -> NoncontigInfo {
        let mut info: mpi::ffi::MPI_Info = unsafe { mpi::ffi::RSMPI_INFO_NULL };
        let key = CString::new("alloc_shared_noncontig").expect("no NUL");
        let value = CString::new("true").expect("no NUL");
        // SAFETY: out-parameter, then NUL-terminated strings MPI copies.
        unsafe {
            mpi::ffi::MPI_Info_create(&mut info);
            mpi::ffi::MPI_Info_set(info, key.as_ptr(), value.as_ptr());
        }
        NoncontigInfo(info)
    }
}

impl Drop for NoncontigInfo {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once.
        unsafe { mpi::ffi::MPI_Info_free(&mut self.0) };
    }
}
