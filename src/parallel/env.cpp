#include <cstdlib>

#include "parallel/comm.h"

namespace dsv4::parallel {

// Open MPI's launcher sets OMPI_COMM_WORLD_SIZE; PMIx-based launchers (Open MPI 5, Slurm)
// set PMIX_RANK; MPICH's Hydra sets PMI_SIZE.
bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace dsv4::parallel
