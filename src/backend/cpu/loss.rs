//! Losses on logits: softmax cross-entropy (one class per row) and binary cross-entropy with
//! logits (multi-label). Both return the SUM of the per-row (per-element) losses and its
//! gradient, so that ranks can add their sums and divide by the global count (ARCHITECTURE
//! invariant 4).

use anyhow::{bail, Result};
use ndarray::{Array2, ArrayView2, AsArray, Ix2};
use rayon::prelude::*;

use super::softmax::log_softmax_row;

/// Check that every label is a class index in `0..num_classes` (call once on load, so the loss
/// never meets a bad label).
pub fn check_labels(labels: &[i64], num_classes: usize) -> Result<()> {
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l < 0 || l as usize >= num_classes)
    {
        bail!("label {l} of row {i} is not a class in 0..{num_classes}");
    }
    Ok(())
}

/// Softmax cross-entropy: returns `(Σ_i −log softmax(logits_i)[labels_i], d sum / d logits)`.
///
/// # Panics
/// If the row counts differ or a label is out of range (see [`check_labels`]).
pub fn cross_entropy<'a>(logits: impl AsArray<'a, f32, Ix2>, labels: &[i64]) -> (f64, Array2<f32>) {
    let logits: ArrayView2<f32> = logits.into();
    let (n, c) = logits.dim();
    assert_eq!(n, labels.len(), "cross_entropy: one label per row");
    let mut grad = super::standard(logits).into_owned();
    if n == 0 {
        return (0.0, grad);
    }
    assert!(c > 0, "cross_entropy: no classes");
    let losses: Vec<f64> = grad
        .as_slice_mut()
        .unwrap()
        .par_chunks_mut(c)
        .zip(labels.par_iter())
        .with_min_len(super::rows_per_task(c * 8))
        .map(|(row, &y)| {
            assert!(y >= 0 && (y as usize) < c, "label {y} not in 0..{c}");
            log_softmax_row(row);
            let loss = -row[y as usize] as f64;
            row.iter_mut().for_each(|v| *v = v.exp());
            row[y as usize] -= 1.0;
            loss
        })
        .collect();
    (losses.iter().sum(), grad)
}

/// Binary cross-entropy with logits over every element: returns
/// `(Σ −[t·log σ(x) + (1−t)·log(1−σ(x))], σ(x) − t)`, computed stably as
/// `max(x, 0) − x·t + log(1 + e^{−|x|})`. Targets are 0 or 1 (any non-zero counts as 1).
pub fn bce_with_logits<'a>(
    logits: impl AsArray<'a, f32, Ix2>,
    targets: ArrayView2<i64>,
) -> (f64, Array2<f32>) {
    let logits: ArrayView2<f32> = logits.into();
    assert_eq!(
        logits.dim(),
        targets.dim(),
        "bce_with_logits: shapes differ"
    );
    let (n, c) = logits.dim();
    let mut grad = super::standard(logits).into_owned();
    if n == 0 || c == 0 {
        return (0.0, grad);
    }
    let targets = targets.as_standard_layout();
    let ts = targets.as_slice().unwrap();
    let losses: Vec<f64> = grad
        .as_slice_mut()
        .unwrap()
        .par_chunks_mut(c)
        .zip(ts.par_chunks(c))
        .with_min_len(super::rows_per_task(c * 8))
        .map(|(row, t)| {
            let mut loss = 0f64;
            for (x, &t) in row.iter_mut().zip(t) {
                let t = if t != 0 { 1.0f32 } else { 0.0 };
                let xv = *x;
                loss += (xv.max(0.0) - xv * t + (-xv.abs()).exp().ln_1p()) as f64;
                *x = sigmoid(xv) - t;
            }
            loss
        })
        .collect();
    (losses.iter().sum(), grad)
}

/// The logistic function, stable for large |x|.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn cross_entropy_of_uniform_logits_is_log_c() {
        let logits = Array2::zeros((2, 4));
        let (loss, grad) = cross_entropy(&logits, &[1, 3]);
        assert!((loss - 2.0 * 4f64.ln()).abs() < 1e-6);
        assert!((grad[[0, 1]] + 0.75).abs() < 1e-6);
        assert!((grad[[0, 0]] - 0.25).abs() < 1e-6);
    }

    #[test]
    fn bce_matches_the_definition() {
        let logits = array![[2.0f32, -1.0]];
        let t = array![[1i64, 0]];
        let (loss, grad) = bce_with_logits(&logits, t.view());
        let s = |x: f64| 1.0 / (1.0 + (-x).exp());
        let expect = -(s(2.0).ln()) - (1.0 - s(-1.0)).ln();
        assert!((loss - expect).abs() < 1e-6);
        assert!((grad[[0, 0]] as f64 - (s(2.0) - 1.0)).abs() < 1e-6);
        assert!((grad[[0, 1]] as f64 - s(-1.0)).abs() < 1e-6);
    }

    #[test]
    fn bad_labels_are_reported() {
        assert!(check_labels(&[0, 2, 1], 3).is_ok());
        let err = check_labels(&[0, 3], 3).unwrap_err().to_string();
        assert!(err.contains("label 3 of row 1"), "{err}");
        assert!(check_labels(&[-1], 3).is_err());
    }
}
