// Fuzz target: the chat encoding both ways. The input is tried as a messages JSON (a list, or a
// request body with "messages" and "tools") rendered in both modes, and as a completion parsed
// back in both modes (reasoning, content, DSML tool calls). Only dsv4::Error may come out: a
// server turns it into a 400; anything else (a JSON type error from a field of the wrong type)
// would be a 500 or worse.
// The completion also goes through CompletionStream (the server's streaming parser), with and
// without a tools list: fed whole, byte by byte (short inputs) and in pieces chosen from the
// input, it must give the same joined events and result each time, never throw, have deltas that
// join to its result, arguments that are JSON objects (valid UTF-8 input) and, when
// parse_completion accepts the text, exactly parse_completion's result.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat.h"
#include "text/completion_stream.h"
#include "text/unicode.h"

namespace {

using dsv4::CompletionEvent;

void require(bool ok) {
  if (!ok) std::abort();
}

struct Fed {
  std::vector<CompletionEvent> events;  // consecutive deltas of one kind joined
  dsv4::StreamedCompletion result;
};

// Feeds `s` in pieces ending at `cuts` (increasing), then finishes.
Fed feed(const std::string& s, const std::vector<size_t>& cuts, dsv4::ChatMode mode, const nlohmann::ordered_json& tools) {
  dsv4::CompletionStream stream(mode, tools);
  Fed f;
  const auto take = [&](std::vector<CompletionEvent> evs) {
    for (auto& e : evs) {
      const bool delta = e.kind == CompletionEvent::Kind::Reasoning || e.kind == CompletionEvent::Kind::Content ||
                         e.kind == CompletionEvent::Kind::ToolCallArguments;
      if (delta && !f.events.empty() && f.events.back().kind == e.kind && f.events.back().index == e.index)
        f.events.back().text += e.text;
      else
        f.events.push_back(std::move(e));
    }
  };
  size_t at = 0;
  for (size_t c : cuts) {
    take(stream.feed(std::string_view(s).substr(at, c - at)));
    at = c;
  }
  take(stream.feed(std::string_view(s).substr(at)));
  take(stream.finish());
  f.result = stream.result();
  return f;
}

void check_stream(const std::string& s, dsv4::ChatMode mode, const nlohmann::ordered_json& tools) {
  const Fed whole = feed(s, {}, mode, tools);
  // The deltas join to the result; calls begin, get arguments and end in order.
  std::string reasoning, content;
  std::vector<std::string> args;
  for (const auto& e : whole.events) {
    switch (e.kind) {
      case CompletionEvent::Kind::Reasoning: reasoning += e.text; break;
      case CompletionEvent::Kind::Content: content += e.text; break;
      case CompletionEvent::Kind::ToolCallBegin:
        require(e.index == static_cast<int>(args.size()) && !e.text.empty());
        args.emplace_back();
        break;
      case CompletionEvent::Kind::ToolCallArguments:
        require(e.index + 1 == static_cast<int>(args.size()));
        args.back() += e.text;
        break;
      case CompletionEvent::Kind::ToolCallEnd: require(e.index + 1 == static_cast<int>(args.size())); break;
    }
  }
  const dsv4::ParsedCompletion& p = whole.result.parsed;
  require(reasoning == p.reasoning_content && content == p.content && args.size() == p.tool_calls.size());
  const bool utf8 = dsv4::unicode::is_valid_utf8(s);
  for (size_t k = 0; k < args.size(); ++k) {
    require(p.tool_calls[k]["function"]["arguments"] == args[k]);
    if (utf8) require(nlohmann::ordered_json::parse(args[k], nullptr, false).is_object());
  }
  if (whole.result.well_formed) {
    const dsv4::ParsedCompletion ref = dsv4::parse_completion(s, mode, dsv4::ToolSchemas(tools));
    require(ref.reasoning_content == p.reasoning_content && ref.content == p.content && ref.tool_calls == p.tool_calls);
  }
  // Other splits: byte by byte, and pieces of 1-16 bytes chosen by a generator seeded from the input.
  std::vector<size_t> bytes, pieces;
  if (s.size() <= 256)  // byte by byte on short inputs only: it dominates the time otherwise
    for (size_t c = 1; c < s.size(); ++c) bytes.push_back(c);
  uint32_t x = 2166136261u;
  for (unsigned char c : s) x = (x ^ c) * 16777619u;
  for (size_t c = 0;;) {
    x = x * 1664525u + 1013904223u;
    c += 1 + (x >> 28);
    if (c >= s.size()) break;
    pieces.push_back(c);
  }
  for (const auto* cuts : {&bytes, &pieces}) {
    const Fed f = feed(s, *cuts, mode, tools);
    require(f.events == whole.events);
    require(f.result.parsed.reasoning_content == p.reasoning_content && f.result.parsed.content == p.content &&
            f.result.parsed.tool_calls == p.tool_calls && f.result.tool_call_dsml == whole.result.tool_call_dsml &&
            f.result.well_formed == whole.result.well_formed && f.result.ended == whole.result.ended);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  for (dsv4::ChatMode mode : {dsv4::ChatMode::Thinking, dsv4::ChatMode::Chat}) {
    try {
      (void)dsv4::parse_completion(s, mode);
    } catch (const dsv4::Error&) {
    }
    check_stream(s, mode, nullptr);
    // Tools with schemas of each kind the typing reads (tool_schema.h), and one without.
    static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
      {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
        "location":{"type":"string"},"days":{"type":"integer"},"scale":{"type":"number"},
        "units":{"enum":["c","f"]},"opts":{"type":["object","null"]},"flag":{"anyOf":[{"type":"boolean"},{"type":"string"}]},
        "tags":{"type":"array"}}}}},
      {"name":"a"}])");
    check_stream(s, mode, tools);
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    dsv4::ChatOptions o;
    o.mode = mode;
    try {
      (void)dsv4::render_chat(j, o);
    } catch (const dsv4::Error&) {
    }
  }
  return 0;
}
