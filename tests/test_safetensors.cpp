// safetensors: writer/reader round trips (single file and sharded) and one test per kind of
// malformed input, each checking that the error names the file and the offending detail.
#include "io/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/bulk_read.h"

namespace dsv4 {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class SafeTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dsv4_st_" + std::string(info->name()) + "_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 31 * i);
  return v;
}

// Writes a safetensors file by hand: length prefix (declared_len, or the real length when
// negative), header text, then data.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
               int64_t declared_len = -1) {
  uint64_t n = declared_len < 0 ? header.size() : static_cast<uint64_t>(declared_len);
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  ASSERT_TRUE(out.good());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// One header entry, e.g. entry("w", "F32", "[2, 3]", 0, 24).
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, int64_t begin,
                  int64_t end) {
  return "\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape + ", \"data_offsets\": [" +
         std::to_string(begin) + ", " + std::to_string(end) + "]}";
}

std::string object(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const auto& e : entries) s += (s.size() > 1 ? ", " : "") + e;
  return s + "}";
}

// Runs fn, requiring a dsv4::Error whose single-line message contains every piece.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> pieces) {
  try {
    fn();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected dsv4::Error, got other exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected dsv4::Error, nothing thrown";
}

// Both ways of loading validate the same way.
void expect_open_error(const std::string& file, std::initializer_list<std::string> pieces) {
  expect_error([&] { SafeTensorsFile::open(file, LoadMode::Mmap); }, pieces);
  expect_error([&] { SafeTensorsFile::open(file, LoadMode::Read); }, pieces);
}

struct Sample {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Several dtypes, a scalar and an empty tensor; sizes differ so sharding has to balance.
std::vector<Sample> samples() {
  return {
      {"embed.weight", DType::BF16, {8, 16}, pattern(8 * 16 * 2, 1)},
      {"layers.0.attn.wq", DType::F8_E4M3, {16, 16}, pattern(256, 2)},
      {"layers.0.attn.wq.scale", DType::F8_E8M0, {1, 1}, pattern(1, 3)},
      {"layers.0.norm", DType::F32, {16}, pattern(64, 4)},
      {"layers.0.empty", DType::F16, {0, 4}, {}},
      {"step", DType::I64, {}, pattern(8, 5)},
      {"layers.1.mask", DType::BOOL, {3, 5}, pattern(15, 6)},
      {"layers.1.ids", DType::I32, {7}, pattern(28, 7)},
      {"head.weight", DType::F64, {4, 4}, pattern(128, 8)},
  };
}

// prefix + i, appended rather than "prefix" + to_string(i): GCC 12 -O2 flags the latter
// with a spurious -Wrestrict.
std::string numbered(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

SafeTensorsWriter writer_with(const std::vector<Sample>& ss) {
  SafeTensorsWriter w;
  for (const auto& s : ss) w.add(s.name, s.dtype, s.shape, s.bytes);
  return w;
}

void expect_matches(const TensorStore& store, const std::vector<Sample>& ss) {
  ASSERT_EQ(store.names().size(), ss.size());
  for (const auto& s : ss) {
    const TensorInfo& t = store.get(s.name);
    EXPECT_EQ(t.name, s.name);
    EXPECT_EQ(t.dtype, s.dtype) << s.name;
    EXPECT_EQ(t.shape, s.shape) << s.name;
    ASSERT_EQ(t.nbytes, s.bytes.size()) << s.name;
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(t.data, s.bytes.data(), t.nbytes), 0) << s.name;
    }
  }
}

uint64_t header_length(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  uint8_t b[8] = {};
  in.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

// ---- basics -----------------------------------------------------------------------------

TEST(SafeTensorsDType, NamesAndSizesRoundTrip) {
  const std::pair<const char*, size_t> expected[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},     {"I16", 2},     {"I8", 1},
      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1},    {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
  };
  for (const auto& [name, size] : expected) {
    DType t;
    ASSERT_TRUE(dtype_from_name(name, &t)) << name;
    EXPECT_STREQ(dtype_name(t), name);
    EXPECT_EQ(dtype_size(t), size) << name;
  }
  DType t;
  EXPECT_FALSE(dtype_from_name("F4", &t));
  EXPECT_FALSE(dtype_from_name("f32", &t));
}

TEST(SafeTensorsInfo, NumelAndShapeStr) {
  TensorInfo t;
  t.shape = {3, 4};
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.shape_str(), "[3, 4]");
  t.shape = {};
  EXPECT_EQ(t.numel(), 1);
  EXPECT_EQ(t.shape_str(), "[]");
  t.shape = {5, 0, 2};
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.shape_str(), "[5, 0, 2]");
}

