//! Who holds what under SliceGCN: rank `i` of `p` reads feature columns
//! `[i·s, i·s + ⌈s·scale⌉)` clipped to the `d'` features (`s = ⌈d'/p⌉`), or with feature
//! fusion all `d'` columns, fused to `⌈s·scale⌉`; its GCN is `⌈hidden/p⌉` wide. And how many
//! parameters that gives a rank (the paper's Table III).

use anyhow::{bail, Result};
use std::ops::Range;

/// The shape of one rank's share of a SliceGCN model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceLayout {
    pub rank: usize,
    pub ranks: usize,
    /// Input features of the dataset (`d'`).
    pub features: usize,
    /// Columns this rank reads: its slice under direct slicing, all of them with fusion.
    pub read_cols: Range<usize>,
    /// Width of the rank's GCN input: its slice, or the fused width.
    pub gcn_in: usize,
    /// Width of every rank's GCN (`⌈hidden/p⌉`): its hidden layers and its output.
    pub width: usize,
    /// Feature fusion (a shared 2-layer MLP `d' → hidden → gcn_in`) instead of direct slicing.
    pub fusion: bool,
}

impl SliceLayout {
    /// Rank `rank` of `ranks` over `features` input columns.
    pub fn new(
        rank: usize,
        ranks: usize,
        features: usize,
        hidden: usize,
        scale: f64,
        fusion: bool,
    ) -> Result<SliceLayout> {
        if features == 0 {
            bail!("slicegcn: the dataset has no feature columns to slice");
        }
        let s = features.div_ceil(ranks);
        let wide = ((s as f64 * scale).ceil() as usize).max(1);
        let (read_cols, gcn_in) = if fusion {
            (0..features, wide)
        } else {
            let start = (rank * s).min(features);
            let end = (start + wide).min(features);
            if start >= end {
                bail!(
                    "slicegcn: rank {rank} of {ranks} gets no feature column (the dataset has \
                     {features} features, slices of {s}); use fewer ranks, a larger \
                     --slice-size-scale, or --feature-fusion on"
                );
            }
            (start..end, end - start)
        };
        Ok(SliceLayout {
            rank,
            ranks,
            features,
            read_cols,
            gcn_in,
            width: hidden.div_ceil(ranks),
            fusion,
        })
    }

    /// Width of the gathered slice outputs, the classifier's input (`p · width`).
    pub fn gathered(&self) -> usize {
        self.ranks * self.width
    }
}

/// Parameters of one rank of a SliceGCN of `layers` plain GCN layers (no residual, norm or
/// input projection), a classifier `p·w → hidden → classes`, and the options: the paper's
/// Table III, from the layout. Returns (the rank's own GCN, the shared parts).
///
/// GCN: `gcn_in·w + w` for the first layer, `w·w + w` for each other (`w = ⌈hidden/p⌉`), so
/// the hidden layers shrink as `1/p²`; shared: the classifier `(p·w)·hidden + hidden +
/// hidden·classes + classes`, the encoding `p·w`, fusion `d'·hidden + hidden + hidden·f + f`.
pub fn param_counts(
    layout: &SliceLayout,
    layers: usize,
    hidden: usize,
    classes: usize,
    encoding: bool,
) -> (usize, usize) {
    let w = layout.width;
    let gcn = layout.gcn_in * w + w + (layers - 1) * (w * w + w);
    let head = layout.gathered() * hidden + hidden + hidden * classes + classes;
    let enc = if encoding { layout.gathered() } else { 0 };
    let f = layout.gcn_in;
    let fusion = if layout.fusion {
        layout.features * hidden + hidden + hidden * f + f
    } else {
        0
    };
    (gcn, head + enc + fusion)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_columns_and_clip_the_last() {
        let cols: Vec<_> = (0..3)
            .map(|r| {
                SliceLayout::new(r, 3, 7, 128, 1.0, false)
                    .unwrap()
                    .read_cols
            })
            .collect();
        assert_eq!(cols, [0..3, 3..6, 6..7]);
        let l = SliceLayout::new(1, 2, 10, 128, 1.5, false).unwrap();
        assert_eq!((l.read_cols.clone(), l.gcn_in, l.width), (5..10, 5, 64));
        let l = SliceLayout::new(0, 2, 10, 128, 1.5, false).unwrap();
        assert_eq!(l.read_cols, 0..8);
        let f = SliceLayout::new(2, 3, 7, 128, 1.0, true).unwrap();
        assert_eq!((f.read_cols, f.gcn_in, f.width), (0..7, 3, 43));
    }

    #[test]
    fn a_rank_without_columns_is_refused_with_the_counts() {
        let err = SliceLayout::new(4, 5, 4, 8, 1.0, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 4 of 5") && err.contains("4 features"),
            "{err}"
        );
    }
}
