//! A reader for NumPy `.npy` arrays: the magic string, a version 1/2/3 header holding a Python
//! dict literal (`descr`, `fortran_order`, `shape`), then the raw data.
//!
//! Read, as NumPy reads them:
//! - dtypes bool (`b1`), int8/16/32/64 (`i1 i2 i4 i8`), uint8/16/32/64 (`u1 u2 u4 u8`) and
//!   float16/32/64 (`f2 f4 f8`);
//! - any byte order: `<` (little-endian), `>` (big-endian, swapped on reading), `|` (not
//!   applicable) and `=` (native: taken as little-endian, the order of x86-64 and AArch64);
//! - C order and Fortran order (`'fortran_order': True`, what NumPy writes for a transposed
//!   array), of any number of dimensions; Fortran order is reordered to C order on reading with
//!   blocked parallel transposes.
//!
//! After [`parse`] an [`NpyArray`] holds little-endian C-order bytes whatever the file held, so
//! the conversions ([`NpyArray::to_f32`], [`NpyArray::to_i64`], [`NpyArray::to_bool`]) decode
//! in one parallel pass; f32 and i64 arrays, the common case, are a plain parallel copy.
//! Complex, string, object, structured and datetime arrays are refused with a message that
//! names the array and lists what is supported.

use anyhow::{bail, Result};
use rayon::prelude::*;

const MAGIC: &[u8] = b"\x93NUMPY";

/// What [`parse`] reads, for messages.
const SUPPORTED: &str = "bool (b1), int8/16/32/64 (i1 i2 i4 i8), uint8/16/32/64 (u1 u2 u4 u8) \
                         and float16/32/64 (f2 f4 f8), in byte order <, >, | or =, C or Fortran \
                         order";

/// The element type of an array, from its `descr` (the byte order is not part of it: the data
/// of an [`NpyArray`] is always little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
}

impl Dtype {
    /// The type and whether its data is big-endian, from a `descr` such as `<f4` or `>i8`.
    fn parse(descr: &str, what: &str) -> Result<(Self, bool)> {
        let (big_endian, code) = match descr.as_bytes().first() {
            Some(b'<' | b'|' | b'=') => (false, &descr[1..]),
            Some(b'>') => (true, &descr[1..]),
            _ => (false, descr),
        };
        let dtype = match code {
            "b1" => Dtype::Bool,
            "i1" => Dtype::I8,
            "i2" => Dtype::I16,
            "i4" => Dtype::I32,
            "i8" => Dtype::I64,
            "u1" => Dtype::U8,
            "u2" => Dtype::U16,
            "u4" => Dtype::U32,
            "u8" => Dtype::U64,
            "f2" => Dtype::F16,
            "f4" => Dtype::F32,
            "f8" => Dtype::F64,
            _ => {
                let kind = match code.as_bytes().first() {
                    Some(b'c') => "complex numbers",
                    Some(b'U' | b'S' | b'a') => "strings",
                    Some(b'O') => "Python objects",
                    Some(b'V') => "raw or structured records",
                    Some(b'M') => "datetimes",
                    Some(b'm') => "timedeltas",
                    Some(b'f') => "a float width other than 2, 4 or 8 bytes",
                    Some(b'i' | b'u') => "an integer width other than 1, 2, 4 or 8 bytes",
                    _ => "an unknown type",
                };
                bail!("{what}: unsupported dtype `{descr}` ({kind}); gnnpar reads {SUPPORTED}")
            }
        };
        Ok((dtype, big_endian))
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::I8 | Dtype::U8 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    /// The NumPy spelling of the little-endian type, for messages.
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::Bool => "|b1",
            Dtype::I8 => "|i1",
            Dtype::I16 => "<i2",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
            Dtype::U8 => "|u1",
            Dtype::U16 => "<u2",
            Dtype::U32 => "<u4",
            Dtype::U64 => "<u8",
            Dtype::F16 => "<f2",
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
        }
    }

    /// Is this a floating-point type?
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64)
    }
}

