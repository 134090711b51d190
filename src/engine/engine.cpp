#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <cstdio>
#include <cstring>
#include <set>
#include <sys/stat.h>

#include "backends/cpu/cpu_backend.h"
#include "core/sysmem.h"
#include "core/sampling.h"
#include "core/threads.h"
#include "engine/lockstep.h"
#include "engine/sampler.h"
#include "engine/snapshot_file.h"
#include "io/safetensors.h"
#include "kv/state_io.h"
#include "kernels/cpu/qmatmul.h"
#include "model/forward.h"
#include "model/weights.h"
#include "parallel/comm.h"
#include "parallel/partition.h"

#ifdef DSV4_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace dsv4 {

// ---- Memory budget ------------------------------------------------------------------------

// Cache bytes reserved by live sequences. Shared with them so a sequence destroyed after its
// engine does not touch freed memory (it must not outlive it, but a dangling count is cheap).
struct Engine::Budget {
  int64_t limit = 0;  // 0 = no limit
  std::atomic<int64_t> reserved{0}, sequences{0};
};

// ---- Sequence / Snapshot ------------------------------------------------------------------

// With MTP on, the block lags the main model by one position after every step (position t
// needs token t+1): mtp_pos == pos - 1. Drafting runs it further ahead on its own outputs;
// those positions (>= `confirmed`) are dropped before the next step.
struct Sequence::Impl {
  const Engine* owner = nullptr;
  SequenceState st;
  std::vector<int32_t> tokens;  // main-model tokens consumed (replayed by deep rewinds)
  bool broken = false;
  bool mtp = false;
  int64_t confirmed = 0;        // MTP positions [0, confirmed) follow the main model
  // The main model's final hc state of the last kCheapRewind + 1 positions, slot = pos % rows:
  // after a rewind to p the block needs position p - 1's.
  std::vector<float> hidden_ring;
  static constexpr int64_t kRingRows = kCheapRewind + 1;
  int64_t max_positions = 0;
  std::shared_ptr<Engine::Budget> budget;  // set once the reservation below is taken
  int64_t reserved = 0;
  uint64_t id = 0;                       // parallel runs: the name the followers know it by
  std::shared_ptr<Lockstep> lockstep;    // parallel runs: the leader tells the followers it is gone
  ~Impl() {
    if (lockstep && lockstep->leader && lockstep->open) {
      Msg m(Cmd::DropSeq);
      m.put(id);
      lockstep->send(m);
    }
    if (budget) {
      budget->reserved -= reserved;
      budget->sequences -= 1;
    }
  }
};

Sequence::Sequence() = default;
Sequence::~Sequence() = default;
Sequence::Sequence(Sequence&&) noexcept = default;
Sequence& Sequence::operator=(Sequence&&) noexcept = default;

static const std::vector<int32_t> kNoTokens;
int64_t Sequence::pos() const { return impl_ ? impl_->st.pos : 0; }
int64_t Sequence::mtp_pos() const { return impl_ ? impl_->st.mtp_pos : 0; }
const std::vector<int32_t>& Sequence::tokens() const { return impl_ ? impl_->tokens : kNoTokens; }
bool Sequence::broken() const { return impl_ && impl_->broken; }
bool Sequence::mtp() const { return impl_ && impl_->mtp; }
int64_t Sequence::max_positions() const { return impl_ ? impl_->max_positions : 0; }
size_t Sequence::cache_bytes() const {
  size_t n = 0;
  if (impl_)
    for (const LayerState& l : impl_->st.layers) n += l.bytes();
  return n;
}

struct Snapshot::Impl {
  const Engine* owner = nullptr;
  SequenceState st;
  std::vector<int32_t> tokens;
  bool mtp = false;
  int64_t confirmed = 0;
  std::vector<float> hidden_ring;
  int64_t max_positions = 0;
  uint64_t id = 0;
  std::shared_ptr<Lockstep> lockstep;
  ~Impl() {
    if (lockstep && lockstep->leader && lockstep->open) {
      Msg m(Cmd::DropSnap);
      m.put(id);
      lockstep->send(m);
    }
  }
};

Snapshot::Snapshot() = default;
Snapshot::~Snapshot() = default;
Snapshot::Snapshot(const Snapshot&) = default;
Snapshot& Snapshot::operator=(const Snapshot&) = default;
int64_t Snapshot::pos() const { return impl_ ? impl_->st.pos : 0; }
const std::vector<int32_t>& Snapshot::tokens() const { return impl_ ? impl_->tokens : kNoTokens; }
size_t Snapshot::bytes() const {
  if (!impl_) return 0;
  size_t n = impl_->tokens.size() * sizeof(int32_t) + impl_->hidden_ring.size() * sizeof(float);
  for (const LayerState& l : impl_->st.layers)
    n += l.private_bytes() + static_cast<size_t>(l.entries.pages() + l.index_keys.pages()) * sizeof(std::shared_ptr<int>);
  return n;
}

// ---- options ------------------------------------------------------------------------------

WeightLoad parse_weight_load(const std::string& s) {
  if (s == "auto") return WeightLoad::Auto;
  if (s == "mmap") return WeightLoad::Mmap;
  if (s == "read") return WeightLoad::Read;
  throw Error("load mode must be auto, mmap or read, got '" + s + "'");
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::Cpu;
  if (s == "cuda") return Device::Cuda;
  throw Error("device must be cpu or cuda, got '" + s + "'");
}

