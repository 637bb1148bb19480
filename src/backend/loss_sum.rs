//! A batch's summed loss as a backend hands it back: a number on the host, or per-row losses
//! still on the device, read when the training loop wants them.
//!
//! Reading a device's loss is a download, and a download waits for every operation queued
//! before it. Read at once, a step's loss would stop the host between the forward pass and the
//! backward pass until the device has finished the forward: the device then idles while the
//! host queues the backward pass, and the host cannot queue the next step while the device
//! works on this one. Kept as a [`LossSum`], the losses of several steps are read together
//! (`train::losses`), after the work of all of them has been queued.

use std::fmt;

/// A summed loss, ready or to be read.
pub struct LossSum(Inner);

enum Inner {
    Ready(f64),
    Pending(Box<dyn FnOnce() -> f64 + Send>),
}

impl LossSum {
    /// A loss already on the host.
    pub fn ready(value: f64) -> LossSum {
        LossSum(Inner::Ready(value))
    }

    /// A loss that `read` fetches (and sums) when it is wanted; `read` may wait for the device.
    pub fn pending(read: impl FnOnce() -> f64 + Send + 'static) -> LossSum {
        LossSum(Inner::Pending(Box::new(read)))
    }

    /// The value, read from the device if it is still there.
    pub fn value(self) -> f64 {
        match self.0 {
            Inner::Ready(v) => v,
            Inner::Pending(read) => read(),
        }
    }
}

impl Default for LossSum {
    fn default() -> LossSum {
        LossSum::ready(0.0)
    }
}

impl fmt::Debug for LossSum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::Ready(v) => write!(f, "LossSum({v})"),
            Inner::Pending(_) => write!(f, "LossSum(on the device)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_pending_loss_is_read_only_when_its_value_is_asked_for() {
        let read = Arc::new(AtomicBool::new(false));
        let flag = read.clone();
        let loss = LossSum::pending(move || {
            flag.store(true, Ordering::SeqCst);
            2.5
        });
        assert_eq!(format!("{loss:?}"), "LossSum(on the device)");
        assert!(!read.load(Ordering::SeqCst), "read before it was asked for");
        assert_eq!(loss.value(), 2.5);
        assert!(read.load(Ordering::SeqCst));
        let ready = LossSum::ready(1.0);
        assert_eq!(format!("{ready:?}"), "LossSum(1)");
        assert_eq!(ready.value(), 1.0);
        assert_eq!(LossSum::default().value(), 0.0);
    }
}
