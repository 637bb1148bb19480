//! Typed device arrays: [`DevMat`] (a row-major `f32` matrix), its borrowed views [`DevView`] /
//! [`DevViewMut`] (a range of rows, or a parameter inside the flat parameter buffer), and
//! [`DevVec`] (a typed vector: indices, bit words, keys).
//!
//! Matrices are dense: row `r` starts `r · cols` elements after the first, so a row range is a
//! pointer offset and every view is contiguous.

use super::gpu::{as_bytes, DevBuf, DevPtr, Device, Pod};
use anyhow::Result;
use std::marker::PhantomData;

const F32: usize = std::mem::size_of::<f32>();

/// An owned row-major `rows × cols` matrix of `f32` in device memory.
#[derive(Debug)]
pub struct DevMat {
    buf: DevBuf,
    rows: usize,
    cols: usize,
}

impl DevMat {
    /// Uninitialised (for kernels that write every element).
    pub fn uninit(device: &Device, rows: usize, cols: usize) -> Result<DevMat> {
        Ok(DevMat {
            buf: device.alloc(rows * cols * F32)?,
            rows,
            cols,
        })
    }

    /// All zeros.
    pub fn zeros(device: &Device, rows: usize, cols: usize) -> Result<DevMat> {
        Ok(DevMat {
            buf: device.alloc_zeroed(rows * cols * F32)?,
            rows,
            cols,
        })
    }

    /// A copy of the row-major `values` (`rows · cols` of them).
    pub fn upload(device: &Device, rows: usize, cols: usize, values: &[f32]) -> Result<DevMat> {
        assert_eq!(values.len(), rows * cols, "upload: {rows} × {cols} values");
        Ok(DevMat {
            buf: device.upload(values)?,
            rows,
            cols,
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The device it lives on.
    pub fn device(&self) -> &Device {
        self.buf.device()
    }

    /// The whole matrix, borrowed.
    pub fn view(&self) -> DevView<'_> {
        DevView {
            ptr: self.buf.ptr(),
            rows: self.rows,
            cols: self.cols,
            device: self.buf.device(),
            _life: PhantomData,
        }
    }

    /// The whole matrix, borrowed mutably.
    pub fn view_mut(&mut self) -> DevViewMut<'_> {
        DevViewMut {
            ptr: self.buf.ptr(),
            rows: self.rows,
            cols: self.cols,
            device: self.buf.device(),
            _life: PhantomData,
        }
    }

    /// The row-major values, copied to the host (waits for the queued work).
    pub fn download(&self) -> Result<Vec<f32>> {
        self.view().download()
    }

    /// Keep the first `rows` rows (no copy: the allocation is kept whole).
    pub fn truncate_rows(&mut self, rows: usize) {
        assert!(
            rows <= self.rows,
            "truncate to {rows} of {} rows",
            self.rows
        );
        self.rows = rows;
    }
}

/// A borrowed row-major matrix on the device.
#[derive(Clone, Copy, Debug)]
pub struct DevView<'a> {
    ptr: DevPtr,
    rows: usize,
    cols: usize,
    device: &'a Device,
    _life: PhantomData<&'a DevBuf>,
}

impl<'a> DevView<'a> {
    /// A `rows × cols` view of `buf` starting `offset` elements in.
    pub fn of(buf: &'a DevBuf, offset: usize, rows: usize, cols: usize) -> DevView<'a> {
        assert!(
            (offset + rows * cols) * F32 <= buf.len(),
            "view of {rows} × {cols} at {offset} past a buffer of {} B",
            buf.len()
        );
        DevView {
            ptr: buf.at(offset * F32),
            rows,
            cols,
            device: buf.device(),
            _life: PhantomData,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `(rows, cols)`.
    pub fn dim(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The address of element `(0, 0)`.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// Rows `range` of this view.
    pub fn row_range(&self, range: std::ops::Range<usize>) -> DevView<'a> {
        assert!(
            range.start <= range.end && range.end <= self.rows,
            "rows {range:?} of {}",
            self.rows
        );
        DevView {
            ptr: self.ptr + (range.start * self.cols * F32) as u64,
            rows: range.len(),
            cols: self.cols,
            device: self.device,
            _life: PhantomData,
        }
    }

    /// The same elements as `rows × cols` (their product must not change).
    pub fn reshape(&self, rows: usize, cols: usize) -> DevView<'a> {
        assert_eq!(
            rows * cols,
            self.rows * self.cols,
            "reshape changes the size"
        );
        DevView {
            rows,
            cols,
            ..*self
        }
    }

    /// A new matrix with these values.
    pub fn to_owned(&self) -> Result<DevMat> {
        let out = DevMat::uninit(self.device, self.rows, self.cols)?;
        self.device
            .gpu
            .copy(out.buf.ptr(), self.ptr, self.rows * self.cols * F32)?;
        Ok(out)
    }

    /// The row-major values, copied to the host.
    pub fn download(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.rows * self.cols];
        self.device
            .copy_to_host(self.ptr, super::gpu::as_bytes_mut(&mut out))?;
        Ok(out)
    }
}

/// A mutably borrowed row-major matrix on the device.
#[derive(Debug)]
pub struct DevViewMut<'a> {
    ptr: DevPtr,
    rows: usize,
    cols: usize,
    device: &'a Device,
    _life: PhantomData<&'a mut DevBuf>,
}

