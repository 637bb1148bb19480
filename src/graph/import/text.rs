//! Reading delimited text (CSV, TSV, whitespace-separated, optionally gzip-compressed) line by
//! line, with errors that name the file, the line and the column.
//!
//! Lines starting with `#` or `%` (after leading blanks) and blank lines are skipped. The
//! delimiter is sniffed from the first data line: a comma if it has one, else a tab, else runs
//! of blanks. A header is a first data line whose first field is not a number.

use crate::util::progress::Progress;
use anyhow::{bail, Context, Result};
use flate2::read::MultiGzDecoder;
use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

/// How fields are separated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delim {
    Comma,
    Tab,
    Blanks,
}

impl Delim {
    /// Guess from one data line.
    pub fn sniff(line: &[u8]) -> Self {
        if line.contains(&b',') {
            Delim::Comma
        } else if line.contains(&b'\t') {
            Delim::Tab
        } else {
            Delim::Blanks
        }
    }
}

/// Split `line` into fields (trimmed of surrounding blanks), calling `f(column, field)`;
/// columns count from 1. Stops early and returns the error when `f` fails.
#[inline]
pub fn for_each_field<'a>(
    line: &'a [u8],
    delim: Delim,
    mut f: impl FnMut(usize, &'a [u8]) -> Result<()>,
) -> Result<()> {
    match delim {
        Delim::Blanks => {
            let fields = line
                .split(|b| *b == b' ' || *b == b'\t')
                .filter(|s| !s.is_empty());
            for (i, field) in fields.enumerate() {
                f(i + 1, field)?;
            }
        }
        Delim::Comma | Delim::Tab => {
            let sep = if delim == Delim::Comma { b',' } else { b'\t' };
            for (i, field) in line.split(|b| *b == sep).enumerate() {
                f(i + 1, field.trim_ascii())?;
            }
        }
    }
    Ok(())
}

/// Fields of `line` as strings (for headers and short lines; allocates).
pub fn fields(line: &[u8], delim: Delim) -> Vec<String> {
    let mut out = Vec::new();
    let _ = for_each_field(line, delim, |_, f| {
        out.push(String::from_utf8_lossy(f).into_owned());
        Ok(())
    });
    out
}

/// Does this field look like a number (so a line starting with it is data, not a header)?
pub fn is_numeric(field: &[u8]) -> bool {
    std::str::from_utf8(field).is_ok_and(|s| s.parse::<f64>().is_ok())
}

