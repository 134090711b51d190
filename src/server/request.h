#pragma once
// Requests of the OpenAI- and Anthropic-compatible endpoints turned into what the scheduler runs:
// the prompt (rendered with the DeepSeek-V4 chat encoding, then tokenized), sampling, stops and
// the shape of the answer. Every field is validated here; a bad one throws ApiError naming it
// (status 400, OpenAI's error body), before anything reaches the engine.
#include <cstdint>
#include <stdexcept>
#include <map>
#include <utility>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/response_store.h"
#include "server/scheduler.h"
#include "server/tool_calls.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace dsv4::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type;   // invalid_request_error | authentication_error | server_error | ...
  std::string param;  // the offending field, when one is
  std::string code;
};

// A 400 naming the field.
[[noreturn]] void bad_request(const std::string& param, const std::string& message);

enum class Api {
  OpenAiChat,        // POST /v1/chat/completions
  OpenAiCompletion,  // POST /v1/completions
  OpenAiResponses,   // POST /v1/responses (responses_api.h)
  Anthropic,         // POST /v1/messages
};

// What the server limits (besides the engine's context and memory budget).
struct RequestLimits {
  int max_n = 16;                 // choices per request
  int64_t default_max_tokens = 4096;
  // Only the prompt's tokens are wanted (/v1/messages/count_tokens, /v1/responses/input_tokens):
  // no max_tokens needed, no check against the context.
  bool count_only = false;
};

struct ParsedRequest {
  Api api = Api::OpenAiChat;
  GenParams gen;
  std::string model;             // echoed back
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  bool logprobs = false;
  bool chat = true;              // false: /v1/completions (raw text, no chat encoding)
  ChatMode mode = ChatMode::Thinking;
  std::string forced_prefix;     // text appended to the prompt that the answer starts with
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI format
  // parallel_tool_calls: false (OpenAI) / disable_parallel_tool_use (Anthropic): the answer ends
  // with the first call (GenParams::end_at_first_call); if that call was cut short by malformed
  // markup, it alone is answered and any after it are dropped.
  bool single_tool_call = false;
  bool echo = false;             // /v1/completions: the prompt as sent in front of the answer
  std::string echo_text;
  std::string prompt_text;
  // /v1/responses: the conversation as chat messages (earlier turns of previous_response_id
  // included, the instructions not), the request's settings the response object repeats, and
  // whether to keep the response (store), the reasoning in encrypted_content too (include).
  nlohmann::ordered_json conversation;
  // ... and the same as the API's items with ids, for GET /v1/responses/{id}/input_items: the
  // previous response's input items and output, then this input's.
  nlohmann::ordered_json input_items;
  nlohmann::ordered_json settings;
  bool store_response = false;
  bool reasoning_in_encrypted_content = false;
  // /v1/responses namespace tools: the model sees each function as "NAMESPACE__NAME"; this maps
  // such a name to its namespace and own name, for the function_call items.
  std::map<std::string, std::pair<std::string, std::string>> tool_namespaces;
  // Anthropic thinking.display "omitted": thinking blocks go out empty, the reasoning in their
  // signature (kReasoningSignature + text), which a client sends back unchanged.
  bool reasoning_in_signature = false;
};

// How a thinking block's signature starts when it carries the reasoning.
inline constexpr const char* kReasoningSignature = "dsv4-reasoning:";

// What parsing needs to know of the model, and nothing more: requests can then be parsed (and
// fuzzed, tests/fuzz/fuzz_server_request.cpp) with a tokenizer alone, no weights loaded.
struct ModelFacts {
  const Tokenizer& tok;
  int64_t context;  // positions a sequence may hold (prompt + answer)
  int64_t vocab;    // the model's vocabulary: token-id prompts must be in [0, vocab)
};

// Parses and validates a request body for `api`. Throws ApiError. Tool calls sent back with an
// id in `store` are rendered with the DSML the model sampled for them; a Responses API
// previous_response_id is looked up in `responses` (none: a 404).
ParsedRequest parse_request(Api api, const std::string& body, const ModelFacts& model, const RequestLimits& lim,
                            const ToolCallStore* store = nullptr, const ResponseStore* responses = nullptr);

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
std::string error_body(const ApiError& e);
// Anthropic's: {"type": "error", "error": {"type", "message"}}.
std::string anthropic_error_body(const ApiError& e);

}  // namespace dsv4::server
