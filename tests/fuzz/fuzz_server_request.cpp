// Fuzz target: the server's API layer (src/server/request.*, response.*) on untrusted bodies.
// The first byte picks the endpoint (mod 3: /v1/chat/completions, /v1/completions,
// /v1/messages) and, above that, which synthetic answer is fed back; the rest is the body.
// parse_request runs with the real tokenizer and no model (ModelFacts). It must either succeed
// or throw ApiError 400 (invalid_request_error): anything else that escapes it (a JSON library
// exception, dsv4::Error, another status) would reach the client as a 500 or kill the server.
// A parsed request must be one the scheduler can run: a prompt of 1 .. context-1 tokens, all
// inside the vocabulary, 1 <= max_tokens with prompt + max_tokens <= context, 1 <= n <= max_n.
// Its answer is then formatted (make_responder) from synthetic events, streamed or not as the
// request asks: every SSE data line and every body must be valid JSON, and nothing may throw.
// The tokenizer.json comes from $DSV4_TOKENIZER or build/deps/tokenizer/tokenizer.json.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/response.h"
#include "server/tool_calls.h"
#include "text/chat.h"
#include "text/completion_stream.h"
#include "text/tokenizer.h"

namespace {

using dsv4::server::Api;
using dsv4::server::ApiError;
using dsv4::server::Event;
using dsv4::server::ParsedRequest;
using ojson = nlohmann::ordered_json;

// The tool-use preamble the chat encoding adds alone is ~300 tokens: a context of 256 would
// refuse every request with tools, and their answers (the forced-call and DSML paths of the
// formatter) would never be reached. 1024 keeps prompts small and still lets "too long" happen.
constexpr int64_t kContext = 1024;
// The model's vocabulary may be padded past the tokenizer's (ids the tokenizer has no text for):
// token-id prompts and sampled ids (logprobs) then include ids without text.
constexpr int64_t kVocabPadding = 64;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_server_request: %s\n", what);
    std::abort();
  }
}

const dsv4::Tokenizer& tokenizer() {
  static const dsv4::Tokenizer tok = [] {
    const char* env = std::getenv("DSV4_TOKENIZER");
    std::string path = env && *env ? env : DSV4_DEFAULT_TOKENIZER;
    if (std::filesystem::is_directory(path)) path += "/tokenizer.json";
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "fuzz_server_request: no tokenizer.json at %s (set DSV4_TOKENIZER)\n", path.c_str());
      std::abort();
    }
    return dsv4::Tokenizer::load(path);
  }();
  return tok;
}

// DSV4_FUZZ_VERBOSE=1: each input's outcome on stderr (to see what a corpus exercises).
bool verbose() {
  static const bool v = std::getenv("DSV4_FUZZ_VERBOSE") != nullptr;
  return v;
}

std::string dsml(const char* tag) { return std::string(tag) + dsv4::kDsmlText; }

// The first tool's name, if the request has tools (a call to an unknown tool is also valid
// model output; the known one drives the common path).
std::string first_tool(const ParsedRequest& r) {
  if (r.tools.is_array() && !r.tools.empty() && r.tools[0].contains("function")) {
    const ojson& n = r.tools[0]["function"]["name"];
    if (n.is_string()) return n.get<std::string>();
  }
  return "get_weather";
}

// What the model "answers", continuing the prompt: after a forced tool-call prefix, the rest of
// that call; otherwise one of a few shapes (plain, reasoning + call, non-ASCII text, a broken call).
std::string answer(const ParsedRequest& r, unsigned variant) {
  const std::string call_body = dsml("<") + "parameter name=\"location\" string=\"true\">Paris" + dsml("</") +
                                "parameter>\n" + dsml("<") + "parameter name=\"days\" string=\"false\">3" + dsml("</") +
                                "parameter>\n" + dsml("</") + "invoke>\n";
  const std::string invoke = dsml("<") + "invoke name=\"" + first_tool(r) + "\">\n";
  if (!r.forced_prefix.empty()) {
    // The prefix ends with the invoke line when a function was named, else with tool_calls.
    const bool named = r.forced_prefix.find("invoke name=") != std::string::npos;
    return (named ? "" : invoke) + call_body + dsml("</") + "tool_calls>";
  }
  const std::string think = r.chat && r.mode == dsv4::ChatMode::Thinking ? "Let me think about it.</think>" : "";
  switch (variant % 4) {
    case 0: return think + "The answer is 42.";
    case 1: return think + "\n\n" + dsml("<") + "tool_calls>\n" + invoke + call_body + dsml("</") + "tool_calls>";
    case 2: return think + "Größe: 東京 🙂 — done";
    default: return think + "text <" + dsml("") + "tool_calls>\n" + dsml("<") + "invoke name=\"";
  }
}

