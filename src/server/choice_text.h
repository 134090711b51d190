#pragma once
// One choice's text split into reasoning, content and tool calls as the scheduler's Text events
// arrive (text/completion_stream.h), recording what the events say for a non-streamed body and
// giving each call an id. Shared by the answer formats (response.cpp, responses_api.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/tool_calls.h"
#include "text/completion_stream.h"

namespace dsv4::server {

// One choice's text split into reasoning, content and tool calls, as events arrive.
struct ChoiceText {
  ChoiceText(const ParsedRequest& r, const std::string& id_prefix)
      : stream(r.mode, r.tools.empty() ? nlohmann::ordered_json(nullptr) : r.tools), id_prefix(id_prefix),
        max_calls(r.single_tool_call ? 1 : -1) {
    // A forced tool call: the prompt ended with the opening markup, which the answer continues.
    if (!r.forced_prefix.empty()) held = stream.feed(r.forced_prefix);
  }
  std::vector<CompletionEvent> feed(const std::string& text) { return take(stream.feed(text)); }
  // Counts the reasoning tokens among a Text event's ids: in thinking mode, those up to and
  // including `think_end` ("</think>"; all of an answer without one).
  void count(const std::vector<int32_t>& ids, int32_t think_end, bool thinking) {
    for (int32_t id : ids) {
      if (thinking && !thought) ++reasoning_tokens;
      thought |= id == think_end;
    }
  }
  std::vector<CompletionEvent> finish() { return take(stream.finish()); }

  // Records what the events say (for the non-streamed body) and gives call ids.
  std::vector<CompletionEvent> take(std::vector<CompletionEvent> ev) {
    if (!held.empty()) ev.insert(ev.begin(), held.begin(), held.end()), held.clear();
    if (max_calls >= 0)
      std::erase_if(ev, [&](const CompletionEvent& e) { return e.index >= max_calls; });  // only tool-call events have one
    for (const auto& e : ev) {
      if (e.kind == CompletionEvent::Kind::Reasoning) reasoning += e.text;
      if (e.kind == CompletionEvent::Kind::Content) content += e.text;
      if (e.kind == CompletionEvent::Kind::ToolCallBegin) calls.push_back({ToolCallStore::new_id(id_prefix), e.text, ""});
      if (e.kind == CompletionEvent::Kind::ToolCallArguments) calls[static_cast<size_t>(e.index)].args += e.text;
    }
    return ev;
  }
  // Remembers the sampled DSML of each call (after finish()).
  void store(ToolCallStore& s) const {
    const auto& dsml = stream.result().tool_call_dsml;
    for (size_t k = 0; k < calls.size() && k < dsml.size(); ++k)
      if (!dsml[k].empty()) s.put(calls[k].id, dsml[k]);
  }

  struct Call {
    std::string id, name, args;
  };
  CompletionStream stream;
  std::string id_prefix;
  int max_calls;  // -1: any number
  std::vector<CompletionEvent> held;
  std::string reasoning, content;
  int64_t reasoning_tokens = 0;
  bool thought = false;  // "</think>" was among the ids
  std::vector<Call> calls;
  std::string finish_reason;
  nlohmann::ordered_json logprobs = nlohmann::ordered_json::array();
};

}  // namespace dsv4::server