Parallel parse_parallel(const std::string& s) {
  if (s == "none") return Parallel::None;
  if (s == "ep") return Parallel::Ep;
  if (s == "tp") return Parallel::Tp;
  if (s == "ep+tp" || s == "tp+ep") return Parallel::EpTp;
  throw Error("--parallel must be none, ep, tp or ep+tp, got '" + s + "'");
}

bool device_usable(Device d, std::string* why) {
  if (d == Device::Cpu) return true;
#ifdef DSV4_HAVE_CUDA
  if (gpu::device_available()) return true;
  if (why) *why = gpu::device_summary();
#else
  if (why) *why = "this dsv4 was built without CUDA support (CMake found no nvcc, or -DDSV4_CUDA=OFF)";
#endif
  return false;
}

static LoadMode to_load_mode(WeightLoad w) {
  return w == WeightLoad::Mmap ? LoadMode::Mmap : w == WeightLoad::Read ? LoadMode::Read : LoadMode::Auto;
}

// The tokenizer (EngineOptions::tokenizer, else the model directory's tokenizer.json when there
// is one), read after config.json and before the weights: when text goes in (require_tokenizer),
// a missing one, or one whose ids the model does not have, is refused in a second, not after
// minutes of loading (and not as a 400 on every request of a server).
std::shared_ptr<Tokenizer> check_model_dir(const EngineOptions& o) {
  const int64_t vocab = load_model_config(o.model_dir).vocab;  // also: a wrong --model is named first
  std::string path = o.tokenizer;
  if (path.empty()) {
    struct stat sb;
    const std::string p = o.model_dir + "/tokenizer.json";
    if (::stat(p.c_str(), &sb) == 0) path = p;
  }
  if (path.empty()) {
    if (o.require_tokenizer) throw Error("no tokenizer.json in " + o.model_dir + " (pass --tokenizer DIR)");
    return nullptr;
  }
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(path));
  if (o.require_tokenizer && tok->vocab_size() > vocab)
    throw Error("tokenizer " + path + " has " + std::to_string(tok->vocab_size()) + " tokens but the model's vocab_size is " +
                std::to_string(vocab) + " (" + o.model_dir + "/config.json): they do not belong together");
  return tok;
}

// ---- Engine -------------------------------------------------------------------------------

