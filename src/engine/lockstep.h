#pragma once
// The leader -> follower request stream of a multi-process run (docs/parallel.md). Rank 0's
// Engine sends every call that changes state (sequences made, forked, truncated, dropped, steps,
// drafts) before it runs it; the followers' Engines run the same calls in the same order on
// their own copies of every sequence, so the forwards line up and meet in the same collectives.
// Internal to the engine (apps see engine/cluster.h).
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace dsv4 {

namespace parallel {
class Comm;
}
struct EngineOptions;

enum class Cmd : uint32_t {
  Exit,          // the leader's command finished: status
  CreateEngine,  // EngineOptions
  EndEngine,
  NewSeq,        // id, mtp, max_positions
  Fork,          // id, from, max_positions
  Snapshot,      // snapshot id, from
  Restore,       // id, snapshot id, max_positions
  DropSeq,       // id
  DropSnap,      // snapshot id
  Truncate,      // id, pos
  Step,          // requests
  Draft,         // requests
};

// A request in bytes: plain values and vectors of them, read back in the order written.
class Msg {
 public:
  explicit Msg(Cmd c) { put(static_cast<uint32_t>(c)); }
  Msg() = default;
  template <class T>
  Msg& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    buf_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  template <class T>
  Msg& put_vec(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
    return *this;
  }
  Msg& put_str(const std::string& s) {
    put<uint64_t>(s.size());
    buf_ += s;
    return *this;
  }
  std::string& bytes() { return buf_; }

  template <class T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, buf_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  template <class T>
  std::vector<T> get_vec() {
    const uint64_t n = get<uint64_t>();
    need(n * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), buf_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  std::string get_str() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::string s = buf_.substr(at_, n);
    at_ += n;
    return s;
  }
  Cmd cmd() {
    at_ = 0;
    return static_cast<Cmd>(get<uint32_t>());
  }

 private:
  void need(uint64_t n) const { DSV4_CHECK_MSG(at_ + n <= buf_.size(), "lockstep message shorter than its fields"); }
  std::string buf_;
  size_t at_ = 0;
};

// One process's end of the stream.
struct Lockstep {
  parallel::Comm* comm = nullptr;
  bool leader = false;
  bool open = true;       // false once the engine has ended (late drops are not sent)
  uint64_t next_id = 1;   // sequence and snapshot ids (the leader's numbering)
  void send(Msg& m);      // leader
  Msg receive();          // followers; waits without spinning
};

// CreateEngine's payload: the options the followers need (the memory budget stays with the
// leader, which decides every reservation).
Msg options_msg(const EngineOptions& o);
EngineOptions options_from(Msg& m);

// Ends every rank: a failure inside a lockstep request leaves the ranks unable to agree on what
// comes next. Prints one line first.
[[noreturn]] void lockstep_fatal(parallel::Comm* comm, const std::string& what);

}  // namespace dsv4
