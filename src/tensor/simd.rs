//! Run a hot loop compiled for the best vector extension this CPU has.
//!
//! The crate is built for baseline x86-64 (SSE2), so that one binary runs on every node of a
//! cluster. Element-wise kernels (aggregation `axpy`, dropout hashing, activations, Adam) are
//! plain Rust loops that LLVM vectorises well when it may use AVX2 or AVX-512: [`dispatch`]
//! calls a closure from inside a function compiled with those features, so the closure (and
//! the `#[inline]` helpers it calls) is inlined there and vectorised for them.
//!
//! Results do not change with the extension used: Rust never contracts `a*b + c` into a fused
//! multiply-add on its own, nor reorders floating-point sums, so the vector code computes the
//! same operations in the same order as the scalar code.

use std::sync::atomic::{AtomicU8, Ordering};

/// The vector extensions a [`dispatch`] may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Baseline x86-64 (or another architecture).
    Base,
    /// AVX2 (256-bit vectors).
    Avx2,
    /// AVX-512 F/BW/DQ/VL (512-bit vectors, 64-bit multiplies for hashing).
    Avx512,
}

/// 0 = not yet detected, otherwise `Level as u8 + 1`.
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The best level this CPU supports (detected once).
#[inline]
pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        1 => Level::Base,
        2 => Level::Avx2,
        3 => Level::Avx512,
        _ => {
            let l = detect();
            LEVEL.store(l as u8 + 1, Ordering::Relaxed);
            l
        }
    }
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            return Level::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return Level::Avx2;
        }
    }
    Level::Base
}

/// Call `f` from code compiled for [`level`]'s extensions.
#[inline(always)]
pub fn dispatch<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level` checked that the CPU has these features.
        Level::Avx512 => unsafe { run_avx512(f) },
        Level::Avx2 => unsafe { run_avx2(f) },
        Level::Base => f(),
    }
    #[cfg(not(target_arch = "x86_64"))]
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi1,bmi2,popcnt")]
unsafe fn run_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,popcnt")]
unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatched_loops_give_the_scalar_results() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut y2 = y.clone();
        dispatch(|| crate::tensor::gather::axpy(0.3, &x, &mut y));
        for (yi, &xi) in y2.iter_mut().zip(&x) {
            *yi += 0.3 * xi;
        }
        assert_eq!(y, y2);
        assert_eq!(dispatch(|| 7), 7);
    }
}
