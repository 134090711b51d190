#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "server/connections.h"
#include "server/response.h"
#include "server/responses_api.h"
#include "server/tool_calls.h"

namespace dsv4::server {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

namespace {

// Compares without an early exit, so the time taken does not reveal how much of a key matched.
bool equal_constant_time(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

int status_of(const Error& e) {
  switch (e.kind) {
    case ErrorKind::BadInput: return 400;
    case ErrorKind::ResourceExhausted: return 503;
    case ErrorKind::Unsupported: return 501;
    case ErrorKind::Internal: return 500;
  }
  return 500;
}

ApiError api_error(const Error& e) {
  const int s = status_of(e);
  const char* type = s == 400 ? "invalid_request_error" : s == 503 ? "overloaded_error" : "server_error";
  return ApiError(s, type, e.what());
}

// Anthropic's error bodies on its endpoints, OpenAI's elsewhere.
bool anthropic_path(const std::string& path) { return path == "/v1/messages" || path == "/v1/messages/count_tokens"; }

// The endpoint a request counts under in /metrics: a route, "/v1/responses/{id}" (and its
// "/input_items"), or "other" (raw paths would let any client add label values without bound).
std::string endpoint_label(const std::string& path) {
  static const char* const kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/input_tokens",
                                        "/v1/messages", "/v1/messages/count_tokens", "/v1/models", "/health", "/metrics", "/"};
  for (const char* r : kRoutes)
    if (path == r) return path;
  if (path.rfind("/v1/responses/", 0) == 0) {
    const size_t slash = path.find('/', 14);
    if (slash == std::string::npos) return "/v1/responses/{id}";
    return path.compare(slash, std::string::npos, "/input_items") == 0 ? "/v1/responses/{id}/input_items" : "other";
  }
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// SO_SNDBUF of an event stream's connection (Linux doubles it for its bookkeeping).
constexpr int kStreamSendBuffer = 64 << 10;

}  // namespace

struct HttpServer::Impl {
  Impl(const EngineOptions& eo, const ServerOptions& o) : engine_opt(eo), opt(o) {}

  EngineOptions engine_opt;
  ServerOptions opt;
  Metrics metrics;
  ToolCallStore store;
  ResponseStore responses;  // /v1/responses kept for previous_response_id
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Scheduler> sched;
  std::atomic<bool> ready{false};
  httplib::Server svr;
  std::string model_name;
  std::unique_ptr<RequestDeadline> deadline;  // from bind to after the listener's end

  static Peer peer(const httplib::Request& req) { return {req.remote_addr, req.remote_port}; }
  // The request is read and is being answered (the logger's leave ends it): exempt from the
  // request deadline. Called by every handler, so a slow answer is never cut.
  void busy(const httplib::Request& req) {
    if (deadline) deadline->enter(peer(req));
  }

  // The listener's end. cpp-httplib 0.11's Server::stop() does nothing until listen_after_bind
  // has marked the server running, and must not run twice: a stop that came first (a model that
  // failed to load within a millisecond, a signal during startup) was lost and the listener
  // served on, so run() never returned. Every stop goes through try_stop under mu.
  std::mutex mu;
  std::condition_variable cv;
  bool stop_requested = false, listener_stopped = false, listener_done = false;

  bool try_stop() {  // mu held; whether the listener is stopped (or ending by itself)
    if (!listener_stopped && svr.is_running()) {
      svr.stop();
      listener_stopped = true;
    }
    return listener_stopped || listener_done;
  }
  // Stops the listener (retrying until it is running or has ended), then the scheduler (answers
  // in progress end with an error within a step; the listener's join waited for each to run out:
  // 45 s for a 3000-token stream of the demo model), shuts the idle keep-alive connections (their
  // threads would wait up to 5 s for a next request) and joins the listener.
  void end_listener(std::thread& listener) {
    {
      std::unique_lock<std::mutex> l(mu);
      stop_requested = true;
      while (!try_stop()) cv.wait_for(l, std::chrono::milliseconds(1));
    }
    if (sched) sched->stop();
    if (deadline) deadline->close_idle();
    listener.join();
  }

