#include "server/prefix_cache.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "engine/snapshot_file.h"

namespace dsv4::server {

namespace fs = std::filesystem;

namespace {
int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  const size_t m = std::min(a.size(), b.size());
  while (n < m && a[n] == b[n]) ++n;
  return static_cast<int64_t>(n);
}

// The tokens a state of `tokens` saves of `prompt` (0: none): the common prefix, capped one
// short of the prompt, if the state can be cut back to it cheaply.
int64_t usable(const std::vector<int32_t>& tokens, const std::vector<int32_t>& prompt) {
  const int64_t len = std::min(common_prefix(tokens, prompt), static_cast<int64_t>(prompt.size()) - 1);
  return static_cast<int64_t>(tokens.size()) - len <= kCheapRewind ? len : 0;
}

// A file's name from its tokens (the same tokens always map to the same file).
std::string file_name(const std::vector<int32_t>& tokens) {
  const uint64_t h = hash_bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx-%zu.dsv4snap", static_cast<unsigned long long>(h), tokens.size());
  return buf;
}

constexpr const char* kExt = ".dsv4snap";
}  // namespace

PrefixCache::PrefixCache(Engine& engine, int64_t budget_bytes, const DiskCacheOptions& disk)
    : engine_(engine), budget_(budget_bytes), disk_(disk), writer_(disk.max_queued_bytes) {
  if (disk_.dir.empty()) return;
  std::error_code ec;
  fs::create_directories(disk_.dir, ec);
  if (ec) throw Error("--cache-dir " + disk_.dir + ": cannot create it (" + ec.message() + ")");
  fs::permissions(disk_.dir, fs::perms::owner_all, ec);  // its files hold conversations' tokens
  // Asked of a file that is not there: the engine computes its fingerprint now (not at the first
  // save) and says here whether it can keep snapshot files at all (cpu, one process).
  try {
    engine_.snapshot_file_tokens((fs::path(disk_.dir) / "none").string());
  } catch (const Error& err) {
    if (err.kind == ErrorKind::Unsupported) throw Error(std::string("--cache-dir: ") + err.what(), ErrorKind::Unsupported);
  }
  // Files by last use (their modification time, renewed on every load), newest first.
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  int64_t others = 0, other_bytes = 0;
  for (const auto& e : fs::directory_iterator(disk_.dir, ec)) {
    const fs::path& p = e.path();
    if (p.extension() == ".tmp" && p.stem().extension() == kExt) {  // a write cut short
      fs::remove(p, ec);
      continue;
    }
    if (e.is_regular_file(ec) && p.extension() == kExt) found.emplace_back(e.last_write_time(ec), p);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [t, p] : found) {
    try {
      auto tokens = engine_.snapshot_file_tokens(p.string());
      const auto size = static_cast<int64_t>(fs::file_size(p, ec));
      if (!tokens) {
        ++others, other_bytes += size;
        continue;
      }
      files_.push_back({p.string(), std::move(*tokens), size});
      disk_bytes_ += size;
    } catch (const Error& err) {
      std::fprintf(stderr, "dsv4 serve: prefix cache: deleting %s\n", err.what());
      fs::remove(p, ec);
    }
  }
  while (disk_bytes_ > disk_.budget_bytes && !files_.empty()) drop_file(std::prev(files_.end()), "over --cache-dir-budget");
  std::fprintf(stderr, "dsv4 serve: prefix cache on disk: %zu snapshots (%.1f MB) in %s", files_.size(),
               static_cast<double>(disk_bytes_) / (1 << 20), disk_.dir.c_str());
  if (others) std::fprintf(stderr, "; %lld of another model or build left alone (%.1f MB)", static_cast<long long>(others),
                           static_cast<double>(other_bytes) / (1 << 20));
  std::fprintf(stderr, "\n");
}

