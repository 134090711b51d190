// The MPI implementation of parallel::Comm (Open MPI in CI; any MPI-3 library).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <memory>
#include <thread>

#include "core/error.h"
#include "parallel/comm.h"

namespace dsv4::parallel {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bounded waits where MPI offers none: a rank that dies ends the run through mpirun, but one
// that hangs (stopped, stuck in a read, a deadlock) would leave the others waiting in their
// next collective forever. A watchdog thread ends this rank when one collective has waited
// longer than the limit (DSV4_MPI_TIMEOUT seconds, default 600; 0 = no limit); mpirun then
// ends the others. The idle wait for rank 0's next request is not bounded (a chat waits for its
// user); the load and argument checks get four times the limit (ranks load at different speeds).
class Watchdog {
 public:
  explicit Watchdog(int rank) : rank_(rank) {
    const char* e = std::getenv("DSV4_MPI_TIMEOUT");
    limit_s_ = e ? std::atof(e) : 600.0;
    if (limit_s_ > 0) thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Marks a collective in progress on the calling (driver) thread.
  struct Guard {
    Watchdog& w;
    Guard(Watchdog& w, const char* what, double factor) : w(w) {
      w.what_ = what;
      w.factor_ = factor;
      w.since_ = now_ns();
    }
    ~Guard() { w.since_ = 0; }
  };

 private:
  void run() {
    const auto nap = std::chrono::milliseconds(std::clamp<int64_t>(static_cast<int64_t>(limit_s_ * 250), 10, 500));
    while (!stop_) {
      std::this_thread::sleep_for(nap);
      const int64_t since = since_;
      if (since == 0) continue;
      const double waited = static_cast<double>(now_ns() - since) * 1e-9;
      if (waited > limit_s_ * factor_) {
        std::fprintf(stderr,
                     "dsv4: error: rank %d: waited %.0f s for the other ranks in %s (a rank is stuck or stopped; "
                     "DSV4_MPI_TIMEOUT sets the limit): ending the run\n",
                     rank_, waited, what_.load());
        std::fflush(stderr);
        std::_Exit(1);  // mpirun sees this rank end and ends the others
      }
    }
  }
  int rank_;
  double limit_s_ = 600;
  std::atomic<int64_t> since_{0};
  std::atomic<const char*> what_{""};
  std::atomic<double> factor_{1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class MpiComm final : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    watchdog_ = std::make_unique<Watchdog>(rank_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void bcast(void* data, size_t bytes, int root) override {
    Watchdog::Guard g(*watchdog_, "a broadcast", 1);
    for (size_t off = 0; off < bytes;) {  // MPI counts are int
      const int n = static_cast<int>(std::min<size_t>(bytes - off, INT_MAX / 2));
      MPI_Bcast(static_cast<char*>(data) + off, n, MPI_BYTE, root, MPI_COMM_WORLD);
      off += static_cast<size_t>(n);
    }
    if (rank_ == root) sent_ += bytes * static_cast<uint64_t>(size_ - 1);
  }

  void bcast_idle(void* data, size_t bytes, int root) override {
    DSV4_CHECK(bytes <= INT_MAX / 2);
    MPI_Request req;
    MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    // Sleep a little longer each time nothing has come (up to 1 ms): a request that follows
    // the previous one closely (the next decode step) is picked up at once, a long pause (a
    // chat waiting for its user) costs no CPU.
    int done = 0;
    std::chrono::microseconds nap(0);
    for (;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (nap.count() == 0) {
        std::this_thread::yield();
        nap = std::chrono::microseconds(1);
      } else {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
    }
    if (rank_ == root) sent_ += bytes * static_cast<uint64_t>(size_ - 1);
  }

  void allgather_rows(float* buf, int64_t row, const std::vector<int64_t>& count, const std::vector<int64_t>& displ) override {
    DSV4_CHECK(static_cast<int>(count.size()) == size_ && static_cast<int>(displ.size()) == size_);
    DSV4_CHECK(row > 0 && row <= INT_MAX);
    Watchdog::Guard g(*watchdog_, "an allgather of a step", 1);
    MPI_Datatype row_t;
    MPI_Type_contiguous(static_cast<int>(row), MPI_FLOAT, &row_t);
    MPI_Type_commit(&row_t);
    std::vector<int> c(count.size()), d(displ.size());
    for (size_t r = 0; r < count.size(); ++r) {
      DSV4_CHECK(count[r] >= 0 && count[r] <= INT_MAX && displ[r] >= 0 && displ[r] <= INT_MAX);
      c[r] = static_cast<int>(count[r]);
      d[r] = static_cast<int>(displ[r]);
    }
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.data(), d.data(), row_t, MPI_COMM_WORLD);
    MPI_Type_free(&row_t);
    sent_ += static_cast<uint64_t>(count[rank_] * row) * sizeof(float) * static_cast<uint64_t>(size_ - 1);
  }

  std::vector<std::string> allgather(const std::string& mine) override {
    Watchdog::Guard g(*watchdog_, "a check of every rank (arguments or loading)", 4);
    const int n = static_cast<int>(mine.size());
    std::vector<int> len(static_cast<size_t>(size_)), at(static_cast<size_t>(size_));
    MPI_Allgather(&n, 1, MPI_INT, len.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      at[r] = total;
      total += len[r];
    }
    std::string all(static_cast<size_t>(total), '\0');
    MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), len.data(), at.data(), MPI_CHAR, MPI_COMM_WORLD);
    sent_ += static_cast<uint64_t>(n + 4) * static_cast<uint64_t>(size_ - 1);
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<size_t>(at[r]), static_cast<size_t>(len[r])));
    return out;
  }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; in case an implementation does
  }

 private:
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Watchdog> watchdog_;
};

std::unique_ptr<MpiComm> g_world;

}  // namespace

bool built_with_mpi() { return true; }

Comm* init(int* argc, char*** argv) {
  if (g_world) return g_world.get();
  if (!launched_by_mpirun()) return nullptr;
  int provided = 0;
  // One thread at a time (the engine's driver) makes MPI calls; the thread pool never does. Not
  // always the main thread: `dsv4 serve` builds the Engine on the main thread and steps it on its
  // scheduler thread, hence SERIALIZED rather than FUNNELED.
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw Error("this MPI library does not offer MPI_THREAD_SERIALIZED (the server's scheduler thread drives the engine)",
                ErrorKind::Unsupported);
  }
  g_world = std::make_unique<MpiComm>();
  return g_world.get();
}

Comm* world() { return g_world.get(); }

void finalize() {
  if (!g_world) return;
  g_world.reset();
  MPI_Finalize();
}

}  // namespace dsv4::parallel
