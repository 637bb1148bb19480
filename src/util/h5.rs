//! HDF5 access with errors that name the file and the field, so a user who hands gnnpar a bad
//! file learns exactly which part of it is wrong.

use anyhow::{bail, Context, Result};
use hdf5::types::VarLenUnicode;
use hdf5::{File, H5Type, Location};
use ndarray::{Array2, ArrayView2};
use std::path::Path;

/// Open an existing HDF5 file for reading.
pub fn open(path: &Path) -> Result<File> {
    if !path.exists() {
        bail!("`{}` does not exist", path.display());
    }
    if path.is_dir() {
        bail!("`{}` is a directory, expected an HDF5 file", path.display());
    }
    File::open(path).with_context(|| {
        format!(
            "`{}` is not a readable HDF5 file (truncated or not HDF5?)",
            path.display()
        )
    })
}

/// Create (truncate) an HDF5 file for writing.
pub fn create(path: &Path) -> Result<File> {
    File::create(path).with_context(|| format!("cannot create HDF5 file `{}`", path.display()))
}

/// Does `file` hold a dataset called `name`?
pub fn has(file: &File, name: &str) -> bool {
    file.link_exists(name)
}

/// Shape of dataset `name`.
pub fn shape(file: &File, name: &str) -> Result<Vec<usize>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    Ok(ds.shape())
}

/// Read a 1-d dataset into a vector of `T` (HDF5 converts between integer widths).
pub fn read_vec<T: H5Type>(file: &File, name: &str) -> Result<Vec<T>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    if ds.ndim() != 1 {
        bail!(
            "`{}`: dataset `{name}` has shape {:?}, expected one dimension",
            file.filename(),
            ds.shape()
        );
    }
    ds.read_raw::<T>()
        .with_context(|| format!("`{}`: cannot read dataset `{name}`", file.filename()))
}

/// Read a 1-d dataset of vertex ids stored as u32 or u64 into u32, refusing ids that do not fit.
pub fn read_ids_u32(file: &File, name: &str) -> Result<Vec<u32>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    let size = ds.dtype().map(|t| t.size()).unwrap_or(8);
    if size <= 4 {
        return read_vec::<u32>(file, name);
    }
    let wide = read_vec::<u64>(file, name)?;
    let mut out = Vec::with_capacity(wide.len());
    for (i, &v) in wide.iter().enumerate() {
        if v > u32::MAX as u64 {
            bail!(
                "`{}`: dataset `{name}` entry {i} is {v}; gnnpar supports vertex ids below 2^32",
                file.filename()
            );
        }
        out.push(v as u32);
    }
    Ok(out)
}

/// Read a 2-d dataset.
pub fn read_matrix<T: H5Type>(file: &File, name: &str) -> Result<Array2<T>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    if ds.ndim() != 2 {
        bail!(
            "`{}`: dataset `{name}` has shape {:?}, expected two dimensions",
            file.filename(),
            ds.shape()
        );
    }
    ds.read_2d::<T>()
        .with_context(|| format!("`{}`: cannot read dataset `{name}`", file.filename()))
}

/// Read rows `[start, end)` of a 2-d dataset.
pub fn read_matrix_rows<T: H5Type>(
    file: &File,
    name: &str,
    start: usize,
    end: usize,
) -> Result<Array2<T>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    ds.read_slice_2d::<T, _>(ndarray::s![start..end, ..])
        .with_context(|| {
            format!(
                "`{}`: cannot read rows {start}..{end} of dataset `{name}`",
                file.filename()
            )
        })
}

/// Read columns `cols` of every row of a 2-d dataset (a hyperslab: only the slice is kept in
/// memory).
pub fn read_matrix_columns<T: H5Type>(
    file: &File,
    name: &str,
    cols: std::ops::Range<usize>,
) -> Result<Array2<T>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    let rows = ds.shape().first().copied().unwrap_or(0);
    if cols.is_empty() {
        return Ok(Array2::from_shape_vec((rows, 0), Vec::new())?);
    }
    ds.read_slice_2d::<T, _>(ndarray::s![.., cols.start..cols.end])
        .with_context(|| {
            format!(
                "`{}`: cannot read columns {}..{} of dataset `{name}`",
                file.filename(),
                cols.start,
                cols.end
            )
        })
}

/// Write a 1-d dataset (chunked and compressed when large, so partial reads stay cheap).
pub fn write_vec<T: H5Type>(loc: &hdf5::Group, name: &str, data: &[T]) -> Result<()> {
    let builder = loc.new_dataset_builder();
    let result = if data.len() >= 1 << 16 {
        builder.chunk(1 << 16).with_data(data).create(name)
    } else {
        builder.with_data(data).create(name)
    };
    result.with_context(|| format!("cannot write dataset `{name}`"))?;
    Ok(())
}

/// Write a 2-d dataset chunked by rows.
pub fn write_matrix<T: H5Type>(loc: &hdf5::Group, name: &str, data: ArrayView2<T>) -> Result<()> {
    let (rows, cols) = data.dim();
    let builder = loc.new_dataset_builder();
    let result = if rows > 0 && cols > 0 {
        let chunk_rows = ((1usize << 20) / (cols * std::mem::size_of::<T>()).max(1)).clamp(1, rows);
        builder
            .chunk((chunk_rows, cols))
            .with_data(&data)
            .create(name)
    } else {
        builder.with_data(&data).create(name)
    };
    result.with_context(|| format!("cannot write dataset `{name}`"))?;
    Ok(())
}

/// Write a scalar attribute.
pub fn write_attr<T: H5Type>(loc: &Location, name: &str, value: T) -> Result<()> {
    loc.new_attr::<T>()
        .create(name)
        .and_then(|a| a.write_scalar(&value))
        .with_context(|| format!("cannot write attribute `{name}`"))
}

/// Write a string attribute.
pub fn write_str_attr(loc: &Location, name: &str, value: &str) -> Result<()> {
    let v: VarLenUnicode = value
        .parse()
        .map_err(|e| anyhow::anyhow!("attribute `{name}`: {e:?}"))?;
    loc.new_attr::<VarLenUnicode>()
        .create(name)
        .and_then(|a| a.write_scalar(&v))
        .with_context(|| format!("cannot write attribute `{name}`"))
}

/// Read a scalar attribute.
pub fn read_attr<T: H5Type>(file: &File, name: &str) -> Result<T> {
    file.attr(name)
        .and_then(|a| a.read_scalar::<T>())
        .with_context(|| {
            format!(
                "`{}`: missing or unreadable attribute `{name}`",
                file.filename()
            )
        })
}

/// Read a string attribute.
pub fn read_str_attr(file: &File, name: &str) -> Result<String> {
    let v: VarLenUnicode = read_attr(file, name)?;
    Ok(v.as_str().to_string())
}
