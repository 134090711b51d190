#include "engine/lockstep.h"

#include <cstdio>

#include "engine/engine.h"
#include "parallel/comm.h"

namespace dsv4 {

// Two broadcasts: the length (waited for without spinning: the next request may be long in
// coming), then the bytes.
void Lockstep::send(Msg& m) {
  DSV4_CHECK(leader && open);
  uint64_t n = m.bytes().size();
  comm->bcast_idle(&n, sizeof n, 0);
  comm->bcast(m.bytes().data(), n, 0);
}

Msg Lockstep::receive() {
  DSV4_CHECK(!leader);
  uint64_t n = 0;
  comm->bcast_idle(&n, sizeof n, 0);
  Msg m;
  m.bytes().resize(n);
  comm->bcast(m.bytes().data(), n, 0);
  return m;
}

Msg options_msg(const EngineOptions& o) {
  Msg m(Cmd::CreateEngine);
  m.put_str(o.model_dir).put(o.load).put(o.device).put(o.threads).put(o.context).put_str(o.tokenizer).put(o.parallel);
  return m;
}

EngineOptions options_from(Msg& m) {
  EngineOptions o;
  o.model_dir = m.get_str();
  o.load = m.get<WeightLoad>();
  o.device = m.get<Device>();
  o.threads = m.get<int>();
  o.context = m.get<int64_t>();
  o.tokenizer = m.get_str();
  o.parallel = m.get<Parallel>();
  return o;
}

void lockstep_fatal(parallel::Comm* comm, const std::string& what) {
  std::fprintf(stderr, "dsv4: error: rank %d: %s (a parallel run cannot continue past it: every rank stops)\n",
               comm ? comm->rank() : 0, what.c_str());
  std::fflush(stderr);
  if (comm) comm->abort(1);
  std::_Exit(1);
}

}  // namespace dsv4
