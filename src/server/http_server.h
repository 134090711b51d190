#pragma once
// `dsv4 serve`: the HTTP front of the scheduler, on cpp-httplib (Debian's libcpp-httplib-dev:
// a maintained, small, synchronous server with a thread per connection, chunked responses for
// Server-Sent Events and limits on body size and timeouts; the engine is driven by one thread
// anyway, so an asynchronous stack such as Boost.Beast would add complexity without a gain).
//
// Endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages (Anthropic);
// GET /v1/models, /health, /metrics. See docs/server.md.
//
// The port is bound before the model loads: /health answers 503 {"status": "loading"} (and the
// generation endpoints 503) until the engine is ready.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/scheduler.h"

namespace dsv4::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0 = any free port (reported to `ready`)
  std::string api_key;              // "" = no authentication
  std::string model_name;           // the id /v1/models lists ("" = the model directory's name)
  SchedulerOptions scheduler;
  int64_t default_max_tokens = 4096;
  int64_t max_body_bytes = 8 << 20;
  int timeout_s = 600;              // a request still running after this is cancelled
  int stall_timeout_s = 30;         // a client that takes no byte of its answer for this long is dropped
  int read_timeout_s = 60;          // a connection that sends no complete request in this long is closed
  int http_threads = 0;             // 0 = enough for max_batch streams plus the queue
  bool quiet = false;               // no per-request log lines
};

class HttpServer {
 public:
  HttpServer(const EngineOptions& engine, const ServerOptions& o);
  ~HttpServer();
  // Binds the port (throws Error when it cannot), calls `listening` with it, loads the engine
  // (meanwhile /health answers "loading"), calls `ready` with the port, then serves until
  // stop(). Throws Error when the model fails to load.
  void run(const std::function<void(int port)>& ready, const std::function<void(int port)>& listening = {});
  // Safe from another thread, and at any time: a stop before run() or while the model loads
  // ends run() once the model has loaded.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::server
