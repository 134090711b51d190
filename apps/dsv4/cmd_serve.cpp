// dsv4 serve: the OpenAI- and Anthropic-compatible HTTP server (src/server, docs/server.md).
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "args.h"
#include "device.h"
#include "server/http_server.h"

namespace dsv4::cli {

int cmd_serve(const Args& a) {
  server::ServerOptions so;
  so.host = a.str("host", "127.0.0.1");
  so.port = static_cast<int>(a.integer("port", 8080));
  so.api_key = a.str("api-key", "");
  so.model_name = a.str("model-name", "");
  so.scheduler.max_batch = static_cast<int>(a.integer("max-batch", 16));
  so.scheduler.step_tokens = a.integer("step-tokens", 256);
  so.scheduler.step_tokens_decoding = a.integer("step-tokens-decoding", 64);
  so.scheduler.max_queue = static_cast<int>(a.integer("max-queue", 64));
  so.scheduler.cache_budget = static_cast<int64_t>(a.number("cache-budget", 1024) * 1024 * 1024);
  so.scheduler.cache_dir = a.str("cache-dir", "");
  so.scheduler.cache_dir_budget = static_cast<int64_t>(a.number("cache-dir-budget", 10240) * 1024 * 1024);
  so.default_max_tokens = a.integer("max-tokens", 4096);
  so.timeout_s = static_cast<int>(a.integer("timeout", 600));
  so.stall_timeout_s = static_cast<int>(a.integer("stall-timeout", 30));
  so.read_timeout_s = static_cast<int>(a.integer("read-timeout", 60));
  so.scheduler.draft = static_cast<int>(a.integer("draft", 0));
  so.quiet = a.flag("quiet");
  if (so.port < 0 || so.port > 65535) throw Usage("--port must be in [0, 65535]");
  if (so.scheduler.max_batch < 1 || so.scheduler.max_batch > 256) throw Usage("--max-batch must be in [1, 256]");
  if (so.scheduler.step_tokens < 1) throw Usage("--step-tokens must be >= 1");
  if (so.scheduler.step_tokens_decoding < 1) throw Usage("--step-tokens-decoding must be >= 1");
  if (so.scheduler.max_queue < 0) throw Usage("--max-queue must be >= 0");
  if (so.scheduler.cache_budget < 0) throw Usage("--cache-budget must be >= 0");
  if (so.scheduler.cache_dir_budget < 0) throw Usage("--cache-dir-budget must be >= 0");
  if (a.has("cache-dir") && so.scheduler.cache_dir.empty()) throw Usage("--cache-dir needs a directory");
  if (so.default_max_tokens < 1) throw Usage("--max-tokens must be >= 1");
  if (so.timeout_s < 1) throw Usage("--timeout must be >= 1");
  if (so.stall_timeout_s < 1 || so.stall_timeout_s > 3600) throw Usage("--stall-timeout must be in [1, 3600]");
  if (so.read_timeout_s < 1 || so.read_timeout_s > 3600) throw Usage("--read-timeout must be in [1, 3600]");
  if (so.scheduler.draft < 0 || so.scheduler.draft > kCheapRewind)
    throw Usage("--draft must be in [0, " + std::to_string(kCheapRewind) + "]");
  EngineOptions eo = engine_options(a, a.integer("ctx-size", 0));
  if (a.has("kv-budget")) {
    const double mb = a.number("kv-budget", 0);
    if (!(mb >= 0)) throw Usage("--kv-budget must be a size in MB (0 = no limit)");
    eo.memory_budget = static_cast<int64_t>(mb * 1024 * 1024);
  }
  a.check_all_used();

  // SIGINT / SIGTERM stop the server from a thread of ours (stopping from a signal handler
  // would not be async-signal-safe): blocked here, before any thread starts, and waited for.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  server::HttpServer srv(eo, so);
  // The watcher is joined before srv goes, also when run() throws (a model that fails to load):
  // a detached one could call stop() on a destroyed server if a signal came as the command
  // returned. On the way out it is woken with a signal of its set and told not to act on it.
  struct Watcher {
    std::atomic<bool> leaving{false};
    std::thread thread;
    ~Watcher() {
      leaving = true;
      pthread_kill(thread.native_handle(), SIGTERM);  // pending for it alone: every thread blocks it
      thread.join();
    }
  } watcher;
  watcher.thread = std::thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig != 0 && !watcher.leaving) {
      std::fprintf(stderr, "dsv4 serve: stopping (signal %d)\n", sig);
      srv.stop();
    }
  });
  srv.run(
      [&](int port) {
        std::fprintf(stderr, "dsv4 serve: ready at http://%s:%d/v1 (max batch %d, queue %d)\n", so.host.c_str(), port,
                     so.scheduler.max_batch, so.scheduler.max_queue);
        std::fflush(stderr);
      },
      [&](int port) {
        std::fprintf(stderr, "dsv4 serve: listening on http://%s:%d (/health says \"loading\"), loading %s\n",
                     so.host.c_str(), port, eo.model_dir.c_str());
        std::fflush(stderr);
      });
  return 0;
}

}  // namespace dsv4::cli
