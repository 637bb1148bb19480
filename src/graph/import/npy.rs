//! A small reader for NumPy `.npy` arrays: the magic string, a version 1/2/3 header holding a
//! Python dict literal (`descr`, `fortran_order`, `shape`), then the raw little-endian data.
//!
//! Only what graph datasets use is supported: `<f4`, `<f8`, `|u1`, `|b1`, `<i4`, `<i8`, in C
//! order. Anything else (big-endian data, Fortran order, object arrays) is refused with a
//! message that names the array and says what was found.

use anyhow::{bail, Result};
use rayon::prelude::*;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The element type of an array, from its `descr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    U8,
    Bool,
    I32,
    I64,
}

impl Dtype {
    fn parse(descr: &str, what: &str) -> Result<Self> {
        let dtype = match descr {
            "<f4" => Dtype::F32,
            "<f8" => Dtype::F64,
            "|u1" | "<u1" => Dtype::U8,
            "|b1" | "<b1" => Dtype::Bool,
            "<i4" => Dtype::I32,
            "<i8" => Dtype::I64,
            d if d.starts_with('>') => bail!(
                "{what}: dtype `{d}` is big-endian; gnnpar reads little-endian arrays only \
                 (convert with `arr.astype(arr.dtype.newbyteorder('<'))`)"
            ),
            d => bail!(
                "{what}: unsupported dtype `{d}` (expected one of <f4, <f8, |u1, |b1, <i4, <i8)"
            ),
        };
        Ok(dtype)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::Bool => 1,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    /// The NumPy spelling, for messages.
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
            Dtype::U8 => "|u1",
            Dtype::Bool => "|b1",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
        }
    }
}

/// One array: its type, its shape and its raw little-endian bytes (C order).
#[derive(Clone, Debug)]
pub struct NpyArray {
    /// Name for messages, e.g. "`cora.npz`: `edges`".
    pub what: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    data: Vec<u8>,
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

    /// The elements as f32 (from f32, f64, u8 or bool). f64 values outside the f32 range
    /// become infinite and are then caught by the finiteness check of the caller.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        Ok(match self.dtype {
            Dtype::F32 => self
                .data
                .par_chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F64 => self
                .data
                .par_chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("chunk of 8")) as f32)
                .collect(),
            Dtype::U8 | Dtype::Bool => self.data.par_iter().map(|&b| b as f32).collect(),
            d => bail!(
                "{}: dtype `{}` where floating-point or uint8 values were expected",
                self.what,
                d.descr()
            ),
        })
    }

    /// The elements as i64 (from i64, i32 or u8).
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        Ok(match self.dtype {
            Dtype::I64 => self
                .data
                .par_chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunk of 8")))
                .collect(),
            Dtype::I32 => self
                .data
                .par_chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::U8 => self.data.iter().map(|&b| b as i64).collect(),
            d => bail!(
                "{}: dtype `{}` where integers (<i8, <i4 or |u1) were expected",
                self.what,
                d.descr()
            ),
        })
    }

    /// The elements as booleans (from bool or u8: non-zero is true).
    pub fn to_bool(&self) -> Result<Vec<bool>> {
        match self.dtype {
            Dtype::Bool | Dtype::U8 => Ok(self.data.iter().map(|&b| b != 0).collect()),
            d => bail!(
                "{}: dtype `{}` where booleans (|b1) were expected",
                self.what,
                d.descr()
            ),
        }
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
    if fortran_order {
        bail!(
            "{what}: array is stored in Fortran order; gnnpar reads C-order arrays only \
             (save `np.ascontiguousarray(arr)`)"
        );
    }
    let dtype = Dtype::parse(&descr, what)?;
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
            "{what}: shape {shape:?} of `{}` needs {expected} bytes of data but the array holds \
             {found} (truncated or corrupt)",
            dtype.descr()
        );
    }
    let mut data = bytes;
    data.drain(..data_start);
    Ok(NpyArray {
        what: what.to_string(),
        dtype,
        shape,
        data,
    })
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
            "{what}: .npy `descr` is not a simple type string (structured arrays are not supported)"
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

/// Encode an array as a version 1 `.npy` file (used by tests and fixtures; gnnpar itself only
/// reads npy).
pub fn encode(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
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
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Pad so the data starts on a 64-byte boundary, newline-terminated, as NumPy does.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn round_trips_a_float_matrix() {
        let bytes = encode("<f4", &[2, 3], &f32_bytes(&[1., 2., 3., 4., 5., 6.]));
        assert_eq!(
            (10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize) % 64,
            0
        );
        let a = parse(bytes, "t").unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.to_f32().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
        assert!(a.to_i64().is_err());
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
    fn refuses_fortran_big_endian_and_truncated_arrays() {
        let mut fortran = encode("<f4", &[1, 1], &f32_bytes(&[1.0]));
        let at = fortran.windows(5).position(|w| w == b"False").unwrap();
        fortran[at..at + 5].copy_from_slice(b"True ");
        let err = parse(fortran, "x.npy").unwrap_err().to_string();
        assert!(err.contains("Fortran order"), "{err}");

        let err = parse(encode(">f4", &[1], &[0; 4]), "x.npy")
            .unwrap_err()
            .to_string();
        assert!(err.contains("big-endian"), "{err}");

        let mut short = encode("<f4", &[4], &f32_bytes(&[1., 2., 3., 4.]));
        short.truncate(short.len() - 3);
        let err = parse(short, "x.npy").unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("x.npy"), "{err}");

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
}
