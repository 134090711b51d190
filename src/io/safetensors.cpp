// safetensors reader (mmap + strict validation), directory store and writer.
// Every failure is a dsv4::Error with a one-line message that starts with the file concerned.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/sysmem.h"
#include "io/bulk_read.h"

namespace dsv4 {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Headers this large are certainly corrupt; the limit keeps a bad length field from
// making us parse (or allocate for) gigabytes of "JSON".
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DTypeDesc {
  DType type;
  const char* name;
  size_t size;
};

constexpr DTypeDesc kDTypes[] = {
    {DType::F64, "F64", 8},         {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I64, "I64", 8},         {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},         {DType::I8, "I8", 1},           {DType::U64, "U64", 8},
    {DType::U32, "U32", 4},         {DType::U16, "U16", 2},         {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
};

const DTypeDesc& desc(DType t) {
  for (const auto& d : kDTypes)
    if (d.type == t) return d;
  throw Error("invalid DType value " + std::to_string(static_cast<int>(t)));
}

// Names and values in messages come from untrusted files; control characters would break
// the "one line per error" promise the CLI relies on.
std::string one_line(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s;
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw Error(one_line(file + ": " + what));
}

// A JSON value quoted in an error message, cut short so a huge array stays readable.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Element count, or false when it does not fit in int64 (a hostile shape like [2^40, 2^40]).
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = n;
  return true;
}

// Byte size for dtype x shape, or false on overflow.
bool checked_nbytes(DType t, const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 0;
  return checked_numel(shape, &n) && !__builtin_mul_overflow(n, dtype_size(t), out);
}

// ---- reading ----------------------------------------------------------------------------

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

struct Span {
  uint64_t begin = 0, end = 0;
};

DType parse_dtype(const std::string& file, const std::string& name, const json& entry) {
  auto it = entry.find("dtype");
  if (it == entry.end()) fail(file, "tensor " + name + ": missing \"dtype\"");
  if (!it->is_string()) fail(file, "tensor " + name + ": dtype must be a string, got " + show(*it));
  DType t;
  if (!dtype_from_name(it->get<std::string>(), &t))
    fail(file, "tensor " + name + ": unknown dtype " + show(*it));
  return t;
}

std::vector<int64_t> parse_shape(const std::string& file, const std::string& name, const json& entry) {
  auto it = entry.find("shape");
  if (it == entry.end()) fail(file, "tensor " + name + ": missing \"shape\"");
  std::vector<int64_t> shape;
  bool ok = it->is_array();
  if (ok) {
    for (const auto& d : *it) {
      // nlohmann stores non-negative literals as unsigned, negative ones as signed.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        ok = false;
        break;
      }
      shape.push_back(d.get<int64_t>());
    }
  }
  if (!ok) fail(file, "tensor " + name + ": shape must be an array of non-negative integers, got " + show(*it));
  return shape;
}

Span parse_offsets(const std::string& file, const std::string& name, const json& entry) {
  auto it = entry.find("data_offsets");
  if (it == entry.end()) fail(file, "tensor " + name + ": missing \"data_offsets\"");
  const json& v = *it;
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned())
    fail(file, "tensor " + name + ": data_offsets must be two non-negative integers [begin, end], got " + show(v));
  Span s{v[0].get<uint64_t>(), v[1].get<uint64_t>()};
  if (s.begin > s.end)
    fail(file, "tensor " + name + ": data_offsets begin " + std::to_string(s.begin) + " > end " +
                   std::to_string(s.end));
  return s;
}

void parse_metadata(const std::string& file, const json& v, std::map<std::string, std::string>* out) {
  if (!v.is_object()) fail(file, "__metadata__ must be an object of strings, got " + show(v));
  for (const auto& [k, val] : v.items()) {
    if (!val.is_string()) fail(file, "__metadata__ value for " + k + " must be a string, got " + show(val));
    (*out)[k] = val.get<std::string>();
  }
}