TEST_F(SafeTensorsTest, WriterRejectsWrongByteCount) {
  SafeTensorsWriter w;
  expect_error([&] { w.add("w", DType::F32, {2, 3}, std::vector<uint8_t>(20)); }, {"w", "24", "20"});
  expect_error([&] { w.add("w", DType::F32, {-1}, {}); }, {"w", "-1"});
  w.add("w", DType::F32, {2, 3}, std::vector<uint8_t>(24));
  expect_error([&] { w.add("w", DType::F32, {1}, std::vector<uint8_t>(4)); }, {"duplicate", "w"});
  EXPECT_EQ(w.count(), 1u);
}

// ---- round trips ------------------------------------------------------------------------

TEST_F(SafeTensorsTest, RoundTripSingleFile) {
  const auto ss = samples();
  writer_with(ss).write(dir_.string());

  const std::string file = path("model.safetensors");
  ASSERT_TRUE(fs::exists(file));
  EXPECT_FALSE(fs::exists(path("model.safetensors.index.json")));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1) << "temp files left behind";
  EXPECT_EQ((8 + header_length(file)) % 8, 0u) << "data section not 8-aligned";

  auto f = SafeTensorsFile::open(file);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->tensors().size(), ss.size());
  EXPECT_EQ(f->file_size(), fs::file_size(file));

  TensorStore store = TensorStore::open_dir(dir_.string());
  expect_matches(store, ss);
  EXPECT_EQ(store.get("step").shape_str(), "[]");
  EXPECT_EQ(store.get("step").numel(), 1);
  EXPECT_EQ(store.get("layers.0.empty").numel(), 0);
  EXPECT_EQ(store.get("embed.weight").file, file);
  EXPECT_EQ(store.files().size(), 1u);
  EXPECT_EQ(store.dir(), dir_.string());
  EXPECT_TRUE(store.has("head.weight"));
  EXPECT_EQ(store.find("nope"), nullptr);
}

// Reading into memory gives the same tensors as mapping, in memory of our own (not the file's
// mapping), read-only; auto picks read for a small checkpoint.
// Read mode also places each tensor aligned (64 bytes; 4 KiB from 1 MiB on), whatever the
// file's offsets: the kernels' vector loads and row order assume it (safetensors.cpp, place_up).
TEST_F(SafeTensorsTest, ReadModeMatchesMmap) {
  auto ss = samples();
  ss.push_back({"layers.2.big", DType::U8, {(1 << 20) + 3}, pattern((1 << 20) + 3, 9)});
  ss.push_back({"layers.2.odd", DType::U8, {5}, pattern(5, 10)});
  writer_with(ss).write(dir_.string(), 2);
  TensorStore mapped = TensorStore::open_dir(dir_.string(), LoadMode::Mmap);
  TensorStore read = TensorStore::open_dir(dir_.string(), LoadMode::Read);
  EXPECT_EQ(mapped.load_mode(), LoadMode::Mmap);
  EXPECT_EQ(read.load_mode(), LoadMode::Read);
  expect_matches(read, ss);
  for (const auto& name : mapped.names()) {
    const TensorInfo &a = mapped.get(name), &b = read.get(name);
    ASSERT_EQ(a.nbytes, b.nbytes) << name;
    if (a.nbytes > 0) {
      EXPECT_NE(a.data, b.data) << name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % (a.nbytes >= (1u << 20) ? 4096 : 64), 0u) << name;
    }
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << name;
  }
  EXPECT_EQ(TensorStore::open_dir(dir_.string(), LoadMode::Auto).load_mode(), LoadMode::Read);
}