// Splits `s` into pieces of 1-8 bytes (chosen from `seed`) that end on UTF-8 character
// boundaries, as the scheduler sends them.
std::vector<std::string> pieces(const std::string& s, uint32_t seed) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < s.size()) {
    seed = seed * 1664525u + 1013904223u;
    size_t end = std::min(s.size(), at + 1 + (seed >> 29));
    while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
    out.push_back(s.substr(at, end - at));
    at = end;
  }
  return out;
}

// Every "data: " line of an SSE text is JSON (or OpenAI's [DONE]).
void check_sse(const std::string& text) {
  size_t at = 0;
  while ((at = text.find("data: ", at)) != std::string::npos) {
    const size_t end = text.find('\n', at);
    require(end != std::string::npos, "SSE data line without newline");
    const std::string payload = text.substr(at + 6, end - at - 6);
    if (payload != "[DONE]") require(!ojson::parse(payload, nullptr, false).is_discarded(), "SSE data is not JSON");
    at = end;
  }
}

void format_answer(const ParsedRequest& r, unsigned variant, uint32_t seed) {
  dsv4::server::ToolCallStore store;
  dsv4::server::ResponseStore kept;
  auto resp = dsv4::server::make_responder(r, tokenizer(), store, &kept);
  require(resp != nullptr, "no responder");
  std::string sse = r.stream ? resp->start() : "";
  // Sampled ids: the prompt's (in the vocabulary), and every third one the model's last id,
  // which the tokenizer has no text for.
  std::vector<int32_t> ids = r.gen.prompt;
  for (size_t k = 0; k < r.gen.prompt.size(); k += 3)
    ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(k), static_cast<int32_t>(tokenizer().vocab_size() + kVocabPadding - 1));
  size_t next_id = 0;
  dsv4::server::Usage usage;
  usage.prompt_tokens = static_cast<int64_t>(ids.size());
  const int choices = r.api == Api::Anthropic ? 1 : r.gen.n;
  for (int c = 0; c < choices; ++c) {
    for (const std::string& p : pieces(answer(r, variant + static_cast<unsigned>(c)), seed + static_cast<uint32_t>(c))) {
      Event e = Event::of(Event::Text, c);
      e.text = p;
      if (r.gen.top_logprobs >= 0) {
        // One token per piece, with as many alternatives as asked; ids taken from the prompt.
        e.ids.push_back(ids[next_id++ % ids.size()]);
        e.logprobs.push_back(-0.5f);
        e.top.emplace_back();
        for (int k = 0; k < r.gen.top_logprobs; ++k)
          e.top.back().push_back({ids[next_id++ % ids.size()], -1.0f - static_cast<float>(k)});
      }
      ++usage.completion_tokens;
      const std::string out = resp->event(e);
      if (r.stream) sse += out;
    }
    Event fin = Event::of(Event::Finish, c);
    const char* reasons[] = {"eos", "length", "stop_token", "stop_string"};
    fin.finish_reason = reasons[(variant + static_cast<unsigned>(c)) % 4];
    if (fin.finish_reason == "stop_string") fin.stop_string = r.gen.stop.empty() ? "END" : r.gen.stop[0];
    const std::string out = resp->event(fin);
    if (r.stream) sse += out;
  }
  std::string id;
  if (r.stream) {
    sse += resp->end(usage);
    check_sse(sse);
  } else {
    const ojson body = ojson::parse(resp->body(usage), nullptr, false);
    require(body.is_object(), "the answer body is not a JSON object");
    if (r.api == Api::OpenAiResponses) id = body.value("id", "");
  }
  // A kept response holds the conversation and the answer, for previous_response_id.
  if (!id.empty() && r.store_response) {
    auto k = kept.get(id);
    require(k && k->conversation.is_array() && k->conversation.back().value("role", "") == "assistant", "response not kept");
  }
}

// The DSML of a call to get_weather(location: "Paris") as the model would have sampled it (what
// the server stores under the call's id): taken from the streaming parser, as the server does.
const std::string& known_call_dsml() {
  static const std::string d = [] {
    dsv4::CompletionStream s(dsv4::ChatMode::Chat);
    s.feed("\n\n" + dsml("<") + "tool_calls>\n" + dsml("<") + "invoke name=\"get_weather\">\n" + dsml("<") +
           "parameter name=\"location\" string=\"true\">Paris" + dsml("</") + "parameter>\n" + dsml("</") +
           "invoke>\n" + dsml("</") + "tool_calls>");
    s.finish();
    const auto& calls = s.result().tool_call_dsml;
    require(calls.size() == 1 && !calls[0].empty(), "the known call did not parse");
    return calls[0];
  }();
  return d;
}