std::optional<PrefixCache::Hit> PrefixCache::lookup(const std::vector<int32_t>& prompt) {
  if (prompt.empty()) return std::nullopt;
  forget_failed_writes();
  auto best = entries_.end();
  int64_t best_len = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const int64_t len = usable(it->snap.tokens(), prompt);
    if (len > best_len) best = it, best_len = len;
  }
  // A file that saves more than memory: loaded, then kept in memory like any snapshot.
  auto file = files_.end();
  int64_t file_len = best_len;
  for (auto it = files_.begin(); it != files_.end(); ++it) {
    const int64_t len = usable(it->tokens, prompt);
    if (len > file_len && !writer_.pending(it->path)) file = it, file_len = len;  // (pending: in memory still)
  }
  if (file != files_.end()) {
    try {
      Snapshot s = engine_.load_snapshot(file->path);
      files_.splice(files_.begin(), files_, file);
      std::error_code ec;
      fs::last_write_time(file->path, fs::file_time_type::clock::now(), ec);  // its last use, for the next start
      ++disk_loads_;
      remember(s, true);
      return Hit{s, file_len};
    } catch (const Error& err) {
      std::fprintf(stderr, "dsv4 serve: prefix cache: %s\n", err.what());
      drop_file(file, "unreadable");
    }
  }
  if (best == entries_.end()) return std::nullopt;
  entries_.splice(entries_.begin(), entries_, best);  // most recently used
  Entry& e = entries_.front();
  if (!e.on_disk) {  // a state from inside a prompt, now shared by another: worth a file
    e.on_disk = true;
    if (!disk_.dir.empty() && e.snap.pos() >= disk_.min_tokens) save(e.snap);
  }
  return Hit{e.snap, best_len};
}

void PrefixCache::insert(const Snapshot& s, bool durable) {
  forget_failed_writes();
  remember(s, durable || disk_.dir.empty());
  if (durable && !disk_.dir.empty() && s.pos() >= disk_.min_tokens) save(s);
}

void PrefixCache::remember(const Snapshot& s, bool on_disk) {
  if (budget_ <= 0 || s.pos() == 0) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->snap.tokens() == s.tokens()) {
      bytes_ -= it->charged;
      entries_.erase(it);
      break;
    }
  const int64_t charged = static_cast<int64_t>(std::max(engine_.sequence_bytes(s.pos()), s.bytes()));
  if (charged > budget_) return;
  entries_.push_front({s, charged, on_disk});
  bytes_ += charged;
  while (bytes_ > budget_) {
    bytes_ -= entries_.back().charged;
    entries_.pop_back();
  }
}

void PrefixCache::save(const Snapshot& s) {
  for (auto it = files_.begin(); it != files_.end(); ++it)
    if (it->tokens == s.tokens()) {
      files_.splice(files_.begin(), files_, it);
      return;
    }
  const std::string path = (fs::path(disk_.dir) / file_name(s.tokens())).string();
  SnapshotImage im = engine_.snapshot_image(s);
  const auto size = static_cast<int64_t>(im.file_bytes());
  if (!writer_.write(path, std::move(im))) {
    std::fprintf(stderr, "dsv4 serve: prefix cache: not saved: the snapshots waiting for the disk fill its %.1f MB queue\n",
                 static_cast<double>(disk_.max_queued_bytes) / (1 << 20));
    return;
  }
  for (auto it = files_.begin(); it != files_.end(); ++it)
    if (it->path == path) {  // the same name for other tokens (a hash collision): replaced
      disk_bytes_ -= it->bytes;
      files_.erase(it);
      break;
    }
  files_.push_front({path, s.tokens(), size});
  disk_bytes_ += size;
  while (disk_bytes_ > disk_.budget_bytes && files_.size() > 1) drop_file(std::prev(files_.end()), "");
  if (disk_bytes_ > disk_.budget_bytes) drop_file(files_.begin(), "");  // larger than the whole budget
}

// A write the writer could not do (said on stderr): that file is not there. Unless a later
// write of the same path is still pending, its entry goes.
void PrefixCache::forget_failed_writes() {
  for (const std::string& path : writer_.failed()) {
    if (writer_.pending(path)) continue;
    for (auto it = files_.begin(); it != files_.end(); ++it)
      if (it->path == path) {
        disk_bytes_ -= it->bytes;
        files_.erase(it);
        break;
      }
  }
}

void PrefixCache::drop_file(std::list<File>::iterator it, const char* why) {
  writer_.remove(it->path);  // after a write of it still queued
  if (*why) std::fprintf(stderr, "dsv4 serve: prefix cache: deleted %s (%s)\n", it->path.c_str(), why);
  disk_bytes_ -= it->bytes;
  files_.erase(it);
}

}  // namespace dsv4::server
