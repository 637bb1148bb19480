//! Where a rank's own feature rows live: in its private memory, or in its segment of memory
//! shared with the other ranks of its host, who then read its rows with plain loads instead
//! of asking for them by alltoallv (and it reads theirs).
//!
//! Several ranks on one host (one per GPU or socket) each fetched the rows of the others
//! through MPI: on the 200k SBM at two ranks of the 2-core VM, 62 MB of features a step
//! packed, copied through Open MPI's shared-memory transport and unpacked, where one rank
//! copies its rows once. Shared, a row of a rank of the same host costs one copy, as an own
//! row does. Rows of other hosts are still fetched.

use crate::comm::{Group, HostShared};
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use ndarray::{Array2, ArrayView2};

/// A rank's own rows (`rows × cols`, row-major), and the rows of the ranks that share them
/// with it.
pub struct HostRows {
    storage: Storage,
    rows: usize,
    cols: usize,
    /// Ranks (of the group whose `offsets` number the rows) whose rows this rank reads in
    /// shared memory, as (rank, its first vertex, its segment in `storage`'s window).
    peers: Vec<Peer>,
    /// Index into `peers` of each rank of the group, `NOT_A_PEER` for ranks not sharing.
    peer_of_rank: Vec<u32>,
}

enum Storage {
    Private(Array2<f32>),
    Shared(HostShared),
}

#[derive(Clone, Copy, Debug)]
struct Peer {
    first: u64,
    rows: usize,
    segment: usize,
}

const NOT_A_PEER: u32 = u32::MAX;

impl HostRows {
    /// Rows in this rank's private memory, shared with no one.
    pub fn private(rows: Array2<f32>) -> HostRows {
        let rows = if rows.is_standard_layout() {
            rows
        } else {
            rows.as_standard_layout().into_owned()
        };
        HostRows {
            rows: rows.nrows(),
            cols: rows.ncols(),
            storage: Storage::Private(rows),
            peers: Vec::new(),
            peer_of_rank: Vec::new(),
        }
    }

    /// Move the rows into this rank's segment of memory shared with the ranks of `group` on
    /// its host and node (`node`, which tells pretend nodes apart), and map the rows of
    /// those ranks (`offsets` number every rank's rows). Collective over `group`; returns how
    /// many other ranks' rows this rank now reads directly (0: nothing shared, the rows stay
    /// where they were).
    pub fn share_on_host(&mut self, group: &Group, node: usize, offsets: &[u64]) -> usize {
        let Some(mut shared) = group.share_on_host(node, self.rows * self.cols) else {
            return 0;
        };
        shared.mine_mut().copy_from_slice(self.as_slice());
        shared.publish();
        let mut peer_of_rank = vec![NOT_A_PEER; group.size()];
        let mut peers = Vec::new();
        for (segment, (rank, floats)) in shared.segments().enumerate() {
            if rank == group.rank() {
                continue;
            }
            let rows = (offsets[rank + 1] - offsets[rank]) as usize;
            assert_eq!(
                floats.len(),
                rows * self.cols,
                "rank {rank} shares its {rows} rows of width {}",
                self.cols
            );
            peer_of_rank[rank] = peers.len() as u32;
            peers.push(Peer {
                first: offsets[rank],
                rows,
                segment,
            });
        }
        // The private copy goes; the shared segment now holds the rows.
        self.storage = Storage::Shared(shared);
        self.peers = peers;
        self.peer_of_rank = peer_of_rank;
        self.peers.len()
    }

    /// Number of other ranks whose rows are read in shared memory.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }

    /// Where vertex `v` (not this rank's) is read in shared memory: (peer, row of its
    /// segment), `None` when its owner does not share with this rank.
    pub fn peer_row(&self, offsets: &[u64], v: NodeId) -> Option<(u32, u32)> {
        if self.peers.is_empty() {
            return None;
        }
        let owner = owner_of(offsets, v as u64);
        let p = *self.peer_of_rank.get(owner)?;
        (p != NOT_A_PEER).then(|| (p, (v as u64 - self.peers[p as usize].first) as u32))
    }

    /// The index among this rank's peers of `rank` (of the group whose `offsets` number the
    /// rows), `None` for a rank that does not share its rows with this one.
    pub fn peer_index(&self, rank: usize) -> Option<u32> {
        self.peer_of_rank
            .get(rank)
            .copied()
            .filter(|&p| p != NOT_A_PEER)
    }

    /// Whether vertex `v`, not this rank's, is read in shared memory.
    pub fn is_peer_row(&self, offsets: &[u64], v: NodeId) -> bool {
        self.peer_row(offsets, v).is_some()
    }

    /// The rows of peer `p` ([`HostRows::peer_row`]), row-major.
    pub fn peer_slice(&self, p: u32) -> &[f32] {
        let peer = &self.peers[p as usize];
        match &self.storage {
            Storage::Shared(s) => {
                let floats = s.segment(peer.segment);
                debug_assert_eq!(floats.len(), peer.rows * self.cols);
                floats
            }
            Storage::Private(_) => unreachable!("peers exist only with shared storage"),
        }
    }

    /// Every peer's rows, in peer order: looked up once per gather rather than per row.
    pub fn peer_slices(&self) -> Vec<&[f32]> {
        (0..self.peers.len() as u32)
            .map(|p| self.peer_slice(p))
            .collect()
    }

    /// Row `r` of peer `p`.
    pub fn peer_row_slice(&self, p: u32, r: u32) -> &[f32] {
        let d = self.cols;
        &self.peer_slice(p)[r as usize * d..(r as usize + 1) * d]
    }

    /// This rank's rows, row-major.
    pub fn as_slice(&self) -> &[f32] {
        match &self.storage {
            Storage::Private(a) => a.as_slice().expect("standard layout"),
            Storage::Shared(s) => s.mine(),
        }
    }

    /// This rank's rows as a matrix.
    pub fn view(&self) -> ArrayView2<'_, f32> {
        ArrayView2::from_shape((self.rows, self.cols), self.as_slice()).expect("rows × cols")
    }

    pub fn nrows(&self) -> usize {
        self.rows
    }

    pub fn ncols(&self) -> usize {
        self.cols
    }

    /// Floats of this rank's rows.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_rows_are_read_as_given_and_have_no_peers() {
        let a = Array2::from_shape_fn((3, 2), |(i, j)| (i * 2 + j) as f32);
        let own = HostRows::private(a.clone());
        assert_eq!(own.view(), a.view());
        assert_eq!(own.as_slice(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!((own.nrows(), own.ncols(), own.len()), (3, 2, 6));
        assert_eq!(own.peers(), 0);
        assert_eq!(own.peer_row(&[0, 3, 6], 4), None);
    }

    #[test]
    fn rows_in_another_layout_are_made_row_major() {
        let t = Array2::from_shape_fn((2, 3), |(i, j)| (i * 3 + j) as f32).reversed_axes();
        assert!(!t.is_standard_layout());
        let own = HostRows::private(t.clone());
        assert_eq!(own.view(), t.view());
        assert_eq!(own.as_slice(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn a_solo_group_shares_nothing_and_keeps_the_rows() {
        let world = crate::comm::World::solo();
        let a = Array2::from_shape_fn((3, 2), |(i, j)| (i + j) as f32);
        let mut own = HostRows::private(a.clone());
        assert_eq!(own.share_on_host(&world, 0, &[0, 3]), 0);
        assert_eq!(own.view(), a.view());
    }
}