void check_parsed(const ParsedRequest& r, Api api, const dsv4::server::RequestLimits& lim) {
  const dsv4::Tokenizer& tok = tokenizer();
  const auto n = static_cast<int64_t>(r.gen.prompt.size());
  require(r.api == api, "api changed");
  require(n > 0, "empty prompt accepted");
  require(n < kContext, "prompt fills the context");
  require(r.gen.max_tokens >= 1 && n + r.gen.max_tokens <= kContext, "max_tokens out of the context");
  require(r.gen.n >= 1 && r.gen.n <= lim.max_n, "n out of range");
  for (int32_t id : r.gen.prompt) require(id >= 0 && id < tok.vocab_size() + kVocabPadding, "prompt token outside the vocabulary");
  require(r.gen.top_logprobs >= -1 && r.gen.top_logprobs <= 20, "top_logprobs out of range");
  require(r.logprobs == (r.gen.top_logprobs >= 0), "logprobs and top_logprobs disagree");
  require(r.gen.stop.size() <= 16, "more than 16 stop strings");
  for (const auto& s : r.gen.stop) require(!s.empty(), "empty stop string");
  const auto& s = r.gen.sampling;
  require(s.temperature >= 0 && s.temperature <= 2 && s.top_p > 0 && s.top_p <= 1, "sampling out of range");
  require(r.chat == (api != Api::OpenAiCompletion), "chat flag");
  // A forced tool call is only made in chat mode, and only with tools to call.
  if (!r.forced_prefix.empty()) require(r.mode == dsv4::ChatMode::Chat && !r.tools.empty(), "forced call without tools");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the endpoint: 0xC0 and up /v1/responses (its low bits the answer's
  // variant), below that the other three in turn (as the corpus was written before it).
  const Api apis[] = {Api::OpenAiChat, Api::OpenAiCompletion, Api::Anthropic};
  const bool responses = data[0] >= 0xC0;
  const Api api = responses ? Api::OpenAiResponses : apis[data[0] % 3];
  const unsigned variant = responses ? data[0] & 0x3Fu : data[0] / 3u;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const dsv4::Tokenizer& tok = tokenizer();
  const dsv4::server::ModelFacts facts{tok, kContext, tok.vocab_size() + kVocabPadding};
  dsv4::server::RequestLimits lim;
  lim.max_n = 4;
  lim.default_max_tokens = 64;
  // A call id the server answered earlier: messages that send it back render with its DSML.
  dsv4::server::ToolCallStore store;
  store.put("call_known", known_call_dsml());
  // A response kept earlier: previous_response_id "resp_known" continues its conversation.
  dsv4::server::ResponseStore kept;
  kept.put("resp_known", {ojson::object(), ojson::parse(R"([{"role":"user","content":"Hi"},
    {"role":"assistant","content":"","reasoning_content":"greet","tool_calls":[{"id":"call_known","type":"function",
    "function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]}])"), ojson::array()});
  ParsedRequest r;
  try {
    r = dsv4::server::parse_request(api, body, facts, lim, &store, &kept);
  } catch (const ApiError& e) {
    if (verbose()) std::fprintf(stderr, "%d %s\n", e.status, e.what());
    // 404: a previous_response_id that is not kept.
    require((e.status == 400 || (e.status == 404 && api == Api::OpenAiResponses)) && e.type == "invalid_request_error",
            "an ApiError other than 400");
    // The error bodies echo parts of the input: they must still be JSON.
    require(!ojson::parse(dsv4::server::error_body(e), nullptr, false).is_discarded(), "error body is not JSON");
    require(!ojson::parse(dsv4::server::anthropic_error_body(e), nullptr, false).is_discarded(), "error body is not JSON");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_server_request: parse_request threw a non-ApiError: %s\n", e.what());
    std::abort();
  } catch (...) {
    require(false, "parse_request threw a non-exception");
  }
  check_parsed(r, api, lim);
  if (verbose())
    std::fprintf(stderr, "ok: %zu prompt tokens, max_tokens %lld, n %d, stream %d, forced %d\n", r.gen.prompt.size(),
                 static_cast<long long>(r.gen.max_tokens), r.gen.n, r.stream, !r.forced_prefix.empty());
  try {
    format_answer(r, variant, static_cast<uint32_t>(size) * 2654435761u);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_server_request: formatting the answer threw: %s\n", e.what());
    std::abort();
  }
  return 0;
}
