//! Sparse input rows on the device (twin: `cpu::sparse`): a first layer's mostly-zero input
//! (bag-of-words features) kept as CSR, so its products touch only the non-zeros — on
//! Facebook's 4,714 columns about 0.3 % of the dense product's work and of its memory.
//!
//! [`DevSparse`] is the rows' values over a shared [`Structure`] (row offsets, columns, and
//! the transpose grouped by column, built on first use): [`DevSparse::first_rows`] and dropout
//! change values only, so a full-batch input, its per-step copy and every step's backward share
//! one structure and one transpose. The transpose is `BlockTranspose` of the CSR, built on the
//! host (a counting sort) and uploaded: by a prefetch worker with a mini-batch's rows (given to
//! [`DevSparse::from_csr`]), else on first use from the host's copy of the columns (downloaded
//! once when the rows were made on the device); the transposed product gathers over it (no
//! atomics).
//!
//! [`DevSparse::from_dense`] decides as the CPU does ([`cpu::sparse::prefers_sparse`]: at
//! least 64 columns, at most 10 % non-zeros on the same sampled rows), from per-row counts the
//! device computes: one small download per call, so the same data takes the same path on
//! either backend.
//!
//! [`cpu::sparse::prefers_sparse`]: crate::backend::cpu::sparse::prefers_sparse

use std::sync::{Arc, OnceLock};

use anyhow::Result;
use ndarray::ArrayView2;

use super::dropout::RowMask;
use super::graph::DevBlockTranspose;
use super::{launch, same_device, Args};
use crate::backend::cpu::aggregate::BlockTranspose;
use crate::backend::cpu::sparse::{prefers_sparse_counts, CsrMatrix};
use crate::backend::cuda::gpu::Device;
use crate::backend::cuda::kernels::per_warp;
use crate::backend::cuda::mat::{DevMat, DevVec, DevView, DevViewMut};

/// The CSR's shape and columns, shared by every copy of its values.
#[derive(Debug)]
pub struct Structure {
    cols: usize,
    /// `rows + 1` entry offsets, on the host (row counts of prefixes) and the device.
    indptr_host: Vec<usize>,
    indptr: DevVec<u64>,
    /// Each entry's column.
    indices: DevVec<u32>,
    /// The columns on the host: known when the rows were made there, else downloaded for the
    /// transpose.
    indices_host: OnceLock<Vec<u32>>,
    /// Entries grouped by column, built on first use.
    transpose: OnceLock<DevBlockTranspose>,
}

impl Structure {
    fn rows(&self) -> usize {
        self.indptr_host.len() - 1
    }

    /// The transpose, built and uploaded the first time.
    fn transpose(&self) -> Result<&DevBlockTranspose> {
        if let Some(t) = self.transpose.get() {
            return Ok(t);
        }
        let indices = match self.indices_host.get() {
            Some(i) => i,
            None => {
                let downloaded = self.indices.download()?;
                self.indices_host.get_or_init(|| downloaded)
            }
        };
        let host = BlockTranspose::of_csr(self.cols, &self.indptr_host, indices);
        let t = DevBlockTranspose::upload(self.indices.device(), &host)?;
        // Another thread may have built it meanwhile: either is the same transpose.
        let _ = self.transpose.set(t);
        Ok(self.transpose.get().expect("just set"))
    }
}

/// Sparse rows on the device: the first `rows` rows of `structure`, with their values.
#[derive(Debug)]
pub struct DevSparse {
    rows: usize,
    structure: Arc<Structure>,
    /// The stored entries of the first `rows` rows.
    values: DevVec<f32>,
}

impl DevSparse {
    /// `x` (host rows) as sparse rows when it is mostly zeros (the CPU's test), uploaded as CSR:
    /// the dense form never reaches the device.
    pub fn from_host(device: &Device, x: ArrayView2<f32>) -> Result<Option<DevSparse>> {
        if !crate::backend::cpu::sparse::prefers_sparse(x) {
            return Ok(None);
        }
        DevSparse::from_csr(device, CsrMatrix::from_dense(x), None).map(Some)
    }

