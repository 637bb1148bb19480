//! HDF5 access with errors that name the file and the field, so a user who hands gnnpar a bad
//! file learns exactly which part of it is wrong.

use anyhow::{bail, Context, Result};
use hdf5::types::{TypeDescriptor, VarLenUnicode};
use hdf5::{Container, File, H5Type, Location};
use ndarray::{Array, Array2, ArrayView2, Dimension, Ix1, Ix2};
use std::fmt::Display;
use std::ops::Range;
use std::path::Path;

/// A number gnnpar reads from HDF5: what a stored value of another type converts to, or `None`
/// when it does not fit. Integer reads check the stored values instead of letting HDF5 convert
/// them (HDF5 clamps a negative value read as unsigned to 0 and truncates 1.5 to 1, silently).
pub trait Numeric: H5Type + Copy {
    #[doc(hidden)]
    fn from_i64(v: i64) -> Option<Self>;
    #[doc(hidden)]
    fn from_u64(v: u64) -> Option<Self>;
}

macro_rules! numeric_int {
    ($($t:ty),*) => {$(
        impl Numeric for $t {
            fn from_i64(v: i64) -> Option<Self> {
                Self::try_from(v).ok()
            }
            fn from_u64(v: u64) -> Option<Self> {
                Self::try_from(v).ok()
            }
        }
    )*};
}
numeric_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! numeric_float {
    ($($t:ty),*) => {$(
        impl Numeric for $t {
            fn from_i64(v: i64) -> Option<Self> {
                Some(v as $t)
            }
            fn from_u64(v: u64) -> Option<Self> {
                Some(v as $t)
            }
        }
    )*};
}
numeric_float!(f32, f64);

/// How to read a stored type as `T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// HDF5's conversion is exact (same type, a wider integer, anything into a float): read as
    /// `T` directly, no extra copy.
    Direct,
    /// Stored as a signed integer: read as i64 and check that every value fits `T`.
    Signed,
    /// Stored as an unsigned integer: read as u64 and check.
    Unsigned,
    /// Stored as a float, read as an integer: read as f64 and check for whole numbers that fit.
    Float,
}

fn plan<T: H5Type>(c: &Container) -> Plan {
    use TypeDescriptor::{Float, Integer, Unsigned};
    let Ok(stored) = c.dtype().and_then(|t| t.to_descriptor()) else {
        // An unknown stored type: HDF5's own read refuses what it cannot convert.
        return Plan::Direct;
    };
    match (T::type_descriptor(), stored) {
        (Integer(t), Integer(s)) if s <= t => Plan::Direct,
        (Unsigned(t), Unsigned(s)) if s <= t => Plan::Direct,
        (Integer(t), Unsigned(s)) if s < t => Plan::Direct,
        (Integer(_) | Unsigned(_), Integer(_)) => Plan::Signed,
        (Integer(_) | Unsigned(_), Unsigned(_)) => Plan::Unsigned,
        (Integer(_) | Unsigned(_), Float(_)) => Plan::Float,
        _ => Plan::Direct,
    }
}

/// A stored value as `T`, or why it cannot be one.
fn from_i64<T: Numeric>(v: i64) -> Result<T, &'static str> {
    T::from_i64(v).ok_or(if v < 0 && T::from_i64(-1).is_none() {
        "negative, where only non-negative integers are valid"
    } else {
        "out of range"
    })
}

fn from_u64<T: Numeric>(v: u64) -> Result<T, &'static str> {
    T::from_u64(v).ok_or("out of range")
}

fn from_f64<T: Numeric>(v: f64) -> Result<T, &'static str> {
    if !v.is_finite() || v.fract() != 0.0 {
        return Err("not a whole number (stored as float, read as integer)");
    }
    // 2^63 and 2^64 are exact in f64; a whole number in [-2^63, 2^63) fits i64.
    let two_63 = (1u64 << 63) as f64;
    if (-two_63..two_63).contains(&v) {
        from_i64(v as i64)
    } else if (0.0..2.0 * two_63).contains(&v) {
        from_u64(v as u64)
    } else {
        Err("out of range")
    }
}

