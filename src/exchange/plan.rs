//! One shuffle plan, two directions (ARCHITECTURE invariant 6): a [`RowExchange`] is built
//! once from the global ids a rank wants; `forward` brings those rows from their owners,
//! `backward` sends gradients of the same rows back and sums them into the owners' rows.

use crate::comm::Group;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

/// Group `wanted` by owner (stably): the request buffer, the count per owner, and each
/// wanted id's position in the request buffer (= in the reply buffer).
fn route(offsets: &[u64], ranks: usize, wanted: &[NodeId]) -> (Vec<NodeId>, Vec<usize>, Vec<u32>) {
    let mut counts = vec![0usize; ranks];
    let owners: Vec<usize> = wanted
        .iter()
        .map(|&v| {
            let o = owner_of(offsets, v as u64);
            counts[o] += 1;
            o
        })
        .collect();
    let mut starts: Vec<usize> = counts
        .iter()
        .scan(0, |acc, &c| {
            let s = *acc;
            *acc += c;
            Some(s)
        })
        .collect();
    let mut request = vec![0 as NodeId; wanted.len()];
    let mut recv_pos = vec![0u32; wanted.len()];
    for (i, (&v, &o)) in wanted.iter().zip(&owners).enumerate() {
        request[starts[o]] = v;
        recv_pos[i] = starts[o] as u32;
        starts[o] += 1;
    }
    (request, counts, recv_pos)
}

/// A plan for moving rows of a row-partitioned matrix to the ranks that need them.
#[derive(Clone, Debug, Default)]
pub struct RowExchange {
    /// Local rows this rank sends, grouped by destination rank (rank order).
    send_rows: Vec<u32>,
    /// Rows sent to each rank.
    send_counts: Vec<usize>,
    /// Rows received from each rank.
    recv_counts: Vec<usize>,
    /// Position in the receive buffer of each wanted id (caller's order).
    recv_pos: Vec<u32>,
}

impl RowExchange {
    /// Build the plan for `wanted` global ids (any owner, this rank included; duplicates
    /// allowed) of a matrix whose rows on each owner are its vertices in id order (row
    /// `v - offsets[owner]`). Collective over `group`: every rank must call it, possibly with
    /// no ids.
    pub fn new(group: &Group, offsets: &[u64], wanted: &[NodeId]) -> RowExchange {
        let first = offsets[group.rank()];
        RowExchange::with_rows(group, offsets, wanted, |v| (v as u64 - first) as u32)
    }

    /// Like [`RowExchange::new`] for a matrix whose rows on the owner are ordered otherwise:
    /// `owner_row(v)`, called on the owner of `v`, gives the row holding `v`.
    pub fn with_rows(
        group: &Group,
        offsets: &[u64],
        wanted: &[NodeId],
        owner_row: impl Fn(NodeId) -> u32,
    ) -> RowExchange {
        let (request, counts, recv_pos) = route(offsets, group.size(), wanted);
        let (asked, asked_counts) = group.alltoallv("plan_ids", &request, &counts);
        let send_rows = asked.iter().map(|&v| owner_row(v)).collect();
        RowExchange {
            send_rows,
            send_counts: asked_counts,
            recv_counts: counts,
            recv_pos,
        }
    }

    /// A plan whose rows on each owner are the distinct ids it was asked for, in order of
    /// first request (rank order, then request order): the owner computes each requested
    /// vertex once, however many ranks ask for it. Returns the plan and this rank's distinct
    /// requested ids (the rows it must provide). Collective.
    pub fn to_owners(
        group: &Group,
        offsets: &[u64],
        wanted: &[NodeId],
    ) -> (RowExchange, Vec<NodeId>) {
        let (request, counts, recv_pos) = route(offsets, group.size(), wanted);
        let (asked, asked_counts) = group.alltoallv("plan_ids", &request, &counts);
        let mut distinct = Vec::new();
        let mut slot: std::collections::HashMap<NodeId, u32> = std::collections::HashMap::new();
        let send_rows = asked
            .iter()
            .map(|&v| {
                *slot.entry(v).or_insert_with(|| {
                    distinct.push(v);
                    (distinct.len() - 1) as u32
                })
            })
            .collect();
        (
            RowExchange {
                send_rows,
                send_counts: asked_counts,
                recv_counts: counts,
                recv_pos,
            },
            distinct,
        )
    }

    /// Number of wanted rows.
    pub fn len(&self) -> usize {
        self.recv_pos.len()
    }

    /// True when nothing is wanted.
    pub fn is_empty(&self) -> bool {
        self.recv_pos.is_empty()
    }

    /// Rows this rank sends per forward call, and rows it receives.
    pub fn volume(&self) -> (usize, usize) {
        (self.send_rows.len(), self.recv_pos.len())
    }

    /// Bring the wanted rows of the distributed matrix whose local part is `local`: returns
    /// one row per wanted id, in the caller's order. Collective.
    pub fn forward(
        &self,
        group: &Group,
        kind: &'static str,
        local: ArrayView2<f32>,
    ) -> Array2<f32> {
        let d = local.ncols();
        let mut send = vec![0f32; self.send_rows.len() * d];
        send.par_chunks_mut(d.max(1))
            .zip(self.send_rows.par_iter())
            .for_each(|(row, &r)| {
                row.copy_from_slice(local.row(r as usize).as_slice().expect("row-major"))
            });
        let (recv, _) = group.alltoallv_rows(kind, &send, d, &self.send_counts);
        let mut out = Array2::<f32>::zeros((self.recv_pos.len(), d));
        out.as_slice_mut()
            .expect("fresh matrix")
            .par_chunks_mut(d.max(1))
            .zip(self.recv_pos.par_iter())
            .for_each(|(row, &p)| {
                let p = p as usize;
                row.copy_from_slice(&recv[p * d..(p + 1) * d]);
            });
        out
    }

    /// The reverse of [`RowExchange::forward`]: send `grads` (one row per wanted id) back to
    /// the owners and add them into `local_grad` (their local rows). Collective.
    pub fn backward(
        &self,
        group: &Group,
        kind: &'static str,
        grads: ArrayView2<f32>,
        local_grad: &mut Array2<f32>,
    ) {
        let d = grads.ncols();
        assert_eq!(
            grads.nrows(),
            self.recv_pos.len(),
            "one gradient row per wanted id"
        );
        let total: usize = self.recv_counts.iter().sum();
        // Duplicated wanted ids add up here before they travel.
        let mut send = vec![0f32; total * d];
        for (i, &p) in self.recv_pos.iter().enumerate() {
            let p = p as usize;
            for (s, g) in send[p * d..(p + 1) * d].iter_mut().zip(grads.row(i)) {
                *s += g;
            }
        }
        let (recv, _) = group.alltoallv_rows(kind, &send, d, &self.recv_counts);
        // Rows arrive in rank order: a fixed order, so the sums do not depend on timing.
        for (k, &r) in self.send_rows.iter().enumerate() {
            let mut row = local_grad.row_mut(r as usize);
            for (dst, g) in row.iter_mut().zip(&recv[k * d..(k + 1) * d]) {
                *dst += g;
            }
        }
    }
}
