#include "engine/cluster.h"

#include "engine/engine.h"
#include "engine/lockstep.h"
#include "parallel/comm.h"

namespace dsv4 {

Cluster::Cluster(int* argc, char*** argv) {
  comm_ = parallel::init(argc, argv);
  if (!comm_ || comm_->size() < 2) return;
  // Every rank must run the same command: a follower reads nothing of its own command line
  // (it takes its options from rank 0), so a difference means the launch is not what was meant.
  std::string mine;
  for (int i = 1; i < *argc; ++i) mine += std::string((*argv)[i]) + '\0';
  const std::vector<std::string> all = comm_->allgather(mine);
  auto pretty = [](std::string s) {
    for (char& ch : s)
      if (ch == '\0') ch = ' ';
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) {
      mismatch_ = "rank " + std::to_string(r) + " was started with other arguments than rank 0 ('" + pretty(all[r]) + "' vs '" +
                  pretty(all[0]) + "'): every rank of a parallel run needs the same command line";
      return;
    }
}

Cluster::~Cluster() {
  if (comm_ && comm_->size() > 1 && leader() && !finished_) finish(1);
  parallel::finalize();
}

int Cluster::rank() const { return comm_ ? comm_->rank() : 0; }
int Cluster::size() const { return comm_ ? comm_->size() : 1; }

void Cluster::finish(int status) {
  if (!comm_ || comm_->size() < 2 || finished_ || !leader()) return;
  finished_ = true;
  Lockstep ls;
  ls.comm = comm_;
  ls.leader = true;
  Msg m(Cmd::Exit);
  m.put(status);
  ls.send(m);
}

int Cluster::follow() {
  if (!comm_ || comm_->size() < 2 || leader()) return 0;
  Lockstep ls;
  ls.comm = comm_;
  for (;;) {
    Msg m = ls.receive();
    switch (m.cmd()) {
      case Cmd::Exit: return m.get<int>();
      case Cmd::CreateEngine: {
        const EngineOptions o = options_from(m);
        std::unique_ptr<Engine> e;
        try {
          e = std::make_unique<Engine>(o);
        } catch (const std::exception&) {
          continue;  // every rank knows (the load check is collective); rank 0 reports it
        }
        e->follow();
        break;
      }
      default: lockstep_fatal(comm_, "request " + std::to_string(static_cast<int>(m.cmd())) + " outside an engine");
    }
  }
}

}  // namespace dsv4