impl<'a> DevViewMut<'a> {
    /// A `rows × cols` view of `buf` starting `offset` elements in.
    pub fn of(buf: &'a mut DevBuf, offset: usize, rows: usize, cols: usize) -> DevViewMut<'a> {
        let v = DevView::of(buf, offset, rows, cols);
        DevViewMut {
            ptr: v.ptr,
            rows,
            cols,
            device: v.device,
            _life: PhantomData,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn dim(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// Read access to the same elements.
    pub fn view(&self) -> DevView<'_> {
        DevView {
            ptr: self.ptr,
            rows: self.rows,
            cols: self.cols,
            device: self.device,
            _life: PhantomData,
        }
    }

    /// Reborrow.
    pub fn reborrow(&mut self) -> DevViewMut<'_> {
        DevViewMut {
            ptr: self.ptr,
            rows: self.rows,
            cols: self.cols,
            device: self.device,
            _life: PhantomData,
        }
    }

    /// Rows `range`, mutably.
    pub fn row_range(self, range: std::ops::Range<usize>) -> DevViewMut<'a> {
        assert!(
            range.start <= range.end && range.end <= self.rows,
            "rows {range:?} of {}",
            self.rows
        );
        DevViewMut {
            ptr: self.ptr + (range.start * self.cols * F32) as u64,
            rows: range.len(),
            cols: self.cols,
            ..self
        }
    }
}

/// An owned vector of `T` in device memory (indices, bit words, keys, factors).
#[derive(Debug)]
pub struct DevVec<T: Pod> {
    buf: DevBuf,
    len: usize,
    _t: PhantomData<T>,
}

impl DevVec<u64> {
    /// Host offsets (CSR `indptr`s, `usize`) as the kernels' `u64`s: uploaded as they are
    /// where `usize` is 64 bits, so the training thread makes no converted copy of a block's
    /// offsets every step.
    pub fn upload_offsets(device: &Device, offsets: &[usize]) -> Result<DevVec<u64>> {
        #[cfg(target_pointer_width = "64")]
        // SAFETY: `usize` and `u64` have the same size and alignment on 64-bit targets, and
        // every bit pattern is a valid `u64`.
        let offsets: &[u64] =
            unsafe { std::slice::from_raw_parts(offsets.as_ptr().cast::<u64>(), offsets.len()) };
        #[cfg(not(target_pointer_width = "64"))]
        let converted: Vec<u64> = offsets.iter().map(|&e| e as u64).collect();
        #[cfg(not(target_pointer_width = "64"))]
        let offsets: &[u64] = &converted;
        DevVec::upload(device, offsets)
    }
}

impl<T: Pod + Default> DevVec<T> {
    /// A copy of `values`.
    pub fn upload(device: &Device, values: &[T]) -> Result<DevVec<T>> {
        Ok(DevVec {
            buf: device.upload(values)?,
            len: values.len(),
            _t: PhantomData,
        })
    }

    /// `len` zeros.
    pub fn zeros(device: &Device, len: usize) -> Result<DevVec<T>> {
        Ok(DevVec {
            buf: device.alloc_zeroed(len * std::mem::size_of::<T>())?,
            len,
            _t: PhantomData,
        })
    }

    /// `len` uninitialised elements.
    pub fn uninit(device: &Device, len: usize) -> Result<DevVec<T>> {
        Ok(DevVec {
            buf: device.alloc(len * std::mem::size_of::<T>())?,
            len,
            _t: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of element 0.
    pub fn ptr(&self) -> DevPtr {
        self.buf.ptr()
    }

    /// The address of element `i`.
    pub fn at(&self, i: usize) -> DevPtr {
        self.buf.at(i * std::mem::size_of::<T>())
    }

    pub fn device(&self) -> &Device {
        self.buf.device()
    }

    /// The underlying buffer (for views into it).
    pub fn buf(&self) -> &DevBuf {
        &self.buf
    }

    /// The underlying buffer, mutably.
    pub fn buf_mut(&mut self) -> &mut DevBuf {
        &mut self.buf
    }

    /// Overwrite with `values` (same length).
    pub fn write(&mut self, values: &[T]) -> Result<()> {
        assert_eq!(values.len(), self.len, "write: length");
        self.buf
            .device()
            .copy_to_device(self.buf.ptr(), as_bytes(values))
    }

    /// Copied to the host.
    pub fn download(&self) -> Result<Vec<T>> {
        let mut v = self.buf.download::<T>()?;
        v.truncate(self.len);
        Ok(v)
    }
}