Engine::Engine(const EngineOptions& o) {
  std::string why;
  if (!device_usable(o.device, &why)) throw Error("--device cuda: " + why, ErrorKind::Unsupported);
  if (o.memory_budget < 0 && o.memory_budget != kAutoMemoryBudget)
    throw Error("memory budget must be >= 0 bytes (or automatic), got " + std::to_string(o.memory_budget));
  parallel::Comm* comm = parallel::world();
  const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  if (world > 1) {
    if (o.parallel == Parallel::None)
      throw Error("started by mpirun with " + std::to_string(world) + " processes but without --parallel (give --parallel ep)",
                  ErrorKind::Unsupported);
    if (o.device != Device::Cpu) throw Error("--parallel runs on the CPU backend only", ErrorKind::Unsupported);
    lockstep_ = std::make_shared<Lockstep>();
    lockstep_->comm = comm;
    lockstep_->leader = rank == 0;
    if (rank == 0) {
      Msg m = options_msg(o);
      lockstep_->send(m);
    }
  }
  const bool ep = o.parallel == Parallel::Ep || o.parallel == Parallel::EpTp;
  const bool tp = o.parallel == Parallel::Tp || o.parallel == Parallel::EpTp;
  const Share share{rank, world, ep, tp};
  // Every rank loads its share; then the ranks agree that all of them could, on the same
  // checkpoint, before any of them goes on (a rank that failed alone would leave the others
  // waiting in the first collective).
  ModelWeights w;
  std::shared_ptr<Tokenizer> tokenizer;
  std::exception_ptr failed;
  try {
    set_threads(o.threads);
    // The followers need none: rank 0 owns the text.
    if (rank == 0) tokenizer = o.checked_tokenizer ? o.checked_tokenizer : check_model_dir(o);
    w = load_model(o.model_dir, to_load_mode(o.load), share);
  } catch (...) {
    failed = std::current_exception();
  }
  if (world > 1) {
    std::string mine = "ok ";
    if (failed) {
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        mine = std::string("error ") + e.what();
      }
    } else {
      double bytes = 0;
      for (const auto& f : w.store.files())
        for (const auto& [name, t] : f->tensors()) bytes += static_cast<double>(t.nbytes);
      const ModelConfig& c = w.cfg;
      // The kernels' summation order depends on the instruction set (docs/design.md): ranks on
      // different ISAs would compute different bits for the replicated parts, route tokens
      // differently and disagree on what to exchange, so they must match (DSV4_ISA forces one).
      mine += "vocab " + std::to_string(c.vocab) + ", dim " + std::to_string(c.dim) + ", layers " + std::to_string(c.n_layers) +
              ", experts " + std::to_string(c.n_experts) + ", " + std::to_string(static_cast<int64_t>(bytes)) + " tensor bytes, isa " +
              isa_name(active_isa());
    }
    const std::vector<std::string> all = comm->allgather(mine);
    if (failed) std::rethrow_exception(failed);
    for (int r = 0; r < world; ++r) {
      if (all[r].rfind("error ", 0) == 0) throw Error("rank " + std::to_string(r) + ": " + all[r].substr(6));
      if (all[r] != all[0])
        throw Error("rank " + std::to_string(r) + " differs from rank 0 in its checkpoint or instruction set (" + all[r].substr(3) +
                    " vs " + all[0].substr(3) + "; set DSV4_ISA to the same value on every rank if only the isa differs)");
    }
  } else if (failed) {
    std::rethrow_exception(failed);
  }
  const ModelConfig& c = w.cfg;
  const int64_t ctx = o.context > 0 ? o.context : (c.max_positions > 0 ? c.max_positions : (int64_t{1} << 40));
  info_.dir = o.model_dir;
  info_.format = w.format_summary();
  info_.load = load_mode_name(w.store.load_mode());
  info_.vocab = c.vocab;
  info_.dim = c.dim;
  info_.n_layers = c.n_layers;
  info_.hc = c.hc;
  info_.window = c.window;
  info_.context = ctx;
  info_.bos = c.bos;
  info_.eos = c.eos;
  info_.has_mtp = w.mtp.has_value();
  info_.hidden_size = c.hc * c.dim;
  info_.world = world;
  info_.rank = rank;
  info_.parallel = ep && tp ? "ep+tp" : ep ? "ep" : tp ? "tp" : "none";
  for (const auto& f : w.store.files())
    for (const auto& [name, t] : f->tensors()) info_.weight_bytes += static_cast<double>(t.nbytes);
  if (o.device == Device::Cpu) {
    info_.device = "cpu";
    model_ = std::make_unique<Model>(std::move(w), make_cpu_backend);
    if (world > 1) {
      Shard sh;
      static_cast<Share&>(sh) = share;
      sh.comm = comm;
      model_->set_shard(sh);
    }
  } else {
#ifdef DSV4_HAVE_CUDA
    info_.device = "cuda";
    CudaOptions co;
    co.context = std::max<int64_t>(1, o.context > 0 ? o.context : std::min<int64_t>(ctx, 8192));
    co.graphs = o.cuda_graphs;
    info_.context = co.context;
    model_ = std::make_unique<Model>(std::move(w), [&](const ModelWeights& mw) { return make_cuda_backend(mw, co); });
#endif
  }
  tokenizer_ = std::move(tokenizer);
  budget_ = std::make_shared<Budget>();
  if (o.memory_budget == kAutoMemoryBudget) {
    budget_->limit = static_cast<int64_t>(static_cast<double>(available_memory_bytes()) * 0.9);
    if (budget_->limit <= 0) budget_->limit = 0;  // unknown: no limit
  } else {
    budget_->limit = o.memory_budget;
  }
  if (o.device != Device::Cpu) budget_->limit = 0;  // device caches are sized at load
  if (lockstep_ && !lockstep_->leader) budget_->limit = 0;  // the leader decides every reservation
  info_.memory_budget = budget_->limit;
  info_.sample_candidates = model_ ? model_->backend().sample_max_candidates(info_.vocab) : 0;
}

size_t Engine::sequence_bytes(int64_t positions, bool mtp) const {
  if (info_.device != "cpu") return 0;
  // Every CPU sequence state carries the MTP layer when the model has one; it grows only for
  // MTP sequences.
  return sequence_cache_bytes(model_->config(), positions, info_.has_mtp ? (mtp ? positions : 0) : -1);
}

int64_t Engine::reserved_bytes() const { return budget_->reserved.load(); }

static std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return b;
}

// Takes q's reservation for up to `max_positions` positions (0 = the context), or throws
// without changing anything.
void Engine::reserve(Sequence::Impl& q, int64_t max_positions, const char* what) {
  if (max_positions < 0 || max_positions > info_.context)
    throw Error(std::string(what) + ": max_positions " + std::to_string(max_positions) + " outside [1, " +
                std::to_string(info_.context) + "] (the context limit; 0 = all of it)");
  const int64_t maxp = max_positions == 0 ? info_.context : max_positions;
  const int64_t need = static_cast<int64_t>(sequence_bytes(maxp, q.mtp));
  const int64_t now = budget_->reserved.load();
  if (budget_->limit > 0 && now + need > budget_->limit)
    throw Error(std::string(what) + ": a sequence of up to " + std::to_string(maxp) + " positions reserves " + mib(need) +
                    " of cache, more than the " + mib(budget_->limit - now) + " left of the " + mib(budget_->limit) +
                    " memory budget" +
                    (now > 0 ? " (" + std::to_string(budget_->sequences.load()) + " live sequences reserve " + mib(now) + ")" : "") +
                    ": ask for fewer positions (a lower context or token limit) or raise the budget",
                ErrorKind::ResourceExhausted);
  q.max_positions = maxp;
  q.reserved = need;
  q.budget = budget_;
  budget_->reserved += need;
  budget_->sequences += 1;
}

Engine::~Engine() {
  if (lockstep_ && lockstep_->leader && lockstep_->open) {
    Msg m(Cmd::EndEngine);
    lockstep_->send(m);
  }
  if (lockstep_) lockstep_->open = false;
}

