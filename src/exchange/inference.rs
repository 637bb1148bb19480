//! Exact full-graph inference over a partitioned graph, layer by layer: every rank computes
//! the next representation of the vertices it owns, after fetching the previous
//! representation of its halo (remote in-neighbours) along one fixed [`RowExchange`].

use super::plan::RowExchange;
use crate::backend::cpu::sparse::SparseRows;
use crate::comm::Group;
use crate::graph::{Dataset, NodeId};
use crate::nn::{DropoutCtx, Model};
use crate::sample::Block;
use ndarray::{concatenate, Array2, Axis, CowArray};
use std::collections::HashMap;
use std::sync::OnceLock;

/// The local block of full-graph inference (destinations = owned vertices, sources = owned
/// vertices then the halo) and the exchange that fills the halo rows.
pub struct HaloPlan {
    pub block: Block,
    pub halo: RowExchange,
    /// Full-batch training: the first layer's source rows (own then halo features), fetched
    /// on the first step and kept, since input features never change between epochs.
    pub input: OnceLock<FullInput>,
}

/// The first layer's input rows of full-batch training.
#[derive(Debug)]
pub enum FullInput {
    Dense(Array2<f32>),
    /// Mostly-zero rows (bag-of-words features): the first layer multiplies the non-zeros.
    Sparse(SparseRows),
}

impl HaloPlan {
    /// Build the plan for this rank's part (`part.first_node ..`). Collective.
    pub fn new(group: &Group, part: &Dataset, offsets: &[u64], self_loops: bool) -> HaloPlan {
        let own = part.local_nodes();
        let first = part.first_node;
        let mut halo_ids: Vec<NodeId> = Vec::new();
        let mut halo_slot: HashMap<NodeId, u32> = HashMap::new();
        let mut indptr = Vec::with_capacity(own + 1);
        let mut indices = Vec::with_capacity(part.graph.indices.len() + own);
        indptr.push(0usize);
        for r in 0..own {
            for &v in part.graph.neighbors(r) {
                let local = if (v as u64) >= first && (v as u64) < first + own as u64 {
                    (v as u64 - first) as u32
                } else {
                    *halo_slot.entry(v).or_insert_with(|| {
                        halo_ids.push(v);
                        (own + halo_ids.len() - 1) as u32
                    })
                };
                indices.push(local);
            }
            if self_loops {
                indices.push(r as u32);
            }
            indptr.push(indices.len());
        }
        let mut src_nodes: Vec<NodeId> = (first..first + own as u64).map(|v| v as NodeId).collect();
        src_nodes.extend_from_slice(&halo_ids);
        let halo = RowExchange::new(group, offsets, &halo_ids);
        HaloPlan {
            block: Block {
                num_dst: own,
                src_nodes,
                indptr,
                indices,
            },
            halo,
            input: OnceLock::new(),
        }
    }

    /// Logits of the owned vertices: the model applied layer by layer, without dropout.
    /// `gcn_degrees`: see [`DropoutCtx::gcn_degrees`]. Collective.
    pub fn infer(
        &self,
        group: &Group,
        model: &Model,
        own_features: &Array2<f32>,
        gcn_degrees: Option<&[u32]>,
    ) -> Array2<f32> {
        let ctx = DropoutCtx {
            gcn_degrees,
            ..DropoutCtx::eval()
        };
        let mut h = own_features.clone();
        for layer in &model.layers {
            let remote = self.halo.forward(group, "eval_halo_rows", h.view());
            // One rank has no halo: read the owned rows in place.
            let h_src = if remote.nrows() == 0 {
                CowArray::from(h.view())
            } else {
                CowArray::from(
                    concatenate(Axis(0), &[h.view(), remote.view()]).expect("same feature width"),
                )
            };
            let (out, _) = layer.forward(&model.params, &self.block, h_src.view(), &ctx);
            h = out;
        }
        h
    }
}