// The parallel reader: every span lands where it says, whatever the chunking and thread count,
// and the progress counts every byte once.
TEST_F(SafeTensorsTest, ReadSpansChunkedAndThreaded) {
  const auto data = pattern(100003, 7);
  write_raw(path("f"), "", {});  // replaced below: a plain file of `data`
  {
    std::ofstream out(path("f"), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  const int fd = ::open(path("f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (int threads : {1, 3}) {
    for (size_t chunk : {size_t{1}, size_t{4096}, size_t{0}}) {
      std::vector<char> dst(60000, 'x');
      ReadProgress progress(50000, std::chrono::hours(1));
      // Out of order, one empty, one ending at the file's last byte.
      read_spans("f", fd, {{dst.data() + 30000, 70003, 30000}, {dst.data(), 0, 12345}, {dst.data() + 20000, 5, 0},
                           {dst.data() + 12345, 40000, 7655}},
                 &progress, threads, chunk == 1 ? 1000 : chunk);
      EXPECT_EQ(progress.done(), 50000u);
      EXPECT_EQ(std::memcmp(dst.data(), data.data(), 12345), 0);
      EXPECT_EQ(std::memcmp(dst.data() + 12345, data.data() + 40000, 7655), 0);
      EXPECT_EQ(std::memcmp(dst.data() + 30000, data.data() + 70003, 30000), 0);
      EXPECT_EQ(dst[20000], 'x');
      EXPECT_EQ(dst[29999], 'x');
    }
  }
  // Past the end: the error names the file and the first byte that is not there.
  std::vector<char> dst(5000);
  for (int threads : {1, 2})
    expect_error([&] { read_spans(path("f"), fd, {{dst.data(), 99003, 5000}}, nullptr, threads, 1024); },
                 {path("f"), "read failed at byte 100003", "unexpected end of file"});
  ::close(fd);
}

// Progress lines: one per interval while bytes arrive, none for the last bytes (the caller says
// "read in ..." then).
TEST(SafeTensorsReadProgress, LinesWhileReading) {
  ::testing::internal::CaptureStderr();
  ReadProgress p(uint64_t{4} << 30, std::chrono::milliseconds(0));
  p.add(uint64_t{1} << 30);
  p.add(uint64_t{1} << 30);
  p.add(uint64_t{2} << 30);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("dsv4: read 1.1 of 4.3 GB (25%"), std::string::npos) << err;
  EXPECT_NE(err.find("dsv4: read 2.1 of 4.3 GB (50%"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 2) << err;
  EXPECT_EQ(p.done(), uint64_t{4} << 30);
}

TEST(SafeTensorsLoadMode, ParseAndName) {
  for (LoadMode m : {LoadMode::Auto, LoadMode::Mmap, LoadMode::Read}) EXPECT_EQ(parse_load_mode(load_mode_name(m)), m);
  expect_error([] { parse_load_mode("fast"); }, {"fast", "auto, mmap or read"});
}

TEST_F(SafeTensorsTest, RoundTripSharded) {
  const auto ss = samples();
  const fs::path single = dir_ / "single", sharded = dir_ / "sharded";
  writer_with(ss).write(single.string(), 1);
  writer_with(ss).write(sharded.string(), 3);

  const char* shard_files[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                               "model-00003-of-00003.safetensors"};
  for (const char* f : shard_files) ASSERT_TRUE(fs::exists(sharded / f)) << f;
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
  // Three shards + index, no temporary files.
  EXPECT_EQ(std::distance(fs::directory_iterator(sharded), fs::directory_iterator()), 4);

  // Index: total size and a weight_map that places tensors in insertion order, every shard used.
  std::ifstream in(sharded / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  uint64_t total = 0;
  for (const auto& s : ss) total += s.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  ASSERT_EQ(index["weight_map"].size(), ss.size());
  std::string prev;
  std::set<std::string> used;
  for (const auto& s : ss) {
    std::string shard = index["weight_map"][s.name].get<std::string>();
    EXPECT_GE(shard, prev) << "shards must hold contiguous ranges in insertion order";
    prev = shard;
    used.insert(shard);
  }
  EXPECT_EQ(used.size(), 3u);

  TensorStore a = TensorStore::open_dir(single.string());
  TensorStore b = TensorStore::open_dir(sharded.string());
  EXPECT_EQ(b.files().size(), 3u);
  for (const auto& f : b.files()) {
    EXPECT_FALSE(f->tensors().empty()) << f->path();
    EXPECT_EQ((8 + header_length(f->path())) % 8, 0u) << f->path();
  }
  expect_matches(b, ss);
  ASSERT_EQ(a.names(), b.names());
  for (const auto& name : a.names()) {
    const TensorInfo& x = a.get(name);
    const TensorInfo& y = b.get(name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    ASSERT_EQ(x.nbytes, y.nbytes);
    if (x.nbytes) {
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << name;
    }
  }
}

TEST_F(SafeTensorsTest, ShardsBalanceBytesAndStayNonEmpty) {
  // Six equal tensors over three shards: two each.
  SafeTensorsWriter w;
  for (int i = 0; i < 6; ++i) w.add(numbered("t", i), DType::U8, {100}, pattern(100, 1));
  w.write(dir_.string(), 3);
  TensorStore store = TensorStore::open_dir(dir_.string());
  ASSERT_EQ(store.files().size(), 3u);
  for (const auto& f : store.files()) EXPECT_EQ(f->tensors().size(), 2u) << f->path();

  // One huge tensor first, then tiny ones: every shard still gets at least one.
  SafeTensorsWriter skew;
  skew.add("big", DType::U8, {1000}, pattern(1000, 1));
  for (int i = 0; i < 3; ++i) skew.add(numbered("small", i), DType::U8, {1}, pattern(1, 2));
  const fs::path skew_dir = dir_ / "skew";
  skew.write(skew_dir.string(), 4);
  TensorStore s2 = TensorStore::open_dir(skew_dir.string());
  ASSERT_EQ(s2.files().size(), 4u);
  for (const auto& f : s2.files()) EXPECT_EQ(f->tensors().size(), 1u) << f->path();

  // Fewer tensors than shards cannot be written.
  SafeTensorsWriter few;
  few.add("a", DType::U8, {1}, pattern(1, 1));
  expect_error([&] { few.write((dir_ / "few").string(), 2); }, {"few", "2"});
}

TEST_F(SafeTensorsTest, DirectoryWithoutIndexOpensEveryFile) {
  write_raw(path("b.safetensors"), object({entry("y", "U8", "[2]", 0, 2)}), {1, 2});
  write_raw(path("a.safetensors"), object({entry("x", "U8", "[1]", 0, 1)}), {9});
  write_text(path("notes.txt"), "not a tensor file");
  TensorStore store = TensorStore::open_dir(dir_.string());
  EXPECT_EQ(store.names(), (std::vector<std::string>{"x", "y"}));
  ASSERT_EQ(store.files().size(), 2u);
  EXPECT_EQ(store.files()[0]->path(), path("a.safetensors"));  // sorted by name
  EXPECT_EQ(store.get("y").data[1], 2);
}

TEST_F(SafeTensorsTest, IndexToleratesUnlistedTensorsAndPadding) {
  // Header padded with trailing spaces, a gap-free layout, and a tensor the index omits.
  std::string header = object({entry("x", "U8", "[1]", 0, 1), entry("extra", "U8", "[1]", 1, 2)}) + "     ";
  write_raw(path("s1.safetensors"), header, {7, 8});
  write_text(path("model.safetensors.index.json"), R"({"weight_map": {"x": "s1.safetensors"}})");
  TensorStore store = TensorStore::open_dir(dir_.string());
  EXPECT_EQ(store.get("x").data[0], 7);
  EXPECT_EQ(store.get("extra").data[0], 8);
}

TEST_F(SafeTensorsTest, MetadataKept) {
  write_raw(path("m.safetensors"),
            object({R"("__metadata__": {"format": "pt", "note": "hi"})", entry("x", "U8", "[1]", 0, 1)}), {1});
  auto f = SafeTensorsFile::open(path("m.safetensors"));
  EXPECT_EQ(f->metadata().at("note"), "hi");
  EXPECT_EQ(f->tensors().count("__metadata__"), 0u);
}

// ---- malformed files --------------------------------------------------------------------

TEST_F(SafeTensorsTest, TruncatedDataSection) {
  const auto ss = samples();
  writer_with(ss).write(dir_.string());
  const std::string file = path("model.safetensors");
  fs::resize_file(file, fs::file_size(file) - 10);
  expect_open_error(file, {file, "past the end"});
}

TEST_F(SafeTensorsTest, FileShorterThanLengthField) {
  write_text(path("tiny.safetensors"), "abcd");
  expect_open_error(path("tiny.safetensors"), {path("tiny.safetensors"), "4 bytes"});
  write_text(path("zero.safetensors"), "");
  expect_open_error(path("zero.safetensors"), {path("zero.safetensors"), "0 bytes"});
}

TEST_F(SafeTensorsTest, MissingFile) {
  expect_open_error(path("absent.safetensors"), {path("absent.safetensors"), "No such file"});
}

TEST_F(SafeTensorsTest, OversizedHeaderLength) {
  const std::string header = object({entry("x", "U8", "[1]", 0, 1)});
  write_raw(path("long.safetensors"), header, {1}, static_cast<int64_t>(header.size()) + 100);
  expect_open_error(path("long.safetensors"), {path("long.safetensors"), "header length", "exceeds"});

  write_raw(path("huge.safetensors"), header, {1}, int64_t{1} << 40);
  expect_open_error(path("huge.safetensors"), {path("huge.safetensors"), "header length 1099511627776"});

  // Within the file but beyond the 100 MB cap: rejected before any parsing. The file is
  // sparse, so this costs no disk space.
  write_raw(path("cap.safetensors"), header, {1}, 150'000'000);
  fs::resize_file(path("cap.safetensors"), 150'000'100);
  expect_open_error(path("cap.safetensors"), {path("cap.safetensors"), "header length 150000000", "100 MB"});
}

TEST_F(SafeTensorsTest, HeaderNotJson) {
  write_raw(path("bad.safetensors"), "{\"x\": {\"dtype\": ", {});
  expect_open_error(path("bad.safetensors"), {path("bad.safetensors"), "not valid JSON"});
  write_raw(path("arr.safetensors"), "[1, 2]", {});
  expect_open_error(path("arr.safetensors"), {path("arr.safetensors"), "object"});
  write_raw(path("entry.safetensors"), R"({"x": 5})", {});
  expect_open_error(path("entry.safetensors"), {path("entry.safetensors"), "tensor x", "object"});
}

// A number beyond a double's range is nlohmann's out_of_range, not parse_error: the fuzzer found
// that it escaped as an uncaught exception (abort) before both catches took any json::exception.
TEST_F(SafeTensorsTest, NumberOutOfRange) {
  write_raw(path("big.safetensors"), R"({"x": {"dtype": "U8", "shape": [1e999], "data_offsets": [0, 1]}})", {1});
  expect_open_error(path("big.safetensors"), {path("big.safetensors"), "not valid JSON", "1e999"});
  write_raw(path("s1.safetensors"), object({entry("x", "U8", "[1]", 0, 1)}), {1});
  write_text(path("model.safetensors.index.json"), R"({"metadata": {"total_size": 1e999}, "weight_map": {"x": "s1.safetensors"}})");
  expect_error([&] { TensorStore::open_dir(dir_.string()); }, {path("model.safetensors.index.json"), "not valid JSON"});
}

TEST_F(SafeTensorsTest, UnknownOrMissingDtype) {
  write_raw(path("d.safetensors"), object({entry("w", "F4", "[2]", 0, 1)}), {1});
  expect_open_error(path("d.safetensors"), {path("d.safetensors"), "tensor w", "unknown dtype", "F4"});
  write_raw(path("m.safetensors"), R"({"w": {"shape": [1], "data_offsets": [0, 1]}})", {1});
  expect_open_error(path("m.safetensors"), {path("m.safetensors"), "tensor w", "dtype"});
}

TEST_F(SafeTensorsTest, ShapeDtypeOffsetsMismatch) {
  write_raw(path("s.safetensors"), object({entry("w", "F32", "[2, 3]", 0, 20)}), std::vector<uint8_t>(24));
  expect_open_error(path("s.safetensors"),
                    {path("s.safetensors"), "tensor w: dtype F32 shape [2, 3] needs 24 bytes but data_offsets span 20"});
}

TEST_F(SafeTensorsTest, OffsetsPastEnd) {
  write_raw(path("p.safetensors"), object({entry("w", "F32", "[4]", 8, 24)}), std::vector<uint8_t>(16));
  expect_open_error(path("p.safetensors"), {path("p.safetensors"), "tensor w", "past the end", "[8, 24]"});
}

TEST_F(SafeTensorsTest, BadOffsets) {
  write_raw(path("r.safetensors"), object({entry("w", "U8", "[0]", 5, 4)}), std::vector<uint8_t>(8));
  expect_open_error(path("r.safetensors"), {path("r.safetensors"), "tensor w", "begin 5 > end 4"});
  write_raw(path("n.safetensors"), object({entry("w", "U8", "[1]", -1, 0)}), std::vector<uint8_t>(8));
  expect_open_error(path("n.safetensors"), {path("n.safetensors"), "tensor w", "data_offsets", "-1"});
  write_raw(path("t.safetensors"), R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", {1});
  expect_open_error(path("t.safetensors"), {path("t.safetensors"), "tensor w", "data_offsets"});
}

TEST_F(SafeTensorsTest, OverlappingTensors) {
  write_raw(path("o.safetensors"),
            object({entry("a", "F32", "[4]", 0, 16), entry("b", "F32", "[2]", 8, 16), entry("e", "F32", "[0]", 4, 4)}),
            std::vector<uint8_t>(16));
  expect_open_error(path("o.safetensors"), {path("o.safetensors"), "overlap", "a [0, 16]", "b [8, 16]"});
}

TEST_F(SafeTensorsTest, NegativeOrNonIntegerShape) {
  write_raw(path("neg.safetensors"), object({entry("w", "F32", "[-1, 3]", 0, 0)}), {});
  expect_open_error(path("neg.safetensors"), {path("neg.safetensors"), "tensor w", "shape", "-1"});
  write_raw(path("flt.safetensors"), object({entry("w", "U8", "[1.5]", 0, 0)}), {});
  expect_open_error(path("flt.safetensors"), {path("flt.safetensors"), "tensor w", "shape", "1.5"});
}

TEST_F(SafeTensorsTest, NumelOverflow) {
  write_raw(path("big.safetensors"), object({entry("w", "F32", "[4294967296, 4294967296]", 0, 0)}), {});
  expect_open_error(path("big.safetensors"), {path("big.safetensors"), "tensor w", "too many elements"});
}

TEST_F(SafeTensorsTest, MetadataValuesMustBeStrings) {
  write_raw(path("md.safetensors"), R"({"__metadata__": {"format": 1}})", {});
  expect_open_error(path("md.safetensors"), {path("md.safetensors"), "__metadata__", "format"});
}

TEST_F(SafeTensorsTest, EmptyHeaderObjectIsValid) {
  write_raw(path("e.safetensors"), "{}      ", {});
  auto f = SafeTensorsFile::open(path("e.safetensors"));
  EXPECT_TRUE(f->tensors().empty());
}

// ---- directories ------------------------------------------------------------------------

TEST_F(SafeTensorsTest, IndexPointsToMissingShard) {
  write_raw(path("s1.safetensors"), object({entry("x", "U8", "[1]", 0, 1)}), {1});
  write_text(path("model.safetensors.index.json"),
             R"({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  expect_error([&] { TensorStore::open_dir(dir_.string()); },
               {path("model.safetensors.index.json"), "s2.safetensors", "tensor y", "does not exist"});
}

TEST_F(SafeTensorsTest, IndexMapsTensorItsShardLacks) {
  write_raw(path("s1.safetensors"), object({entry("x", "U8", "[1]", 0, 1)}), {1});
  write_raw(path("s2.safetensors"), object({entry("y", "U8", "[1]", 0, 1)}), {2});
  write_text(path("model.safetensors.index.json"),
             R"({"weight_map": {"x": "s1.safetensors", "y": "s1.safetensors", "z": "s2.safetensors"}})");
  expect_error([&] { TensorStore::open_dir(dir_.string()); },
               {path("model.safetensors.index.json"), "tensor y", "s1.safetensors", "does not contain"});
}

TEST_F(SafeTensorsTest, SameTensorInTwoFiles) {
  write_raw(path("a.safetensors"), object({entry("w", "U8", "[1]", 0, 1)}), {1});
  write_raw(path("b.safetensors"), object({entry("w", "U8", "[1]", 0, 1)}), {2});
  expect_error([&] { TensorStore::open_dir(dir_.string()); },
               {"tensor w", path("a.safetensors"), path("b.safetensors")});

  // Also when an index lists both shards.
  write_text(path("model.safetensors.index.json"), R"({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}})");
  expect_error([&] { TensorStore::open_dir(dir_.string()); },
               {"tensor w", path("a.safetensors"), path("b.safetensors")});
}

TEST_F(SafeTensorsTest, GetMissingTensor) {
  write_raw(path("a.safetensors"), object({entry("w", "U8", "[1]", 0, 1)}), {1});
  TensorStore store = TensorStore::open_dir(dir_.string());
  expect_error([&] { store.get("layers.9.ffn"); }, {"missing tensor layers.9.ffn in " + dir_.string()});
}

TEST_F(SafeTensorsTest, BadDirectories) {
  const std::string absent = path("nowhere");
  expect_error([&] { TensorStore::open_dir(absent); }, {absent});
  expect_error([&] { TensorStore::open_dir(dir_.string()); }, {"no .safetensors files in " + dir_.string()});
  write_text(path("model.safetensors.index.json"), "{not json");
  expect_error([&] { TensorStore::open_dir(dir_.string()); }, {path("model.safetensors.index.json"), "JSON"});
}

TEST_F(SafeTensorsTest, BadShardNamesTheShard) {
  write_text(path("model.safetensors"), "xy");
  expect_error([&] { TensorStore::open_dir(dir_.string()); }, {path("model.safetensors"), "2 bytes"});
}

}  // namespace
}  // namespace dsv4