uint64_t Engine::announce(int cmd, uint64_t from, int64_t max_positions) {
  if (!lockstep_) return 0;
  const uint64_t id = lockstep_->next_id++;
  if (lockstep_->leader) {
    Msg m(static_cast<Cmd>(cmd));
    m.put(id).put(from).put(max_positions);
    lockstep_->send(m);
  }
  return id;
}

uint64_t Engine::bytes_sent() const { return lockstep_ ? lockstep_->comm->bytes_sent() : 0; }

const Tokenizer& Engine::tokenizer() const {
  if (!tokenizer_) throw Error(info_.dir + " has no tokenizer.json (give one with --tokenizer)");
  return *tokenizer_;
}

void Engine::check_seq(const Sequence& s, const char* what) const {
  if (!s.impl_) throw Error(std::string(what) + ": empty sequence handle");
  if (s.impl_->owner != this) throw Error(std::string(what) + ": the sequence belongs to another engine");
  if (s.impl_->broken) throw Error(std::string(what) + ": the sequence was left half-written by a failed step; start a new one");
}

Sequence Engine::new_sequence(const SequenceOptions& o) {
  if (o.mtp && !info_.has_mtp) throw Error(info_.dir + " has no MTP block (num_nextn_predict_layers = 0)", ErrorKind::Unsupported);
  Sequence s;
  s.impl_ = std::make_unique<Sequence::Impl>();
  s.impl_->owner = this;
  s.impl_->mtp = o.mtp;
  reserve(*s.impl_, o.max_positions, "new sequence");
  if (lockstep_) {
    s.impl_->id = lockstep_->next_id++;
    if (lockstep_->leader) {
      Msg m(Cmd::NewSeq);
      m.put(s.impl_->id).put(o.mtp).put(o.max_positions);
      lockstep_->send(m);
    }
    s.impl_->lockstep = lockstep_;
  }
  s.impl_->st = model_->new_sequence();
  if (o.mtp) s.impl_->hidden_ring.assign(static_cast<size_t>(Sequence::Impl::kRingRows * info_.hidden_size), 0.0f);
  return s;
}

// A sequence continuing from `st` and the host-side rest of a sequence or snapshot.
template <class From>
static std::unique_ptr<Sequence::Impl> copy_impl(const Engine* owner, const Model& m, const From& f) {
  auto impl = std::make_unique<Sequence::Impl>();
  impl->owner = owner;
  impl->st = m.fork(f.st);
  impl->tokens = f.tokens;
  impl->mtp = f.mtp;
  impl->confirmed = f.confirmed;
  impl->hidden_ring = f.hidden_ring;
  return impl;
}

// A new sequence continuing from a sequence or snapshot `f` (fork, restore): its cache reserved
// first (nothing announced or copied when that is refused), then the followers told.
template <class From>
Sequence Engine::continue_from(const From& f, const char* what, const char* noun, int cmd, int64_t max_positions) {
  const int64_t maxp = max_positions ? max_positions : f.max_positions;
  if (f.st.pos > maxp)
    throw Error(std::string(what) + ": the " + noun + " holds " + std::to_string(f.st.pos) +
                " positions, more than max_positions " + std::to_string(maxp));
  auto probe = std::make_unique<Sequence::Impl>();
  probe->mtp = f.mtp;
  reserve(*probe, maxp, what);
  const uint64_t id = announce(cmd, f.id, max_positions);
  Sequence s;
  s.impl_ = copy_impl(this, *model_, f);
  s.impl_->id = id;
  s.impl_->lockstep = lockstep_;
  std::swap(s.impl_->budget, probe->budget);
  std::swap(s.impl_->reserved, probe->reserved);
  s.impl_->max_positions = probe->max_positions;
  return s;
}

Sequence Engine::fork(const Sequence& src, int64_t max_positions) {
  check_seq(src, "fork");
  return continue_from(*src.impl_, "fork", "sequence", static_cast<int>(Cmd::Fork), max_positions);
}

Snapshot Engine::snapshot(const Sequence& src) {
  check_seq(src, "snapshot");
  auto impl = std::make_shared<Snapshot::Impl>();
  impl->id = announce(static_cast<int>(Cmd::Snapshot), src.impl_->id, 0);
  impl->lockstep = lockstep_;
  impl->owner = this;
  impl->st = model_->fork(src.impl_->st);
  impl->tokens = src.impl_->tokens;
  impl->mtp = src.impl_->mtp;
  impl->confirmed = src.impl_->confirmed;
  impl->hidden_ring = src.impl_->hidden_ring;
  impl->max_positions = src.impl_->max_positions;
  Snapshot snap;
  snap.impl_ = std::move(impl);
  return snap;
}

Sequence Engine::restore(const Snapshot& snap, int64_t max_positions) {
  if (!snap.impl_) throw Error("restore: empty snapshot");
  if (snap.impl_->owner != this) throw Error("restore: the snapshot belongs to another engine");
  return continue_from(*snap.impl_, "restore", "snapshot", static_cast<int>(Cmd::Restore), max_positions);
}

// ---- Snapshot files ---------------------------------------------------------------------

uint64_t Engine::snapshot_fingerprint(const char* what) {
  if (lockstep_ || info_.device != "cpu")
    throw Error(std::string(what) + ": snapshot files are for the cpu backend in one process", ErrorKind::Unsupported);
  if (!fingerprint_) fingerprint_ = dsv4::snapshot_fingerprint(model_->weights(), info_.dir, isa_name(active_isa())) | 1;
  return fingerprint_;
}

