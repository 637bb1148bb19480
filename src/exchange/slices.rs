//! The collectives of feature-sliced training (NFP): every rank's input block to every rank,
//! partial rows summed at the rank they belong to (a reduce-scatter), and one rank's rows to
//! every rank (an allgather), the rows on any backend. Built on the row all-to-all of
//! [`super::plan`], so bytes and seconds are counted per kind like every other exchange, and a
//! CUDA-aware MPI moves device rows directly.

use super::plan::alltoallv_rows_on;
use crate::backend::Backend;
use crate::comm::Group;
use crate::sample::Block;

/// Every rank's `block` on every rank, in rank order. Sent as `u32`s: the destination and
/// source counts, each destination's in-degree, the source ids, the edges' source positions.
/// Collective.
///
/// # Panics
/// If a count exceeds `u32` (a block of more than 4 billion sources or edges).
pub fn allgather_blocks(group: &Group, kind: &'static str, block: &Block) -> Vec<Block> {
    let u32_of = |n: usize| u32::try_from(n).expect("block size fits in u32");
    let mut mine = Vec::with_capacity(2 + block.num_dst + block.num_src() + block.num_edges());
    mine.push(u32_of(block.num_dst));
    mine.push(u32_of(block.num_src()));
    mine.extend(block.indptr.windows(2).map(|w| u32_of(w[1] - w[0])));
    mine.extend_from_slice(&block.src_nodes);
    mine.extend_from_slice(&block.indices);
    let (all, counts) = group.allgatherv(kind, &mine);
    let mut blocks = Vec::with_capacity(counts.len());
    let mut at = 0;
    for count in counts {
        let words = &all[at..at + count];
        at += count;
        let (num_dst, num_src) = (words[0] as usize, words[1] as usize);
        let degrees = &words[2..2 + num_dst];
        let mut indptr = Vec::with_capacity(num_dst + 1);
        indptr.push(0usize);
        for &d in degrees {
            indptr.push(indptr[indptr.len() - 1] + d as usize);
        }
        let src_start = 2 + num_dst;
        blocks.push(Block {
            num_dst,
            src_nodes: words[src_start..src_start + num_src].to_vec(),
            indptr,
            indices: words[src_start + num_src..].to_vec(),
        });
    }
    blocks
}

/// The rows `0..rows` repeated `times` times: gather/scatter indices that stack or sum
/// `times` copies of a matrix of `rows` rows.
fn repeated(rows: usize, times: usize) -> Vec<u32> {
    (0..times).flat_map(|_| 0..rows as u32).collect()
}

/// Reduce-scatter of partial rows: `send` holds this rank's partial rows for every rank,
/// grouped by rank (`counts[q]` rows for rank `q`, one per row of `q`'s result); each rank
/// sums what every rank sent it, in rank order (a fixed order: the sum depends neither on
/// timing nor on the backend). Returns this rank's `rows`-row sum. Collective; every rank's
/// `counts[q]` must equal rank `q`'s `rows` (both come from the same allgathered blocks).
pub fn reduce_scatter_rows<B: Backend>(
    group: &Group,
    be: &B,
    kind: &'static str,
    send: B::Mat,
    counts: &[usize],
    rows: usize,
) -> B::Mat {
    let cols = be.mat_dim(&send).1;
    let ranks = group.size();
    let recv = alltoallv_rows_on(group, be, kind, send, counts, &vec![rows; ranks]);
    let mut sum = be.zeros(rows, cols);
    be.scatter_add_rows(
        be.view_mut(&mut sum),
        &repeated(rows, ranks),
        be.view(&recv),
    );
    sum
}

/// Allgather of rows: this rank's `mine` goes to every rank; returns every rank's rows
/// stacked in rank order (`counts[q]` rows from rank `q`). Collective.
pub fn allgather_rows<B: Backend>(
    group: &Group,
    be: &B,
    kind: &'static str,
    mine: B::View<'_>,
    counts: &[usize],
) -> B::Mat {
    let (rows, _) = be.dim(mine);
    let ranks = group.size();
    let send = be.gather_rows(mine, &repeated(rows, ranks));
    alltoallv_rows_on(group, be, kind, send, &vec![rows; ranks], counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Cpu;
    use crate::comm::World;
    use ndarray::array;

    #[test]
    fn one_rank_gets_its_own_block_and_rows_back() {
        let world = World::solo();
        let block = Block {
            num_dst: 2,
            src_nodes: vec![7, 3, 9],
            indptr: vec![0, 2, 3],
            indices: vec![1, 2, 0],
        };
        let blocks = allgather_blocks(&world, "test_blocks", &block);
        assert_eq!(blocks, vec![block]);
        let be = Cpu;
        let p = array![[1.0f32, 2.0], [3.0, 4.0]];
        let sum = reduce_scatter_rows(&world, &be, "test_rows", p.clone(), &[2], 2);
        assert_eq!(sum, p);
        let all = allgather_rows(&world, &be, "test_rows", p.view(), &[2]);
        assert_eq!(all, p);
    }
}
