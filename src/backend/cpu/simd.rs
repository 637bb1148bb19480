//! Run a hot loop compiled for the best vector extension this CPU has.
//!
//! The crate is built for baseline x86-64 (SSE2), so that one binary runs on every node of a
//! cluster. Element-wise kernels (aggregation `axpy`, dropout hashing, activations, Adam) are
//! plain Rust loops that LLVM vectorises well when it may use AVX2 or AVX-512: [`simd_kernel`]
//! defines a kernel whose body is force-inlined into copies compiled with those features and
//! picks one at run time.
//!
//! Results do not change with the extension used: Rust never contracts `a*b + c` into a fused
//! multiply-add on its own, nor reorders floating-point sums, so the vector code computes the
//! same operations in the same order as the scalar code.

use std::sync::atomic::{AtomicU8, Ordering};

/// The vector extensions a [`simd_kernel`] may use.
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

/// Define a kernel function that runs its body compiled for [`level`]'s extensions.
///
/// ```ignore
/// simd_kernel! {
///     /// Doc comment.
///     pub(crate) fn add_row(b: &[f32], row: &mut [f32]) { axpy(1.0, b, row) }
/// }
/// ```
///
/// The body becomes an `#[inline(always)]` function that is inlined into one copy compiled
/// with AVX-512 and one with AVX2 (and called plainly elsewhere); the kernel picks one per
/// call. Forced inlining is what makes this reliable: a closure handed to a
/// `#[target_feature]` function may stay out of line, and then runs as SSE2 code. Arguments
/// are plain `name: Type` pairs; the kernel returns nothing.
macro_rules! simd_kernel {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident $(<$($lt:lifetime),*>)? ($($arg:ident : $ty:ty),* $(,)?) $body:block
    ) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name $(<$($lt),*>)? ($($arg: $ty),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body $(<$($lt),*>)? ($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(
                    enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi1,bmi2,popcnt"
                )]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512 $(<$($lt),*>)? ($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,bmi1,bmi2,popcnt")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2 $(<$($lt),*>)? ($($arg: $ty),*) {
                    body($($arg),*)
                }
                match $crate::backend::cpu::simd::level() {
                    // SAFETY: `level` checked that the CPU has these features.
                    $crate::backend::cpu::simd::Level::Avx512 => return unsafe { avx512($($arg),*) },
                    $crate::backend::cpu::simd::Level::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::backend::cpu::simd::Level::Base => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use simd_kernel;

#[cfg(test)]
mod tests {
    use super::*;

    simd_kernel! {
        fn scaled_add(a: f32, x: &[f32], y: &mut [f32]) {
            crate::backend::cpu::gather::axpy(a, x, y)
        }
    }

    #[test]
    fn kernels_give_the_scalar_results() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut y2 = y.clone();
        scaled_add(0.3, &x, &mut y);
        for (yi, &xi) in y2.iter_mut().zip(&x) {
            *yi += 0.3 * xi;
        }
        assert_eq!(y, y2);
        let _ = level();
    }
}