/// Convert the values of `a` with `f`, failing on the first one that does not convert with a
/// message naming the file, the field and the entry.
fn convert<S, T, D>(
    a: Array<S, D>,
    f: impl Fn(S) -> Result<T, &'static str>,
    what: &str,
    note: Option<&str>,
) -> Result<Array<T, D>>
where
    S: Copy + Display,
    D: Dimension,
    D::Pattern: std::fmt::Debug,
{
    let mut out = Vec::with_capacity(a.len());
    for (i, &v) in a.indexed_iter() {
        match f(v) {
            Ok(t) => out.push(t),
            Err(why) => match (why, note) {
                ("out of range", Some(note)) => bail!("{what} entry {i:?} is {v}; {note}"),
                (why, _) => {
                    bail!(
                        "{what} entry {i:?} is {v}: {why} for {}",
                        std::any::type_name::<T>()
                    )
                }
            },
        }
    }
    Ok(Array::from_shape_vec(a.raw_dim(), out)?)
}

/// Which part of a dataset to read.
#[derive(Clone, Debug)]
enum Region {
    All,
    Rows(Range<usize>),
    Columns(Range<usize>),
}

fn read_region<S: H5Type, D: Dimension>(
    c: &Container,
    region: &Region,
) -> hdf5::Result<Array<S, D>> {
    match region {
        Region::All => c.read::<S, D>(),
        Region::Rows(r) => c.read_slice::<S, _, D>(ndarray::s![r.start..r.end, ..]),
        Region::Columns(r) => c.read_slice::<S, _, D>(ndarray::s![.., r.start..r.end]),
    }
}

/// Read `region` of `c` as `T`, checking the stored values when HDF5's conversion could change
/// them (see [`Plan`]). `what` names the file and the field; `note` replaces the message for a
/// value out of the range of `T`.
fn read_checked<T, D>(
    c: &Container,
    region: &Region,
    what: &str,
    note: Option<&str>,
) -> Result<Array<T, D>>
where
    T: Numeric,
    D: Dimension,
    D::Pattern: std::fmt::Debug,
{
    let cannot = || format!("{what}: cannot read it");
    Ok(match plan::<T>(c) {
        Plan::Direct => read_region::<T, D>(c, region).with_context(cannot)?,
        Plan::Signed => convert(
            read_region::<i64, D>(c, region).with_context(cannot)?,
            from_i64,
            what,
            note,
        )?,
        Plan::Unsigned => convert(
            read_region::<u64, D>(c, region).with_context(cannot)?,
            from_u64,
            what,
            note,
        )?,
        Plan::Float => convert(
            read_region::<f64, D>(c, region).with_context(cannot)?,
            from_f64,
            what,
            note,
        )?,
    })
}

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

/// Read a 1-d dataset into a vector of `T`. HDF5 converts exactly what converts exactly (a
/// wider integer, anything to a float); a value stored as a negative integer, a fraction or a
/// number too large for `T` is refused, naming the file, the dataset and the entry.
pub fn read_vec<T: Numeric>(file: &File, name: &str) -> Result<Vec<T>> {
    read_vec_checked(file, name, None)
}

fn read_vec_checked<T: Numeric>(file: &File, name: &str, note: Option<&str>) -> Result<Vec<T>> {
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
    if plan::<T>(&ds) == Plan::Direct {
        return ds
            .read_raw::<T>()
            .with_context(|| format!("`{}`: cannot read dataset `{name}`", file.filename()));
    }
    let what = format!("`{}`: dataset `{name}`", file.filename());
    Ok(read_checked::<T, Ix1>(&ds, &Region::All, &what, note)?
        .into_raw_vec_and_offset()
        .0)
}

/// Read a 1-d dataset of vertex ids (stored as any integer type, or as whole floats) into u32,
/// refusing ids that are negative, fractional or do not fit.
pub fn read_ids_u32(file: &File, name: &str) -> Result<Vec<u32>> {
    read_vec_checked(file, name, Some("gnnpar supports vertex ids below 2^32"))
}

/// Read a 2-d dataset (values checked as in [`read_vec`]).
pub fn read_matrix<T: Numeric>(file: &File, name: &str) -> Result<Array2<T>> {
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
    let what = format!("`{}`: dataset `{name}`", file.filename());
    read_checked(&ds, &Region::All, &what, None)
}

