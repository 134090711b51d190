#pragma once
// Multi-process runs as the CLI sees them (docs/parallel.md): `mpirun -np N dsv4 <command> ...
// --parallel ep`. Every rank starts the same command line; rank 0 runs the command (it owns
// tokenization, sampling and output) and its Engine drives, while the other ranks follow: they
// build the Engines rank 0 builds and run its requests in lockstep until rank 0 finishes.
//
//   Cluster cluster(&argc, &argv);
//   if (!cluster.leader()) return cluster.follow();
//   int status = run_the_command();
//   cluster.finish(status);
//
// Outside mpirun (or with one process) a Cluster does nothing: rank 0 of a world of 1.
#include <string>

namespace dsv4 {

namespace parallel {
class Comm;
}

class Cluster {
 public:
  // Starts MPI when the process was launched by mpirun. Throws Error when it was but this build
  // has no MPI.
  Cluster(int* argc, char*** argv);
  ~Cluster();  // ends MPI
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int rank() const;
  int size() const;
  bool leader() const { return rank() == 0; }
  // Empty when every rank was given rank 0's arguments; else one line naming the first rank
  // that was not and how its arguments differ (every rank gets the same line).
  const std::string& argument_mismatch() const { return mismatch_; }

  // A follower: runs the Engines rank 0 makes until rank 0 finishes; returns its exit status.
  int follow();
  // Rank 0, once its command has returned (or failed): the followers' follow() returns status.
  void finish(int status);

 private:
  parallel::Comm* comm_ = nullptr;
  std::string mismatch_;
  bool finished_ = false;
};

}  // namespace dsv4
