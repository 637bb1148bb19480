//! Exporting a whole dataset as a NumPy `.npz` of gnnpar's own arrays, for tools that have
//! numpy but no HDF5 reader (a PyTorch image on a GPU node need not have `h5py`; the GPU
//! benchmark's PyG peer reads this).
//!
//! The archive is uncompressed (members `stored`, so `np.load(..., mmap_mode=None)` reads at
//! disk speed) and holds, little-endian, C order:
//!
//! | member | dtype | shape | meaning |
//! | --- | --- | --- | --- |
//! | `indptr` | int64 | n + 1 | CSR row offsets |
//! | `indices` | int64 | E | `indices[indptr[v]..indptr[v+1]]` send messages to `v` |
//! | `features` | float32 | n × d | only when the dataset has features |
//! | `labels` | int64 | n, or n × C (multi-label) | only when labelled |
//! | `train_idx`, `val_idx`, `test_idx` | int64 | any | split vertex ids |
//! | `num_classes` | int64 | () | |
//! | `directed` | bool | () | false: every edge is stored both ways |
//!
//! It is not the heterophilous-benchmark layout that `gnnpar prepare` imports (that one stores
//! each undirected edge once), because a directed graph cannot be written that way.

use super::import::npy;
use super::{Dataset, Labels};
use anyhow::{Context, Result};
use std::io::{Seek, Write};
use std::path::Path;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// What an export wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NpzExport {
    /// Arrays written.
    pub arrays: usize,
    /// Bytes of the archive.
    pub bytes: u64,
}

/// An array's element type as numpy names it, and its bytes.
trait NpyElement: Copy {
    const DESCR: &'static str;
    fn put(self, out: &mut Vec<u8>);
}

impl NpyElement for i64 {
    const DESCR: &'static str = "<i8";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl NpyElement for f32 {
    const DESCR: &'static str = "<f4";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl NpyElement for bool {
    const DESCR: &'static str = "|b1";
    fn put(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

/// Writes members one after the other into a zip archive.
struct NpzWriter<W: Write + Seek> {
    zip: ZipWriter<W>,
    arrays: usize,
}

impl<W: Write + Seek> NpzWriter<W> {
    /// Member `name`.npy with `shape` and the elements of `values` (row-major), streamed in
    /// chunks so that a large array is never copied whole.
    fn array<T: NpyElement>(
        &mut self,
        name: &str,
        shape: &[usize],
        values: impl IntoIterator<Item = T>,
    ) -> Result<()> {
        let count: usize = shape.iter().product();
        let bytes = count * std::mem::size_of::<T>() + 128;
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .large_file(bytes >= u32::MAX as usize);
        self.zip.start_file(format!("{name}.npy"), options)?;
        self.zip.write_all(&npy::header(T::DESCR, false, shape))?;
        let mut chunk = Vec::with_capacity(1 << 20);
        let mut written = 0usize;
        for v in values {
            v.put(&mut chunk);
            written += 1;
            if chunk.len() >= 1 << 20 {
                self.zip.write_all(&chunk)?;
                chunk.clear();
            }
        }
        self.zip.write_all(&chunk)?;
        debug_assert_eq!(written, count, "{name}: shape {shape:?}");
        self.arrays += 1;
        Ok(())
    }
}

/// A writer that, once a write, flush or seek has failed, takes every later one as done and
/// does nothing, keeping the positions it would have had. The archive's first error reaches the
/// caller through the write that failed; the zip writer's `Drop` then finishes the archive
/// into nothing instead of printing a second, raw error of its own (the temporary file is
/// removed either way). It counts positions from where `inner` starts (a new file: 0).
struct Fuse<W> {
    inner: W,
    blown: bool,
    /// The position, and the end of what was written, as `inner` has them (or would).
    pos: u64,
    end: u64,
}

impl<W> Fuse<W> {
    fn new(inner: W) -> Self {
        Fuse {
            inner,
            blown: false,
            pos: 0,
            end: 0,
        }
    }
}

impl<W: Write> Write for Fuse<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = if self.blown {
            buf.len()
        } else {
            match self.inner.write(buf) {
                Ok(n) => n,
                Err(e) => {
                    self.blown = true;
                    return Err(e);
                }
            }
        };
        self.pos += written as u64;
        self.end = self.end.max(self.pos);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.blown {
            return Ok(());
        }
        let result = self.inner.flush();
        self.blown = result.is_err();
        result
    }
}

impl<W: Seek> Seek for Fuse<W> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        use std::io::SeekFrom;
        if !self.blown {
            match self.inner.seek(to) {
                Ok(p) => self.pos = p,
                Err(e) => {
                    self.blown = true;
                    return Err(e);
                }
            }
        } else {
            let base = match to {
                SeekFrom::Start(p) => p as i128,
                SeekFrom::Current(d) => self.pos as i128 + d as i128,
                SeekFrom::End(d) => self.end as i128 + d as i128,
            };
            self.pos = base.max(0) as u64;
        }
        Ok(self.pos)
    }
}

