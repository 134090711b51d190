#pragma once
// A job's events turned into the answer of its endpoint: OpenAI chat completions, OpenAI
// completions or Anthropic messages, streamed (Server-Sent Events) or as one JSON body. Each
// choice's text goes through a CompletionStream (text/completion_stream.h), which splits
// reasoning, content and tool calls without ever letting markup into a delta.
#include <memory>
#include <string>

#include "server/request.h"
#include "server/scheduler.h"
#include "server/tool_calls.h"

namespace dsv4::server {

class Responder {
 public:
  virtual ~Responder() = default;
  // Streaming: the SSE text to send first, for each event, and at the end (Done).
  virtual std::string start() = 0;
  virtual std::string event(const Event& e) = 0;
  virtual std::string end(const Usage& u) = 0;
  // Non-streaming: the body once Done arrived (the events were given to event() as they came).
  virtual std::string body(const Usage& u) = 0;
  // Streaming: the SSE text that ends a stream which failed after it began, and the keep-alive
  // sent while nothing else is (OpenAI's error body and an SSE comment unless overridden).
  virtual std::string failed(const ApiError& e);
  virtual std::string keep_alive();
};

// `responses`: where a Responses API answer is kept when its request asks (store).
std::unique_ptr<Responder> make_responder(const ParsedRequest& r, const Tokenizer& tok, ToolCallStore& store,
                                          ResponseStore* responses = nullptr);

// "data: <json>\n\n" (and Anthropic's "event: <name>\n" line).
std::string sse(const std::string& json);
std::string sse_event(const std::string& name, const std::string& json);
// OpenAI's log-probability entries of a Text event's tokens: {token, logprob, bytes, top_logprobs}.
nlohmann::ordered_json token_logprobs(const Event& e, const Tokenizer& tok);
// Seconds since the epoch (the answers' "created").
int64_t now_s();

}  // namespace dsv4::server