SnapshotImage Engine::snapshot_image(const Snapshot& snap) {
  SnapshotImage im;
  im.fingerprint = snapshot_fingerprint("snapshot_image");
  if (!snap.impl_ || snap.impl_->owner != this) throw Error("snapshot_image: the snapshot belongs to another engine");
  const Snapshot::Impl& q = *snap.impl_;
  im.tokens = q.tokens;
  std::vector<uint8_t>& body = im.body;
  auto put = [&](int64_t v) { body.insert(body.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 8); };
  put(q.mtp ? 1 : 0);
  put(q.confirmed);
  put(static_cast<int64_t>(q.hidden_ring.size()));
  const auto* hr = reinterpret_cast<const uint8_t*>(q.hidden_ring.data());
  body.insert(body.end(), hr, hr + q.hidden_ring.size() * sizeof(float));
  write_state(q.st, body);
  return im;
}

void Engine::save_snapshot(const Snapshot& snap, const std::string& path) { write_snapshot_file(snapshot_image(snap), path); }

std::optional<std::vector<int32_t>> Engine::snapshot_file_tokens(const std::string& path) {
  const uint64_t fp = snapshot_fingerprint("snapshot_file_tokens");
  SnapshotFile f = read_snapshot_file(path, true);
  if (f.version != kSnapshotFormat || f.fingerprint != fp) return std::nullopt;  // another build's
  return std::move(f.tokens);
}

Snapshot Engine::load_snapshot(const std::string& path) {
  const uint64_t fp = snapshot_fingerprint("load_snapshot");
  const SnapshotFile f = read_snapshot_file(path, false);
  if (f.fingerprint != fp)
    throw Error(path + ": a snapshot of another model, build of dsv4 or ISA (fingerprint differs)");
  size_t at = f.body_at;
  auto get = [&](const char* field) {
    int64_t v = 0;
    if (f.bytes.size() - at < 8) throw Error(path + ": ends inside " + field + " (a truncated or damaged file)");
    std::memcpy(&v, f.bytes.data() + at, 8);
    at += 8;
    return v;
  };
  auto impl = std::make_shared<Snapshot::Impl>();
  impl->owner = this;
  const int64_t mtp = get("the MTP flag");
  if (mtp != 0 && mtp != 1) throw Error(path + ": the MTP flag is " + std::to_string(mtp));
  if (mtp && !info_.has_mtp) throw Error(path + ": a snapshot with the MTP block, which this model lacks");
  impl->mtp = mtp == 1;
  impl->confirmed = get("the confirmed MTP positions");
  const int64_t ring = get("the hidden ring size");
  const int64_t want = impl->mtp ? Sequence::Impl::kRingRows * info_.hidden_size : 0;
  if (ring != want) throw Error(path + ": hidden ring of " + std::to_string(ring) + " floats, the model's is " + std::to_string(want));
  impl->hidden_ring.resize(static_cast<size_t>(ring));
  if (f.bytes.size() - at < static_cast<size_t>(ring) * sizeof(float)) throw Error(path + ": ends inside the hidden ring");
  if (ring > 0) std::memcpy(impl->hidden_ring.data(), f.bytes.data() + at, static_cast<size_t>(ring) * sizeof(float));
  at += static_cast<size_t>(ring) * sizeof(float);
  impl->st = model_->new_sequence();
  read_state(f.bytes, at, impl->st, path);
  if (at != f.bytes.size()) throw Error(path + ": " + std::to_string(f.bytes.size() - at) + " bytes past the state");
  if (impl->st.pos != static_cast<int64_t>(f.tokens.size()) || impl->confirmed < 0 || impl->confirmed > impl->st.pos ||
      impl->st.mtp_pos > impl->st.pos)
    throw Error(path + ": positions (" + std::to_string(impl->st.pos) + " main, " + std::to_string(impl->st.mtp_pos) +
                " MTP) do not match its " + std::to_string(f.tokens.size()) + " tokens");
  for (int32_t t : f.tokens)
    if (t < 0 || t >= info_.vocab) throw Error(path + ": token id " + std::to_string(t) + " outside the vocabulary");
  impl->tokens = f.tokens;
  impl->max_positions = info_.context;
  Snapshot snap;
  snap.impl_ = std::move(impl);
  return snap;
}

void Engine::truncate(Sequence& s, int64_t pos) {
  check_seq(s, "truncate");
  Sequence::Impl& q = *s.impl_;
  SequenceState& st = q.st;
  if (pos < 0 || pos > st.pos)
    throw Error("truncate: position " + std::to_string(pos) + " outside [0, " + std::to_string(st.pos) + "]");
  if (lockstep_ && lockstep_->leader) {
    Msg m(Cmd::Truncate);
    m.put(q.id).put(pos);
    lockstep_->send(m);
  }
  if (lockstep_) {
    try {
      return truncate_checked(s, pos);
    } catch (const std::exception& e) {
      lockstep_fatal(lockstep_->comm, e.what());
    }
  }
  truncate_checked(s, pos);
}

