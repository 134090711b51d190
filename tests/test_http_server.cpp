// HttpServer's start and stop (src/server/http_server.h), without a client: a stop that comes
// before the HTTP listener runs must still end run(). cpp-httplib 0.11 drops such a stop, and
// `dsv4 serve` then served on after a signal during startup or hung after a failed load.
// The HTTP side is tested through the official clients (tests/server).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <future>

#include "server/http_server.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dsv4;
using namespace dsv4::testing;

TEST(HttpServer, StopBeforeRunEndsRunOnceLoaded) {
  if (!fs::exists(tokenizer_dir() + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer.json in " << tokenizer_dir();
  const std::string model = temp_dir("http-stop") + "/m";
  const std::string mk = std::string(DSV4_BIN) + " make-tiny --out " + model + " --preset demo --seed 3 --tokenizer " +
                         tokenizer_dir() + " >/dev/null 2>&1";
  ASSERT_EQ(run_command(mk).status, 0) << mk;
  EngineOptions eo;
  eo.model_dir = model;
  eo.threads = 1;
  server::ServerOptions so;
  so.port = 0;
  so.quiet = true;
  server::HttpServer srv(eo, so);
  srv.stop();
  int port = -1;
  auto done = std::async(std::launch::async, [&] { srv.run([&](int p) { port = p; }); });
  if (done.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
    ADD_FAILURE() << "run() still serving 120 s after stop()";
    std::_Exit(1);  // the future would wait for it forever
  }
  done.get();
  EXPECT_GT(port, 0);  // it loaded and was ready before it stopped
}
