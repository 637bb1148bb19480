//! Compressed sparse rows: `indices[indptr[v]..indptr[v+1]]` are the neighbours of row `v`.

use super::NodeId;
use anyhow::{bail, Result};

/// A CSR adjacency. Rows are local (0-based over the held vertices); column ids are global.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Csr {
    pub indptr: Vec<u64>,
    pub indices: Vec<NodeId>,
}

impl Csr {
    /// An empty CSR with `rows` rows.
    pub fn empty(rows: usize) -> Self {
        Csr {
            indptr: vec![0; rows + 1],
            indices: Vec::new(),
        }
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.indptr.len().saturating_sub(1)
    }

    /// Bytes of its row offsets and neighbour ids, what a walk of it reads.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.indptr.as_slice())
            + std::mem::size_of_val(self.indices.as_slice())
    }

    /// Number of stored edges.
    pub fn num_edges(&self) -> u64 {
        self.indices.len() as u64
    }

    /// Neighbours of local row `row`.
    #[inline]
    pub fn neighbors(&self, row: usize) -> &[NodeId] {
        &self.indices[self.indptr[row] as usize..self.indptr[row + 1] as usize]
    }

    /// Degree of local row `row`.
    #[inline]
    pub fn degree(&self, row: usize) -> usize {
        (self.indptr[row + 1] - self.indptr[row]) as usize
    }

    /// Build from (src, dst) pairs over `rows` rows (src local, dst global); neighbour lists
    /// keep the order of the input. Counting sort: two passes, no per-edge allocation.
    pub fn from_edges(rows: usize, src: &[NodeId], dst: &[NodeId]) -> Self {
        assert_eq!(src.len(), dst.len());
        let mut indptr = vec![0u64; rows + 1];
        for &s in src {
            indptr[s as usize + 1] += 1;
        }
        for i in 0..rows {
            indptr[i + 1] += indptr[i];
        }
        let mut next: Vec<u64> = indptr[..rows].to_vec();
        let mut indices = vec![0 as NodeId; src.len()];
        for (&s, &d) in src.iter().zip(dst) {
            let slot = &mut next[s as usize];
            indices[*slot as usize] = d;
            *slot += 1;
        }
        Csr { indptr, indices }
    }

    /// Sort every neighbour list (makes comparisons and duplicate removal easy).
    pub fn sort_rows(&mut self) {
        use rayon::prelude::*;
        let indptr = &self.indptr;
        let mut rows: Vec<&mut [NodeId]> = Vec::with_capacity(self.num_rows());
        let mut rest: &mut [NodeId] = &mut self.indices;
        for r in 0..indptr.len().saturating_sub(1) {
            let len = (indptr[r + 1] - indptr[r]) as usize;
            let (head, tail) = rest.split_at_mut(len);
            rows.push(head);
            rest = tail;
        }
        rows.par_iter_mut().for_each(|r| r.sort_unstable());
    }

    /// Check the structure: `indptr` starts at 0, never decreases, ends at the edge count,
    /// and every column id is below `num_cols`. `what` names the source in errors.
    pub fn validate(&self, num_cols: u64, what: &str) -> Result<()> {
        if self.indptr.is_empty() {
            bail!("{what}: `indptr` is empty (expected rows + 1 entries)");
        }
        if self.indptr[0] != 0 {
            bail!("{what}: `indptr[0]` is {}, expected 0", self.indptr[0]);
        }
        for (i, w) in self.indptr.windows(2).enumerate() {
            if w[1] < w[0] {
                bail!(
                    "{what}: `indptr` decreases at row {i} ({} > {})",
                    w[0],
                    w[1]
                );
            }
        }
        let last = *self.indptr.last().unwrap_or(&0);
        if last != self.indices.len() as u64 {
            bail!(
                "{what}: `indptr` ends at {last} but `indices` has {} entries",
                self.indices.len()
            );
        }
        if let Some((i, &v)) = self
            .indices
            .iter()
            .enumerate()
            .find(|(_, &v)| v as u64 >= num_cols)
        {
            bail!("{what}: `indices[{i}]` = {v} is out of range (graph has {num_cols} vertices)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_edges_groups_by_source_in_input_order() {
        let csr = Csr::from_edges(3, &[2, 0, 2, 1], &[0, 1, 1, 2]);
        assert_eq!(csr.indptr, vec![0, 1, 2, 4]);
        assert_eq!(csr.neighbors(2), &[0, 1]);
        assert_eq!(csr.neighbors(0), &[1]);
        csr.validate(3, "test").unwrap();
    }

    #[test]
    fn validate_names_the_bad_entry() {
        let csr = Csr {
            indptr: vec![0, 2],
            indices: vec![0, 9],
        };
        let err = csr.validate(3, "g").unwrap_err().to_string();
        assert!(err.contains("indices[1]"), "{err}");
    }
}
