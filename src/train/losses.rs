//! The steps' losses and counters, summed over ranks and checked a group of steps at a time.
//!
//! A step's loss on a device is read by a download, which waits for every operation queued
//! before it ([`LossSum`]). Read at every step, the host would wait for each step's forward
//! pass on the device before it queued the backward pass; so the losses of up to
//! [`READ_EVERY`] steps wait (on the device, or on the host for a host backend, alike: every
//! rank reads at the same steps whatever its backend) and are read together, summed over ranks
//! with their counters in one collective. A non-finite loss is then refused naming the step it
//! came from, at most `READ_EVERY - 1` steps late (the run ends with an error either way).

use super::checkpoint::Position;
use crate::backend::LossSum;
use crate::comm::World;
use anyhow::{bail, Result};
use std::time::Instant;

/// The most steps whose losses wait on the device before they are read.
pub const READ_EVERY: usize = 16;

/// Where a step was when it ran: what a non-finite loss names.
#[derive(Clone, Copy, Debug)]
struct StepAt {
    epoch: usize,
    step: u64,
    batch: usize,
}

/// One step's loss on this rank, still to be read, and its counters.
#[derive(Debug)]
struct Pending {
    loss: LossSum,
    /// Destination rows, edges and input rows this rank processed.
    counts: [f64; 3],
    /// The global batch's seeds (every rank's).
    seeds: usize,
    at: StepAt,
}

/// An epoch's losses and counters: summed over ranks, and those still on the device.
#[derive(Debug, Default)]
pub struct StepLosses {
    /// Loss summed over the seeds trained, and their count.
    pub loss_sum: f64,
    pub loss_count: usize,
    /// Destination rows, edges and input rows processed, summed over ranks.
    pub counts: (u64, u64, u64),
    pending: Vec<Pending>,
}

impl StepLosses {
    /// Add a finished step's `loss` and counters (`[rows, edges, input rows]` of this rank) over
    /// a global batch of `seeds`, the step at `pos`; read the group once [`READ_EVERY`] wait.
    /// Collective over `world`: every rank adds the same steps, so every rank reads at the
    /// same one.
    pub fn add(
        &mut self,
        world: &World,
        pos: &mut Position,
        loss: LossSum,
        counts: [f64; 3],
        seeds: usize,
    ) -> Result<()> {
        let at = StepAt {
            epoch: pos.epoch,
            step: pos.step,
            batch: pos.batch,
        };
        self.pending.push(Pending {
            loss,
            counts,
            seeds,
            at,
        });
        if self.pending.len() >= READ_EVERY {
            self.read(world, pos)?;
        }
        Ok(())
    }

    /// Whether losses wait to be read.
    pub fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Read the waiting losses (a download each on a device: this waits for the device to
    /// finish the work queued so far), sum them and their counters over ranks in one
    /// collective, and add them in step order; refuse the first non-finite one. Collective.
    /// Returns the seconds the collective took on this rank: mostly its wait for the slowest
    /// rank to finish the steps read.
    pub fn read(&mut self, world: &World, pos: &mut Position) -> Result<f64> {
        if self.pending.is_empty() {
            return Ok(0.0);
        }
        let pending = std::mem::take(&mut self.pending);
        let mut sums = Vec::with_capacity(pending.len() * 4);
        let mut steps = Vec::with_capacity(pending.len());
        for p in pending {
            sums.push(p.loss.value());
            sums.extend(p.counts);
            steps.push((p.seeds, p.at));
        }
        let t = Instant::now();
        world.allreduce_sum_f64(&mut sums);
        let collective = t.elapsed().as_secs_f64();
        for (s, (seeds, at)) in sums.chunks_exact(4).zip(steps) {
            let batch_loss = s[0] / seeds as f64;
            if !batch_loss.is_finite() {
                bail!(
                    "loss is {batch_loss} at epoch {} step {} (batch {}); lower `lr` or check \
                     the features for extreme values",
                    at.epoch,
                    at.step,
                    at.batch
                );
            }
            self.loss_sum += s[0];
            self.loss_count += seeds;
            pos.epoch_loss_sum += s[0];
            pos.epoch_loss_seeds += seeds as u64;
            self.counts.0 += s[1] as u64;
            self.counts.1 += s[2] as u64;
            self.counts.2 += s[3] as u64;
        }
        Ok(collective)
    }

    /// The mean loss per seed of the steps read so far.
    pub fn mean(&self) -> f64 {
        self.loss_sum / self.loss_count.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::World;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A device-like loss: counts its reads.
    fn later(value: f64, reads: &Arc<AtomicUsize>) -> LossSum {
        let reads = reads.clone();
        LossSum::pending(move || {
            reads.fetch_add(1, Ordering::SeqCst);
            value
        })
    }

    #[test]
    fn losses_are_read_together_every_so_many_steps_and_at_the_end() {
        let world = World::solo();
        let mut pos = Position::start();
        let mut losses = StepLosses::default();
        let reads = Arc::new(AtomicUsize::new(0));
        // A host loss waits with the others.
        losses
            .add(&world, &mut pos, LossSum::ready(4.0), [1.0, 2.0, 3.0], 2)
            .unwrap();
        assert!(losses.waiting());
        for i in 0..READ_EVERY - 2 {
            pos.step += 1;
            losses
                .add(&world, &mut pos, later(i as f64, &reads), [1.0; 3], 1)
                .unwrap();
        }
        assert_eq!(reads.load(Ordering::SeqCst), 0, "read before they were due");
        assert_eq!(
            losses.loss_count, 0,
            "waiting losses are not in the totals yet"
        );
        losses
            .add(&world, &mut pos, later(100.0, &reads), [1.0; 3], 1)
            .unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), READ_EVERY - 1);
        assert!(!losses.waiting());
        let sum: f64 = 4.0 + (0..READ_EVERY - 2).map(|i| i as f64).sum::<f64>() + 100.0;
        assert_eq!(losses.loss_sum, sum);
        assert_eq!(losses.loss_count, 2 + READ_EVERY - 1);
        assert_eq!(pos.epoch_loss_seeds, (1 + READ_EVERY) as u64);
        assert_eq!(
            losses.counts,
            (
                READ_EVERY as u64,
                2 + READ_EVERY as u64 - 1,
                3 + READ_EVERY as u64 - 1
            )
        );
        // The epoch's end reads what waits.
        losses
            .add(&world, &mut pos, later(1.0, &reads), [0.0; 3], 1)
            .unwrap();
        assert!(losses.waiting());
        losses.read(&world, &mut pos).unwrap();
        assert!(!losses.waiting());
        assert_eq!(losses.loss_count, 2 + READ_EVERY);
    }

    #[test]
    fn a_non_finite_loss_read_late_names_the_step_it_came_from() {
        let world = World::solo();
        let mut pos = Position::start();
        let mut losses = StepLosses::default();
        let reads = Arc::new(AtomicUsize::new(0));
        for step in 0..4u64 {
            pos.step = step;
            pos.batch = step as usize;
            let value = if step == 2 { f64::NAN } else { 1.0 };
            losses
                .add(&world, &mut pos, later(value, &reads), [0.0; 3], 1)
                .unwrap();
        }
        let err = losses.read(&world, &mut pos).unwrap_err().to_string();
        assert!(err.contains("step 2 (batch 2)"), "{err}");
        assert!(err.contains("loss is NaN"), "{err}");
    }
}
