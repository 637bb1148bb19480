// OpenBLAS is linked directly (the four C functions used are declared in `src/openblas.rs`):
// Debian's `libopenblas-dev` provides `libopenblas.so`. `OPENBLAS_LIB_DIR` adds a search path
// for a build elsewhere.
fn main() {
    println!("cargo:rerun-if-env-changed=OPENBLAS_LIB_DIR");
    if let Ok(dir) = std::env::var("OPENBLAS_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    }
    println!("cargo:rustc-link-lib=dylib=openblas");
}