  void send_error(httplib::Response& res, const ApiError& e, bool anthropic) {
    res.status = e.status;
    if (e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(anthropic ? anthropic_error_body(e) : error_body(e), "application/json");
  }

  bool authorized(const httplib::Request& req) const {
    if (opt.api_key.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (auth.size() > bearer.size() && auth.compare(0, bearer.size(), bearer) == 0 &&
        equal_constant_time(auth.substr(bearer.size()), opt.api_key))
      return true;
    return req.has_header("x-api-key") && equal_constant_time(req.get_header_value("x-api-key"), opt.api_key);
  }

  void generate(const httplib::Request& req, httplib::Response& res, Api api) {
    busy(req);
    const bool anthropic = api == Api::Anthropic;
    if (!ready) return send_error(res, ApiError(503, "overloaded_error", "the model is loading"), anthropic);
    // Everything the streaming callback needs outlives this handler: shared.
    struct State {
      ParsedRequest req;
      std::shared_ptr<Job> job;
      std::unique_ptr<Responder> resp;
      Clock::time_point t0 = Clock::now();
      bool started = false;
    };
    auto st = std::make_shared<State>();
    try {
      RequestLimits lim;
      lim.max_n = opt.scheduler.max_batch;
      lim.default_max_tokens = opt.default_max_tokens;
      const ModelFacts facts{engine->tokenizer(), engine->info().context, engine->info().vocab};
      st->req = parse_request(api, req.body, facts, lim, &store, &responses);
    } catch (const ApiError& e) {
      return send_error(res, e, anthropic);
    } catch (const Error& e) {
      return send_error(res, api_error(e), anthropic);
    }
    if (st->req.model.empty()) st->req.model = model_name;
    st->job = std::make_shared<Job>(st->req.gen);
    try {
      sched->submit(st->job);
    } catch (const Error& e) {
      return send_error(res, api_error(e), anthropic);
    }
    st->resp = make_responder(st->req, engine->tokenizer(), store, &responses);
    const auto timeout = std::chrono::seconds(opt.timeout_s);

    if (!st->req.stream) {
      // Nothing is written before the answer, so a client that leaves is seen on its socket:
      // checked every kCheck (the descriptor is looked up at the first check), its job cancelled.
      constexpr auto kCheck = std::chrono::milliseconds(250);
      auto checked = st->t0;
      int fd = -2;  // not looked up yet
      Event e;
      for (;;) {
        const bool got = st->job->next(e, kCheck);
        if (Clock::now() - checked >= kCheck) {
          checked = Clock::now();
          if (fd == -2) fd = connection_fd(req.local_port, peer(req));
          if (fd >= 0 && peer_closed(fd)) {
            st->job->cancel();
            // nginx's "client closed request": for the log line and /metrics, nobody reads it.
            return send_error(res, ApiError(499, "client_closed_request", "the client closed the connection"), anthropic);
          }
        }
        if (!got) {
          if (Clock::now() - st->t0 > timeout) {
            st->job->cancel();
            return send_error(res, ApiError(504, "timeout", "the request took longer than the server's timeout (" +
                                                                 std::to_string(opt.timeout_s) + " s)"), anthropic);
          }
          continue;
        }
        if (e.kind == Event::Failed) return send_error(res, api_error(e.error), anthropic);
        if (e.kind == Event::Done) break;
        st->resp->event(e);
      }
      res.set_content(st->resp->body(st->job->usage()), "application/json");
      return;
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    // A small send buffer, so that a client that stops reading blocks our writes (and pauses its
    // job, see Scheduler) after ~kStreamSendBuffer of its answer rather than after the megabytes
    // a loopback or fast link autotunes to. An event stream needs little: at ~200 bytes a token
    // it holds hundreds of tokens, and the link's round trip is paid once per buffer, not per token.
    if (const int fd = connection_fd(req.local_port, peer(req)); fd >= 0) {
      const int bytes = kStreamSendBuffer;
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    }
    const int64_t timeout_s = opt.timeout_s;
    const int stall_s = opt.stall_timeout_s;
    const bool quiet = opt.quiet;
    const std::string who = req.remote_addr + ":" + std::to_string(req.remote_port) + " (" + req.path + ")";
    Metrics* const counts = &metrics;  // outlives the listener's threads, hence every stream
    res.set_chunked_content_provider(
        "text/event-stream",
        [st, timeout_s, stall_s, quiet, who, counts](size_t, httplib::DataSink& sink) {
          // A failed write means the client left or took nothing for stall_s (cpp-httplib's
          // write timeout): either way its job is cancelled, freed before the next step.
          auto write = [&](const std::string& s) {
            if (s.empty()) return true;
            const auto t = Clock::now();
            st->job->write_begin();
            const bool ok = sink.write(s.data(), s.size());
            st->job->write_end();
            if (ok) return true;
            if (Clock::now() - t >= std::chrono::seconds(stall_s)) {  // counted before the job ends
              counts->stream_stalled();
              if (!quiet) std::fprintf(stderr, "dsv4 serve: dropped the stream to %s: it took no data for %d s\n", who.c_str(), stall_s);
            }
            st->job->cancel();
            return false;
          };
          if (!st->started) {
            st->started = true;
            if (!write(st->resp->start())) return false;
          }
          Event e;
          for (;;) {
            if (!st->job->next(e, std::chrono::milliseconds(1000))) {
              // Keep-alive while a long prompt is read; a failed write means the client left.
              if (!write(st->resp->keep_alive())) return false;
              if (Clock::now() - st->t0 > std::chrono::seconds(timeout_s)) {
                st->job->cancel();
                const ApiError err(504, "timeout", "the request took longer than the server's timeout");
                write(st->resp->failed(err));
                sink.done();
                return true;
              }
              continue;
            }
            if (e.kind == Event::Failed) {
              const ApiError err = api_error(e.error);
              write(st->resp->failed(err));
              sink.done();
              return true;
            }
            if (e.kind == Event::Done) {
              write(st->resp->end(st->job->usage()));
              sink.done();
              return true;
            }
            if (!write(st->resp->event(e))) return false;
          }
        },
        [st](bool success) {
          if (!success) st->job->cancel();
        });
  }

  // The one model /v1/models lists (its context once loaded).
  ojson model_object() const {
    ojson m = {{"id", model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "dsv4"}};
    if (ready) m["context_length"] = engine->info().context;
    return m;
  }

  // /v1/messages/count_tokens and /v1/responses/input_tokens: the prompt a request would
  // render, counted (what agents check against the context before they send).
  void count_tokens(const httplib::Request& req, httplib::Response& res, Api api) {
    busy(req);
    const bool anthropic = api == Api::Anthropic;
    if (!ready) return send_error(res, ApiError(503, "overloaded_error", "the model is loading"), anthropic);
    ParsedRequest r;
    try {
      RequestLimits lim;
      lim.count_only = true;
      const ModelFacts facts{engine->tokenizer(), engine->info().context, engine->info().vocab};
      r = parse_request(api, req.body, facts, lim, &store, &responses);
    } catch (const ApiError& e) {
      return send_error(res, e, anthropic);
    } catch (const Error& e) {
      return send_error(res, api_error(e), anthropic);
    }
    ojson out = {{"input_tokens", r.gen.prompt.size()}};
    if (!anthropic) out = {{"object", "response.input_tokens"}, {"input_tokens", r.gen.prompt.size()}};
    res.set_content(out.dump(), "application/json");
  }

  // GET / DELETE /v1/responses/{id}: a kept response, or a 404.
  void kept_response(const httplib::Request& req, httplib::Response& res, bool erase) {
    busy(req);
    const std::string id = req.matches[1];
    const ApiError missing(404, "invalid_request_error", "No response with id '" + id + "' found (kept responses are "
                           "in memory only, the oldest forgotten first).", "", "not_found");
    if (erase) {
      if (!responses.erase(id)) return send_error(res, missing, false);
      res.set_content(ojson{{"id", id}, {"object", "response"}, {"deleted", true}}.dump(), "application/json");
      return;
    }
    auto p = responses.get(id);
    if (!p) return send_error(res, missing, false);
    res.set_content(p->response.dump(), "application/json");
  }

  // GET /v1/responses/{id}/input_items: a page of a kept response's input items, or a 404.
  void input_items(const httplib::Request& req, httplib::Response& res) {
    busy(req);
    const std::string id = req.matches[1];
    auto p = responses.get(id);
    if (!p)
      return send_error(res, ApiError(404, "invalid_request_error", "No response with id '" + id + "' found (kept responses are "
                                      "in memory only, the oldest forgotten first).", "", "not_found"), false);
    try {
      res.set_content(list_input_items(*p, req.params).dump(), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e, false);
    }
  }

  void routes() {
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::OpenAiChat); });
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::OpenAiCompletion); });
    svr.Post("/v1/responses", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::OpenAiResponses); });
    svr.Post("/v1/responses/input_tokens",
             [this](const httplib::Request& q, httplib::Response& r) { count_tokens(q, r, Api::OpenAiResponses); });
    svr.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& q, httplib::Response& r) { kept_response(q, r, false); });
    svr.Get(R"(/v1/responses/([^/]+)/input_items)", [this](const httplib::Request& q, httplib::Response& r) { input_items(q, r); });
    svr.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& q, httplib::Response& r) { kept_response(q, r, true); });
    svr.Post("/v1/messages", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, Api::Anthropic); });
    svr.Post("/v1/messages/count_tokens",
             [this](const httplib::Request& q, httplib::Response& r) { count_tokens(q, r, Api::Anthropic); });
    svr.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) {
      busy(q);
      r.set_content(ojson{{"object", "list"}, {"data", ojson::array({model_object()})}}.dump(), "application/json");
    });
    svr.Get(R"(/v1/models/([^/]+))", [this](const httplib::Request& q, httplib::Response& r) {
      busy(q);
      if (q.matches[1] != model_name)
        return send_error(r, ApiError(404, "invalid_request_error", "The model '" + q.matches[1].str() + "' does not exist (this server has '" +
                                                                        model_name + "')", "model", "model_not_found"), false);
      r.set_content(model_object().dump(), "application/json");
    });
    // The root says what is served (Claude Code asks HEAD / before it starts: a 404 there looked
    // like a fault in the log).
    svr.Get("/", [this](const httplib::Request& q, httplib::Response& r) {
      busy(q);
      r.set_content("dsv4 serve: " + model_name +
                        " at /v1 (OpenAI: /v1/chat/completions, /v1/completions, /v1/responses; Anthropic: /v1/messages); "
                        "state at /health, counters at /metrics\n",
                    "text/plain");
    });
    svr.Get("/health", [this](const httplib::Request& q, httplib::Response& r) {
      busy(q);
      if (!ready) {
        r.status = 503;
        r.set_content(R"({"status":"loading"})", "application/json");
        return;
      }
      r.set_content(ojson{{"status", "ok"}, {"queue_depth", sched->queue_depth()}, {"running", sched->running()}}.dump(),
                    "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request& q, httplib::Response& r) {
      busy(q);
      Metrics::Gauges g;
      if (ready) {
        g.queue_depth = sched->queue_depth();
        g.running = sched->running();
        const auto s = sched->stats();
        g.kv_reserved_bytes = s.kv_reserved_bytes;
        g.prefix_cache_bytes = s.cache_bytes;
        g.prefix_cache_entries = s.cache_entries;
        g.paused = s.paused;
        g.disk_cache_bytes = s.disk_bytes;
        g.disk_cache_entries = s.disk_entries;
        g.disk_cache_loads = s.disk_loads;
      }
      g.kept_responses_bytes = static_cast<int64_t>(responses.bytes());
      r.set_content(metrics.render(g), "text/plain; version=0.0.4");
    });
  }

  void setup() {
    svr.set_payload_max_length(static_cast<size_t>(opt.max_body_bytes));
    svr.set_read_timeout(30, 0);
    // A client that takes no byte for this long is dropped (its job cancelled by the failed write).
    svr.set_write_timeout(opt.stall_timeout_s, 0);
    const int threads = opt.http_threads > 0 ? opt.http_threads : opt.scheduler.max_batch + opt.scheduler.max_queue + 8;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
        busy(req);
        send_error(res, ApiError(401, "authentication_error", "a valid API key is required (Authorization: Bearer KEY or x-api-key)"),
                   anthropic_path(req.path));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // Statuses httplib answers by itself (404, 413, 400 for a bad request line...) get a JSON body.
    svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      // httplib caps form-encoded bodies (curl -d without a Content-Type) at 8 KiB by itself.
      const bool form = req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0;
      std::string msg = res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                        : res.status == 413 && form
                            ? std::string("a form-encoded body is limited to 8 KiB: send the JSON with Content-Type: application/json")
                        : res.status == 413 ? "the request body exceeds the server's limit (" + std::to_string(opt.max_body_bytes) + " bytes)"
                                            : "bad request";
      send_error(res, ApiError(res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", msg),
                 anthropic_path(req.path));
    });
    svr.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = std::string("internal error: ") + e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, "server_error", what), anthropic_path(req.path));
    });
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      if (deadline) deadline->leave(peer(req));
      metrics.request_done(endpoint_label(req.path), res.status);
      if (opt.quiet) return;
      std::fprintf(stderr, "%s %s %d %s\n", req.method.c_str(), req.path.c_str(), res.status, req.remote_addr.c_str());
    });
    routes();
  }
};