/// Read rows `[start, end)` of a 2-d dataset (values checked as in [`read_vec`]).
pub fn read_matrix_rows<T: Numeric>(
    file: &File,
    name: &str,
    start: usize,
    end: usize,
) -> Result<Array2<T>> {
    let ds = file
        .dataset(name)
        .with_context(|| format!("`{}`: missing dataset `{name}`", file.filename()))?;
    let what = format!(
        "`{}`: rows {start}..{end} of dataset `{name}`",
        file.filename()
    );
    read_checked::<T, Ix2>(&ds, &Region::Rows(start..end), &what, None)
}

/// Read columns `cols` of every row of a 2-d dataset (a hyperslab: only the slice is kept in
/// memory; values checked as in [`read_vec`]).
pub fn read_matrix_columns<T: Numeric>(
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
    let what = format!(
        "`{}`: columns {}..{} of dataset `{name}`",
        file.filename(),
        cols.start,
        cols.end
    );
    read_checked::<T, Ix2>(&ds, &Region::Columns(cols), &what, None)
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

/// Read a scalar numeric attribute (values checked as in [`read_vec`]: a negative, fractional or
/// too large value for `T` is refused, naming the file and the attribute).
pub fn read_attr<T: Numeric>(file: &File, name: &str) -> Result<T> {
    let unreadable = || {
        format!(
            "`{}`: missing or unreadable attribute `{name}`",
            file.filename()
        )
    };
    let attr = file.attr(name).with_context(unreadable)?;
    let what = format!("`{}`: attribute `{name}`", file.filename());
    let checked = |r: Result<T, &'static str>, v: &dyn Display| -> Result<T> {
        r.map_err(|why| anyhow::anyhow!("{what} is {v}: {why} for {}", std::any::type_name::<T>()))
    };
    match plan::<T>(&attr) {
        Plan::Direct => attr.read_scalar::<T>().with_context(unreadable),
        Plan::Signed => {
            let v = attr.read_scalar::<i64>().with_context(unreadable)?;
            checked(from_i64(v), &v)
        }
        Plan::Unsigned => {
            let v = attr.read_scalar::<u64>().with_context(unreadable)?;
            checked(from_u64(v), &v)
        }
        Plan::Float => {
            let v = attr.read_scalar::<f64>().with_context(unreadable)?;
            checked(from_f64(v), &v)
        }
    }
}

/// Whether `file` has an attribute `name`.
pub fn has_attr(file: &File, name: &str) -> bool {
    file.attr_names()
        .is_ok_and(|names| names.iter().any(|n| n == name))
}

/// [`read_attr`] of an optional attribute: `default` where it is absent; a value that is there
/// but unreadable or out of range is an error, not the default.
pub fn read_attr_or<T: Numeric>(file: &File, name: &str, default: T) -> Result<T> {
    if has_attr(file, name) {
        read_attr(file, name)
    } else {
        Ok(default)
    }
}

/// [`read_str_attr`] of an optional attribute: `default` where it is absent; one that is there
/// but is no string is an error.
pub fn read_str_attr_or(file: &File, name: &str, default: &str) -> Result<String> {
    if has_attr(file, name) {
        read_str_attr(file, name)
    } else {
        Ok(default.to_string())
    }
}