// Validates one entry against the data section and records it; returns its byte range.
Span parse_tensor(const std::string& file, const std::string& name, const json& entry, const uint8_t* data,
                  uint64_t data_size, std::map<std::string, TensorInfo>* out) {
  if (!entry.is_object()) fail(file, "tensor " + name + ": entry must be an object, got " + show(entry));
  TensorInfo info;
  info.name = name;
  info.file = file;
  info.dtype = parse_dtype(file, name, entry);
  info.shape = parse_shape(file, name, entry);
  Span span = parse_offsets(file, name, entry);

  uint64_t need = 0;
  if (!checked_nbytes(info.dtype, info.shape, &need))
    fail(file, "tensor " + name + ": shape " + shape_string(info.shape) + " has too many elements");
  uint64_t have = span.end - span.begin;
  if (need != have)
    fail(file, "tensor " + name + ": dtype " + dtype_name(info.dtype) + " shape " + shape_string(info.shape) +
                   " needs " + std::to_string(need) + " bytes but data_offsets span " + std::to_string(have));
  if (span.end > data_size)
    fail(file, "tensor " + name + ": data_offsets [" + std::to_string(span.begin) + ", " +
                   std::to_string(span.end) + "] go past the end of the data section (" +
                   std::to_string(data_size) + " bytes)");
  info.data = data + span.begin;
  info.nbytes = static_cast<size_t>(have);
  (*out)[name] = std::move(info);
  return span;
}

// Two tensors sharing bytes means a corrupt or malicious header: writing through one
// (after a copy) would silently change the other's values.
void check_overlaps(const std::string& file, std::vector<std::pair<Span, std::string>> spans) {
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return a.first.begin != b.first.begin ? a.first.begin < b.first.begin : a.first.end < b.first.end;
  });
  const std::pair<Span, std::string>* reach = nullptr;  // the tensor ending furthest so far
  for (const auto& cur : spans) {
    if (cur.first.begin == cur.first.end) continue;  // empty tensors occupy no bytes
    if (reach && cur.first.begin < reach->first.end)
      fail(file, "tensors " + reach->second + " [" + std::to_string(reach->first.begin) + ", " +
                     std::to_string(reach->first.end) + "] and " + cur.second + " [" +
                     std::to_string(cur.first.begin) + ", " + std::to_string(cur.first.end) + "] overlap");
    if (!reach || cur.first.end > reach->first.end) reach = &cur;
  }
}

void parse_header(const std::string& file, const uint8_t* base, uint64_t size,
                  std::map<std::string, TensorInfo>* tensors, std::map<std::string, std::string>* metadata) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian regardless of host
  if (n > size - 8)
    fail(file, "header length " + std::to_string(n) + " exceeds the " + std::to_string(size - 8) +
                   " bytes after the length field");
  if (n > kMaxHeaderBytes)
    fail(file, "header length " + std::to_string(n) + " exceeds the 100 MB limit");

  const char* text = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::exception& e) {
    // Not only parse_error: a number too large for a double ("1e999") is out_of_range.
    fail(file, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(file, "header must be a JSON object, got " + show(header));

  const uint8_t* data = base + 8 + n;
  uint64_t data_size = size - 8 - n;
  std::vector<std::pair<Span, std::string>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      parse_metadata(file, entry, metadata);
      continue;
    }
    spans.emplace_back(parse_tensor(file, name, entry, data, data_size, tensors), name);
  }
  check_overlaps(file, std::move(spans));
}

// ---- directory store --------------------------------------------------------------------

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(p.string(), std::string("cannot open: ") + std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(p.string(), "read error");
  return s;
}

// weight_map of an HF index file: tensor name -> shard file name (relative to the index).
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const std::string ip = index_path.string();
  json index;
  try {
    index = json::parse(read_text(index_path));
  } catch (const json::exception& e) {
    fail(ip, std::string("not valid JSON: ") + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    fail(ip, "missing \"weight_map\" object");
  std::map<std::string, std::string> map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string() || shard.get<std::string>().empty() || fs::path(shard.get<std::string>()).is_absolute())
      fail(ip, "weight_map entry for tensor " + name + " must be a relative file name, got " + show(shard));
    map[name] = shard.get<std::string>();
  }
  return map;
}

