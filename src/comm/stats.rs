//! Byte and time accounting of every communication call, per kind of operation, for the
//! per-epoch JSON (what moved, and what it cost).

use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Instant;

/// Totals of one kind of operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct OpStats {
    pub calls: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub seconds: f64,
}

/// Totals per kind of operation (`allreduce`, `alltoallv_ids`, `alltoallv_rows`, …).
#[derive(Debug, Default)]
pub struct CommStats {
    ops: RefCell<BTreeMap<&'static str, OpStats>>,
    /// Calls that handed MPI device pointers (a CUDA-aware MPI), whatever their kind.
    device_pointer_calls: Cell<u64>,
}

impl CommStats {
    /// Record one call of `kind` that started at `start`.
    pub fn record(&self, kind: &'static str, start: Instant, sent: usize, received: usize) {
        let mut ops = self.ops.borrow_mut();
        let e = ops.entry(kind).or_default();
        e.calls += 1;
        e.bytes_sent += sent as u64;
        e.bytes_received += received as u64;
        e.seconds += start.elapsed().as_secs_f64();
    }

    /// Count one call that handed MPI device memory instead of a host copy.
    pub fn record_device_pointers(&self) {
        self.device_pointer_calls
            .set(self.device_pointer_calls.get() + 1);
    }

    /// Calls so far that handed MPI device memory.
    pub fn device_pointer_calls(&self) -> u64 {
        self.device_pointer_calls.get()
    }

    /// Add totals counted elsewhere (another thread's communicator) to these.
    pub fn add(&self, other: &BTreeMap<&'static str, OpStats>) {
        let mut ops = self.ops.borrow_mut();
        for (kind, o) in other {
            let e = ops.entry(kind).or_default();
            e.calls += o.calls;
            e.bytes_sent += o.bytes_sent;
            e.bytes_received += o.bytes_received;
            e.seconds += o.seconds;
        }
    }

    /// A copy of the totals so far.
    pub fn snapshot(&self) -> BTreeMap<&'static str, OpStats> {
        self.ops.borrow().clone()
    }

    /// Totals accumulated since `earlier` (a previous snapshot).
    pub fn since(
        &self,
        earlier: &BTreeMap<&'static str, OpStats>,
    ) -> BTreeMap<&'static str, OpStats> {
        self.ops
            .borrow()
            .iter()
            .map(|(k, v)| {
                let e = earlier.get(k).copied().unwrap_or_default();
                (
                    *k,
                    OpStats {
                        calls: v.calls - e.calls,
                        bytes_sent: v.bytes_sent - e.bytes_sent,
                        bytes_received: v.bytes_received - e.bytes_received,
                        seconds: v.seconds - e.seconds,
                    },
                )
            })
            .collect()
    }
}
