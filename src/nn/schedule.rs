//! Learning-rate schedules, stepped once per epoch. The rate of an epoch is a pure function of
//! (schedule, base rate, epoch, epochs), so a run resumed from a checkpoint at epoch `e` uses
//! exactly the rates of the uninterrupted run: nothing but the position is state.

use crate::kinds::LrSchedule;

/// The learning rate of epoch `epoch` (0-based) of a run of `epochs` epochs.
///
/// `Cosine` is PyTorch's `CosineAnnealingLR(T_max = epochs, eta_min = 0)` stepped after every
/// epoch: `lr · (1 + cos(π · epoch / epochs)) / 2` (the closed form, which the recursive update
/// PyTorch applies equals up to rounding). Epoch 0 trains at `lr`; the rate reaches 0 only at
/// `epoch = epochs`, after the last epoch.
pub fn lr_at(schedule: LrSchedule, lr: f32, epoch: usize, epochs: usize) -> f32 {
    match schedule {
        LrSchedule::Constant => lr,
        LrSchedule::Cosine => {
            let t = epoch.min(epochs) as f64 / epochs.max(1) as f64;
            (lr as f64 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())) as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_never_moves() {
        for e in [0, 3, 99] {
            assert_eq!(lr_at(LrSchedule::Constant, 0.01, e, 100), 0.01);
        }
    }

    /// Values of PyTorch's `CosineAnnealingLR(opt, T_max=500)` with `lr = 0.001`, read after
    /// `e` calls of `scheduler.step()`.
    #[test]
    fn cosine_matches_pytorch_at_known_epochs() {
        let cases = [
            (0, 0.001),
            (125, 0.000_853_553_4),
            (250, 0.000_5),
            (375, 0.000_146_446_6),
            (499, 9.869_6e-9),
            (500, 0.0),
        ];
        for (e, want) in cases {
            let got = lr_at(LrSchedule::Cosine, 0.001, e, 500) as f64;
            assert!((got - want).abs() < 1e-9, "epoch {e}: {got} vs {want}");
        }
    }
}
