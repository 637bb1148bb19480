//! All parameters of a model in one flat `f32` buffer (and one for their gradients), with
//! named views, so that a gradient allreduce is a single call over `grads`. The buffers live on
//! the model's backend; a model is built and initialised on the host ([`ParamStore<Cpu>`]) and
//! moved to its device with [`ParamStore::to_backend`].

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Cpu};

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
/// Every parameter of a model: values and gradients in two flat buffers on backend `B`, and
/// the named entries that view them.
#[derive(Debug)]
pub struct ParamStore<B: Backend = Cpu> {
    pub values: B::Buffer,
    pub grads: B::Buffer,
    pub entries: Vec<ParamEntry>,
    backend: B,
}

impl Default for ParamStore<Cpu> {
    fn default() -> Self {
        ParamStore {
            values: Vec::new(),
            grads: Vec::new(),
            entries: Vec::new(),
            backend: Cpu,
        }
    }
}

impl Clone for ParamStore<Cpu> {
    fn clone(&self) -> Self {
        ParamStore {
            values: self.values.clone(),
            grads: self.grads.clone(),
            entries: self.entries.clone(),
            backend: Cpu,
        }
    }
}

impl PartialEq for ParamStore<Cpu> {
    fn eq(&self, other: &Self) -> bool {
        self.values == other.values && self.grads == other.grads && self.entries == other.entries
    }
}

impl ParamStore<Cpu> {
    /// An empty store on the host.
    pub fn new() -> ParamStore<Cpu> {
        ParamStore::default()
    }

    /// Register a parameter of `shape` (zeros); returns its index.
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

    /// The same parameters with only rows `rows` of the matrices `narrowed` (gradients
    /// zero): the layout of a rank that holds a row slice of some weights (NFP's input
    /// layer). Indices are unchanged; offsets follow the narrower shapes.
    pub fn with_rows(&self, narrowed: &[usize], rows: Range<usize>) -> ParamStore<Cpu> {
        let mut out = ParamStore::new();
        for (i, e) in self.entries.iter().enumerate() {
            let shape = if narrowed.contains(&i) {
                let (r, c) = e.dims();
                assert!(
                    rows.end <= r,
                    "parameter {}: rows {rows:?} outside its {r} rows",
                    e.name
                );
                vec![rows.len(), c]
            } else {
                e.shape.clone()
            };
            out.add(e.name.clone(), &shape);
        }
        out.values = narrow_rows(&self.entries, narrowed, &rows, &self.values);
        out
    }

    /// The same parameters (and gradients) on `backend`.
    pub fn to_backend<B: Backend>(&self, backend: B) -> ParamStore<B> {
        ParamStore {
            values: backend.buffer_from_host(&self.values),
            grads: backend.buffer_from_host(&self.grads),
            entries: self.entries.clone(),
            backend,
        }
    }
}

impl<B: Backend> ParamStore<B> {
    /// The backend the buffers live on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Number of scalars.
    pub fn len(&self) -> usize {
        self.backend.buffer_len(&self.values)
    }