HttpServer::HttpServer(const EngineOptions& engine, const ServerOptions& o) : impl_(std::make_unique<Impl>(engine, o)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> l(m.mu);
  m.stop_requested = true;
  m.try_stop();  // when not yet running, run() retries
  m.cv.notify_all();
}

void HttpServer::run(const std::function<void(int)>& ready, const std::function<void(int)>& listening) {
  Impl& m = *impl_;
  // A wrong --model or tokenizer is refused before the port opens, in a second (the weights
  // load while /health says "loading"). Text in and out: the tokenizer must be there and fit.
  EngineOptions eo = m.engine_opt;
  eo.require_tokenizer = true;
  eo.checked_tokenizer = check_model_dir(eo);
  m.setup();
  int port = m.opt.port;
  if (port == 0) {
    port = m.svr.bind_to_any_port(m.opt.host);
    if (port < 0) throw Error("cannot bind " + m.opt.host + " to a free port");
  } else if (!m.svr.bind_to_port(m.opt.host, port)) {
    throw Error("cannot listen on " + m.opt.host + ":" + std::to_string(port) + " (in use, or not an address of this machine)");
  }
  // A burst of clients while the accept thread waits for a core (a loaded machine) must queue,
  // not be reset (connections.h).
  if (!widen_listen_backlog(port, SOMAXCONN) && !m.opt.quiet)
    std::fprintf(stderr, "dsv4 serve: warning: could not raise the listen backlog of port %d (cpp-httplib's is 5)\n", port);
  // Headers: cpp-httplib caps each line at 8 KiB; 64 KiB in all is what nginx and Node accept.
  m.deadline = std::make_unique<RequestDeadline>(port, std::chrono::seconds(m.opt.read_timeout_s),
                                                 m.opt.max_body_bytes + (int64_t{64} << 10), m.opt.quiet,
                                                 [&m](RequestDeadline::Close why) { m.metrics.connection_closed(why); });
  // Named before the listener starts: /v1/models answers while the model loads.
  m.model_name = m.opt.model_name.empty() ? std::filesystem::path(m.engine_opt.model_dir).filename().string() : m.opt.model_name;
  if (m.model_name.empty()) m.model_name = "dsv4";
  std::thread listener([&] {
    m.svr.listen_after_bind();
    std::lock_guard<std::mutex> l(m.mu);
    m.listener_done = true;
    m.cv.notify_all();
  });
  try {
    if (listening) listening(port);
    m.engine = std::make_unique<Engine>(eo);
    m.sched = std::make_unique<Scheduler>(*m.engine, m.opt.scheduler, m.metrics);
  } catch (...) {
    m.end_listener(listener);
    m.deadline.reset();
    throw;
  }
  m.ready = true;
  if (ready) ready(port);
  {
    std::unique_lock<std::mutex> l(m.mu);
    m.cv.wait(l, [&] { return m.stop_requested || m.listener_done; });
  }
  m.end_listener(listener);  // fails what is still queued or running
  m.deadline.reset();
  m.ready = false;
  m.sched.reset();
}

}  // namespace dsv4::server