void Engine::truncate_checked(Sequence& s, int64_t pos) {
  Sequence::Impl& q = *s.impl_;
  SequenceState& st = q.st;
  // MTP position t read the main token t+1: positions >= pos - 1 go with the main tokens >= pos.
  const int64_t mtp = q.mtp ? std::min(q.confirmed, std::max<int64_t>(pos - 1, 0)) : 0;
  if (st.pos - pos > kCheapRewind || (q.mtp && st.mtp_pos - mtp > kCheapRewind)) return rebuild(s, pos);
  model_->truncate(st, pos, Stack::Main);
  if (q.mtp && mtp < st.mtp_pos) model_->truncate(st, mtp, Stack::Mtp);
  q.confirmed = std::min(q.confirmed, mtp);
  q.tokens.resize(static_cast<size_t>(pos));
}

// A deep rewind: a fresh state fed the kept tokens again in chunks (the MTP block follows).
void Engine::rebuild(Sequence& s, int64_t pos) {
  std::vector<int32_t> toks(s.impl_->tokens.begin(), s.impl_->tokens.begin() + pos);
  Sequence::Impl& q = *s.impl_;
  q.st = model_->new_sequence();
  q.tokens.clear();
  q.confirmed = 0;
  constexpr int64_t kChunk = 512;
  std::vector<StepResult> out(1);
  for (int64_t p = 0; p < pos; p += kChunk) {
    StepRequest r;
    r.seq = &s;
    r.tokens.assign(toks.begin() + p, toks.begin() + std::min(pos, p + kChunk));
    r.logits = Rows::None;
    run_step({r}, out);
  }
}

void Engine::validate(const std::vector<StepRequest>& reqs) const {
  std::set<const Sequence*> seen;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const StepRequest& r = reqs[i];
    const std::string where = "step request " + std::to_string(i);
    if (!r.seq) throw Error(where + ": no sequence");
    check_seq(*r.seq, where.c_str());
    if (!seen.insert(r.seq).second) throw Error(where + ": the same sequence appears twice in one step");
    if (r.tokens.empty()) throw Error(where + ": no tokens");
    if (r.mtp_logits && !r.seq->mtp()) throw Error(where + ": MTP logits asked of a sequence made without SequenceOptions::mtp");
    if (r.sampler) {
      if (r.sampler->penalised())
        throw Error(where + ": a step cannot apply sampling penalties (they need the sequence's history): sample from the logits");
      const int64_t cand = r.sampler->candidates(info_.vocab);
      if (cand > info_.sample_candidates)
        throw Error(where + ": sampling from " + std::to_string(cand) + " candidates; " + info_.device + " steps sample from at most " +
                    std::to_string(info_.sample_candidates) + " (set top-k, or sample from the logits)");
    }
    for (size_t t = 0; t < r.tokens.size(); ++t)
      if (r.tokens[t] < 0 || r.tokens[t] >= info_.vocab)
        throw Error(where + ": token id " + std::to_string(r.tokens[t]) + " at index " + std::to_string(t) +
                    " is outside the vocabulary [0, " + std::to_string(info_.vocab) + ")");
    const int64_t end = r.seq->pos() + static_cast<int64_t>(r.tokens.size());
    if (end > info_.context)
      throw Error(where + ": " + std::to_string(end) + " tokens exceed the context limit of " + std::to_string(info_.context),
                  ErrorKind::ResourceExhausted);
    if (end > r.seq->max_positions())
      throw Error(where + ": " + std::to_string(end) + " tokens exceed the sequence's max_positions of " +
                      std::to_string(r.seq->max_positions()) + " (SequenceOptions::max_positions)",
                  ErrorKind::ResourceExhausted);
  }
}

std::vector<StepResult> Engine::step(const std::vector<StepRequest>& reqs) {
  validate(reqs);  // every check before any state changes (the exception-safety rule in engine.h)
  std::vector<StepResult> out(reqs.size());
  if (lockstep_ && lockstep_->leader) {
    Msg m(Cmd::Step);
    m.put<uint64_t>(reqs.size());
    for (const StepRequest& r : reqs) m.put(r.seq->impl_->id).put_vec(r.tokens).put(r.logits).put(r.hidden).put(r.mtp_logits);
    lockstep_->send(m);
  }
  try {
    run_step(reqs, out);
  } catch (const std::exception& e) {
    if (lockstep_) lockstep_fatal(lockstep_->comm, e.what());
    for (const StepRequest& r : reqs) r.seq->impl_->broken = true;
    throw;
  } catch (...) {
    for (const StepRequest& r : reqs) r.seq->impl_->broken = true;
    throw;
  }
  return out;
}

