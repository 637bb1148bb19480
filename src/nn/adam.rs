//! Adam with weight decay, with PyTorch's semantics: by default the L2 term `wd·p` is added to
//! the gradient (`torch.optim.Adam(weight_decay=…)`); with `decoupled` the parameters are
//! shrunk by `lr·wd·p` before the update instead (`torch.optim.AdamW`). The moments live where
//! the parameters live (the backend's buffers); the update is the backend's
//! ([`Backend::adam_step`]).

use anyhow::{ensure, Result};

use crate::backend::{AdamStep, Backend, Cpu};

/// Adam state over one flat parameter buffer.
#[derive(Debug)]
pub struct Adam<B: Backend = Cpu> {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// AdamW: decay the weights directly instead of adding `wd·p` to the gradient.
    pub decoupled: bool,
    m: B::Buffer,
    v: B::Buffer,
    t: u64,
    backend: B,
}

impl Adam<Cpu> {
    /// Adam on the CPU with PyTorch's defaults (`betas = (0.9, 0.999)`, `eps = 1e-8`).
    pub fn new(n_params: usize, lr: f32, weight_decay: f32) -> Adam<Cpu> {
        Adam::on(Cpu, n_params, lr, weight_decay)
    }
}

impl<B: Backend> Adam<B> {
    /// Adam on `backend` with PyTorch's defaults (`betas = (0.9, 0.999)`, `eps = 1e-8`).
    pub fn on(backend: B, n_params: usize, lr: f32, weight_decay: f32) -> Adam<B> {
        let zeros = vec![0.0; n_params];
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            decoupled: false,
            m: backend.buffer_from_host(&zeros),
            v: backend.buffer_from_host(&zeros),
            t: 0,
            backend,
        }
    }

    /// One update of `values` from `grads` (both the full flat buffers).
    ///
    /// # Panics
    /// If the buffer lengths differ from the optimizer's.
    pub fn step(&mut self, values: &mut B::Buffer, grads: &B::Buffer) {
        let n = self.backend.buffer_len(&self.m);
        assert_eq!(
            self.backend.buffer_len(values),
            n,
            "adam: parameter count changed"
        );
        assert_eq!(
            self.backend.buffer_len(grads),
            n,
            "adam: gradient count differs"
        );
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        // Bias corrections in f64 as PyTorch computes them (Python floats).
        let bc1 = 1.0 - (b1 as f64).powi(self.t.min(i32::MAX as u64) as i32);
        let bc2 = 1.0 - (b2 as f64).powi(self.t.min(i32::MAX as u64) as i32);
        let step = AdamStep {
            beta1: b1,
            beta2: b2,
            lr: self.lr,
            weight_decay: self.weight_decay,
            eps: self.eps,
            decoupled: self.decoupled,
            step_size: (self.lr as f64 / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
        };
        self.backend
            .adam_step(values, grads, &mut self.m, &mut self.v, step);
    }

    /// First moments, second moments and the step count, on the host (for checkpoints).
    pub fn state(&self) -> (Vec<f32>, Vec<f32>, u64) {
        (
            self.backend.buffer_to_host(&self.m),
            self.backend.buffer_to_host(&self.v),
            self.t,
        )
    }

    /// Restore the state saved by [`Adam::state`]; the lengths must match the model's.
    pub fn set_state(&mut self, m: &[f32], v: &[f32], t: u64) -> Result<()> {
        let n = self.backend.buffer_len(&self.m);
        ensure!(
            m.len() == n && v.len() == n,
            "Adam state has {} / {} moments but the model has {} parameters",
            m.len(),
            v.len(),
            n
        );
        self.backend.buffer_write(&mut self.m, m);
        self.backend.buffer_write(&mut self.v, v);
        self.t = t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PyTorch's Adam / AdamW update written out in f64 for one scalar.
    fn reference(p0: f64, grads: &[f64], lr: f64, wd: f64, decoupled: bool) -> f64 {
        let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8f64);
        let (mut p, mut m, mut v) = (p0, 0.0, 0.0);
        for (t, &g0) in grads.iter().enumerate() {
            let t = (t + 1) as i32;
            let mut g = g0;
            if decoupled {
                p *= 1.0 - lr * wd;
            } else {
                g += wd * p;
            }
            m = b1 * m + (1.0 - b1) * g;
            v = b2 * v + (1.0 - b2) * g * g;
            let m_hat = m / (1.0 - b1.powi(t));
            let v_hat = v / (1.0 - b2.powi(t));
            p -= lr * m_hat / (v_hat.sqrt() + eps);
        }
        p
    }

    #[test]
    fn matches_hand_computed_adam_and_adamw() {
        let grads = [
            [0.5f32, -2.0, 0.0],
            [0.1, -1.0, 3.0],
            [-0.3, 0.2, 1e-3],
            [2.0, 2.0, -2.0],
        ];
        for &(wd, decoupled) in &[(0.0f32, false), (0.01, false), (0.05, true)] {
            let mut values = vec![1.0f32, -0.5, 0.25];
            let start = values.clone();
            let mut opt = Adam::new(3, 0.01, wd);
            opt.decoupled = decoupled;
            for g in &grads {
                opt.step(&mut values, &g.to_vec());
            }
            for i in 0..3 {
                let gi: Vec<f64> = grads.iter().map(|g| g[i] as f64).collect();
                let expect = reference(start[i] as f64, &gi, 0.01, wd as f64, decoupled);
                assert!(
                    (values[i] as f64 - expect).abs() < 1e-6,
                    "param {i} (wd {wd}, decoupled {decoupled}): {} vs {expect}",
                    values[i]
                );
            }
            assert_eq!(opt.state().2, 4);
        }
    }

    #[test]
    fn state_round_trips_and_bad_lengths_are_refused() {
        let mut a = Adam::new(2, 0.1, 0.0);
        let mut p = vec![1.0f32, 2.0];
        a.step(&mut p, &vec![0.5, -0.5]);
        let (m, v, t) = a.state();
        let mut b = Adam::new(2, 0.1, 0.0);
        b.set_state(&m, &v, t).unwrap();
        let mut q = p.clone();
        a.step(&mut p, &vec![0.2, 0.1]);
        b.step(&mut q, &vec![0.2, 0.1]);
        assert_eq!(p, q);
        let err = b.set_state(&[0.0], &[0.0], 1).unwrap_err().to_string();
        assert!(err.contains("2 parameters"), "{err}");
    }
}