std::vector<fs::path> list_safetensors(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    // is_regular_file follows symlinks, as in the HF cache layout.
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec2)) found.push_back(it->path());
  }
  if (ec) fail(dir.string(), "cannot list directory: " + ec.message());
  std::sort(found.begin(), found.end());
  return found;
}

// ---- writing ----------------------------------------------------------------------------

std::string shard_name(int i, int n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
  return buf;
}

// Contiguous ranges in insertion order, each ending where the cumulative byte count comes
// closest to its equal share, while keeping enough tensors back for the later shards.
std::vector<int> assign_shards(const std::vector<size_t>& sizes, int shards) {
  const size_t count = sizes.size();
  double total = 0;
  for (size_t b : sizes) total += static_cast<double>(b);
  std::vector<int> shard_of(count);
  int s = 0;
  size_t in_shard = 0;
  double cum = 0;
  for (size_t i = 0; i < count; ++i) {
    if (in_shard > 0 && s + 1 < shards) {
      bool forced = count - i == static_cast<size_t>(shards - s - 1);
      double target = total * (s + 1) / shards;
      // Closing here is better when adding tensor i would overshoot by more than it undershoots.
      bool full = cum + static_cast<double>(sizes[i]) / 2 > target;
      if (forced || full) {
        ++s;
        in_shard = 0;
      }
    }
    shard_of[i] = s;
    cum += static_cast<double>(sizes[i]);
    ++in_shard;
  }
  return shard_of;
}

// Header JSON padded with spaces so that 8 + header length is a multiple of 8: the data
// section then starts 8-aligned and mmap'd F32/I64 tensors at aligned offsets stay aligned.
std::string padded_header(const json& header) {
  std::string s = header.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

void write_file(const fs::path& path, const std::string& header, const std::vector<const std::vector<uint8_t>*>& blobs) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path.string(), std::string("cannot create: ") + std::strerror(errno));
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto* b : blobs) out.write(reinterpret_cast<const char*>(b->data()), static_cast<std::streamsize>(b->size()));
  out.close();
  if (!out) fail(path.string(), std::string("write failed: ") + std::strerror(errno));
}

}  // namespace

// ---- dtype / TensorInfo -----------------------------------------------------------------

const char* dtype_name(DType t) { return desc(t).name; }

size_t dtype_size(DType t) { return desc(t).size; }

