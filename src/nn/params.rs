//! All parameters of a model in one flat `f32` buffer (and one for their gradients), with
//! named views, so that a gradient allreduce is a single call over `grads`.

use ndarray::{ArrayView2, ArrayViewMut2};
use serde::{Deserialize, Serialize};

/// One named parameter: `shape` elements starting at `offset` in the flat buffers.
/// Shapes are `[rows, cols]` for matrices and `[len]` for vectors (viewed as `1 × len`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamEntry {
    pub name: String,
    pub offset: usize,
    pub shape: Vec<usize>,
}

impl ParamEntry {
    /// Number of scalars.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a parameter without elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape as a matrix: vectors are one row.
    pub fn dims(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            other => panic!("parameter {} has unsupported shape {other:?}", self.name),
        }
    }
}

/// The flat parameter and gradient buffers with their table of entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParamStore {
    pub values: Vec<f32>,
    pub grads: Vec<f32>,
    pub entries: Vec<ParamEntry>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> ParamStore {
        ParamStore::default()
    }

    /// Append a zero-initialised parameter and return its index.
    ///
    /// # Panics
    /// If the name is already taken or the shape is not 1-D or 2-D (model construction bugs).
    pub fn add(&mut self, name: impl Into<String>, shape: &[usize]) -> usize {
        let name = name.into();
        assert!(self.find(&name).is_none(), "parameter {name} defined twice");
        assert!(
            matches!(shape.len(), 1 | 2),
            "parameter {name}: shape {shape:?} must be 1-D or 2-D"
        );
        let entry = ParamEntry {
            name,
            offset: self.values.len(),
            shape: shape.to_vec(),
        };
        self.values.resize(self.values.len() + entry.len(), 0.0);
        self.grads.resize(self.values.len(), 0.0);
        self.entries.push(entry);
        self.entries.len() - 1
    }

    /// Total number of scalars.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when there are no scalars.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Index of the parameter called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.name == name)
    }

    fn range(&self, idx: usize) -> (std::ops::Range<usize>, (usize, usize)) {
        let e = &self.entries[idx];
        (e.offset..e.offset + e.len(), e.dims())
    }

    /// The value of parameter `idx` as a matrix.
    pub fn view(&self, idx: usize) -> ArrayView2<'_, f32> {
        let (r, d) = self.range(idx);
        ArrayView2::from_shape(d, &self.values[r]).expect("entry fits the buffer")
    }

    /// The value of parameter `idx`, mutable.
    pub fn view_mut(&mut self, idx: usize) -> ArrayViewMut2<'_, f32> {
        let (r, d) = self.range(idx);
        ArrayViewMut2::from_shape(d, &mut self.values[r]).expect("entry fits the buffer")
    }

    /// The gradient of parameter `idx`.
    pub fn grad(&self, idx: usize) -> ArrayView2<'_, f32> {
        let (r, d) = self.range(idx);
        ArrayView2::from_shape(d, &self.grads[r]).expect("entry fits the buffer")
    }

    /// The gradient of parameter `idx`, mutable (layers accumulate into it).
    pub fn grad_mut(&mut self, idx: usize) -> ArrayViewMut2<'_, f32> {
        let (r, d) = self.range(idx);
        ArrayViewMut2::from_shape(d, &mut self.grads[r]).expect("entry fits the buffer")
    }

    /// The value and the mutable gradient of parameter `idx` at once.
    pub fn value_and_grad(&mut self, idx: usize) -> (ArrayView2<'_, f32>, ArrayViewMut2<'_, f32>) {
        let (r, d) = self.range(idx);
        (
            ArrayView2::from_shape(d, &self.values[r.clone()]).expect("entry fits the buffer"),
            ArrayViewMut2::from_shape(d, &mut self.grads[r]).expect("entry fits the buffer"),
        )
    }

    /// The range and shape of matrices `first` and `second` stacked by rows.
    ///
    /// # Panics
    /// Unless `second` was registered right after `first` with as many columns (a model
    /// construction bug).
    fn stacked_range(
        &self,
        first: usize,
        second: usize,
    ) -> (std::ops::Range<usize>, (usize, usize)) {
        let (a, (ra, ca)) = self.range(first);
        let (b, (rb, cb)) = self.range(second);
        assert!(
            a.end == b.start && ca == cb,
            "parameters {} and {} are not adjacent matrices of equal width",
            self.entries[first].name,
            self.entries[second].name
        );
        (a.start..b.end, (ra + rb, ca))
    }

    /// The values of `first` and `second` (registered one after the other, with the same
    /// columns) as one matrix, `first`'s rows on top: a layer that multiplies two inputs by
    /// them can do it in one product.
    pub fn stacked(&self, first: usize, second: usize) -> ArrayView2<'_, f32> {
        let (r, d) = self.stacked_range(first, second);
        ArrayView2::from_shape(d, &self.values[r]).expect("entries fit the buffer")
    }

    /// The gradients of [`ParamStore::stacked`], mutable.
    pub fn stacked_grad_mut(&mut self, first: usize, second: usize) -> ArrayViewMut2<'_, f32> {
        let (r, d) = self.stacked_range(first, second);
        ArrayViewMut2::from_shape(d, &mut self.grads[r]).expect("entries fit the buffer")
    }

    /// Set every gradient to zero (before a step's backward passes).
    pub fn zero_grads(&mut self) {
        self.grads.fill(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_contiguous_views_of_one_buffer() {
        let mut p = ParamStore::new();
        let w = p.add("w", &[2, 3]);
        let b = p.add("b", &[3]);
        assert_eq!(p.len(), 9);
        assert_eq!(p.entries[b].offset, 6);
        p.view_mut(w)[[1, 2]] = 5.0;
        p.grad_mut(b)[[0, 1]] = 2.0;
        assert_eq!(p.values[5], 5.0);
        assert_eq!(p.grads[7], 2.0);
        assert_eq!(p.view(b).dim(), (1, 3));
        assert_eq!(p.find("b"), Some(b));
        p.zero_grads();
        assert!(p.grads.iter().all(|&g| g == 0.0));
    }

    #[test]
    fn adjacent_matrices_stack_by_rows() {
        let mut p = ParamStore::new();
        let top = p.add("top", &[2, 3]);
        let bottom = p.add("bottom", &[1, 3]);
        let bias = p.add("bias", &[3]);
        p.view_mut(bottom)[[0, 2]] = 7.0;
        let s = p.stacked(top, bottom);
        assert_eq!(s.dim(), (3, 3));
        assert_eq!(s[[2, 2]], 7.0);
        p.stacked_grad_mut(top, bottom)[[0, 1]] = 3.0;
        assert_eq!(p.grad(top)[[0, 1]], 3.0);
        // Not adjacent in the given order, or of another width: refused.
        for (a, b) in [(bottom, top), (top, bias)] {
            let r = std::panic::catch_unwind(|| p.stacked(a, b).dim());
            assert!(r.is_err(), "stacked({a}, {b}) should panic");
        }
    }
}