/// Read a string attribute.
pub fn read_str_attr(file: &File, name: &str) -> Result<String> {
    use hdf5::types::{FixedAscii, FixedUnicode, VarLenAscii};
    let unreadable = || {
        format!(
            "`{}`: missing or unreadable attribute `{name}`",
            file.filename()
        )
    };
    let attr = file.attr(name).with_context(unreadable)?;
    let descriptor = attr
        .dtype()
        .and_then(|t| t.to_descriptor())
        .with_context(unreadable)?;
    // h5py writes `str` as variable-length UTF-8, NumPy's `bytes_` as fixed-length ASCII.
    const LONGEST: usize = 4096;
    let text = match descriptor {
        TypeDescriptor::VarLenUnicode => attr
            .read_scalar::<VarLenUnicode>()
            .map(|v| v.as_str().to_string()),
        TypeDescriptor::VarLenAscii => attr
            .read_scalar::<VarLenAscii>()
            .map(|v| v.as_str().to_string()),
        TypeDescriptor::FixedAscii(n) if n <= LONGEST => attr
            .read_scalar::<FixedAscii<LONGEST>>()
            .map(|v| v.as_str().to_string()),
        TypeDescriptor::FixedUnicode(n) if n <= LONGEST => attr
            .read_scalar::<FixedUnicode<LONGEST>>()
            .map(|v| v.as_str().to_string()),
        other => {
            let long = matches!(
                other,
                TypeDescriptor::FixedAscii(_) | TypeDescriptor::FixedUnicode(_)
            );
            bail!(
                "`{}`: attribute `{name}` is not a string{} (it is stored as {other})",
                file.filename(),
                if long {
                    format!(" of at most {LONGEST} bytes")
                } else {
                    String::new()
                }
            )
        }
    };
    text.with_context(unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::arr2;

    /// A file in a fresh directory holding `fill`'s datasets; returns the directory and file.
    fn file_with(fill: impl FnOnce(&File)) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.h5");
        {
            let f = create(&path).unwrap();
            fill(&f);
        }
        let f = open(&path).unwrap();
        (dir, f)
    }

    fn message<T: std::fmt::Debug>(r: Result<T>) -> String {
        format!("{:#}", r.unwrap_err())
    }

    #[test]
    fn optional_attributes_default_only_when_absent() {
        use hdf5::types::{FixedAscii, FixedUnicode, VarLenAscii};
        let (_d, f) = file_with(|f| {
            write_attr(f, "first_node", -3i64).unwrap();
            write_attr(f, "directed", 1u8).unwrap();
            write_attr(f, "number", 7u8).unwrap();
            write_str_attr(f, "name", "cora").unwrap();
            let ascii = VarLenAscii::from_ascii("ascii").unwrap();
            f.new_attr::<VarLenAscii>()
                .create("vla")
                .unwrap()
                .write_scalar(&ascii)
                .unwrap();
            let fixed = FixedAscii::<8>::from_ascii("fixed").unwrap();
            f.new_attr::<FixedAscii<8>>()
                .create("fa")
                .unwrap()
                .write_scalar(&fixed)
                .unwrap();
            let fixed = "fixé".parse::<FixedUnicode<8>>().unwrap();
            f.new_attr::<FixedUnicode<8>>()
                .create("fu")
                .unwrap()
                .write_scalar(&fixed)
                .unwrap();
        });
        assert!(has_attr(&f, "name") && !has_attr(&f, "nom"));
        assert_eq!(read_attr_or(&f, "absent", 5u64).unwrap(), 5);
        assert_eq!(read_attr_or(&f, "directed", 0u8).unwrap(), 1);
        let e = message(read_attr_or(&f, "first_node", 0u64));
        assert!(e.contains("attribute `first_node` is -3"), "{e}");
        assert_eq!(read_str_attr_or(&f, "absent", "none").unwrap(), "none");
        assert_eq!(read_str_attr_or(&f, "name", "").unwrap(), "cora");
        assert_eq!(read_str_attr(&f, "vla").unwrap(), "ascii");
        assert_eq!(read_str_attr(&f, "fa").unwrap(), "fixed");
        assert_eq!(read_str_attr(&f, "fu").unwrap(), "fixé");
        let e = message(read_str_attr_or(&f, "number", ""));
        assert!(
            e.contains("bad.h5") && e.contains("attribute `number`"),
            "{e}"
        );
        assert!(e.contains("not a string"), "{e}");
    }

    #[test]
    fn negative_signed_ids_are_refused_not_clamped() {
        let (_d, f) = file_with(|f| {
            write_vec(f, "indices", &[1i64, -1, 2]).unwrap();
            write_vec(f, "train_idx", &[0i64, 2, -1]).unwrap();
        });
        let e = message(read_ids_u32(&f, "indices"));
        for want in ["bad.h5", "`indices`", "entry 1", "-1", "negative"] {
            assert!(e.contains(want), "`{want}` in {e}");
        }
        let e = message(read_vec::<u64>(&f, "train_idx"));
        for want in ["bad.h5", "`train_idx`", "entry 2", "-1"] {
            assert!(e.contains(want), "`{want}` in {e}");
        }
    }

    #[test]
    fn fractional_or_non_finite_floats_are_refused_as_integers() {
        let (_d, f) = file_with(|f| {
            write_vec(f, "labels", &[0.0f64, 1.5, 1.0]).unwrap();
            write_vec(f, "nan", &[0.0f32, f32::NAN]).unwrap();
            write_vec(f, "whole", &[0.0f64, 1.0, 4294967295.0]).unwrap();
            write_matrix(
                f,
                "vertex_weights",
                arr2(&[[1.0f64, 2.0], [3.0, 4.5]]).view(),
            )
            .unwrap();
        });
        let e = message(read_vec::<i64>(&f, "labels"));
        for want in ["bad.h5", "`labels`", "entry 1", "1.5", "whole number"] {
            assert!(e.contains(want), "`{want}` in {e}");
        }
        let e = message(read_vec::<u64>(&f, "nan"));
        assert!(e.contains("`nan` entry 1 is NaN"), "{e}");
        let e = message(read_matrix::<i64>(&f, "vertex_weights"));
        for want in ["`vertex_weights`", "entry (1, 1)", "4.5"] {
            assert!(e.contains(want), "`{want}` in {e}");
        }
        // Whole numbers stored as floats are read exactly.
        assert_eq!(read_vec::<i64>(&f, "whole").unwrap(), [0, 1, 4294967295]);
        assert_eq!(read_ids_u32(&f, "whole").unwrap(), [0, 1, u32::MAX]);
    }

    #[test]
    fn values_too_large_for_the_target_are_refused() {
        let (_d, f) = file_with(|f| {
            write_vec(f, "indices", &[0u64, 1 << 32]).unwrap();
            write_vec(f, "wide", &[3i64, 1 << 40]).unwrap();
            write_vec(f, "labels", &[1u64, u64::MAX]).unwrap();
        });
        let e = message(read_ids_u32(&f, "indices"));
        assert!(e.contains("`indices` entry 1 is 4294967296"), "{e}");
        assert!(e.contains("below 2^32"), "{e}");
        let e = message(read_ids_u32(&f, "wide"));
        assert!(e.contains("`wide` entry 1 is 1099511627776"), "{e}");
        let e = message(read_vec::<i64>(&f, "labels"));
        assert!(
            e.contains("`labels` entry 1 is 18446744073709551615"),
            "{e}"
        );
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn exact_conversions_still_read() {
        let (_d, f) = file_with(|f| {
            write_vec(f, "narrow", &[0u32, 7, u32::MAX]).unwrap();
            write_vec(f, "signed", &[0i32, 5]).unwrap();
            write_matrix(f, "features", arr2(&[[0.5f64, -1.25], [2.0, 3.0]]).view()).unwrap();
            write_matrix(f, "counts", arr2(&[[1i32, 2], [3, 4]]).view()).unwrap();
        });
        assert_eq!(read_vec::<u64>(&f, "narrow").unwrap(), [0, 7, 4294967295]);
        assert_eq!(read_ids_u32(&f, "narrow").unwrap(), [0, 7, u32::MAX]);
        assert_eq!(read_vec::<u64>(&f, "signed").unwrap(), [0, 5]);
        assert_eq!(
            read_matrix::<f32>(&f, "features").unwrap(),
            arr2(&[[0.5f32, -1.25], [2.0, 3.0]])
        );
        assert_eq!(
            read_matrix::<i64>(&f, "counts").unwrap(),
            arr2(&[[1i64, 2], [3, 4]])
        );
        assert_eq!(
            read_matrix_rows::<u64>(&f, "counts", 1, 2).unwrap(),
            arr2(&[[3u64, 4]])
        );
        assert_eq!(
            read_matrix_columns::<u8>(&f, "counts", 1..2).unwrap(),
            arr2(&[[2u8], [4]])
        );
    }

    #[test]
    fn attributes_are_checked_like_datasets() {
        let (_d, f) = file_with(|f| {
            write_attr(f, "num_nodes", -1i64).unwrap();
            write_attr(f, "num_classes", 2.5f64).unwrap();
            write_attr(f, "first_node", 3i64).unwrap();
        });
        let e = message(read_attr::<u64>(&f, "num_nodes"));
        assert!(
            e.contains("bad.h5") && e.contains("attribute `num_nodes` is -1"),
            "{e}"
        );
        let e = message(read_attr::<u64>(&f, "num_classes"));
        assert!(e.contains("attribute `num_classes` is 2.5"), "{e}");
        assert_eq!(read_attr::<u64>(&f, "first_node").unwrap(), 3);
    }
}
