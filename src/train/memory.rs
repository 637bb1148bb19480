//! Per-rank peak memory for the run summary: the host's peak resident set and, on a device
//! backend, the most device memory the backend had allocated at once. Gathered from every rank,
//! because the point of a memory-saving strategy (SliceGCN) is the largest rank's figure.

use crate::backend::Backend;
use crate::comm::Group;
use serde::Serialize;

/// Peak memory of every rank (MiB), and the largest.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MemoryReport {
    /// Largest peak resident set over ranks.
    pub host_peak_mb_max: f64,
    /// Each rank's peak resident set (`VmHWM`), in rank order.
    pub host_peak_mb: Vec<f64>,
    /// Largest peak of device allocations over ranks, on a device backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_mb_max: Option<f64>,
    /// Each rank's peak of device allocations, on a device backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_mb: Option<Vec<f64>>,
    /// The model parameters each rank holds, in rank order (its gradients and two Adam
    /// moments are as many again, each): the whole model under data parallelism, less under
    /// NFP (a row slice of the input layer's weights) and SliceGCN (its own GCN).
    pub params: Vec<u64>,
}

/// Gather this rank's peaks and its parameter count `params` from every rank of `group`.
/// Collective.
pub fn gather<B: Backend>(group: &Group, backend: &B, params: usize) -> MemoryReport {
    let mb = |bytes: usize| bytes as f64 / 1048576.0;
    let host = crate::util::rss::peak_rss_mb().unwrap_or(f64::NAN);
    let host_all: Vec<f64> = group
        .allgather_u64(host.to_bits())
        .into_iter()
        .map(f64::from_bits)
        .collect();
    // Every rank runs the same backend kind, so all or none report a device peak.
    let device = backend.peak_memory().map(mb);
    let device_all: Vec<f64> = group
        .allgather_u64(device.unwrap_or(f64::NAN).to_bits())
        .into_iter()
        .map(f64::from_bits)
        .collect();
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    MemoryReport {
        host_peak_mb_max: max(&host_all),
        device_peak_mb_max: device.map(|_| max(&device_all)),
        device_peak_mb: device.map(|_| device_all),
        host_peak_mb: host_all,
        params: group.allgather_u64(params as u64),
    }
}
