//! Per-row losses of several batches in one device buffer, read back with one download.
//!
//! Each training step's loss kernel writes its per-row losses into the next free span of a
//! chunk ([`LossJournal::reserve`]), and the step keeps a [`JournalEntry`]. The training loop
//! reads the entries of a group of steps together (`train::losses`): the first read of a chunk
//! downloads everything written to it so far, once, and the others sum from that copy. So a
//! step allocates, zeroes and downloads nothing for its loss, and a group of steps costs one
//! download (one wait for the device), not one per step.
//!
//! A chunk is written only until its first download (its host copy would miss later rows);
//! the next entries go to another chunk. Once every entry of a chunk has been read or dropped,
//! the chunk is zeroed (stream-ordered, after the kernels that wrote it) and written again
//! from its start.

use super::gpu::{DevBuf, DevPtr, Device};
use anyhow::Result;
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of a chunk unless one entry needs more: 1 MiB holds 256 steps of 1,024 `f32` losses.
const CHUNK_BYTES: usize = 1 << 20;

/// Entries start at multiples of this (the `f64` losses' alignment).
const ALIGN: usize = 8;

/// How an entry's per-row losses are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossKind {
    F32,
    /// `f64`, as written by a kernel (its bits).
    F64,
}

impl LossKind {
    fn bytes(self) -> usize {
        match self {
            LossKind::F32 => 4,
            LossKind::F64 => 8,
        }
    }
}

/// One device buffer of losses.
struct Chunk {
    buf: DevBuf,
    /// Bytes handed out.
    used: usize,
    /// Entries handed out and not yet read or dropped.
    live: usize,
    /// The written bytes on the host, once downloaded (the chunk takes no more entries).
    host: Option<Vec<u8>>,
}

/// The journal of one device, shared by the backend's clones.
pub struct LossJournal {
    device: Device,
    chunks: Mutex<Vec<Chunk>>,
}

/// One batch's per-row losses in a [`LossJournal`]: read with [`JournalEntry::sum`], released
/// when dropped.
pub struct JournalEntry {
    journal: Arc<LossJournal>,
    chunk: usize,
    offset: usize,
    rows: usize,
    kind: LossKind,
}

impl std::fmt::Debug for LossJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LossJournal({} chunks)", self.chunks())
    }
}

impl LossJournal {
    pub fn new(device: Device) -> Arc<LossJournal> {
        Arc::new(LossJournal {
            device,
            chunks: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Chunk>> {
        // A panic while holding it left the counts as they were: still usable.
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Room for `rows` losses of `kind`, zeroed: where a kernel writes them, and the entry
    /// that reads them.
    pub fn reserve(
        self: &Arc<Self>,
        rows: usize,
        kind: LossKind,
    ) -> Result<(DevPtr, JournalEntry)> {
        let bytes = (rows * kind.bytes()).max(ALIGN);
        let mut chunks = self.lock();
        let fits = |c: &Chunk| c.host.is_none() && c.used + bytes <= c.buf.len();
        let index = match chunks.iter().position(fits) {
            Some(i) => i,
            None => {
                let buf = self.device.alloc_zeroed(bytes.max(CHUNK_BYTES))?;
                chunks.push(Chunk {
                    buf,
                    used: 0,
                    live: 0,
                    host: None,
                });
                chunks.len() - 1
            }
        };
        let chunk = &mut chunks[index];
        let offset = chunk.used;
        chunk.used = (offset + bytes).next_multiple_of(ALIGN);
        chunk.live += 1;
        let ptr = chunk.buf.at(offset);
        let entry = JournalEntry {
            journal: self.clone(),
            chunk: index,
            offset,
            rows,
            kind,
        };
        Ok((ptr, entry))
    }

    /// Device memory the journal holds (tests).
    pub fn chunks(&self) -> usize {
        self.lock().len()
    }
}

impl JournalEntry {
    /// The losses summed in row order as `f64` (as the CPU adds them). The first read of the
    /// chunk downloads what was written to it, which waits for the work queued before.
    pub fn sum(&self) -> Result<f64> {
        let mut chunks = self.journal.lock();
        let chunk = &mut chunks[self.chunk];
        if chunk.host.is_none() {
            let mut host = vec![0u8; chunk.used];
            self.journal
                .device
                .copy_to_host(chunk.buf.ptr(), &mut host)?;
            chunk.host = Some(host);
        }
        let host = chunk.host.as_ref().expect("downloaded above");
        let bytes = &host[self.offset..self.offset + self.rows * self.kind.bytes()];
        Ok(match self.kind {
            LossKind::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64)
                .sum(),
            LossKind::F64 => bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .sum(),
        })
    }
}

impl Drop for JournalEntry {
    fn drop(&mut self) {
        let mut chunks = self.journal.lock();
        let chunk = &mut chunks[self.chunk];
        chunk.live -= 1;
        if chunk.live == 0 {
            // Every entry read or dropped: start the chunk again, zeroed behind the kernels
            // that wrote it. A failure here leaves it downloaded, so it takes no more entries.
            if self
                .journal
                .device
                .gpu
                .zero(chunk.buf.ptr(), chunk.used)
                .is_ok()
            {
                chunk.used = 0;
                chunk.host = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::emu::emu_device_for_tests;
    use crate::backend::cuda::kernels::SOURCES;

    fn write(device: &Device, ptr: DevPtr, bytes: &[u8]) {
        device.copy_to_device(ptr, bytes).unwrap();
    }

    #[test]
    fn a_group_of_entries_is_read_with_one_download_and_the_chunk_is_reused() {
        let device = emu_device_for_tests(SOURCES).expect("the emulator builds");
        let journal = LossJournal::new(device.clone());
        let (p1, e1) = journal.reserve(3, LossKind::F32).unwrap();
        let (p2, e2) = journal.reserve(2, LossKind::F64).unwrap();
        let (_, e3) = journal.reserve(1, LossKind::F32).unwrap();
        let f32s: Vec<u8> = [1.0f32, 2.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write(&device, p1, &f32s);
        let f64s: Vec<u8> = [0.25f64, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        write(&device, p2, &f64s);
        // Entry 3 is left as reserved: zeros.
        let before = device.calls.snapshot();
        assert_eq!(e1.sum().unwrap(), 3.5);
        assert_eq!(e2.sum().unwrap(), 4.25);
        assert_eq!(e3.sum().unwrap(), 0.0);
        let calls = device.calls.snapshot().since(&before);
        assert_eq!(calls.downloads, 1, "one download for the three entries");
        // A new entry while the downloaded chunk still has live ones goes elsewhere.
        let (_, e4) = journal.reserve(1, LossKind::F32).unwrap();
        assert_eq!(journal.chunks(), 2);
        drop((e1, e2, e3));
        // The first chunk is free again, zeroed: the next entry starts it over.
        let (p5, e5) = journal.reserve(2, LossKind::F32).unwrap();
        assert_eq!(p5, p1, "the first chunk, from its start");
        assert_eq!(journal.chunks(), 2);
        assert_eq!(e5.sum().unwrap(), 0.0, "zeroed before reuse");
        drop((e4, e5));
    }
}
