#include "engine/snapshot_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/weights.h"

namespace dsv4 {

namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'S', 'N', 'A', 'P'};
constexpr uint32_t kVersion = kSnapshotFormat;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;

// A 64-bit hash of bytes, 8 at a time (files of tens of MB: a byte-wise FNV would be slow).
struct Hasher {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  void mix(uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v;
      std::memcpy(&v, b + i, 8);
      mix(v);
    }
    uint64_t tail = 0;
    if (n > i) std::memcpy(&tail, b + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n) << 56));
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
};

std::vector<uint8_t> read_whole(const std::string& path, size_t limit) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<uint8_t> out;
  char buf[1 << 16];
  while (out.size() < limit) {
    f.read(buf, static_cast<std::streamsize>(std::min(sizeof buf, limit - out.size())));
    if (f.gcount() <= 0) break;
    out.insert(out.end(), buf, buf + f.gcount());
  }
  return out;
}

}  // namespace

uint64_t hash_bytes(const void* p, size_t n) {
  Hasher h;
  h.bytes(p, n);
  return h.h;
}

uint64_t snapshot_fingerprint(const ModelWeights& w, const std::string& model_dir, const std::string& isa) {
  Hasher h;
  h.str("dsv4 snapshot " + std::to_string(kVersion) + " " + isa);
  const std::vector<uint8_t> exe = read_whole("/proc/self/exe", size_t{1} << 31);
  h.bytes(exe.data(), exe.size());
  const std::vector<uint8_t> cfg = read_whole(model_dir + "/config.json", size_t{1} << 24);
  h.bytes(cfg.data(), cfg.size());
  for (const std::string& name : w.store.names()) {
    const TensorInfo& t = w.store.get(name);
    h.str(name);
    h.str(dtype_name(t.dtype));
    for (int64_t d : t.shape) h.mix(static_cast<uint64_t>(d));
    if (!t.data) continue;
    const size_t n = std::min<size_t>(64, t.nbytes);
    for (size_t at : {size_t{0}, (t.nbytes - n) / 2, t.nbytes - n}) h.bytes(t.data + at, n);
  }
  return h.h;
}

size_t SnapshotImage::file_bytes() const { return kHeaderBytes + tokens.size() * sizeof(int32_t) + body.size() + 8; }

std::vector<uint8_t> frame_snapshot(const SnapshotImage& im) {
  const std::vector<int32_t>& tokens = im.tokens;
  const std::vector<uint8_t>& body = im.body;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const size_t tokens_bytes = tokens.size() * sizeof(int32_t);
  std::vector<uint8_t> out(im.file_bytes());
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 8);
  std::memcpy(p + 8, &kVersion, 4);
  std::memset(p + 12, 0, 4);
  std::memcpy(p + 16, &im.fingerprint, 8);
  std::memcpy(p + 24, &n, 8);
  if (tokens_bytes) std::memcpy(p + kHeaderBytes, tokens.data(), tokens_bytes);
  if (!body.empty()) std::memcpy(p + kHeaderBytes + tokens_bytes, body.data(), body.size());
  const uint64_t sum = hash_bytes(p, out.size() - 8);
  std::memcpy(p + out.size() - 8, &sum, 8);
  return out;
}

SnapshotFile read_snapshot_file(const std::string& path, bool header_only) {
  SnapshotFile f;
  f.bytes = read_whole(path, header_only ? kHeaderBytes : size_t{1} << 40);
  const std::vector<uint8_t>& b = f.bytes;
  if (b.size() < kHeaderBytes || std::memcmp(b.data(), kMagic, 8) != 0)
    throw Error(path + ": not a dsv4 snapshot file (no DSV4SNAP header)");
  std::memcpy(&f.version, b.data() + 8, 4);
  if (f.version != kVersion && !header_only)
    throw Error(path + ": snapshot format " + std::to_string(f.version) + ", this dsv4 reads " + std::to_string(kVersion));
  std::memcpy(&f.fingerprint, b.data() + 16, 8);
  int64_t n = 0;
  std::memcpy(&n, b.data() + 24, 8);
  if (n < 0 || n > (int64_t{1} << 32)) throw Error(path + ": token count " + std::to_string(n) + " is not one");
  const size_t tokens_bytes = static_cast<size_t>(n) * sizeof(int32_t);
  if (header_only) {  // the tokens straight after the header, the rest not read
    std::ifstream in(path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(kHeaderBytes));
    f.tokens.resize(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(f.tokens.data()), static_cast<std::streamsize>(tokens_bytes));
    if (static_cast<size_t>(in.gcount()) != tokens_bytes) throw Error(path + ": ends inside its tokens (a truncated file)");
    return f;
  }
  if (b.size() < kHeaderBytes + tokens_bytes + 8) throw Error(path + ": ends inside its tokens (a truncated file)");
  uint64_t sum;
  std::memcpy(&sum, b.data() + b.size() - 8, 8);
  if (hash_bytes(b.data(), b.size() - 8) != sum) throw Error(path + ": checksum mismatch (a truncated or damaged file)");
  f.tokens.resize(static_cast<size_t>(n));
  std::memcpy(f.tokens.data(), b.data() + kHeaderBytes, tokens_bytes);
  f.body_at = kHeaderBytes + tokens_bytes;
  f.bytes.resize(b.size() - 8);  // the body ends where the checksum begins
  return f;
}

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp";
  // 0600: a snapshot holds a conversation's tokens.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(tmp + ": cannot create (" + std::strerror(errno) + ")", ErrorKind::ResourceExhausted);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(tmp + ": write failed (" + why + ")", ErrorKind::ResourceExhausted);
    }
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot rename into place (" + why + ")", ErrorKind::ResourceExhausted);
  }
}

void write_snapshot_file(const SnapshotImage& im, const std::string& path) { write_file_atomically(path, frame_snapshot(im)); }

}  // namespace dsv4