/// IEEE 754 half precision to single precision; exact (every f16 is an f32), NaN payloads kept.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: man × 2^-24. Shift the leading one up to the implicit bit (bit 10).
            let shift = man.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((man << shift) & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// One array: its type, its shape and its raw bytes, little-endian and in C order whatever the
/// file held.
#[derive(Clone, Debug)]
pub struct NpyArray {
    /// Name for messages, e.g. "`cora.npz`: `edges`".
    pub what: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    data: Vec<u8>,
}

/// Decode little-endian elements of `N` bytes in parallel.
fn decode<const N: usize, T: Send>(data: &[u8], f: impl Fn([u8; N]) -> T + Sync + Send) -> Vec<T> {
    data.par_chunks_exact(N)
        .map(|c| f(c.try_into().expect("chunk of N bytes")))
        .collect()
}

impl NpyArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` (C order) named for messages: "entry 4" in a vector, "row 1 column 2" in a
    /// matrix, "entry [1, 0, 2]" otherwise.
    fn at(&self, i: usize) -> String {
        match self.shape[..] {
            [] | [_] => format!("entry {i}"),
            [_, cols] => format!("row {} column {}", i / cols, i % cols),
            _ => {
                let mut index = vec![0; self.shape.len()];
                let mut rest = i;
                for (k, &d) in self.shape.iter().enumerate().rev() {
                    index[k] = rest % d;
                    rest /= d;
                }
                format!("entry {index:?}")
            }
        }
    }

    /// The elements of a float array as f64 (exact).
    fn floats(&self) -> Vec<f64> {
        match self.dtype {
            Dtype::F16 => decode(&self.data, |b| f64::from(f16_to_f32(u16::from_le_bytes(b)))),
            Dtype::F32 => decode(&self.data, |b| f64::from(f32::from_le_bytes(b))),
            Dtype::F64 => decode(&self.data, f64::from_le_bytes),
            d => unreachable!("floats() of {d:?}"),
        }
    }

    /// The elements as f32, from every dtype (bool: 0 or 1). Integers beyond 2^24 and f64
    /// values are rounded to the nearest f32, as NumPy's `astype(np.float32)` does; f64 values
    /// outside the f32 range become infinite and are then caught by the finiteness check of the
    /// caller.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let d = &self.data;
        Ok(match self.dtype {
            Dtype::F32 => decode(d, f32::from_le_bytes),
            Dtype::F64 => decode(d, |b| f64::from_le_bytes(b) as f32),
            Dtype::F16 => decode(d, |b| f16_to_f32(u16::from_le_bytes(b))),
            Dtype::Bool => d.par_iter().map(|&b| f32::from(u8::from(b != 0))).collect(),
            Dtype::U8 => d.par_iter().map(|&b| f32::from(b)).collect(),
            Dtype::I8 => d.par_iter().map(|&b| f32::from(b as i8)).collect(),
            Dtype::I16 => decode(d, |b| f32::from(i16::from_le_bytes(b))),
            Dtype::U16 => decode(d, |b| f32::from(u16::from_le_bytes(b))),
            Dtype::I32 => decode(d, |b| i32::from_le_bytes(b) as f32),
            Dtype::U32 => decode(d, |b| u32::from_le_bytes(b) as f32),
            Dtype::I64 => decode(d, |b| i64::from_le_bytes(b) as f32),
            Dtype::U64 => decode(d, |b| u64::from_le_bytes(b) as f32),
        })
    }

    /// The elements as i64, from every integer dtype and bool; from a float dtype only when
    /// every value is an integer within the i64 range (labels saved as floats), and uint64 only
    /// up to `i64::MAX`. The error names the first offending element and its value.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let d = &self.data;
        Ok(match self.dtype {
            Dtype::I64 => decode(d, i64::from_le_bytes),
            Dtype::I32 => decode(d, |b| i64::from(i32::from_le_bytes(b))),
            Dtype::I16 => decode(d, |b| i64::from(i16::from_le_bytes(b))),
            Dtype::I8 => d.par_iter().map(|&b| i64::from(b as i8)).collect(),
            Dtype::U8 => d.par_iter().map(|&b| i64::from(b)).collect(),
            Dtype::Bool => d.par_iter().map(|&b| i64::from(b != 0)).collect(),
            Dtype::U16 => decode(d, |b| i64::from(u16::from_le_bytes(b))),
            Dtype::U32 => decode(d, |b| i64::from(u32::from_le_bytes(b))),
            Dtype::U64 => {
                let values = decode(d, u64::from_le_bytes);
                if let Some(i) = values.par_iter().position_first(|&v| v > i64::MAX as u64) {
                    bail!(
                        "{}: {} is {}, beyond the largest int64 ({}); integers were expected",
                        self.what,
                        self.at(i),
                        values[i],
                        i64::MAX
                    );
                }
                values.into_par_iter().map(|v| v as i64).collect()
            }
            Dtype::F16 | Dtype::F32 | Dtype::F64 => {
                // 2^63: the first f64 beyond i64 (i64::MIN = -2^63 is representable).
                const LIMIT: f64 = 9_223_372_036_854_775_808.0;
                let values = self.floats();
                let integral = |v: f64| v.fract() == 0.0 && (-LIMIT..LIMIT).contains(&v);
                if let Some(i) = values.par_iter().position_first(|&v| !integral(v)) {
                    // f16 and f32 values print as themselves, not as their f64 expansion.
                    let shown = match self.dtype {
                        Dtype::F64 => values[i].to_string(),
                        _ => (values[i] as f32).to_string(),
                    };
                    bail!(
                        "{}: {} is {shown}: dtype `{}` is read as integers only when every \
                         value is a whole number within the int64 range",
                        self.what,
                        self.at(i),
                        self.dtype.descr()
                    );
                }
                values.into_par_iter().map(|v| v as i64).collect()
            }
        })
    }

    /// The elements as booleans, from every dtype: non-zero is true (NaN too, -0.0 is false),
    /// as NumPy's `astype(bool)`.
    pub fn to_bool(&self) -> Result<Vec<bool>> {
        let d = &self.data;
        Ok(match self.dtype {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => d.par_iter().map(|&b| b != 0).collect(),
            Dtype::I16 | Dtype::U16 => decode(d, |b| u16::from_le_bytes(b) != 0),
            Dtype::F16 => decode(d, |b| u16::from_le_bytes(b) & 0x7fff != 0),
            Dtype::I32 | Dtype::U32 => decode(d, |b| u32::from_le_bytes(b) != 0),
            Dtype::F32 => decode(d, |b| f32::from_le_bytes(b) != 0.0),
            Dtype::I64 | Dtype::U64 => decode(d, |b| u64::from_le_bytes(b) != 0),
            Dtype::F64 => decode(d, |b| f64::from_le_bytes(b) != 0.0),
        })
    }
}

/// Parse a whole `.npy` file held in `bytes`; `what` names it in errors.
pub fn parse(bytes: Vec<u8>, what: &str) -> Result<NpyArray> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        bail!("{what}: not a .npy array (missing the `\\x93NUMPY` magic string)");
    }
    let major = bytes[6];
    let (header_len, header_start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                bail!("{what}: .npy header is truncated");
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => bail!("{what}: unsupported .npy format version {v} (expected 1, 2 or 3)"),
    };
    let data_start = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| anyhow::anyhow!("{what}: .npy header is truncated"))?;
    // Version 3 allows UTF-8 in the header; versions 1 and 2 are latin-1, of which the dict
    // literal uses only the ASCII part, so UTF-8 decoding is right for all three.
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| anyhow::anyhow!("{what}: .npy header is not text"))?;
    let (descr, fortran_order, shape) = parse_header(header, what)?;
    let (dtype, big_endian) = Dtype::parse(&descr, what)?;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| anyhow::anyhow!("{what}: shape {shape:?} is too large"))?;
    let expected = count
        .checked_mul(dtype.size())
        .ok_or_else(|| anyhow::anyhow!("{what}: shape {shape:?} is too large"))?;
    let found = bytes.len() - data_start;
    if found != expected {
        bail!(
            "{what}: shape {shape:?} of `{descr}` needs {expected} bytes of data but the array \
             holds {found} (truncated or corrupt)"
        );
    }
    // In Fortran order the first index varies fastest; with fewer than two dimensions (or no
    // element) that is C order already.
    let reorder = fortran_order && shape.len() >= 2 && count > 0;
    let mut data = if reorder {
        log::debug!("{what}: reordering a Fortran-order {descr} array of shape {shape:?}");
        let mut out = vec![0u8; expected];
        let src = &bytes[data_start..];
        match dtype.size() {
            1 => fortran_to_c::<1>(src, &mut out, &shape),
            2 => fortran_to_c::<2>(src, &mut out, &shape),
            4 => fortran_to_c::<4>(src, &mut out, &shape),
            8 => fortran_to_c::<8>(src, &mut out, &shape),
            s => unreachable!("element size {s}"),
        }
        out
    } else {
        let mut data = bytes;
        data.drain(..data_start);
        data
    };
    if big_endian {
        match dtype.size() {
            2 => swap_bytes::<2>(&mut data),
            4 => swap_bytes::<4>(&mut data),
            8 => swap_bytes::<8>(&mut data),
            _ => {}
        }
    }
    Ok(NpyArray {
        what: what.to_string(),
        dtype,
        shape,
        data,
    })
}

/// Reverse the bytes of every `N`-byte element (big-endian to little-endian), in parallel.
fn swap_bytes<const N: usize>(data: &mut [u8]) {
    data.par_chunks_mut(N << 14).for_each(|block| {
        for e in block.chunks_exact_mut(N) {
            e.reverse();
        }
    });
}

/// Rows of the output written by one task of [`transpose`].
const TILE: usize = 64;

/// `dst` (`cols` × `rows`) = the transpose of `src` (`rows` × `cols`), both C order, elements
/// of `N` bytes. Parallel over bands of `TILE` rows of `dst` (`TILE` columns of `src`): a band
/// walks the rows of `src` in order, reading `TILE` contiguous elements of each and writing
/// them one column further along `TILE` output rows, so reads are whole cache lines and the
/// `TILE` write streams stay in cache until their lines are full.
fn transpose<const N: usize>(src: &[u8], dst: &mut [u8], rows: usize, cols: usize) {
    debug_assert_eq!(src.len(), rows * cols * N);
    debug_assert_eq!(dst.len(), src.len());
    if src.is_empty() {
        return;
    }
    dst.par_chunks_mut(TILE * rows * N)
        .enumerate()
        .for_each(|(band, out)| {
            let c0 = band * TILE;
            let width = out.len() / (rows * N);
            for r in 0..rows {
                let start = (r * cols + c0) * N;
                let segment = &src[start..start + width * N];
                for (k, e) in segment.chunks_exact(N).enumerate() {
                    let at = (k * rows + r) * N;
                    out[at..at + N].copy_from_slice(e);
                }
            }
        });
}

/// Reorder the Fortran-order array `src` of `shape` into C order in `dst`, elements of `N`
/// bytes.
///
/// Fortran offset of (i0, i1, …) is `i0 + d0 · J` with `J` the Fortran offset of (i1, …) in
/// shape (d1, …): `src` is a C-order M × d0 matrix (M = d1 · d2 ⋯) indexed [J, i0]. Its
/// transpose, d0 × M, holds for each i0 a Fortran-order array of shape (d1, …), which is
/// reordered the same way, in parallel; a 2-d array is one transpose.
fn fortran_to_c<const N: usize>(src: &[u8], dst: &mut [u8], shape: &[usize]) {
    if src.is_empty() {
        return;
    }
    match shape {
        [] | [_] => dst.copy_from_slice(src),
        [d0, rest @ ..] => {
            let m: usize = rest.iter().product();
            if rest.len() == 1 {
                transpose::<N>(src, dst, m, *d0);
            } else {
                let mut tmp = vec![0u8; src.len()];
                transpose::<N>(src, &mut tmp, m, *d0);
                tmp.par_chunks(m * N)
                    .zip(dst.par_chunks_mut(m * N))
                    .for_each(|(s, d)| fortran_to_c::<N>(s, d, rest));
            }
        }
    }
}

/// Parse the dict literal `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`.
fn parse_header(header: &str, what: &str) -> Result<(String, bool, Vec<usize>)> {
    let value_after = |key: &str| -> Result<&str> {
        let pat_single = format!("'{key}'");
        let pat_double = format!("\"{key}\"");
        let at = header
            .find(&pat_single)
            .map(|i| i + pat_single.len())
            .or_else(|| header.find(&pat_double).map(|i| i + pat_double.len()))
            .ok_or_else(|| anyhow::anyhow!("{what}: .npy header has no `{key}`: {header}"))?;
        let rest = header[at..].trim_start();
        rest.strip_prefix(':')
            .map(str::trim_start)
            .ok_or_else(|| anyhow::anyhow!("{what}: .npy header is malformed near `{key}`"))
    };

    let descr_rest = value_after("descr")?;
    let quote = descr_rest
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"');
    let descr = match quote {
        Some(q) => {
            let body = &descr_rest[1..];
            let end = body
                .find(q)
                .ok_or_else(|| anyhow::anyhow!("{what}: .npy header `descr` is unterminated"))?;
            body[..end].to_string()
        }
        None => bail!(
            "{what}: .npy `descr` is not a simple type string (a structured array); gnnpar \
             reads {SUPPORTED}"
        ),
    };

    let fortran_rest = value_after("fortran_order")?;
    let fortran_order = if fortran_rest.starts_with("True") {
        true
    } else if fortran_rest.starts_with("False") {
        false
    } else {
        bail!("{what}: .npy header `fortran_order` is neither True nor False");
    };

    let shape_rest = value_after("shape")?;
    let body = shape_rest
        .strip_prefix('(')
        .and_then(|s| s.find(')').map(|end| &s[..end]))
        .ok_or_else(|| anyhow::anyhow!("{what}: .npy header `shape` is not a tuple"))?;
    let mut shape = Vec::new();
    for part in body.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        // NumPy on some platforms writes `3L`.
        let digits = part.trim_end_matches('L');
        shape.push(digits.parse::<usize>().map_err(|_| {
            anyhow::anyhow!("{what}: .npy header `shape` holds `{part}`, not a dimension")
        })?);
    }
    Ok((descr, fortran_order, shape))
}

/// Encode an array as a version 1 `.npy` file in C order (tests and fixtures write npy this
/// way; `gnnpar export --format npz` streams [`header`] and the data instead). `data` is
/// written as given: it must already be in the byte order `descr` names.
pub fn encode(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    encode_with(descr, false, shape, data)
}

/// [`encode`] with the `fortran_order` flag of the header: with `fortran` true, `data` must
/// hold the elements with the first index varying fastest.
pub fn encode_with(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = header(descr, fortran, shape);
    out.extend_from_slice(data);
    out
}

/// The version 1 `.npy` header of an array (magic, version, length, the dict), after which
/// its data follows. `shape` `[]` is a 0-d array.
pub fn header(descr: &str, fortran: bool, shape: &[usize]) -> Vec<u8> {
    let shape_text = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let order = if fortran { "True" } else { "False" };
    let mut dict =
        format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_text}, }}");
    // Pad so the data starts on a 64-byte boundary, newline-terminated, as NumPy does.
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn f64_bytes(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// The big-endian image of the little-endian elements `le` of `size` bytes.
    fn to_be(le: &[u8], size: usize) -> Vec<u8> {
        le.chunks_exact(size)
            .flat_map(|c| c.iter().rev().copied())
            .collect()
    }

    /// A version 1 `.npy` file with the header dict `dict` as written.
    fn with_header(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut header = dict.to_string();
        header.push('\n');
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn round_trips_a_float_matrix() {
        let bytes = encode("<f4", &[2, 3], &f32_bytes(&[1., 2., 3., 4., 5., 6.5]));
        assert_eq!(
            (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
            0
        );
        let a = parse(bytes, "t").unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.to_f32().unwrap(), vec![1., 2., 3., 4., 5., 6.5]);
        let err = a.to_i64().unwrap_err().to_string();
        assert!(err.contains("row 1 column 2 is 6.5"), "{err}");
    }

    #[test]
    fn reads_version_2_headers_and_1d_shapes() {
        let v1 = encode("<i8", &[3], &[5i64, -1, 7].map(i64::to_le_bytes).concat());
        let hl = u16::from_le_bytes([v1[8], v1[9]]) as u32;
        let mut v2 = Vec::from(&v1[..6]);
        v2.extend_from_slice(&[2, 0]);
        v2.extend_from_slice(&hl.to_le_bytes());
        v2.extend_from_slice(&v1[10..]);
        let a = parse(v2, "t").unwrap();
        assert_eq!(a.shape, vec![3]);
        assert_eq!(a.to_i64().unwrap(), vec![5, -1, 7]);
    }

    #[test]
    fn refuses_truncated_and_foreign_files() {
        let mut short = encode(">f4", &[4], &f32_bytes(&[1., 2., 3., 4.]));
        short.truncate(short.len() - 3);
        let err = parse(short, "x.npy").unwrap_err().to_string();
        assert!(
            err.contains("truncated") && err.contains("x.npy") && err.contains(">f4"),
            "{err}"
        );

        let mut short = encode_with("<f8", true, &[2, 2], &f64_bytes(&[1., 2., 3., 4.]));
        short.pop();
        let err = parse(short, "f.npy").unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("f.npy"), "{err}");

        let err = parse(b"PK\x03\x04 not npy".to_vec(), "y.npy")
            .unwrap_err()
            .to_string();
        assert!(err.contains("magic"), "{err}");
    }

    #[test]
    fn bools_and_bytes() {
        let a = parse(encode("|b1", &[1, 3], &[1, 0, 1]), "m").unwrap();
        assert_eq!(a.to_bool().unwrap(), vec![true, false, true]);
        let u = parse(encode("|u1", &[2], &[0, 1]), "u").unwrap();
        assert_eq!(u.to_f32().unwrap(), vec![0.0, 1.0]);
    }

    /// One dtype: its code, element size, three little-endian elements and what each
    /// conversion gives (`None`: refused).
    struct Case {
        code: &'static str,
        size: usize,
        le: Vec<u8>,
        f32s: Vec<f32>,
        i64s: Vec<i64>,
        bools: Vec<bool>,
    }

    macro_rules! le {
        ($t:ty; $($v:expr),*) => {
            [$($v as $t),*].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()
        };
    }

    /// Every dtype, with values whose bytes differ so that a wrong byte order shows, and the
    /// pattern non-zero, zero, non-zero.
    fn cases() -> Vec<Case> {
        let tft = vec![true, false, true];
        let ints = |code, size, le, v: [i64; 3]| Case {
            code,
            size,
            le,
            f32s: v.iter().map(|&x| x as f32).collect(),
            i64s: v.to_vec(),
            bools: vec![v[0] != 0, v[1] != 0, v[2] != 0],
        };
        vec![
            Case {
                code: "b1",
                size: 1,
                le: vec![1, 0, 1],
                f32s: vec![1., 0., 1.],
                i64s: vec![1, 0, 1],
                bools: tft.clone(),
            },
            ints("i1", 1, le!(i8; -128, 0, 127), [-128, 0, 127]),
            ints("i2", 2, le!(i16; -32768, 0, 258), [-32768, 0, 258]),
            ints(
                "i4",
                4,
                le!(i32; i32::MIN, 0, 0x0102_0304),
                [i32::MIN as i64, 0, 0x0102_0304],
            ),
            ints(
                "i8",
                8,
                le!(i64; i64::MIN, 0, 0x0102_0304_0506_0708_i64),
                [i64::MIN, 0, 0x0102_0304_0506_0708],
            ),
            ints("u1", 1, le!(u8; 255, 0, 1), [255, 0, 1]),
            ints("u2", 2, le!(u16; 65535, 0, 258), [65535, 0, 258]),
            ints(
                "u4",
                4,
                le!(u32; u32::MAX, 0, 0x0102_0304),
                [u32::MAX as i64, 0, 0x0102_0304],
            ),
            ints(
                "u8",
                8,
                le!(u64; i64::MAX as u64, 0, 0x0102_0304_0506_0708_u64),
                [i64::MAX, 0, 0x0102_0304_0506_0708],
            ),
            Case {
                code: "f2",
                size: 2,
                // 2.0, -0.0, -3.0.
                le: le!(u16; 0x4000, 0x8000, 0xc200),
                f32s: vec![2.0, -0.0, -3.0],
                i64s: vec![2, 0, -3],
                bools: tft.clone(),
            },
            Case {
                code: "f4",
                size: 4,
                le: f32_bytes(&[-7.0, 0.0, 65_536.0]),
                f32s: vec![-7.0, 0.0, 65_536.0],
                i64s: vec![-7, 0, 65_536],
                bools: tft.clone(),
            },
            Case {
                code: "f8",
                size: 8,
                le: f64_bytes(&[0.5e15, 0.0, -1.0]),
                f32s: vec![0.5e15, 0.0, -1.0],
                i64s: vec![500_000_000_000_000, 0, -1],
                bools: tft,
            },
        ]
    }

    #[test]
    fn every_dtype_in_every_byte_order() {
        for case in cases() {
            for order in ["<", ">", "=", "|", ""] {
                let descr = format!("{order}{}", case.code);
                let bytes = if order == ">" {
                    to_be(&case.le, case.size)
                } else {
                    case.le.clone()
                };
                if case.size > 1 && order == ">" {
                    assert_ne!(bytes, case.le, "{descr}: the test must swap bytes");
                }
                let a = parse(encode(&descr, &[3], &bytes), "t.npy")
                    .unwrap_or_else(|e| panic!("{descr}: {e}"));
                assert_eq!(a.dtype.size(), case.size, "{descr}");
                assert_eq!(&a.dtype.descr()[1..], case.code, "{descr}");
                let f = a.to_f32().unwrap();
                // Bitwise, so that -0.0 is told from 0.0.
                assert_eq!(
                    f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    case.f32s.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{descr}: {f:?}"
                );
                assert_eq!(a.to_i64().unwrap(), case.i64s, "{descr}");
                assert_eq!(a.to_bool().unwrap(), case.bools, "{descr}");
            }
        }
    }

    /// The Fortran-order image of C-order elements `c` (each `size` bytes) of `shape`: the
    /// first index varies fastest.
    fn fortran_of(c: &[u8], size: usize, shape: &[usize]) -> Vec<u8> {
        let n: usize = shape.iter().product();
        let mut out = Vec::with_capacity(c.len());
        for p in 0..n {
            // Multi-index of Fortran position p, then its C offset.
            let mut rest = p;
            let mut offset = 0;
            let mut index = vec![0; shape.len()];
            for (k, &d) in shape.iter().enumerate() {
                index[k] = rest % d;
                rest /= d;
            }
            for (k, &d) in shape.iter().enumerate() {
                offset = offset * d + index[k];
            }
            out.extend_from_slice(&c[offset * size..(offset + 1) * size]);
        }
        out
    }

    #[test]
    fn fortran_order_reads_as_c_order() {
        let shapes: [&[usize]; 11] = [
            &[3, 4],
            &[130, 67],
            &[1, 5],
            &[5, 1],
            &[200, 2],
            &[2, 3, 4],
            &[5, 70, 3],
            &[3, 2, 2, 2],
            &[0, 3],
            &[4],
            &[],
        ];
        // One dtype of each element size, big- and little-endian.
        let codes = [
            ("|u1", 1),
            (">i2", 2),
            ("<u2", 2),
            ("<f4", 4),
            (">f8", 8),
            ("<i8", 8),
        ];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let values: Vec<i64> = (0..n as i64).map(|v| v % 251).collect();
            for (descr, size) in codes {
                let le: Vec<u8> = values
                    .iter()
                    .flat_map(|&v| match &descr[1..] {
                        "u1" => vec![v as u8],
                        "i2" => (v as i16).to_le_bytes().to_vec(),
                        "u2" => (v as u16).to_le_bytes().to_vec(),
                        "f4" => (v as f32).to_le_bytes().to_vec(),
                        "f8" => (v as f64).to_le_bytes().to_vec(),
                        "i8" => v.to_le_bytes().to_vec(),
                        d => unreachable!("{d}"),
                    })
                    .collect();
                let c = if descr.starts_with('>') {
                    to_be(&le, size)
                } else {
                    le
                };
                let f = fortran_of(&c, size, shape);
                if n > 2 && shape.iter().filter(|&&d| d > 1).count() > 1 {
                    assert_ne!(f, c, "{descr} {shape:?}: the test must reorder");
                }
                let what = format!("{descr} {shape:?}");
                let from_f = parse(encode_with(descr, true, shape, &f), &what).unwrap();
                let from_c = parse(encode_with(descr, false, shape, &c), &what).unwrap();
                assert_eq!(from_f.shape, shape, "{what}");
                assert_eq!(from_f.to_i64().unwrap(), values, "{what}");
                assert_eq!(from_f.to_f32().unwrap(), from_c.to_f32().unwrap(), "{what}");
                assert_eq!(from_f.data, from_c.data, "{what}");
            }
        }
    }

    /// The value of half-precision `h` from its definition.
    fn half_reference(h: u16) -> f64 {
        let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
        let exp = i32::from((h >> 10) & 0x1f);
        let man = f64::from(h & 0x3ff);
        match exp {
            0 => sign * man * 2f64.powi(-24),
            31 if man == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            e => sign * (1.0 + man / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn half_precision_is_exact() {
        for h in 0..=u16::MAX {
            let got = f16_to_f32(h);
            let want = half_reference(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}: {got}");
                // The payload is kept, so a quiet NaN stays quiet.
                assert_eq!(
                    got.to_bits() >> 13 & 0x3ff,
                    u32::from(h & 0x3ff),
                    "{h:#06x}"
                );
            } else {
                assert_eq!(f64::from(got), want, "{h:#06x}");
            }
            assert_eq!(got.is_sign_negative(), h >> 15 == 1, "{h:#06x}");
        }
        // Through an array: subnormals, the smallest normal, the largest finite value, infinities,
        // -0 and NaN; big-endian.
        let bits: [u16; 9] = [
            0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0xfc00, 0x8000, 0x7e00, 0x3555,
        ];
        let be: Vec<u8> = bits.iter().flat_map(|b| b.to_be_bytes()).collect();
        let a = parse(encode(">f2", &[9], &be), "h.npy").unwrap();
        let f = a.to_f32().unwrap();
        assert_eq!(f[0], 2f32.powi(-24));
        assert_eq!(f[1], 1023.0 * 2f32.powi(-24));
        assert_eq!(f[2], 2f32.powi(-14));
        assert_eq!(f[3], 65504.0);
        assert_eq!(f[4], f32::INFINITY);
        assert_eq!(f[5], f32::NEG_INFINITY);
        assert_eq!(f[6].to_bits(), (-0.0f32).to_bits());
        assert!(f[7].is_nan());
        assert_eq!(f[8], 0.333_251_95);
        assert_eq!(
            a.to_bool().unwrap(),
            vec![true, true, true, true, true, true, false, true, true]
        );
        let err = a.to_i64().unwrap_err().to_string();
        assert!(
            err.contains("h.npy") && err.contains("entry 0 is 0.000000059604645"),
            "{err}"
        );
    }

    #[test]
    fn integral_floats_are_integers_and_others_are_refused() {
        let a = parse(encode("<f8", &[4], &f64_bytes(&[0.0, 3.0, -0.0, 1.0])), "l").unwrap();
        assert_eq!(a.to_i64().unwrap(), vec![0, 3, 0, 1]);
        let a = parse(encode(">f4", &[2], &to_be(&f32_bytes(&[1.0, 2.0]), 4)), "l").unwrap();
        assert_eq!(a.to_i64().unwrap(), vec![1, 2]);
        let a = parse(
            encode("<f8", &[1], &f64_bytes(&[-9.223_372_036_854_776e18])),
            "l",
        )
        .unwrap();
        assert_eq!(a.to_i64().unwrap(), vec![i64::MIN]);

        let refused: [(&str, Vec<u8>, &[usize], &str); 5] = [
            ("<f4", f32_bytes(&[0.0, 1.5]), &[2], "entry 1 is 1.5"),
            ("<f8", f64_bytes(&[2.0, f64::NAN]), &[2], "entry 1 is NaN"),
            ("<f8", f64_bytes(&[f64::INFINITY]), &[1], "entry 0 is inf"),
            (
                "<f8",
                f64_bytes(&[1e19]),
                &[1],
                "entry 0 is 10000000000000000000",
            ),
            (
                "<f8",
                f64_bytes(&[0., 1., 2., 0.25]),
                &[2, 2],
                "row 1 column 1 is 0.25",
            ),
        ];
        for (descr, data, shape, expect) in refused {
            let a = parse(encode(descr, shape, &data), "`x.npz`: array `node_labels`").unwrap();
            let err = a.to_i64().unwrap_err().to_string();
            assert!(
                err.contains("`x.npz`: array `node_labels`") && err.contains(expect),
                "{descr}: {err}"
            );
        }
    }

    #[test]
    fn uint64_beyond_int64_is_refused() {
        let big = 1u64 << 63;
        let a = parse(encode("<u8", &[3], &le!(u64; 1, 2, big)), "u.npy").unwrap();
        let err = a.to_i64().unwrap_err().to_string();
        assert!(
            err.contains("u.npy") && err.contains("entry 2 is 9223372036854775808"),
            "{err}"
        );
        // The values still convert to floats and booleans.
        assert_eq!(a.to_f32().unwrap(), vec![1.0, 2.0, big as f32]);
        let a = parse(
            encode(">u8", &[1], &(i64::MAX as u64).to_be_bytes()),
            "u.npy",
        )
        .unwrap();
        assert_eq!(a.to_i64().unwrap(), vec![i64::MAX]);
    }

    #[test]
    fn unsupported_dtypes_are_refused_with_the_list() {
        for descr in [
            "<c8", ">c16", "<U5", "|S3", "|O", "|V8", "<M8[ns]", "<m8[s]", "<f16", "<i3",
        ] {
            let err = parse(encode(descr, &[1], &[0; 16]), "bad.npy")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("bad.npy")
                    && err.contains(&format!("`{descr}`"))
                    && err.contains("f2 f4 f8")
                    && err.contains("u1 u2 u4 u8"),
                "{descr}: {err}"
            );
        }
        let err = parse(encode("<c8", &[1], &[0; 8]), "c.npy")
            .unwrap_err()
            .to_string();
        assert!(err.contains("complex"), "{err}");
        let structured = with_header(
            "{'descr': [('a', '<f4'), ('b', '<i8')], 'fortran_order': False, 'shape': (1,), }",
            &[0; 12],
        );
        let err = parse(structured, "s.npy").unwrap_err().to_string();
        assert!(
            err.contains("s.npy") && err.contains("structured") && err.contains("i1 i2 i4 i8"),
            "{err}"
        );
    }
}
