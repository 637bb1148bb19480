//! A block of the mini-batch on the device, and what its aggregations read.
//!
//! [`DevGraph`] owns the host [`Block`] (its shape, ids and degrees stay readable on the host)
//! and its CSR over destinations on the device: `indptr` as `u64` (`num_dst + 1` offsets, so
//! no edge count is too large) and `indices` as `u32` (source positions, as the block holds
//! them). [`DevTranspose`] is the block's edges grouped by source — `t_indptr` (`u64`,
//! `num_src + 1`), `t_dst` and `t_edge` (`u32`: each edge's destination and its position in
//! the block's CSR) — built on the host by `cpu::aggregate::BlockTranspose` (a counting sort,
//! edges of a source in increasing edge order) the first time a transposed aggregation needs
//! it, uploaded, and kept: full-batch training reuses one for every layer and step. The
//! transposed aggregations gather over it, one warp per source row, with no atomics, so they
//! are deterministic and bitwise the CPU's.
//!
//! [`DevWeights`] are [`EdgeWeights`] uploaded (per-edge weights, GCN's factors).

use std::sync::OnceLock;

use anyhow::Result;

use crate::backend::cpu::aggregate::{BlockTranspose, EdgeWeights};
use crate::backend::cuda::gpu::Device;
use crate::backend::cuda::mat::DevVec;
use crate::sample::Block;

/// A block on the device.
#[derive(Debug)]
pub struct DevGraph {
    block: Block,
    /// `num_dst + 1` edge offsets.
    pub indptr: DevVec<u64>,
    /// Source position of each edge, in the block's CSR order.
    pub indices: DevVec<u32>,
    /// Built on first use by [`DevGraph::transpose`].
    own_transpose: DevTranspose,
}

impl DevGraph {
    /// Upload `block` (kept on the host too).
    ///
    /// # Panics
    /// If the block has `2^32` sources or more (its indices are `u32`).
    pub fn new(device: &Device, block: Block) -> Result<DevGraph> {
        assert!(
            block.num_src() <= u32::MAX as usize,
            "block has more than 2^32 sources"
        );
        Ok(DevGraph {
            indptr: DevVec::upload_offsets(device, &block.indptr)?,
            indices: DevVec::upload(device, &block.indices)?,
            block,
            own_transpose: DevTranspose::default(),
        })
    }

    /// [`DevGraph::new`] with a transpose the host already built (uploaded now).
    pub fn with_transpose(device: &Device, block: Block, t: &BlockTranspose) -> Result<DevGraph> {
        let g = DevGraph::new(device, block)?;
        let _ = g.own_transpose.0.set(DevBlockTranspose::upload(device, t)?);
        Ok(g)
    }

    /// A copy of `block` on the device, with its host transpose uploaded too when given
    /// (else built on first use).
    pub fn from_block(
        device: &Device,
        block: &Block,
        transpose: Option<&BlockTranspose>,
    ) -> Result<DevGraph> {
        match transpose {
            Some(t) => DevGraph::with_transpose(device, block.clone(), t),
            None => DevGraph::new(device, block.clone()),
        }
    }

    /// The host block.
    pub fn block(&self) -> &Block {
        &self.block
    }

    pub fn num_dst(&self) -> usize {
        self.block.num_dst
    }

    pub fn num_src(&self) -> usize {
        self.block.num_src()
    }

    pub fn num_edges(&self) -> usize {
        self.block.num_edges()
    }

    /// The device this graph lives on.
    pub fn device(&self) -> &Device {
        self.indptr.device()
    }

    /// This graph's own transpose, built and uploaded on first use.
    pub fn transpose(&self) -> Result<&DevBlockTranspose> {
        self.own_transpose.get(self)
    }
}

/// The transposed CSR on the device (see the module doc).
#[derive(Debug)]
pub struct DevBlockTranspose {
    /// `num_src + 1` offsets into `dst` / `edge`.
    pub indptr: DevVec<u64>,
    /// Destination of each transposed edge.
    pub dst: DevVec<u32>,
    /// The transposed edge's position in the block's CSR order.
    pub edge: DevVec<u32>,
}

