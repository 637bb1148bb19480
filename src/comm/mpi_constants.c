/* MPI constants that the `mpi` crate's bindings leave out, as linkable symbols (build.rs). */
#include <mpi.h>

/* The "send buffer" that asks a collective to take its input from the receive buffer. */
void *const gnnpar_mpi_in_place = MPI_IN_PLACE;
