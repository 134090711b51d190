#pragma once
// The message-passing layer of multi-process runs (docs/parallel.md). The rest of the engine
// sees only this interface: the MPI implementation (mpi_comm.cpp) is compiled when CMake finds
// MPI (DSV4_MPI), otherwise no_mpi.cpp says so. One communicator per process: every rank of the
// run (mpirun -np N) takes part in every call, in the same order.
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::parallel {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // `bytes` bytes of `root`'s buffer to every rank (the same count everywhere).
  virtual void bcast(void* data, size_t bytes, int root) = 0;
  // The same, for a wait of unknown length (followers between requests): the ranks that wait
  // poll with growing sleeps instead of spinning, so an idle run takes no CPU from others.
  virtual void bcast_idle(void* data, size_t bytes, int root) = 0;
  // In place over buf: rank r's rows [displ[r], displ[r] + count[r]) (rows of `row` floats) go
  // to every rank. The bytes are copied, never combined: every rank ends with the same bits.
  virtual void allgather_rows(float* buf, int64_t row, const std::vector<int64_t>& count,
                              const std::vector<int64_t>& displ) = 0;
  // Every rank's string (lengths may differ), in rank order, on every rank.
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;
  // Ends every rank of the run with `status` (MPI_Abort): for failures after which the ranks
  // can no longer agree on what comes next.
  [[noreturn]] virtual void abort(int status) = 0;

  // Bytes this rank has sent so far (payload only; what the collectives move, counted as the
  // bytes that leave this rank under a direct exchange: a broadcast root sends its buffer to
  // size-1 ranks, an allgather sends this rank's part to size-1 ranks).
  uint64_t bytes_sent() const { return sent_; }

 protected:
  uint64_t sent_ = 0;
};

// Whether this build has MPI.
bool built_with_mpi();
// Whether the process was started by an MPI launcher (its environment says so).
bool launched_by_mpirun();
// Starts MPI when launched by mpirun and built with it; returns the world communicator, else
// null. Throws dsv4::Error when launched by mpirun without MPI support in this build.
Comm* init(int* argc, char*** argv);
// The communicator init returned (null outside an MPI run).
Comm* world();
// Ends MPI (every rank, after its last collective).
void finalize();

}  // namespace dsv4::parallel
