//! Softmax over segments (the in-edges of each destination, per attention head) and row-wise
//! log-softmax.
//!
//! Segment data is edge-major: `scores[e * heads + h]` for edge `e` in the block's CSR order,
//! so the edges of destination `i` are the contiguous range `indptr[i]..indptr[i + 1]`.

use rayon::prelude::*;

/// Run `f(segments, data)` in parallel over groups of consecutive segments (`segments` is a
/// range of segment indices), where `data` is the part of `data` that holds those segments (`stride` values per item, items of segment
/// `i` at `indptr[i]..indptr[i + 1]`). Group boundaries depend only on `indptr`.
pub(crate) fn par_segment_groups<F>(data: &mut [f32], indptr: &[usize], stride: usize, f: F)
where
    F: Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
{
    let segments = indptr.len().saturating_sub(1);
    let items = indptr.last().copied().unwrap_or(0);
    assert_eq!(data.len(), items * stride, "segment data length");
    let per_group = super::rows_per_task((items / segments.max(1) + 1) * stride * 8);
    let mut groups = Vec::with_capacity(segments.div_ceil(per_group.max(1)));
    let mut rest = data;
    let mut first = 0;
    while first < segments {
        let last = (first + per_group).min(segments);
        let len = (indptr[last] - indptr[first]) * stride;
        let (head, tail) = rest.split_at_mut(len);
        groups.push((first..last, head));
        rest = tail;
        first = last;
    }
    groups.into_par_iter().for_each(|(segs, d)| f(segs, d));
}

/// Softmax in place within each segment, independently per head. Empty segments are skipped.
pub fn segment_softmax_in_place(scores: &mut [f32], indptr: &[usize], heads: usize) {
    par_segment_groups(scores, indptr, heads, |segs, data| {
        let base = indptr[segs.start];
        for i in segs {
            let seg = &mut data[(indptr[i] - base) * heads..(indptr[i + 1] - base) * heads];
            softmax_segment(seg, heads);
        }
    });
}

/// Softmax of one segment (`len × heads`, edge-major), per head.
#[inline]
pub(crate) fn softmax_segment(seg: &mut [f32], heads: usize) {
    if seg.is_empty() {
        return;
    }
    for h in 0..heads {
        let max = seg[h..]
            .iter()
            .step_by(heads)
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f32;
        for v in seg[h..].iter_mut().step_by(heads) {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in seg[h..].iter_mut().step_by(heads) {
            *v *= inv;
        }
    }
}

/// Backward of a segment softmax: given `alpha` (the softmax) and `grad` (d loss / d alpha),
/// overwrite `grad` with d loss / d scores = `alpha ⊙ (grad − Σ_segment alpha ⊙ grad)`.
pub fn segment_softmax_backward_in_place(
    alpha: &[f32],
    grad: &mut [f32],
    indptr: &[usize],
    heads: usize,
) {
    assert_eq!(alpha.len(), grad.len(), "softmax backward: lengths differ");
    par_segment_groups(grad, indptr, heads, |segs, data| {
        let base = indptr[segs.start];
        for i in segs {
            let (lo, hi) = ((indptr[i] - base) * heads, (indptr[i + 1] - base) * heads);
            let abs = indptr[i] * heads;
            softmax_segment_backward(&alpha[abs..abs + hi - lo], &mut data[lo..hi], heads);
        }
    });
}

#[inline]
pub(crate) fn softmax_segment_backward(alpha: &[f32], grad: &mut [f32], heads: usize) {
    if grad.is_empty() {
        return;
    }
    for h in 0..heads {
        let dot: f32 = alpha[h..]
            .iter()
            .step_by(heads)
            .zip(grad[h..].iter().step_by(heads))
            .map(|(a, g)| a * g)
            .sum();
        for (g, &a) in grad[h..]
            .iter_mut()
            .step_by(heads)
            .zip(alpha[h..].iter().step_by(heads))
        {
            *g = a * (*g - dot);
        }
    }
}

/// Log-softmax of one row in place: the row becomes `x − logsumexp(x)`.
#[inline]
pub fn log_softmax_row(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    // Subtract the max first: `x − (max + ln Σ)` would lose the low bits for large logits.
    let log_sum = row.iter().map(|&v| (v - max).exp()).sum::<f32>().ln();
    row.iter_mut().for_each(|v| *v = (*v - max) - log_sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_sum_to_one_per_head_and_empty_segments_are_fine() {
        // 3 segments: 2 edges, 0 edges, 3 edges; 2 heads.
        let indptr = [0usize, 2, 2, 5];
        let mut s = vec![1.0, 0.0, 2.0, 0.0, -1.0, 5.0, 0.0, 5.0, 1.0, 5.0];
        segment_softmax_in_place(&mut s, &indptr, 2);
        let e = (1f32).exp();
        assert!((s[0] - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((s[1] - 0.5).abs() < 1e-6);
        for h in 0..2 {
            let total: f32 = (2..5).map(|e| s[e * 2 + h]).sum();
            assert!((total - 1.0).abs() < 1e-6);
        }
        assert!((s[5] - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn log_softmax_exponentiates_to_a_distribution() {
        let mut r = [1000.0f32, 1001.0, 999.0];
        log_softmax_row(&mut r);
        let total: f32 = r.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(r[1] > r[0] && r[0] > r[2]);
    }
}
