// Drives the engine API through every request a parallel run forwards (new, batched steps with
// MTP logits, fork, snapshot / restore, a cheap and a deep truncate, drafts, a dropped
// sequence) and writes every logits row and draft to a file. Run alone and under mpirun
// (tests/mpi/api.sh): the files must be the same bytes.
// usage: mpi_api_check MODEL_DIR PARALLEL OUT_FILE
#include <cstdio>
#include <fstream>
#include <vector>

#include "engine/cluster.h"
#include "engine/engine.h"

using namespace dsv4;

int main(int argc, char** argv) {
  Cluster cluster(&argc, &argv);
  if (!cluster.leader()) return cluster.follow();
  if (argc != 4) {
    std::fprintf(stderr, "usage: mpi_api_check MODEL_DIR none|ep|tp|ep+tp OUT_FILE\n");
    cluster.finish(2);
    return 2;
  }
  int status = 0;
  try {
    EngineOptions o;
    o.model_dir = argv[1];
    o.threads = 1;
    o.parallel = parse_parallel(argv[2]);
    Engine e(o);
    std::vector<float> out;
    auto rec = [&](const std::vector<StepResult>& r) {
      for (const StepResult& x : r) {
        out.insert(out.end(), x.logits.begin(), x.logits.end());
        out.insert(out.end(), x.mtp_logits.begin(), x.mtp_logits.end());
      }
    };
    std::vector<int32_t> t(60);
    for (int i = 0; i < 60; ++i) t[i] = (i * 37 + 11) % 1000 + 2;
    auto span = [&](int a, int b) { return std::vector<int32_t>(t.begin() + a, t.begin() + b); };

    Sequence a = e.new_sequence({.mtp = true});
    rec(e.step({{&a, span(0, 30), Rows::All, false, true}}));
    Sequence b = e.fork(a);
    Snapshot snap = e.snapshot(a);
    rec(e.step({{&a, span(30, 40), Rows::Last, false, true}, {&b, span(40, 45), Rows::All}}));  // one batched step
    e.truncate(a, 5);  // deep: the followers replay too
    rec(e.step({{&a, span(45, 50), Rows::All, false, true}}));
    for (const auto& d : e.draft({{&a, 7, 3}}))
      for (int32_t x : d) out.push_back(static_cast<float>(x));
    e.truncate(b, b.pos() - 3);  // cheap
    rec(e.step({{&b, {9}, Rows::Last}}));
    Sequence c = e.restore(snap);
    rec(e.step({{&c, {3, 4}, Rows::All}, {&a, {5}, Rows::Last}}));
    {
      Sequence gone = e.new_sequence();
      rec(e.step({{&gone, {5, 6}, Rows::Last}}));
    }
    Sequence d = e.new_sequence();
    rec(e.step({{&d, span(50, 60), Rows::All}, {&c, {8}, Rows::Last}}));
    std::ofstream f(argv[3], std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
    if (!f) throw Error(std::string("cannot write ") + argv[3]);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "mpi_api_check: %s\n", ex.what());
    status = 1;
  }
  cluster.finish(status);
  return status;
}
