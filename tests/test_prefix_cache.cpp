// The prefix cache's disk tier (server/prefix_cache.h) and the thread that writes its files
// (server/snapshot_writer.h): writes and deletions in the order asked, failures reported and
// forgotten, the queue bounded, nothing read before it is written.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/snapshot_file.h"
#include "server/prefix_cache.h"
#include "server/snapshot_writer.h"
#include "test_util.h"

using namespace dsv4;
using namespace dsv4::server;
using namespace dsv4::testing;
namespace fs = std::filesystem;

namespace {

SnapshotImage image(std::vector<int32_t> tokens, size_t body_bytes) {
  SnapshotImage im;
  im.fingerprint = 77;
  im.tokens = std::move(tokens);
  im.body.assign(body_bytes, 0xAB);
  return im;
}

// The server's name of a snapshot file (prefix_cache.cpp file_name).
std::string file_name(const std::vector<int32_t>& tokens) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016llx-%zu.dsv4snap",
                static_cast<unsigned long long>(hash_bytes(tokens.data(), tokens.size() * sizeof(int32_t))), tokens.size());
  return buf;
}

}  // namespace

TEST(SnapshotWriter, WritesAndDeletesInOrderAndReportsFailures) {
  const std::string dir = temp_dir("snapwriter");
  SnapshotWriter w(int64_t{1} << 30);
  const std::string a = dir + "/a.dsv4snap", b = dir + "/b.dsv4snap", c = dir + "/c.dsv4snap";
  ASSERT_TRUE(w.write(a, image({1, 2, 3}, 1000)));
  ASSERT_TRUE(w.write(b, image({4, 5}, 10)));
  w.remove(b);  // after its write
  fs::create_directory(c + ".tmp");  // where c's write must create its file: it fails
  ASSERT_TRUE(w.write(c, image({6}, 10)));
  w.flush();
  EXPECT_FALSE(w.pending(a));
  const SnapshotFile f = read_snapshot_file(a, false);
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(f.fingerprint, 77u);
  EXPECT_EQ(fs::file_size(a), image({1, 2, 3}, 1000).file_bytes());
  EXPECT_FALSE(fs::exists(b));
  EXPECT_FALSE(fs::exists(c));
  EXPECT_EQ(w.failed(), std::vector<std::string>{c});
  EXPECT_TRUE(w.failed().empty());  // said once
}

// A write blocked on the disk (here: its .tmp is a FIFO nobody reads yet) holds the queue: a
// second image past the bound is refused, the first stays pending until it is written.
TEST(SnapshotWriter, BoundsTheImagesThatWait) {
  const std::string dir = temp_dir("snapwriter-bound");
  const std::string a = dir + "/a.dsv4snap", b = dir + "/b.dsv4snap";
  ASSERT_EQ(::mkfifo((a + ".tmp").c_str(), 0600), 0);
  SnapshotWriter w(100);
  ASSERT_TRUE(w.write(a, image({1}, 500)));  // over the bound alone: taken, nothing waits
  EXPECT_TRUE(w.pending(a));
  EXPECT_FALSE(w.write(b, image({2}, 10)));  // a waits: refused
  std::string got;
  {
    std::ifstream fifo(a + ".tmp", std::ios::binary);  // lets the writer open it
    got.assign(std::istreambuf_iterator<char>(fifo), {});
  }
  w.flush();
  EXPECT_EQ(got.size(), image({1}, 500).file_bytes());
  EXPECT_FALSE(w.pending(a));
  EXPECT_TRUE(w.write(b, image({2}, 10)));
  w.flush();
  EXPECT_TRUE(fs::exists(b));
}

// The cache asks the writer for its files: they are there once flushed, a restarted cache finds
// and loads them; a file still being written is not read; a write that failed is forgotten at
// the next lookup.
TEST(PrefixCacheDisk, FilesGoThroughTheWriter) {
  const std::string model = golden_dir("tiny-native");
  if (model.empty()) GTEST_SKIP();
  const std::string dir = temp_dir("prefix-disk");
  Engine e({.model_dir = model + "/model"});
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back(3 + (i * 37) % 900);
  Sequence s = e.new_sequence();
  e.step({StepRequest{&s, tokens, Rows::Last}});
  const Snapshot snap = e.snapshot(s);
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(5);
  const DiskCacheOptions disk{.dir = dir, .budget_bytes = int64_t{1} << 30, .min_tokens = 8};
  {
    PrefixCache cache(e, int64_t{1} << 30, disk);
    cache.insert(snap, true);
    EXPECT_EQ(cache.disk_entries(), 1u);  // counted from the moment it is asked for
    cache.flush();
    EXPECT_TRUE(fs::exists(dir + "/" + file_name(tokens)));
  }
  {
    PrefixCache cache(e, int64_t{1} << 30, disk);  // a restart
    EXPECT_EQ(cache.disk_entries(), 1u);
    const auto hit = cache.lookup(prompt);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->common, 40);
    EXPECT_EQ(cache.disk_loads(), 1);
  }
  // A file whose write is still pending (blocked: its .tmp is a FIFO nobody reads yet) is not
  // read: lookups pass it by, and it stays counted.
  fs::remove_all(dir);
  {
    PrefixCache cache(e, 0, disk);  // nothing kept in memory: only a file could serve
    const std::string tmp = dir + "/" + file_name(tokens) + ".tmp";
    ASSERT_EQ(::mkfifo(tmp.c_str(), 0600), 0);
    cache.insert(snap, true);
    EXPECT_FALSE(cache.lookup(prompt).has_value());
    EXPECT_EQ(cache.disk_entries(), 1u);
    EXPECT_EQ(cache.disk_loads(), 0);
    std::ifstream fifo(tmp, std::ios::binary);
    const std::string got(std::istreambuf_iterator<char>(fifo), {});
    EXPECT_GT(got.size(), 0u);
    cache.flush();
  }
  // A write that fails (its .tmp cannot be created) leaves no entry behind after the cache's next call.
  fs::remove_all(dir);
  fs::create_directories(dir + "/" + file_name(tokens) + ".tmp/x");  // a non-empty directory: not cleaned at start
  PrefixCache cache(e, 0, disk);  // nothing kept in memory: only a file could serve
  cache.insert(snap, true);
  cache.flush();
  EXPECT_EQ(cache.disk_entries(), 1u);
  cache.insert(snap, false);  // the cache's next call learns of the failure
  EXPECT_EQ(cache.disk_entries(), 0u);
  EXPECT_EQ(cache.disk_bytes(), 0);
  EXPECT_FALSE(cache.lookup(prompt).has_value());
  EXPECT_EQ(cache.disk_loads(), 0);
}