void Engine::run_step(const std::vector<StepRequest>& reqs, std::vector<StepResult>& out) {
  const int64_t V = info_.vocab, Hs = info_.hidden_size;
  out.assign(reqs.size(), {});
  // MTP positions run ahead by drafting are dropped first (at most kCheapRewind).
  for (const StepRequest& r : reqs) {
    Sequence::Impl& q = *r.seq->impl_;
    if (q.mtp && q.st.mtp_pos > q.confirmed) model_->truncate(q.st, q.confirmed, Stack::Mtp);
  }
  std::vector<std::vector<float>> hid(reqs.size());  // MTP sequences: every row's final state
  std::vector<std::vector<SampleRow>> pick(reqs.size());  // StepRequest::sampler rows
  std::vector<SeqInput> in;
  std::vector<int64_t> pos0(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const StepRequest& r = reqs[i];
    Sequence::Impl& q = *r.seq->impl_;
    pos0[i] = q.st.pos;
    const int64_t n = static_cast<int64_t>(r.tokens.size());
    const int64_t rows = r.logits == Rows::All ? n : r.logits == Rows::Last ? 1 : 0;
    const bool ids = r.ids_only || r.sampler;
    if (ids) out[i].ids.resize(static_cast<size_t>(rows));
    else out[i].logits.resize(static_cast<size_t>(rows * V));
    if (r.hidden || q.mtp) hid[i].resize(static_cast<size_t>(n * Hs));
    // The sampler's draws for this step's rows, now (they do not depend on the logits).
    if (r.sampler)
      for (int64_t k = 0; k < rows; ++k) pick[i].push_back(r.sampler->row());
    in.push_back({&q.st, r.tokens.data(), n, r.logits, ids ? nullptr : out[i].logits.data(),
                  hid[i].empty() ? nullptr : hid[i].data(), nullptr, ids ? out[i].ids.data() : nullptr,
                  r.sampler ? pick[i].data() : nullptr});
  }
  model_->step(Stack::Main, in);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Sequence::Impl& q = *reqs[i].seq->impl_;
    q.tokens.insert(q.tokens.end(), reqs[i].tokens.begin(), reqs[i].tokens.end());
  }

  // The MTP block catches up on every position whose next token is now known: positions
  // [mtp_pos, pos - 1), hidden state from the ring (before this step) or this step's rows.
  std::vector<SeqInput> mi;
  std::vector<std::vector<float>> mh(reqs.size());
  std::vector<size_t> who;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Sequence::Impl& q = *reqs[i].seq->impl_;
    if (!q.mtp) continue;
    const int64_t first = q.st.mtp_pos, end = q.st.pos - 1, m = end - first;
    out[i].mtp_first = first;
    if (m <= 0) continue;
    DSV4_CHECK(first >= pos0[i] - Sequence::Impl::kRingRows);
    mh[i].resize(static_cast<size_t>(m * Hs));
    for (int64_t t = first; t < end; ++t) {
      const float* src = t >= pos0[i] ? hid[i].data() + (t - pos0[i]) * Hs
                                      : q.hidden_ring.data() + (t % Sequence::Impl::kRingRows) * Hs;
      std::copy(src, src + Hs, mh[i].data() + (t - first) * Hs);
    }
    if (reqs[i].mtp_logits) out[i].mtp_logits.resize(static_cast<size_t>(m * V));
    mi.push_back({&q.st, q.tokens.data() + first + 1, m, reqs[i].mtp_logits ? Rows::All : Rows::None,
                  reqs[i].mtp_logits ? out[i].mtp_logits.data() : nullptr, nullptr, mh[i].data()});
    who.push_back(i);
  }
  if (!mi.empty()) model_->step(Stack::Mtp, mi);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Sequence::Impl& q = *reqs[i].seq->impl_;
    if (q.mtp) {
      q.confirmed = q.st.mtp_pos;
      const int64_t n = static_cast<int64_t>(reqs[i].tokens.size());
      for (int64_t t = std::max<int64_t>(0, n - Sequence::Impl::kRingRows); t < n; ++t)
        std::copy(hid[i].data() + t * Hs, hid[i].data() + (t + 1) * Hs,
                  q.hidden_ring.data() + ((pos0[i] + t) % Sequence::Impl::kRingRows) * Hs);
    }
    if (reqs[i].hidden) out[i].hidden = std::move(hid[i]);
  }
}

std::vector<std::vector<int32_t>> Engine::draft(const std::vector<DraftRequest>& reqs) {
  std::set<const Sequence*> seen;
  int64_t rounds = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    const std::string where = "draft request " + std::to_string(i);
    if (!r.seq) throw Error(where + ": no sequence");
    check_seq(*r.seq, where.c_str());
    if (!r.seq->mtp()) throw Error(where + ": the sequence was made without SequenceOptions::mtp");
    if (!seen.insert(r.seq).second) throw Error(where + ": the same sequence appears twice");
    if (r.n < 1 || r.n > kCheapRewind)
      throw Error(where + ": drafts must number 1.." + std::to_string(kCheapRewind) + ", got " + std::to_string(r.n));
    if (r.next < 0 || r.next >= info_.vocab) throw Error(where + ": token id " + std::to_string(r.next) + " is outside the vocabulary");
    if (r.seq->pos() == 0) throw Error(where + ": the sequence has consumed no token yet");
    rounds = std::max(rounds, r.n);
  }
  const int64_t Hs = info_.hidden_size;
  std::vector<std::vector<int32_t>> out(reqs.size());
  std::vector<std::vector<float>> h(reqs.size()), hn(reqs.size());
  std::vector<int32_t> tok(reqs.size());
  if (lockstep_ && lockstep_->leader) {
    Msg m(Cmd::Draft);
    m.put<uint64_t>(reqs.size());
    for (const DraftRequest& r : reqs) m.put(r.seq->impl_->id).put(r.next).put(r.n);
    lockstep_->send(m);
  }
  try {
    for (size_t i = 0; i < reqs.size(); ++i) {
      Sequence::Impl& q = *reqs[i].seq->impl_;
      if (q.st.mtp_pos > q.confirmed) model_->truncate(q.st, q.confirmed, Stack::Mtp);
      DSV4_CHECK(q.st.mtp_pos == q.st.pos - 1);
      // Position pos - 1 from the main model's state there and the token about to be fed.
      const float* x = q.hidden_ring.data() + ((q.st.pos - 1) % Sequence::Impl::kRingRows) * Hs;
      h[i].assign(x, x + Hs);
      tok[i] = reqs[i].next;
    }
    for (int64_t k = 0; k < rounds; ++k) {
      std::vector<SeqInput> in;
      std::vector<size_t> who;
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (k >= reqs[i].n) continue;
        hn[i].resize(static_cast<size_t>(Hs));
        // Only the greedy id back (Backend::argmax): the logits stay in the backend's memory.
        // tok[i] is both the round's input token (read when the step starts) and its pick.
        in.push_back({&reqs[i].seq->impl_->st, &tok[i], 1, Rows::Last, nullptr, hn[i].data(), h[i].data(), &tok[i]});
        who.push_back(i);
      }
      model_->step(Stack::Mtp, in);
      for (size_t i : who) {
        out[i].push_back(tok[i]);
        std::swap(h[i], hn[i]);  // the next draft position reads this one's output state
      }
    }
  } catch (const std::exception& e) {
    if (lockstep_) lockstep_fatal(lockstep_->comm, e.what());
    for (const DraftRequest& r : reqs) r.seq->impl_->broken = true;
    throw;
  } catch (...) {
    for (const DraftRequest& r : reqs) r.seq->impl_->broken = true;
    throw;
  }
  return out;
}

