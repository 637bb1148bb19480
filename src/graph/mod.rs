//! Graphs and datasets in memory, and their HDF5 files.
//!
//! A [`Dataset`] is either a whole graph (`first_node == 0`, every vertex present) or one part
//! of a partitioned graph: the rows of vertices `[first_node, first_node + local_nodes)`, whose
//! neighbour ids are global (ARCHITECTURE invariant 1, contiguous ownership).

pub mod csr;
pub mod export;
pub mod export_npz;
pub mod format;
pub mod generate;
pub mod identity;
pub mod import;
pub mod parts;
pub mod summary;

pub use csr::Csr;

use ndarray::Array2;

/// A vertex id. gnnpar keeps ids in 32 bits in memory (half the memory of 64-bit ids on the
/// edge arrays); graphs of 2^32 vertices or more are refused with a clear message.
pub type NodeId = u32;

/// Node labels: one class per node, or a 0/1 matrix for multi-label tasks.
#[derive(Clone, Debug, PartialEq)]
pub enum Labels {
    /// `labels[v]` in `[0, num_classes)`.
    Class(Vec<i64>),
    /// `labels[[v, c]]` in {0, 1}.
    Multi(Array2<i64>),
}

impl Labels {
    /// Number of labelled rows.
    pub fn len(&self) -> usize {
        match self {
            Labels::Class(v) => v.len(),
            Labels::Multi(m) => m.nrows(),
        }
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Training, validation and test vertex ids (global ids, sorted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Splits {
    pub train: Vec<NodeId>,
    pub val: Vec<NodeId>,
    pub test: Vec<NodeId>,
}

/// A graph with optional features, labels and splits: a whole dataset or one owned part.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Human name (file stem of the source by default).
    pub name: String,
    /// Number of vertices of the whole graph.
    pub num_nodes: u64,
    /// First global vertex id held here (0 for a whole dataset).
    pub first_node: u64,
    /// Out-adjacency of the held vertices; column ids are global.
    pub graph: Csr,
    /// Feature rows of the held vertices (`None`: structure-only graph).
    pub features: Option<Array2<f32>>,
    /// Labels of the held vertices (`None`: unlabelled graph).
    pub labels: Option<Labels>,
    /// Number of classes (0 when unlabelled).
    pub num_classes: usize,
    /// Split vertex ids, global, restricted to held vertices.
    pub splits: Splits,
    /// False when every edge has its reverse (an undirected graph stored both ways).
    pub directed: bool,
}

impl Dataset {
    /// Number of vertices held here.
    pub fn local_nodes(&self) -> usize {
        self.graph.num_rows()
    }

    /// Number of edges held here (each direction counts once).
    pub fn local_edges(&self) -> u64 {
        self.graph.num_edges()
    }

    /// Feature width (0 without features).
    pub fn feature_dim(&self) -> usize {
        self.features.as_ref().map_or(0, |f| f.ncols())
    }

    /// Is this the whole graph rather than one part of it?
    pub fn is_whole(&self) -> bool {
        self.first_node == 0 && self.local_nodes() as u64 == self.num_nodes
    }
}