    /// True when no parameter is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Index of the parameter called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.name == name)
    }

    fn range(&self, idx: usize) -> (usize, (usize, usize)) {
        let e = &self.entries[idx];
        (e.offset, e.dims())
    }

    /// The values of parameter `idx` (`rows × cols`; a vector is `1 × len`).
    pub fn view(&self, idx: usize) -> B::View<'_> {
        let (offset, (r, c)) = self.range(idx);
        self.backend.buffer_view(&self.values, offset, r, c)
    }

    /// The values of parameter `idx`, mutably.
    pub fn view_mut(&mut self, idx: usize) -> B::ViewMut<'_> {
        let (offset, (r, c)) = self.range(idx);
        self.backend.buffer_view_mut(&mut self.values, offset, r, c)
    }

    /// The gradient of parameter `idx`.
    pub fn grad(&self, idx: usize) -> B::View<'_> {
        let (offset, (r, c)) = self.range(idx);
        self.backend.buffer_view(&self.grads, offset, r, c)
    }

    /// The gradient of parameter `idx`, mutably.
    pub fn grad_mut(&mut self, idx: usize) -> B::ViewMut<'_> {
        let (offset, (r, c)) = self.range(idx);
        self.backend.buffer_view_mut(&mut self.grads, offset, r, c)
    }

    /// The values of parameter `idx` and its gradient, mutably, at once.
    pub fn value_and_grad(&mut self, idx: usize) -> (B::View<'_>, B::ViewMut<'_>) {
        let (offset, (r, c)) = self.range(idx);
        (
            self.backend.buffer_view(&self.values, offset, r, c),
            self.backend.buffer_view_mut(&mut self.grads, offset, r, c),
        )
    }

    fn stacked_range(&self, first: usize, second: usize) -> (usize, (usize, usize)) {
        let (a, (ra, ca)) = self.range(first);
        let (b, (rb, cb)) = self.range(second);
        assert!(
            a + ra * ca == b && ca == cb,
            "parameters {} and {} are not adjacent matrices of equal width",
            self.entries[first].name,
            self.entries[second].name
        );
        (a, (ra + rb, ca))
    }

    /// Two adjacent matrices of equal width (registered one after the other) as one
    /// `[first; second]` view, without a copy.
    pub fn stacked(&self, first: usize, second: usize) -> B::View<'_> {
        let (offset, (r, c)) = self.stacked_range(first, second);
        self.backend.buffer_view(&self.values, offset, r, c)
    }

    /// The gradient of [`ParamStore::stacked`], mutably.
    pub fn stacked_grad_mut(&mut self, first: usize, second: usize) -> B::ViewMut<'_> {
        let (offset, (r, c)) = self.stacked_range(first, second);
        self.backend.buffer_view_mut(&mut self.grads, offset, r, c)
    }

    /// Set every gradient to zero.
    pub fn zero_grads(&mut self) {
        self.backend.buffer_zero(&mut self.grads);
    }

    /// The values on the host (checkpoints, comparisons).
    pub fn values_on_host(&self) -> Vec<f32> {
        self.backend.buffer_to_host(&self.values)
    }

    /// The gradients on the host.
    pub fn grads_on_host(&self) -> Vec<f32> {
        self.backend.buffer_to_host(&self.grads)
    }

    /// Overwrite the values from the host (a restored checkpoint).
    pub fn set_values(&mut self, values: &[f32]) {
        self.backend.buffer_write(&mut self.values, values);
    }
}

/// A flat buffer laid out as `entries`, cut to the layout [`ParamStore::with_rows`] makes:
/// rows `rows` of the matrices `narrowed`, every other parameter whole.
pub fn narrow_rows(
    entries: &[ParamEntry],
    narrowed: &[usize],
    rows: &Range<usize>,
    buf: &[f32],
) -> Vec<f32> {
    let mut out = Vec::with_capacity(buf.len());
    for (i, e) in entries.iter().enumerate() {
        let kept = if narrowed.contains(&i) {
            let width = e.dims().1;
            e.offset + rows.start * width..e.offset + rows.end * width
        } else {
            e.offset..e.offset + e.len()
        };
        out.extend_from_slice(&buf[kept]);
    }
    out
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

    #[test]
    fn with_rows_keeps_a_row_slice_of_the_named_matrices_only() {
        let mut p = ParamStore::new();
        let w = p.add("w", &[4, 2]);
        let b = p.add("b", &[2]);
        let v = p.add("v", &[3, 2]);
        for (i, x) in p.values.iter_mut().enumerate() {
            *x = i as f32;
        }
        let q = p.with_rows(&[w], 1..3);
        assert_eq!(q.entries[w].shape, vec![2, 2]);
        assert_eq!(q.entries[b].offset, 4);
        assert_eq!(q.entries[v].shape, vec![3, 2]);
        assert_eq!(
            q.values,
            [2., 3., 4., 5., 8., 9., 10., 11., 12., 13., 14., 15.]
        );
        assert_eq!(q.grads.len(), q.values.len());
        assert_eq!(narrow_rows(&p.entries, &[w], &(1..3), &p.values), q.values);
        // The same rows of every matrix it names: the whole model at 0..rows.
        assert_eq!(p.with_rows(&[w], 0..4), p);
        assert_eq!(p.with_rows(&[w, v], 3..3).len(), 2);
    }
}
