//! Compiles `src/comm/mpi_constants.c` against the MPI that the `mpi` crate builds with:
//! `MPI_IN_PLACE` is a macro with a cast in it (Open MPI `(void *) 1`, MPICH `(void *) -1`),
//! which the crate's generated bindings cannot carry, and the gradient allreduce needs it to
//! sum in place instead of reducing from a copy of the gradients.

fn main() {
    println!("cargo:rerun-if-changed=src/comm/mpi_constants.c");
    println!("cargo:rerun-if-changed=build.rs");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errors) => {
            for e in &errors {
                println!("cargo:warning=MPI probe: {e}");
            }
            panic!(
                "no MPI library found (install libopenmpi-dev and openmpi-bin, or put mpicc on \
                 PATH); scripts/install-deps.sh does this on Debian/Ubuntu"
            );
        }
    };
    let mut build = cc::Build::new();
    build.file("src/comm/mpi_constants.c");
    match lib.mpicc {
        // The wrapper knows its own include paths (as mpi-sys's build uses it).
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for dir in &lib.include_paths {
                build.include(dir);
            }
        }
    }
    build.compile("gnnpar_mpi_constants");
}