    /// Host CSR rows, uploaded; the host keeps their columns, so the transpose a backward
    /// pass needs is built without a download (and without waiting for the device). With
    /// `transpose` (built ahead on the host: `BlockTranspose::of_csr` of these rows) it is
    /// uploaded now, so the training thread never builds it.
    pub fn from_csr(
        device: &Device,
        csr: CsrMatrix,
        transpose: Option<BlockTranspose>,
    ) -> Result<DevSparse> {
        let built = OnceLock::new();
        if let Some(t) = transpose {
            let _ = built.set(DevBlockTranspose::upload(device, &t)?);
        }
        let structure = Structure {
            cols: csr.ncols,
            indptr: DevVec::upload_offsets(device, &csr.indptr)?,
            indices: DevVec::upload(device, &csr.indices)?,
            indptr_host: csr.indptr,
            indices_host: OnceLock::from(csr.indices),
            transpose: built,
        };
        Ok(DevSparse {
            rows: structure.rows(),
            values: DevVec::upload(device, &csr.values)?,
            structure: Arc::new(structure),
        })
    }

    /// `x` (device rows) as sparse rows when it is mostly zeros: the device counts each row's
    /// non-zeros, the host decides and sums them into offsets, and the device writes the
    /// entries. `None` (nothing else done) when the rows are not sparse enough.
    pub fn from_dense(x: DevView) -> Result<Option<DevSparse>> {
        let (rows, cols) = x.dim();
        let device = x.device();
        if rows == 0 || cols < crate::backend::cpu::sparse::MIN_SPARSE_COLS {
            return Ok(None);
        }
        let counts = DevVec::<u32>::uninit(device, rows)?;
        launch(
            device,
            "gnn_count_nonzeros",
            per_warp(rows),
            Args::new()
                .ptr(x.ptr())
                .u64(rows)
                .u32(cols)
                .ptr(counts.ptr()),
        )?;
        let counts = counts.download()?;
        if !prefers_sparse_counts(&counts, cols) {
            return Ok(None);
        }
        let mut indptr_host = Vec::with_capacity(rows + 1);
        indptr_host.push(0usize);
        for &n in &counts {
            indptr_host.push(indptr_host.last().expect("non-empty") + n as usize);
        }
        let nnz = indptr_host[rows];
        let indptr = DevVec::upload_offsets(device, &indptr_host)?;
        let indices = DevVec::<u32>::uninit(device, nnz)?;
        let values = DevVec::<f32>::uninit(device, nnz)?;
        launch(
            device,
            "gnn_compact_rows",
            per_warp(rows),
            Args::new()
                .ptr(x.ptr())
                .u64(rows)
                .u32(cols)
                .ptr(indptr.ptr())
                .ptr(indices.ptr())
                .ptr(values.ptr()),
        )?;
        Ok(Some(DevSparse {
            rows,
            values,
            structure: Arc::new(Structure {
                cols,
                indptr_host,
                indptr,
                indices,
                indices_host: OnceLock::new(),
                transpose: OnceLock::new(),
            }),
        }))
    }

    /// `(rows, columns)`.
    pub fn dim(&self) -> (usize, usize) {
        (self.rows, self.structure.cols)
    }

    /// Stored entries.
    pub fn nnz(&self) -> usize {
        self.values.len()
    }

    /// The device these rows live on.
    pub fn device(&self) -> &Device {
        self.values.device()
    }

    /// Whether the transpose of the structure has been built (tests: it is built once).
    pub fn transpose_built(&self) -> bool {
        self.structure.transpose.get().is_some()
    }

    /// Whether `other` shares this one's structure (tests).
    pub fn shares_structure(&self, other: &DevSparse) -> bool {
        Arc::ptr_eq(&self.structure, &other.structure)
    }

    /// A copy of the first `rows` rows' values over the same structure.
    ///
    /// # Panics
    /// If `rows` exceeds the row count.
    pub fn first_rows(&self, rows: usize) -> Result<DevSparse> {
        assert!(rows <= self.rows, "sparse rows: {rows} of {}", self.rows);
        let nnz = self.structure.indptr_host[rows];
        let values = DevVec::<f32>::uninit(self.device(), nnz)?;
        if nnz > 0 {
            self.device()
                .gpu
                .copy(values.ptr(), self.values.ptr(), nnz * 4)?;
        }
        Ok(DevSparse {
            rows,
            values,
            structure: self.structure.clone(),
        })
    }

