//! Exact full-graph inference over a partitioned graph, layer by layer: every rank computes
//! the next representation of the vertices it owns, after fetching the previous
//! representation of its halo (remote in-neighbours) along one fixed [`RowExchange`].

use super::plan::RowExchange;
use crate::backend::{Backend, CowMat};
use crate::comm::Group;
use crate::graph::{Dataset, NodeId};
use crate::nn::{DropoutCtx, Model};
use crate::sample::Block;
use std::collections::HashMap;

/// The local block of full-graph inference (destinations = owned vertices, sources = owned
/// vertices then the halo) and the exchange that fills the halo rows.
pub struct HaloPlan {
    pub block: Block,
    pub halo: RowExchange,
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
        }
    }

    /// `h` (the owned rows) followed by the halo's rows of the same layer, fetched from their
    /// owners ([`RowExchange::forward_on`]: only the rows that move leave the backend; without
    /// a halo, `h` itself). Collective.
    pub fn with_halo<'h, B: Backend>(
        &self,
        group: &Group,
        be: &B,
        h: B::View<'h>,
        tag: &'static str,
    ) -> CowMat<'h, B> {
        // One rank owns every vertex: no halo, and nothing to fetch.
        if group.size() == 1 {
            return CowMat::Borrowed(h);
        }
        let remote = self.halo.forward_on(group, be, tag, h);
        if be.mat_dim(&remote).0 == 0 {
            return CowMat::Borrowed(h);
        }
        CowMat::Owned(be.concat_rows(h, be.view(&remote)))
    }

    /// Logits of the owned vertices: the model applied layer by layer, without dropout, on
    /// the model's backend (`graph`: [`HaloPlan::block`] on that backend).
    /// `gcn_degrees`: see [`DropoutCtx::gcn_degrees`]. Collective.
    pub fn infer<B: Backend>(
        &self,
        group: &Group,
        model: &Model<B>,
        graph: &B::Graph,
        own_features: B::View<'_>,
        gcn_degrees: Option<&[u32]>,
    ) -> B::Mat {
        self.infer_from(group, model, graph, 0, own_features, gcn_degrees)
    }

    /// [`HaloPlan::infer`] from layer `first` on: `input` holds the owned rows of that layer's
    /// input (the features when `first` is 0, else the output of the layer below, computed by
    /// the caller). Collective.
    pub fn infer_from<B: Backend>(
        &self,
        group: &Group,
        model: &Model<B>,
        graph: &B::Graph,
        first: usize,
        input: B::View<'_>,
        gcn_degrees: Option<&[u32]>,
    ) -> B::Mat {
        let be = model.params.backend();
        let ctx = DropoutCtx {
            gcn_degrees,
            ..DropoutCtx::inference()
        };
        // The first layer reads the features where they are: no copy of them (424 MB on
        // Facebook) beside the model's activations.
        let mut h: Option<B::Mat> = None;
        for layer in &model.layers[first..] {
            let apply = |rows: B::View<'_>| {
                let h_src = self.with_halo(group, be, rows, "eval_halo_rows");
                layer.forward(&model.params, graph, h_src.view(be), &ctx).0
            };
            h = Some(match &h {
                None => apply(input),
                Some(m) => apply(be.view(m)),
            });
        }
        h.unwrap_or_else(|| be.to_owned(input))
    }
}
