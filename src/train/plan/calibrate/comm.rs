//! Points of the communication operators: the collectives over the world, a node and its
//! leaders, the row exchanges and partial sums the strategies run, and host-device copies.

use super::{time_point, MESSAGE_BYTES};
use crate::backend::Backend;
use crate::comm::{Group, World};
use crate::exchange::plan::alltoallv_rows_on;
use crate::exchange::RowExchange;
use crate::graph::NodeId;
use ndarray::Array2;

/// Points of a collective over `group` (when this rank is in it) for every message size;
/// ranks outside the group take part in the timing's barrier and maximum only. `prepare`
/// makes a point's buffers before its timed runs: a step's collectives run on buffers it
/// already holds (the gradients, the rows it sends), so making them is not the operator's
/// time. On the 2-core Zen 3 VM a 16 MiB allreduce that made its buffer (`vec!`, as the
/// points were timed before format 33) took 6.8-8.0 ms where the same call on a held buffer
/// took 5.1-6.4 (medians of 9 interleaved runs, six sweeps); at 4 MiB and below the two were
/// within a run's noise.
pub(super) fn comm_points<S>(
    world: &World,
    group: Option<&Group>,
    prepare: impl Fn(&Group, usize) -> S,
    op: impl Fn(&Group, &mut S),
) -> Vec<[f64; 2]> {
    MESSAGE_BYTES
        .iter()
        .map(|&bytes| {
            let mut state = group.map(|g| prepare(g, bytes));
            let s = time_point(world, || {
                if let (Some(g), Some(state)) = (group, state.as_mut()) {
                    op(g, state)
                }
            });
            [bytes as f64, s]
        })
        .collect()
}

/// Points of the `alltoallv` operators over `group` (when this rank is in it), rows of
/// `width` columns: a row
/// exchange as the strategies run theirs, planned for the batch at hand ([`RowExchange::new`]:
/// the wanted ids to their owners), made ([`RowExchange::forward`]: rows packed by id on their
/// owners, exchanged, and placed in the order asked for) and reversed
/// ([`RowExchange::backward`]: the gradients summed per row, sent back and added into the
/// owners' rows), where every rank receives `bytes` of rows in all, evenly from the other
/// ranks, ids spread over the owners' rows; half the time is one call's. A bare alltoallv of
/// one ready buffer measured 3-4× faster per byte on the 2-core VM than the exchanges inside
/// training steps, whose shuffles and fetches this operator prices.
pub(super) fn row_exchange_points(
    world: &World,
    group: Option<&Group>,
    width: usize,
) -> Vec<[f64; 2]> {
    let prepare = |g: &Group, bytes: usize| {
        let (ranks, peers) = (g.size(), g.size().saturating_sub(1).max(1));
        let wanted_rows = (bytes / 4 / width).max(1);
        let held = 2 * wanted_rows;
        let offsets: Vec<u64> = (0..=ranks).map(|r| (r * held) as u64).collect();
        let wanted: Vec<NodeId> = (0..wanted_rows)
            .map(|i| {
                let owner = (g.rank() + 1 + i % peers) % ranks;
                let row = (i as u64 * 2_654_435_761) % held as u64;
                (offsets[owner] + row) as NodeId
            })
            .collect();
        (offsets, wanted, Array2::from_elem((held, width), 1.0f32))
    };
    let exchange =
        |g: &Group, (offsets, wanted, local): &mut (Vec<u64>, Vec<NodeId>, Array2<f32>)| {
            let plan = RowExchange::new(g, offsets, wanted);
            let rows = plan.forward(g, "calibrate", local.view());
            let mut grads = Array2::zeros(local.dim());
            plan.backward(g, "calibrate", rows.view(), &mut grads);
        };
    one_call_each(comm_points(world, group, prepare, exchange))
}

/// Points of operators timed as a call and its reverse (rows out, gradients back): half the
/// time is one call's.
fn one_call_each(points: Vec<[f64; 2]>) -> Vec<[f64; 2]> {
    points
        .into_iter()
        .map(|[bytes, s]| [bytes, s / 2.0])
        .collect()
}