impl DevBlockTranspose {
    /// Upload a host transpose.
    pub fn upload(device: &Device, t: &BlockTranspose) -> Result<DevBlockTranspose> {
        Ok(DevBlockTranspose {
            indptr: DevVec::upload_offsets(device, &t.indptr)?,
            dst: DevVec::upload(device, &t.dst)?,
            edge: DevVec::upload(device, &t.edge)?,
        })
    }

    /// Build from `g`'s host block and upload.
    pub fn build(g: &DevGraph) -> Result<DevBlockTranspose> {
        DevBlockTranspose::upload(g.device(), &BlockTranspose::new(g.block()))
    }
}

/// A transpose built on first use and then kept (`cpu::aggregate::LazyTranspose` on the
/// device): pass the same graph at every call.
#[derive(Debug, Default)]
pub struct DevTranspose(OnceLock<DevBlockTranspose>);

impl DevTranspose {
    /// The transpose of `g`, built and uploaded the first time.
    pub fn get(&self, g: &DevGraph) -> Result<&DevBlockTranspose> {
        if let Some(t) = self.0.get() {
            return Ok(t);
        }
        let t = DevBlockTranspose::build(g)?;
        // Another thread may have set it meanwhile: either is the same transpose.
        let _ = self.0.set(t);
        Ok(self.0.get().expect("just set"))
    }

    /// `t` uploaded now (it is the transpose of the graph every later call passes).
    pub fn uploaded(device: &Device, t: &BlockTranspose) -> Result<DevTranspose> {
        Ok(DevTranspose(OnceLock::from(DevBlockTranspose::upload(
            device, t,
        )?)))
    }

    /// Whether it was built already.
    pub fn is_built(&self) -> bool {
        self.0.get().is_some()
    }
}

/// [`EdgeWeights`] on the device.
#[derive(Debug)]
pub enum DevWeights {
    /// Weight 1.
    Sum,
    /// `1 / in_degree` of the destination.
    Mean,
    /// One weight per edge, in the block's CSR order.
    PerEdge(DevVec<f32>),
    /// Edge `u → v` weighs `dst[v]·src[u]` (GCN's normalisation, `GcnNorm::weights`).
    Factored { src: DevVec<f32>, dst: DevVec<f32> },
}

impl DevWeights {
    /// Upload `w`'s arrays.
    pub fn upload(device: &Device, w: EdgeWeights) -> Result<DevWeights> {
        Ok(match w {
            EdgeWeights::Sum => DevWeights::Sum,
            EdgeWeights::Mean => DevWeights::Mean,
            EdgeWeights::PerEdge(w) => DevWeights::PerEdge(DevVec::upload(device, w)?),
            EdgeWeights::Factored { src, dst } => DevWeights::Factored {
                src: DevVec::upload(device, src)?,
                dst: DevVec::upload(device, dst)?,
            },
        })
    }

    /// The kernels' mode (0 sum, 1 mean, 2 per edge, 3 factored).
    pub(crate) fn mode(&self) -> usize {
        match self {
            DevWeights::Sum => 0,
            DevWeights::Mean => 1,
            DevWeights::PerEdge(_) => 2,
            DevWeights::Factored { .. } => 3,
        }
    }

    /// Panic unless the arrays fit `g`.
    pub(crate) fn check(&self, g: &DevGraph) {
        match self {
            DevWeights::PerEdge(w) => {
                assert_eq!(w.len(), g.num_edges(), "aggregate: one weight per edge")
            }
            DevWeights::Factored { src, dst } => {
                assert!(src.len() >= g.num_src(), "aggregate: one factor per source");
                assert!(
                    dst.len() >= g.num_dst(),
                    "aggregate: one factor per destination"
                );
            }
            _ => {}
        }
    }
}