// The follower's side of every request Engine's public calls send (engine/engine.cpp): the same
// call on this rank's copy of the sequence, which gets the same id as the leader's.
void Engine::follow() {
  std::map<uint64_t, Sequence> seqs;
  std::map<uint64_t, Snapshot> snaps;
  auto seq = [&](uint64_t id) -> Sequence& {
    auto it = seqs.find(id);
    if (it == seqs.end()) throw Error("lockstep: no sequence " + std::to_string(id));
    return it->second;
  };
  auto same_id = [&](uint64_t mine, uint64_t theirs) {
    if (mine != theirs) throw Error("lockstep: sequence ids diverged (" + std::to_string(mine) + " vs " + std::to_string(theirs) + ")");
  };
  for (;;) {
    Msg m = lockstep_->receive();
    const Cmd cmd = m.cmd();
    try {
      switch (cmd) {
        case Cmd::EndEngine: lockstep_->open = false; return;
        case Cmd::NewSeq: {
          const uint64_t id = m.get<uint64_t>();
          SequenceOptions so;
          so.mtp = m.get<bool>();
          so.max_positions = m.get<int64_t>();
          Sequence s = new_sequence(so);
          same_id(s.impl_->id, id);
          seqs.emplace(id, std::move(s));
          break;
        }
        case Cmd::Fork:
        case Cmd::Restore:
        case Cmd::Snapshot: {
          const uint64_t id = m.get<uint64_t>(), from = m.get<uint64_t>();
          const int64_t maxp = m.get<int64_t>();
          if (cmd == Cmd::Snapshot) {
            Snapshot sn = snapshot(seq(from));
            same_id(sn.impl_->id, id);
            snaps.emplace(id, std::move(sn));
            break;
          }
          Sequence s;
          if (cmd == Cmd::Fork) {
            s = fork(seq(from), maxp);
          } else {
            auto it = snaps.find(from);
            if (it == snaps.end()) throw Error("lockstep: no snapshot " + std::to_string(from));
            s = restore(it->second, maxp);
          }
          same_id(s.impl_->id, id);
          seqs.emplace(id, std::move(s));
          break;
        }
        case Cmd::DropSeq: seqs.erase(m.get<uint64_t>()); break;
        case Cmd::DropSnap: snaps.erase(m.get<uint64_t>()); break;
        case Cmd::Truncate: {
          const uint64_t id = m.get<uint64_t>();
          truncate(seq(id), m.get<int64_t>());
          break;
        }
        case Cmd::Step: {
          std::vector<StepRequest> reqs(m.get<uint64_t>());
          for (StepRequest& r : reqs) {
            r.seq = &seq(m.get<uint64_t>());
            r.tokens = m.get_vec<int32_t>();
            r.logits = m.get<Rows>();
            r.hidden = m.get<bool>();
            r.mtp_logits = m.get<bool>();
            // Only rank 0 uses a step's logits: without TP (whose head is split, so every rank
            // takes part) a follower skips the head. The state does not depend on it.
            const Shard* sh = model_->shard();
            if (!sh || !sh->tp) {
              r.logits = Rows::None;
              r.mtp_logits = false;
            }
          }
          step(reqs);
          break;
        }
        case Cmd::Draft: {
          std::vector<DraftRequest> reqs(m.get<uint64_t>());
          for (DraftRequest& r : reqs) {
            r.seq = &seq(m.get<uint64_t>());
            r.next = m.get<int32_t>();
            r.n = m.get<int64_t>();
          }
          draft(reqs);
          break;
        }
        default: throw Error("lockstep: request " + std::to_string(static_cast<int>(cmd)) + " inside an engine");
      }
    } catch (const std::exception& e) {
      lockstep_fatal(lockstep_->comm, e.what());
    }
  }
}

}  // namespace dsv4