bool dtype_from_name(const std::string& s, DType* out) {
  for (const auto& d : kDTypes) {
    if (s == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const { return shape_string(shape); }

// ---- SafeTensorsFile --------------------------------------------------------------------

const char* load_mode_name(LoadMode m) {
  switch (m) {
    case LoadMode::Auto: return "auto";
    case LoadMode::Mmap: return "mmap";
    case LoadMode::Read: return "read";
  }
  return "?";
}

static std::string fmt_gb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return b;
}

LoadMode parse_load_mode(const std::string& s) {
  if (s == "auto") return LoadMode::Auto;
  if (s == "mmap") return LoadMode::Mmap;
  if (s == "read") return LoadMode::Read;
  throw Error("unknown load mode '" + s + "' (expected auto, mmap or read)");
}

std::unique_ptr<SafeTensorsFile> SafeTensorsFile::open(const std::string& path, LoadMode mode, ReadProgress* progress) {
  std::unique_ptr<SafeTensorsFile> f(new SafeTensorsFile());
  f->path_ = path;

  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  // Checked before mapping, which also keeps us from ever asking mmap for 0 bytes.
  if (size < 8) fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");

  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(errno));
  // From here the destructor unmaps, also when validation below throws.
  f->map_ = map;
  f->size_ = size;
  parse_header(path, static_cast<const uint8_t*>(map), size, &f->tensors_, &f->metadata_);
  // Read: every tensor whole, each to an aligned place (read_ranges), not the file's image,
  // whose offsets are only 8-aligned. The file's pages outside the header are never touched.
  if (mode == LoadMode::Read) f->read_ranges([](const TensorInfo& t) { return std::pair<size_t, size_t>{0, t.nbytes}; }, progress);
  return f;
}

SafeTensorsFile::~SafeTensorsFile() {
  if (map_) ::munmap(map_, size_);
  if (copy_) ::munmap(copy_, copy_size_);
}

// Where read_ranges places a tensor of nbytes, at or after offset `at`: at a multiple of 64
// bytes, and from 1 MiB on at a multiple of 4 KiB. A checkpoint's offsets are only 8-aligned (the safetensors format); the
// kernels' 64-byte vector loads then straddle two cache lines, and a matrix's rows straddle the
// 4 KiB pages that the fused GEMV's row order (qmatmul_kernels.inc, fused_range) and the L2
// prefetcher work in. qmatmul_bench on AMD Zen 5 (docs/perf.md "Session 46"): the BF16 head at
// 8 bytes off -14% at T = 8 and -4% at T = 1. The padding is under 0.4% of a large tensor.
static size_t place_up(size_t at, size_t nbytes) {
  const size_t a = nbytes >= (size_t{1} << 20) ? 4096 : 64;
  return (at + a - 1) / a * a;
}

size_t SafeTensorsFile::bytes_of(const ByteRange& range) const {
  size_t n = 0;
  for (const auto& [name, t] : tensors_) {
    const auto [b, e] = range(t);
    n += e - b;
  }
  return n;
}

void SafeTensorsFile::read_ranges(const ByteRange& range, ReadProgress* progress) {
  DSV4_CHECK(copy_ == nullptr);
  size_t total = 0;
  for (const auto& [name, t] : tensors_) {
    const auto [b, e] = range(t);
    DSV4_CHECK(b <= e && e <= t.nbytes);
    if (e > b) total = place_up(total, t.nbytes) + t.nbytes;
  }
  if (total == 0) return;
  void* mem = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) fail(path_, "cannot allocate " + std::to_string(total) + " bytes: " + std::strerror(errno));
  copy_ = mem;
  copy_size_ = total;
  ::madvise(mem, total, MADV_HUGEPAGE);  // advice only: fine if THP is off
  FdGuard fd{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail(path_, std::string("cannot open: ") + std::strerror(errno));
  // Where each read tensor goes; the tensors point there only once every byte has arrived.
  std::vector<ReadSpan> spans;
  std::vector<std::pair<TensorInfo*, char*>> moved;
  size_t at = 0;
  for (auto& [name, t] : tensors_) {
    const auto [b, e] = range(t);
    if (e <= b) continue;
    at = place_up(at, t.nbytes);
    char* dst = static_cast<char*>(mem) + at;
    const size_t base = static_cast<size_t>(t.data - static_cast<const uint8_t*>(map_));
    spans.push_back({dst + b, base + b, e - b});
    moved.emplace_back(&t, dst);
    at += t.nbytes;
  }
  // In file order: a cold disk then reads front to back.
  std::sort(spans.begin(), spans.end(), [](const ReadSpan& a, const ReadSpan& b) { return a.offset < b.offset; });
  read_spans(one_line(path_), fd.fd, spans, progress);
  for (auto& [t, dst] : moved) t->data = reinterpret_cast<const uint8_t*>(dst);
  ::mprotect(mem, total, PROT_READ);
}

// ---- TensorStore ------------------------------------------------------------------------

// `--load read` of more than 1 GiB says so on stderr when it starts, while it runs
// (ReadProgress) and when it is done.
class LoadReport {
 public:
  explicit LoadReport(uint64_t total) : total_(total), on_(total > (uint64_t{1} << 30)), progress_(total) {
    if (on_) std::fprintf(stderr, "dsv4: reading %.1f GB of weights into memory...\n", static_cast<double>(total) / 1e9);
  }
  ReadProgress* progress() { return on_ ? &progress_ : nullptr; }
  void finish() const {
    if (!on_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "dsv4: read in %.1f s (%.1f GB/s)\n", s, static_cast<double>(total_) / 1e9 / s);
  }

 private:
  const uint64_t total_;
  const bool on_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  ReadProgress progress_;
};

void TensorStore::hold(LoadMode mode, const ByteRange& range) {
  DSV4_CHECK(mode_ == LoadMode::Mmap);
  uint64_t total = 0;
  for (const auto& f : files_) total += f->bytes_of(range);
  const uint64_t avail = available_memory_bytes();
  if (mode == LoadMode::Auto) mode = avail > 0 && total <= avail / 2 ? LoadMode::Read : LoadMode::Mmap;
  if (mode == LoadMode::Read && avail > 0 && total > avail)
    throw Error(dir_ + ": --load read needs " + fmt_gb(total) + " of memory for this process's weights but " + fmt_gb(avail) +
                    " are available (use --load mmap)",
                ErrorKind::ResourceExhausted);
  mode_ = mode;
  if (mode != LoadMode::Read) return;
  LoadReport report(total);
  for (auto& f : files_) f->read_ranges(range, report.progress());
  report.finish();
}

TensorStore TensorStore::open_dir(const std::string& dir, LoadMode mode) {
  TensorStore store;
  store.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(dir, fs::exists(dir, ec) ? "not a directory" : "no such directory");

  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shards;  // as the index spells them, or plain file names
  if (fs::exists(index_path, ec)) {
    weight_map = read_weight_map(index_path);
    if (weight_map.empty()) fail(index_path.string(), "weight_map is empty");
    std::set<std::string> seen;
    for (const auto& [name, shard] : weight_map) {
      if (!seen.insert(shard).second) continue;
      if (!fs::exists(fs::path(dir) / shard, ec))
        fail(index_path.string(), "shard " + shard + " (listed for tensor " + name + ") does not exist");
    }
    shards.assign(seen.begin(), seen.end());
  } else {
    for (const auto& p : list_safetensors(dir)) shards.push_back(p.filename().string());
    if (shards.empty()) throw Error(one_line("no .safetensors files in " + dir));
  }

  uint64_t total = 0;
  for (const auto& shard : shards) total += fs::file_size(fs::path(dir) / shard, ec);
  const uint64_t avail = available_memory_bytes();
  const double gb = 1e9;
  if (mode == LoadMode::Auto) mode = avail > 0 && total <= avail / 2 ? LoadMode::Read : LoadMode::Mmap;
  // Refused up front rather than an OOM kill halfway through reading.
  if (mode == LoadMode::Read && avail > 0 && total > avail)
    throw Error(dir + ": --load read needs " + fmt_gb(total) + " of memory for the weights but " + fmt_gb(avail) +
                    " are available (use --load mmap: the weights then stay on disk and are paged in as used)",
                ErrorKind::ResourceExhausted);
  if (mode == LoadMode::Mmap && avail > 0 && total > avail)
    std::fprintf(stderr,
                 "dsv4: the weights (%.1f GB) exceed the available memory (%.1f GB): they stay mapped from disk and "
                 "the pages a step touches are read again when evicted; this works, but decode runs at disk speed\n",
                 static_cast<double>(total) / gb, static_cast<double>(avail) / gb);
  store.mode_ = mode;
  std::optional<LoadReport> report;
  if (mode == LoadMode::Read) report.emplace(total);

  std::map<std::string, const SafeTensorsFile*> by_shard;
  for (const auto& shard : shards) {
    store.files_.push_back(SafeTensorsFile::open((fs::path(dir) / shard).string(), mode, report ? report->progress() : nullptr));
    const SafeTensorsFile& f = *store.files_.back();
    by_shard[shard] = &f;
    for (const auto& [name, info] : f.tensors()) {
      auto [it, fresh] = store.index_.emplace(name, &info);
      if (!fresh) fail(dir, "tensor " + name + " appears in both " + it->second->file + " and " + f.path());
    }
  }

  // Tensors a shard holds beyond the weight_map stay reachable: some exporters omit entries.
  for (const auto& [name, shard] : weight_map) {
    const SafeTensorsFile* f = by_shard.at(shard);
    if (!f->tensors().count(name))
      fail(index_path.string(), "tensor " + name + " is mapped to shard " + shard + " but " + f->path() +
                                    " does not contain it");
  }
  if (report) report->finish();
  return store;
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorInfo& TensorStore::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error(one_line("missing tensor " + name + " in " + dir_));
  return *t;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;
}

// ---- SafeTensorsWriter ------------------------------------------------------------------

void SafeTensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  if (name == "__metadata__") throw Error("SafeTensorsWriter: tensor name __metadata__ is reserved");
  for (const auto& e : entries_)
    if (e.name == name) throw Error(one_line("SafeTensorsWriter: duplicate tensor " + name));
  uint64_t need = 0;
  if (!checked_nbytes(dtype, shape, &need))
    throw Error(one_line("SafeTensorsWriter: tensor " + name + ": invalid shape " + shape_string(shape)));
  if (need != bytes.size())
    throw Error(one_line("SafeTensorsWriter: tensor " + name + ": dtype " + dtype_name(dtype) + " shape " +
                         shape_string(shape) + " needs " + std::to_string(need) + " bytes but got " +
                         std::to_string(bytes.size())));
  entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

void SafeTensorsWriter::write(const std::string& dir, int shards) const {
  if (shards < 1) fail(dir, "shard count must be >= 1, got " + std::to_string(shards));
  if (shards > 1 && entries_.size() < static_cast<size_t>(shards))
    fail(dir, "cannot split " + std::to_string(entries_.size()) + " tensors into " + std::to_string(shards) +
                  " non-empty shards");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create directory: " + ec.message());

  std::vector<size_t> sizes;
  for (const auto& e : entries_) sizes.push_back(e.bytes.size());
  const std::vector<int> shard_of = assign_shards(sizes, shards);

  // Every file is first written under a temporary name; only when all are complete are they
  // renamed, index last, so a failure leaves no partial checkpoint under the final names.
  std::vector<std::pair<fs::path, fs::path>> staged;  // temp -> final
  auto cleanup = [&staged] {
    std::error_code ignore;
    for (const auto& s : staged) fs::remove(s.first, ignore);
  };
  const std::string tmp_suffix = ".tmp-" + std::to_string(::getpid());
  json weight_map = json::object();
  uint64_t total = 0;
  try {
    for (int s = 0; s < shards; ++s) {
      const std::string fname = shard_name(s, shards);
      json header = json::object();
      header["__metadata__"] = {{"format", "pt"}};
      std::vector<const std::vector<uint8_t>*> blobs;
      uint64_t offset = 0;
      for (size_t i = 0; i < entries_.size(); ++i) {
        if (shard_of[i] != s) continue;
        const Entry& e = entries_[i];
        header[e.name] = {{"dtype", dtype_name(e.dtype)},
                          {"shape", e.shape},
                          {"data_offsets", {offset, offset + e.bytes.size()}}};
        offset += e.bytes.size();
        blobs.push_back(&e.bytes);
        weight_map[e.name] = fname;
      }
      total += offset;
      const fs::path final_path = fs::path(dir) / fname;
      staged.emplace_back(fs::path(final_path.string() + tmp_suffix), final_path);
      write_file(staged.back().first, padded_header(header), blobs);
    }
    if (shards > 1) {
      json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      const fs::path final_path = fs::path(dir) / "model.safetensors.index.json";
      staged.emplace_back(fs::path(final_path.string() + tmp_suffix), final_path);
      std::ofstream out(staged.back().first, std::ios::binary | std::ios::trunc);
      out << index.dump(2) << "\n";
      out.close();
      if (!out) fail(staged.back().first.string(), "write failed");
    }
    for (const auto& [tmp, final_path] : staged) {
      fs::rename(tmp, final_path, ec);
      if (ec) fail(final_path.string(), "cannot rename from temporary file: " + ec.message());
    }
  } catch (const json::exception& e) {
    // dump() rejects tensor names that are not valid UTF-8.
    cleanup();
    fail(dir, std::string("cannot encode safetensors header: ") + e.what());
  } catch (...) {
    cleanup();
    throw;
  }
}

}  // namespace dsv4