/// A position in a text file, for error messages: "`path` line L, column C".
#[derive(Clone, Copy, Debug)]
pub struct At<'a> {
    pub file: &'a str,
    pub line: usize,
    pub column: usize,
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` line {}, column {}",
            self.file, self.line, self.column
        )
    }
}

/// Parse a non-negative integer (a vertex id or a class), refusing signs, fractions and text.
#[inline]
pub fn parse_u64(field: &[u8], at: At, what: &str) -> Result<u64> {
    if field.is_empty() {
        bail!("{at}: empty field where {what} (a non-negative integer) was expected");
    }
    let mut v: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            let text = String::from_utf8_lossy(field);
            if field[0] == b'-' && field[1..].iter().all(u8::is_ascii_digit) && field.len() > 1 {
                bail!(
                    "{at}: {what} is {text}, which is negative (expected a non-negative integer)"
                );
            }
            bail!("{at}: `{text}` is not a valid {what} (expected a non-negative integer)");
        }
        v = match v
            .checked_mul(10)
            .and_then(|v| v.checked_add((b - b'0') as u64))
        {
            Some(v) => v,
            None => bail!(
                "{at}: {what} `{}` is too large",
                String::from_utf8_lossy(field)
            ),
        };
    }
    Ok(v)
}

/// Parse an integer class label; accepts `3` and `3.0` (some exporters write floats), refuses
/// negatives, fractions, NaN and text.
pub fn parse_label(field: &[u8], at: At) -> Result<i64> {
    if let Ok(v) = parse_u64(field, at, "label") {
        return i64::try_from(v).with_context(|| format!("{at}: label {v} is too large"));
    }
    let text = String::from_utf8_lossy(field);
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x < 9.0e15 => Ok(x as i64),
        Ok(x) if x < 0.0 => {
            bail!("{at}: label is {text}, which is negative (expected a class id in [0, C))")
        }
        Ok(_) => bail!("{at}: label `{text}` is not a whole non-negative number"),
        Err(_) => bail!("{at}: `{text}` is not a valid label (expected a non-negative integer)"),
    }
}

/// Parse a finite feature value.
#[inline]
pub fn parse_feature(field: &[u8], at: At) -> Result<f32> {
    let text = std::str::from_utf8(field).ok();
    match text.and_then(|t| t.parse::<f32>().ok()) {
        Some(v) if v.is_finite() => Ok(v),
        Some(v) => bail!("{at}: feature is {v} (features must be finite)"),
        None => bail!(
            "{at}: `{}` is not a number (expected a feature value)",
            String::from_utf8_lossy(field)
        ),
    }
}

/// A text file read line by line, skipping comments and blank lines, reporting progress by
/// bytes of the file on disk (compressed bytes for `.gz`).
pub struct TextFile {
    /// The path as given, for messages.
    pub name: String,
    reader: Box<dyn BufRead>,
    consumed: Rc<Cell<u64>>,
    reported: u64,
    progress: Progress,
    buf: Vec<u8>,
    /// Byte range of the current line in `buf`.
    span: (usize, usize),
    /// 1-based number of the current line.
    pub line_no: usize,
}

/// Counts the bytes read from the file underneath any decompressor.
struct Counting<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

impl TextFile {
    /// Open `path`; a name ending in `.gz` is decompressed on the fly.
    pub fn open(path: &Path) -> Result<Self> {
        let name = path.display().to_string();
        if path.is_dir() {
            bail!("`{name}` is a directory, expected a text file");
        }
        let file = File::open(path).with_context(|| format!("cannot open `{name}`"))?;
        let total = file.metadata().map(|m| m.len()).unwrap_or(0);
        let consumed = Rc::new(Cell::new(0));
        let counting = Counting {
            inner: file,
            count: consumed.clone(),
        };
        let gz = path.extension().is_some_and(|e| e == "gz");
        let reader: Box<dyn BufRead> = if gz {
            Box::new(BufReader::with_capacity(
                1 << 20,
                MultiGzDecoder::new(BufReader::with_capacity(1 << 16, counting)),
            ))
        } else {
            Box::new(BufReader::with_capacity(1 << 20, counting))
        };
        let label = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| name.clone());
        Ok(TextFile {
            name,
            reader,
            consumed,
            reported: 0,
            progress: Progress::new(&label, total),
            buf: Vec::with_capacity(256),
            span: (0, 0),
            line_no: 0,
        })
    }

    /// Advance to the next data line; false at the end of the file.
    pub fn next_line(&mut self) -> Result<bool> {
        loop {
            self.buf.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .with_context(|| {
                    format!(
                        "cannot read `{}` after line {} (corrupt or not the expected format?)",
                        self.name, self.line_no
                    )
                })?;
            if n == 0 {
                self.span = (0, 0);
                return Ok(false);
            }
            self.line_no += 1;
            if self.line_no.is_multiple_of(65_536) {
                let now = self.consumed.get();
                self.progress.inc(now - self.reported);
                self.reported = now;
            }
            let line = self.buf.trim_ascii();
            if line.is_empty() || line[0] == b'#' || line[0] == b'%' {
                continue;
            }
            let start = self.buf.len() - self.buf.trim_ascii_start().len();
            self.span = (start, start + line.len());
            return Ok(true);
        }
    }

    /// The current data line, trimmed, without its line ending.
    pub fn line(&self) -> &[u8] {
        &self.buf[self.span.0..self.span.1]
    }

    /// Position of `column` on the current line, for errors.
    pub fn at(&self, column: usize) -> At<'_> {
        At {
            file: &self.name,
            line: self.line_no,
            column,
        }
    }

    /// Stop reporting progress; returns the seconds spent.
    pub fn finish(self) -> f64 {
        self.progress.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> At<'static> {
        At {
            file: "f.csv",
            line: 7,
            column: 2,
        }
    }

    #[test]
    fn sniffs_delimiters_and_splits() {
        assert_eq!(Delim::sniff(b"1,2"), Delim::Comma);
        assert_eq!(Delim::sniff(b"1\t2"), Delim::Tab);
        assert_eq!(Delim::sniff(b"1  2"), Delim::Blanks);
        assert_eq!(fields(b"1 \t 2  3", Delim::Blanks), vec!["1", "2", "3"]);
        assert_eq!(fields(b"a, b,c", Delim::Comma), vec!["a", "b", "c"]);
        assert!(is_numeric(b"12") && is_numeric(b"1.5e3") && !is_numeric(b"id_1"));
    }

    #[test]
    fn integer_errors_name_line_and_column() {
        assert_eq!(parse_u64(b"42", at(), "vertex id").unwrap(), 42);
        let e = parse_u64(b"-3", at(), "vertex id").unwrap_err().to_string();
        assert!(
            e.contains("line 7, column 2") && e.contains("negative"),
            "{e}"
        );
        let e = parse_u64(b"x1", at(), "vertex id").unwrap_err().to_string();
        assert!(e.contains("`x1`") && e.contains("f.csv"), "{e}");
        let e = parse_u64(b"99999999999999999999999", at(), "vertex id")
            .unwrap_err()
            .to_string();
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn labels_and_features() {
        assert_eq!(parse_label(b"3", at()).unwrap(), 3);
        assert_eq!(parse_label(b"3.0", at()).unwrap(), 3);
        assert!(parse_label(b"-1", at())
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(parse_label(b"nan", at()).is_err());
        assert!(parse_label(b"2.5", at()).is_err());
        assert_eq!(parse_feature(b"-0.5", at()).unwrap(), -0.5);
        let e = parse_feature(b"NaN", at()).unwrap_err().to_string();
        assert!(e.contains("finite") && e.contains("column 2"), "{e}");
        assert!(parse_feature(b"inf", at()).is_err());
        assert!(parse_feature(b"abc", at()).is_err());
    }
}