/// Write every array of `ds` (a whole dataset) into `out` as an npz archive.
fn write_npz<W: Write + Seek>(ds: &Dataset, out: W) -> Result<(usize, W)> {
    let mut w = NpzWriter {
        zip: ZipWriter::new(out),
        arrays: 0,
    };
    let n = ds.local_nodes();
    let g = &ds.graph;
    w.array(
        "indptr",
        &[g.indptr.len()],
        g.indptr.iter().map(|&x| x as i64),
    )?;
    w.array(
        "indices",
        &[g.indices.len()],
        g.indices.iter().map(|&x| x as i64),
    )?;
    if let Some(x) = &ds.features {
        w.array("features", &[x.nrows(), x.ncols()], x.iter().copied())?;
    }
    match &ds.labels {
        Some(Labels::Class(y)) => w.array("labels", &[y.len()], y.iter().copied())?,
        Some(Labels::Multi(y)) => w.array("labels", &[y.nrows(), y.ncols()], y.iter().copied())?,
        None => {}
    }
    for (name, ids) in [
        ("train_idx", &ds.splits.train),
        ("val_idx", &ds.splits.val),
        ("test_idx", &ds.splits.test),
    ] {
        w.array(name, &[ids.len()], ids.iter().map(|&v| v as i64))?;
    }
    w.array("num_classes", &[], [ds.num_classes as i64])?;
    w.array("directed", &[], [ds.directed])?;
    debug_assert_eq!(g.indptr.len(), n + 1);
    let arrays = w.arrays;
    Ok((arrays, w.zip.finish()?))
}

/// Export the whole dataset `ds` to `path` as an npz archive, atomically (a temporary file
/// renamed into place, so a failure leaves nothing behind).
pub fn export_npz(ds: &Dataset, path: &Path) -> Result<NpzExport> {
    let output = crate::util::atomic::AtomicOutput::new(path)?;
    let file = std::fs::File::create(output.tmp_path())
        .with_context(|| format!("cannot create `{}`", output.tmp_path().display()))?;
    let buffered = Fuse::new(std::io::BufWriter::with_capacity(1 << 20, file));
    let (arrays, file) = write_npz(ds, buffered)
        .with_context(|| format!("writing `{}`", output.tmp_path().display()))?;
    let file = file
        .inner
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing `{}`", output.tmp_path().display()))?;
    file.sync_all()
        .with_context(|| format!("writing `{}`", output.tmp_path().display()))?;
    let bytes = file.metadata()?.len();
    output.commit()?;
    Ok(NpzExport { arrays, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::import::npz::Npz;
    use crate::graph::{Csr, Splits};
    use ndarray::array;

    /// A writer that fails after `room` bytes, as a full disk or `ulimit -f` does.
    struct Full {
        room: usize,
        at: u64,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if buf.len() > self.room {
                return Err(std::io::Error::other("File too large"));
            }
            self.room -= buf.len();
            self.at += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Seek for Full {
        fn seek(&mut self, _: std::io::SeekFrom) -> std::io::Result<u64> {
            Ok(self.at)
        }
    }

    #[test]
    fn a_failed_write_is_reported_once_and_the_rest_is_skipped() {
        let ds = Dataset {
            name: "t".into(),
            num_nodes: 3,
            first_node: 0,
            graph: Csr {
                indptr: vec![0, 1, 2, 3],
                indices: vec![1, 2, 0],
            },
            features: Some(array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]]),
            labels: Some(Labels::Class(vec![0, 1, 0])),
            num_classes: 2,
            splits: Splits::default(),
            directed: true,
        };
        let Err(e) = write_npz(&ds, Fuse::new(Full { room: 200, at: 0 })) else {
            panic!("a write past the room succeeded");
        };
        assert!(format!("{e:#}").contains("File too large"), "{e:#}");
        // The fuse took the zip writer's `Drop`: its finishing writes found a blown fuse.
        let mut fuse = Fuse::new(Full { room: 4, at: 0 });
        assert!(fuse.write(b"12345").is_err());
        assert_eq!(fuse.write(b"6").unwrap(), 1);
        assert_eq!(fuse.inner.room, 4);
        assert!(fuse.flush().is_ok());
        // Positions go on as if written: 0 + the 1 byte taken after the failure.
        assert_eq!(fuse.stream_position().unwrap(), 1);
        assert_eq!(fuse.seek(std::io::SeekFrom::End(-1)).unwrap(), 0);
    }

    /// What gnnpar's own npz reader (numpy's rules) reads back is what was written.
    #[test]
    fn arrays_read_back() {
        let ds = Dataset {
            name: "t".into(),
            num_nodes: 3,
            first_node: 0,
            graph: Csr::from_edges(3, &[0, 1, 2], &[1, 2, 0]),
            features: Some(array![[1.0f32, -2.0], [0.5, 4.0], [8.0, 0.25]]),
            labels: Some(Labels::Class(vec![1, 0, 1])),
            num_classes: 2,
            splits: Splits {
                train: vec![0, 2],
                val: vec![1],
                test: vec![],
            },
            directed: true,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.npz");
        let wrote = export_npz(&ds, &path).unwrap();
        assert_eq!(wrote.arrays, 9);
        let mut npz = Npz::open(&path).unwrap();
        let ints = |npz: &mut Npz, key: &str| npz.array(key).unwrap().to_i64().unwrap();
        let indptr: Vec<i64> = ds.graph.indptr.iter().map(|&x| x as i64).collect();
        assert_eq!(ints(&mut npz, "indptr"), indptr);
        let indices: Vec<i64> = ds.graph.indices.iter().map(|&x| x as i64).collect();
        assert_eq!(ints(&mut npz, "indices"), indices);
        assert_eq!(ints(&mut npz, "labels"), vec![1, 0, 1]);
        assert_eq!(ints(&mut npz, "train_idx"), vec![0, 2]);
        assert_eq!(ints(&mut npz, "test_idx"), Vec::<i64>::new());
        assert_eq!(ints(&mut npz, "num_classes"), vec![2]);
        let x = npz.array("features").unwrap();
        assert_eq!(x.shape, vec![3, 2]);
        assert_eq!(
            x.to_f32().unwrap(),
            ds.features.unwrap().into_raw_vec_and_offset().0
        );
    }
}