/// Points of the `partial_sums` operators over `group` (when this rank is in it): partial
/// sums as SNP and NFP exchange theirs ([`alltoallv_rows_on`] on the backend): rows of 256
/// columns made ready on the backend, sent, and added into one destination row per peer's
/// row on receipt; backward, the destinations' gradients gathered back into one row per
/// partial and sent back. Every rank receives `bytes` in all, evenly from the other ranks;
/// half the time is one call's. No rows are packed or placed by id: at 4 MiB on the 2-core
/// EPYC VM this costs 0.5× a row exchange of the same bytes between 2 ranks, 0.35× among 4.
pub(super) fn partial_sums_points<B: Backend>(
    be: &B,
    world: &World,
    group: Option<&Group>,
) -> Vec<[f64; 2]> {
    const WIDTH: usize = 256;
    let prepare = |g: &Group, bytes: usize| {
        let peers = g.size().saturating_sub(1).max(1);
        let per_peer = (bytes / 4 / WIDTH / peers).max(1);
        let rows: Vec<usize> = (0..g.size())
            .map(|r| if r == g.rank() { 0 } else { per_peer })
            .collect();
        // Peer `p`'s `i`-th row adds into destination `i`, as SNP's virtual destinations are
        // grouped by owner, then by destination.
        let dst: Vec<u32> = (0..peers * per_peer)
            .map(|i| (i % per_peer) as u32)
            .collect();
        (rows, dst, per_peer)
    };
    let exchange = |g: &Group, (rows, dst, num_dst): &mut (Vec<usize>, Vec<u32>, usize)| {
        let ready = be.zeros(dst.len(), WIDTH);
        let received = alltoallv_rows_on(g, be, "calibrate", ready, rows, rows);
        let mut sums = be.zeros(*num_dst, WIDTH);
        be.scatter_add_rows(be.view_mut(&mut sums), dst, be.view(&received));
        let grads = be.gather_rows(be.view(&sums), dst);
        let back = alltoallv_rows_on(g, be, "calibrate", grads, rows, rows);
        // A one-row read waits for the device's queued work.
        let _ = be.download(be.rows(be.view(&back), 0..1));
    };
    one_call_each(comm_points(world, group, prepare, exchange))
}

/// The points of a collective operator over the world and over each rank's node
/// (`measure(Some(group))`, every rank at once): none on one rank, and the node's are the
/// world's where the node is the world. Collective over `world`.
pub(super) fn world_and_node(
    world: &World,
    mut measure: impl FnMut(Option<&Group>) -> Vec<[f64; 2]>,
) -> (Vec<[f64; 2]>, Vec<[f64; 2]>) {
    let node = world.node();
    let world_points = if world.size() > 1 {
        measure(Some(world))
    } else {
        vec![]
    };
    let node_points = if node.size() > 1 && node.size() < world.size() {
        measure(Some(node))
    } else if node.size() > 1 {
        world_points.clone() // the node is the world: the same points
    } else {
        vec![]
    };
    (world_points, node_points)
}

/// Host → device and device → host copies of growing matrices.
pub(super) fn copy_points<B: Backend>(be: &B, world: &World) -> (Vec<[f64; 2]>, Vec<[f64; 2]>) {
    let mut up = Vec::new();
    let mut down = Vec::new();
    for &bytes in MESSAGE_BYTES {
        let x = Array2::<f32>::ones((bytes / 4 / 256, 256));
        let s = time_point(world, || {
            let m = be.upload(x.view());
            // A one-row read waits for the copy (device work is queued).
            let _ = be.download(be.rows(be.view(&m), 0..1));
        });
        up.push([bytes as f64, s]);
        let m = be.upload(x.view());
        let s = time_point(world, || {
            let _ = be.download(be.view(&m));
        });
        down.push([bytes as f64, s]);
    }
    (up, down)
}
