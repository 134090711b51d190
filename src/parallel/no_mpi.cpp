// A build without MPI (CMake found none, or -DDSV4_MPI=OFF): single process only.
#include "core/error.h"
#include "parallel/comm.h"

namespace dsv4::parallel {

bool built_with_mpi() { return false; }

Comm* init(int*, char***) {
  if (launched_by_mpirun())
    throw Error("started by mpirun, but this dsv4 was built without MPI (install libopenmpi-dev and rebuild)",
                ErrorKind::Unsupported);
  return nullptr;
}

Comm* world() { return nullptr; }
void finalize() {}

}  // namespace dsv4::parallel
