//! One shuffle plan, two directions (ARCHITECTURE invariant 6): a [`RowExchange`] is built
//! once from the global ids a rank wants; `forward` brings those rows from their owners,
//! `backward` sends gradients of the same rows back and sums them into the owners' rows.
//!
//! The rows may live on any backend ([`RowExchange::forward_on`]): the rows to send are
//! gathered where they live, cross ranks through [`alltoallv_rows_on`] — staged through host
//! memory (only the rows that move: a device gathers them first and copies that block), or as
//! device pointers when the MPI library is CUDA-aware — and land on the receiver's backend,
//! where they are put in order. The host methods are the CPU backend's case.

use super::packed_rows::{self, PackedRows, RowSource};
use crate::backend::{Backend, Cpu};
use crate::comm::Group;
use crate::graph::parts::owner_of;
use crate::graph::NodeId;
use crate::util::positions::with_positions;
use ndarray::{Array2, ArrayView2};

/// All-to-all of rows on backend `be`: `send_rows[r]` rows of `send` (grouped by destination
/// rank, in rank order) go to rank `r`; returns the `recv_rows[r]` rows from each rank `r`, in
/// rank order, on `be`. Collective; every rank's `recv_rows[r]` is rank `r`'s count for it (both
/// come from one plan).
///
/// Device rows are staged through host memory (one download of `send`, one upload of what
/// arrives; nothing is copied where the backend is the host) — unless the group may take device
/// pointers ([`Group::device_pointers`], a CUDA-aware MPI), when MPI reads `send` and writes
/// the result on the device directly.
pub fn alltoallv_rows_on<B: Backend>(
    group: &Group,
    be: &B,
    kind: &'static str,
    send: B::Mat,
    send_rows: &[usize],
    recv_rows: &[usize],
) -> B::Mat {
    let (rows, cols) = be.mat_dim(&send);
    assert_eq!(
        rows,
        send_rows.iter().sum::<usize>(),
        "{kind}: rows to send"
    );
    if group.size() == 1 {
        return send; // the rank sends its rows to itself
    }
    let total: usize = recv_rows.iter().sum();
    if group.device_pointers() && !B::IS_HOST {
        let mut recv = be.zeros(total, cols);
        let spans = (
            be.device_span(be.view(&send)),
            be.device_span_mut(be.view_mut(&mut recv)),
        );
        if let (Some(s), Some(r)) = spans {
            // SAFETY: both matrices outlive the call and nothing is queued on them (the spans
            // waited); the counts come from one plan on every rank; the group takes device
            // pointers (a CUDA-aware MPI, or host memory under the emulator).
            unsafe { group.alltoallv_rows_device(kind, s, r, cols, send_rows, recv_rows) };
            return recv;
        }
    }
    let host = be.download_owned(send);
    let host = crate::backend::cpu::standard(host.view());
    let recv = group.alltoallv_rows_known(
        kind,
        host.as_slice().expect("standard layout"),
        cols,
        send_rows,
        recv_rows,
    );
    let recv = Array2::from_shape_vec((total, cols), recv).expect("one row per count");
    be.upload_owned(recv)
}

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
        let first = offsets[group.rank()];
        let local = (offsets[group.rank() + 1] - first) as usize;
        let mut distinct = Vec::new();
        let send_rows = with_positions(first, local, |positions| {
            let rows = asked
                .iter()
                .map(|&v| positions.get_or_push(v, &mut distinct))
                .collect();
            positions.clear(&distinct);
            rows
        });
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
        self.forward_on(group, &Cpu, kind, local)
    }

    /// [`RowExchange::forward`] of host rows sent without their zeros where that is shorter
    /// (rows with fewer than half their columns set, when `look_for_zeros`; see
    /// [`packed_rows`]): bitwise the rows of `forward`, in fewer bytes when the rows are
    /// sparse, one header word a row more when they are not. Collective.
    pub fn forward_packed(
        &self,
        group: &Group,
        kind: &'static str,
        local: RowSource,
    ) -> Array2<f32> {
        let (recv, total) = self.exchange_packed(group, kind, local);
        packed_rows::decode(recv, total, local.ncols(), &self.recv_pos)
    }

    /// [`RowExchange::forward_packed`], the rows left in their words for the caller to write
    /// where it wants them ([`PackedRows::write_row`]; row `i` is requested row `i`).
    /// Collective.
    pub fn forward_packed_rows(
        &self,
        group: &Group,
        kind: &'static str,
        local: RowSource,
    ) -> PackedRows {
        let (recv, total) = self.exchange_packed(group, kind, local);
        PackedRows::new(recv, total, local.ncols(), self.recv_pos.clone())
    }

    /// The packed words received and how many rows they hold.
    fn exchange_packed(
        &self,
        group: &Group,
        kind: &'static str,
        local: RowSource,
    ) -> (Vec<u32>, usize) {
        let (words, word_counts) =
            packed_rows::encode_from(local, &self.send_rows, &self.send_counts);
        let (recv, _) = group.alltoallv(kind, &words, &word_counts);
        (recv, self.recv_counts.iter().sum())
    }

    /// [`RowExchange::forward`] of rows on backend `be` (see the module doc). Collective.
    pub fn forward_on<B: Backend>(
        &self,
        group: &Group,
        be: &B,
        kind: &'static str,
        local: B::View<'_>,
    ) -> B::Mat {
        let recv = self.exchange_on(group, be, kind, local);
        be.gather_rows(be.view(&recv), &self.recv_pos)
    }

    /// The rows this rank sends, packed from `local` and exchanged: the received block, in
    /// rank order (wanted row `i` is its row `recv_pos[i]`). Collective.
    fn exchange_on<B: Backend>(
        &self,
        group: &Group,
        be: &B,
        kind: &'static str,
        local: B::View<'_>,
    ) -> B::Mat {
        let send = be.gather_rows(local, &self.send_rows);
        alltoallv_rows_on(group, be, kind, send, &self.send_counts, &self.recv_counts)
    }

    /// [`RowExchange::forward_on`] written into rows `dst_pos` of `dst` (wanted row `i` at
    /// `dst_pos[i]`, distinct): the received rows go straight to their places, with no matrix
    /// of them in between. Collective.
    pub fn forward_into_on<B: Backend>(
        &self,
        group: &Group,
        be: &B,
        kind: &'static str,
        local: B::View<'_>,
        dst: B::ViewMut<'_>,
        dst_pos: &[u32],
    ) {
        assert_eq!(
            dst_pos.len(),
            self.recv_pos.len(),
            "one place per wanted row"
        );
        let recv = self.exchange_on(group, be, kind, local);
        be.copy_rows(dst, dst_pos, be.view(&recv), &self.recv_pos);
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
        self.backward_on(group, &Cpu, kind, grads, local_grad.view_mut())
    }

    /// [`RowExchange::backward`] of rows on backend `be`. Duplicated wanted ids add up before
    /// they travel, and rows arrive in rank order and add up in that order: a fixed order, so
    /// the sums depend neither on timing nor on the backend. Collective.
    pub fn backward_on<B: Backend>(
        &self,
        group: &Group,
        be: &B,
        kind: &'static str,
        grads: B::View<'_>,
        local_grad: B::ViewMut<'_>,
    ) {
        let (rows, d) = be.dim(grads);
        assert_eq!(rows, self.recv_pos.len(), "one gradient row per wanted id");
        let total: usize = self.recv_counts.iter().sum();
        let mut send = be.zeros(total, d);
        be.scatter_add_rows(be.view_mut(&mut send), &self.recv_pos, grads);
        let recv = alltoallv_rows_on(group, be, kind, send, &self.recv_counts, &self.send_counts);
        be.scatter_add_rows(local_grad, &self.send_rows, be.view(&recv));
    }
}
