//! The few OpenBLAS functions used, linked directly (`build.rs`): CBLAS's enums are C `int`s.

use std::ffi::{c_char, c_int, CStr};

pub const ROW_MAJOR: c_int = 101;
pub const NO_TRANS: c_int = 111;
pub const TRANS: c_int = 112;

extern "C" {
    #[allow(clippy::too_many_arguments)]
    pub fn cblas_sgemm(
        order: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f32,
        a: *const f32,
        lda: c_int,
        b: *const f32,
        ldb: c_int,
        beta: f32,
        c: *mut f32,
        ldc: c_int,
    );
    #[allow(clippy::too_many_arguments)]
    pub fn cblas_dgemm(
        order: c_int,
        trans_a: c_int,
        trans_b: c_int,
        m: c_int,
        n: c_int,
        k: c_int,
        alpha: f64,
        a: *const f64,
        lda: c_int,
        b: *const f64,
        ldb: c_int,
        beta: f64,
        c: *mut f64,
        ldc: c_int,
    );
    fn openblas_set_num_threads(n: c_int);
    fn openblas_get_num_threads() -> c_int;
    fn openblas_get_config() -> *const c_char;
    fn openblas_get_corename() -> *const c_char;
}

pub fn set_threads(n: usize) {
    // SAFETY: plain setter.
    unsafe { openblas_set_num_threads(n as c_int) }
}

pub fn threads() -> usize {
    // SAFETY: plain getter.
    unsafe { openblas_get_num_threads() as usize }
}

/// `openblas_get_config()` and the kernel set it picked for this CPU.
pub fn describe() -> (String, String) {
    // SAFETY: both return static NUL-terminated strings.
    unsafe {
        (
            CStr::from_ptr(openblas_get_config())
                .to_string_lossy()
                .trim()
                .to_string(),
            CStr::from_ptr(openblas_get_corename())
                .to_string_lossy()
                .trim()
                .to_string(),
        )
    }
}

/// How a strided `rows × cols` view goes to CBLAS (row-major): untransposed when its rows
/// are contiguous, transposed when its columns are.
pub fn layout(rs: isize, cs: isize, cols: usize) -> (c_int, c_int) {
    if cs == 1 && (rs as usize) >= cols.max(1) {
        (NO_TRANS, rs as c_int)
    } else if rs == 1 {
        (TRANS, cs as c_int)
    } else {
        panic!("openblas: operand with strides ({rs}, {cs}) has no unit stride")
    }
}