    /// Dropout on the stored entries (`mask` covers every row), the bits the dense mask gives.
    pub fn dropout_in_place(&mut self, mask: RowMask) -> Result<()> {
        assert_eq!(mask.rows(), self.rows, "sparse dropout: one key per row");
        if self.nnz() == 0 {
            return Ok(());
        }
        let s = &self.structure;
        launch(
            self.values.device(),
            "gnn_sparse_dropout",
            per_warp(self.rows),
            Args::new()
                .ptr(self.values.ptr())
                .ptr(s.indptr.ptr())
                .ptr(s.indices.ptr())
                .u64(self.rows)
                .mask(&mask.args()),
        )
    }

    /// The dense form.
    pub fn to_dense(&self) -> Result<DevMat> {
        let (rows, cols) = self.dim();
        let out = DevMat::uninit(self.device(), rows, cols)?;
        if rows == 0 || cols == 0 {
            return Ok(out);
        }
        let s = &self.structure;
        launch(
            self.device(),
            "gnn_sparse_to_dense",
            per_warp(rows),
            Args::new()
                .ptr(out.view().ptr())
                .u64(rows)
                .u32(cols)
                .ptr(s.indptr.ptr())
                .ptr(s.indices.ptr())
                .ptr(self.values.ptr()),
        )?;
        Ok(out)
    }

    /// `out (+)= x[..rows] · w`.
    ///
    /// # Panics
    /// If the shapes disagree.
    pub fn times_into(
        &self,
        rows: usize,
        w: DevView,
        out: DevViewMut,
        accumulate: bool,
    ) -> Result<()> {
        assert!(rows <= self.rows, "spmm: {rows} rows of {}", self.rows);
        assert_eq!(
            w.rows(),
            self.structure.cols,
            "spmm: w must have x's columns as rows"
        );
        assert_eq!(out.dim(), (rows, w.cols()), "spmm: output shape");
        same_device(w.device(), self.device());
        same_device(out.device(), self.device());
        if rows == 0 || w.cols() == 0 {
            return Ok(());
        }
        let s = &self.structure;
        launch(
            self.device(),
            "gnn_spmm",
            per_warp(rows),
            Args::new()
                .ptr(out.ptr())
                .flag(accumulate)
                .ptr(w.ptr())
                .u32(w.cols())
                .ptr(s.indptr.ptr())
                .ptr(s.indices.ptr())
                .ptr(self.values.ptr())
                .u64(rows),
        )
    }

    /// `x[..rows] · w`.
    pub fn times(&self, rows: usize, w: DevView) -> Result<DevMat> {
        let mut out = DevMat::uninit(self.device(), rows, w.cols())?;
        self.times_into(rows, w, out.view_mut(), false)?;
        Ok(out)
    }

    /// `c += x[..rows]ᵀ · d` (`d` has `rows` rows; `c` has x's columns as rows).
    ///
    /// # Panics
    /// If the shapes disagree.
    pub fn add_transposed_times(&self, rows: usize, d: DevView, c: DevViewMut) -> Result<()> {
        assert!(rows <= self.rows, "spmm_tn: {rows} rows of {}", self.rows);
        assert_eq!(d.rows(), rows, "spmm_tn: d must have `rows` rows");
        assert_eq!(
            c.dim(),
            (self.structure.cols, d.cols()),
            "spmm_tn: output shape"
        );
        same_device(d.device(), self.device());
        same_device(c.device(), self.device());
        if rows == 0 || d.cols() == 0 || self.nnz() == 0 {
            return Ok(());
        }
        let t = self.structure.transpose()?;
        launch(
            self.device(),
            "gnn_spmm_tn_add",
            per_warp(self.structure.cols),
            Args::new()
                .ptr(c.ptr())
                .ptr(d.ptr())
                .u32(d.cols())
                .ptr(t.indptr.ptr())
                .ptr(t.dst.ptr())
                .ptr(t.edge.ptr())
                .ptr(self.values.ptr())
                .u64(self.structure.cols)
                .u64(rows),
        )
    }
}
