#pragma once
// The incremental form of parse_completion (chat.h), for a server that streams a completion to
// OpenAI / Anthropic clients as the text arrives. The text is fed in arbitrary pieces (a piece may
// end inside a UTF-8 character or inside a tag); the stream answers each piece with the events it
// can decide: reasoning and content deltas, and tool calls (begin, argument fragments, end).
//
// Guarantees:
// - No markup in the deltas: text that could still be the start of "</think>", of a tool-call
//   block ("\n\n<｜DSML｜tool_calls") or of the end-of-sentence text is held back until it
//   completes (markup, not emitted) or cannot (plain text, emitted). Deltas never split a UTF-8
//   character (invalid bytes pass through as they are).
// - The events depend only on the text, not on how it was split: feeding it in one piece or byte
//   by byte gives the same events once consecutive deltas of the same kind are joined.
// - The concatenated deltas are the final result: reasoning deltas join to
//   result().parsed.reasoning_content, content deltas to .content, a call's argument fragments to
//   its "arguments" (a JSON object text, also for a call cut short). When parse_completion accepts
//   the text (result().well_formed), result().parsed is exactly what it returns given the same
//   tools.
//
// Tool calls. A call begins (ToolCallBegin with its name) once its invoke tag is complete and well
// formed, i.e. once the tag after it ("<｜DSML｜parameter" or "</｜DSML｜invoke") has arrived, and
// its name is in the tools list (when one is given) and not empty. Arguments: "{" at the begin;
// a string="true" parameter as `"name": "` then its value JSON-escaped as it arrives, then `"`;
// a string="false" parameter whole once its closing tag arrives, the value as written when it
// parses as JSON, else as a JSON string; "}" at "</｜DSML｜invoke>" (ToolCallEnd). With a tools
// list, values are typed by the parameter's schema (tool_schema.h): a string="true" value whose
// schema does not allow a string is held whole like a string="false" one.
//
// Malformed markup is never an error (a server has already sent part of the answer). The rule:
// - a block that fails before its first call began is plain text: its "\n\n<｜DSML｜tool_calls"
//   goes out as text of the phase it appeared in (reasoning or content), and everything after it
//   is parsed again from there as that phase (so a later well-formed block is still found);
// - a failure after a call began closes the open call with what it has (an open string value and
//   the object are closed, so its arguments stay valid JSON) and the rest of the text, from the
//   first unit that did not fit (a tag, a parameter), is parsed again as content;
// - after the end-of-sentence text nothing more is read (inside a string value it is value text
//   when more text follows, as parse_completion reads it; at the end of the text it ends it).
// A text that ends right after an invoke tag, a parameter or "</｜DSML｜invoke" is taken as
// parse_completion takes it: the call closes with its arguments (its dsml stays empty).
// Unknown tool names (with a tools list), empty names, unknown string="..." flags, duplicate
// parameters and bad separators all count as malformed. In thinking mode a tool-call block before
// "</think>" ends the reasoning (parse_completion rejects such a text; models that skip
// "</think>" still get their call). A thinking-mode text without "</think>" is all reasoning.
//
// Re-rendering: result().tool_call_dsml[k] is the exact text the model wrote for call k, from
// "<｜DSML｜invoke" through "</｜DSML｜invoke>". A server that stores it as the "dsml" field of
// the assistant message's tool call gets the sampled text back from render_chat byte for byte
// (chat.h). It is empty for a call cut short (the renderer then writes the call from its name and
// arguments).
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/chat.h"

namespace dsv4 {

struct CompletionEvent {
  enum class Kind {
    Reasoning,          // text: a reasoning delta
    Content,            // text: a content delta
    ToolCallBegin,      // index, text: the tool's name
    ToolCallArguments,  // index, text: the next fragment of the arguments JSON text
    ToolCallEnd,        // index
  };
  Kind kind = Kind::Content;
  int index = -1;  // tool-call events: 0, 1, ... over the whole completion
  std::string text;

  bool operator==(const CompletionEvent&) const = default;
};

struct StreamedCompletion {
  ParsedCompletion parsed;                  // tool_calls in OpenAI format, as parse_completion
  std::vector<std::string> tool_call_dsml;  // per call: its exact DSML text, "" if cut short
  // parse_completion accepts the text and no call was refused (unknown or empty name): then
  // `parsed` equals what parse_completion returns.
  bool well_formed = false;
  bool ended = false;  // the end-of-sentence text was seen
};

class CompletionStream {
 public:
  // `mode`: thinking (the text starts with reasoning) or chat. `tools`: null (any tool name is
  // taken, values as written) or the request's tools, a list of
  // {"type":"function","function":{"name":..,"parameters":..}} (or {"name":..}) objects; then a
  // call to a name not in it is malformed markup and values are typed by the schemas. Throws
  // dsv4::Error for a tools value of another shape.
  explicit CompletionStream(ChatMode mode, const nlohmann::ordered_json& tools = nullptr);

  // Appends a piece of the completion; returns the events it decides (consecutive deltas of one
  // kind joined). Throws dsv4::Error after finish().
  std::vector<CompletionEvent> feed(std::string_view text);

  // The end of the completion: everything held back is decided (a partial tag is plain text, an
  // open call is closed). Returns the last events; then result() is available. Throws
  // dsv4::Error when called twice.
  std::vector<CompletionEvent> finish();

  bool finished() const { return finished_; }
  // Whether call k has ended whole, at its "</｜DSML｜invoke>" (its exact text kept), rather than
  // not yet or cut short by malformed markup. Usable while feeding.
  bool call_whole(int k) const {
    return k >= 0 && static_cast<size_t>(k) < result_.tool_call_dsml.size() && !result_.tool_call_dsml[k].empty();
  }
  // The final parse. Throws dsv4::Error before finish().
  const StreamedCompletion& result() const;

 private:
  enum class State {
    Reasoning,     // before "</think>" (thinking mode)
    Content,       // the answer
    BlockOpen,     // after "\n\n<｜DSML｜tool_calls": ">\n" and a tag
    InvokeHeader,  // at "<｜DSML｜invoke": ` name="NAME">\n` up to the next tag
    CallBody,      // at "<｜DSML｜parameter" or "</｜DSML｜invoke"
    ParamHeader,   // at "<｜DSML｜parameter": ` name="P" string="true|false">`
    StringValue,   // inside a string="true" value (streamed)
    TypedValue,    // at "<｜DSML｜parameter" of a held value (string="false", or typed by schema)
    AfterParam,    // after "</｜DSML｜parameter": ">\n" and a tag
    AfterInvoke,   // after "</｜DSML｜invoke>": "\n" and a tag
    Ended,         // after the end-of-sentence text
  };

  // One step on buf_: consumes and emits what it can decide; false when it must wait for more
  // text (never when finishing_).
  bool step();
  bool step_text(bool reasoning);
  bool step_block();
  void emit(CompletionEvent::Kind kind, std::string_view text, int index = -1);
  void emit_text(bool reasoning, std::string_view text);
  void emit_string_value(size_t n);  // n bytes of buf_ (a string value) as escaped JSON
  void begin_call(const std::string& name, size_t header_end);
  void end_call(bool complete);
  void malformed();

  ChatMode mode_;
  bool check_names_ = false;  // a tools list was given: calls to other names are malformed
  ToolSchemas tools_;

  State state_;
  bool finishing_ = false, finished_ = false;
  std::string text_;  // everything fed (for well_formed)
  std::string buf_;   // fed and not yet decided
  size_t scan_from_ = 0;  // held states: positions of buf_ before this hold no tag (nor its start)
  size_t header_ws_ = 0;  // InvokeHeader: the whitespace before `name="` ends here (or later)
  std::vector<CompletionEvent> out_;
  StreamedCompletion result_;
  bool refused_ = false;  // a call refused for its name

  // The current tool-call block.
  bool block_in_reasoning_ = false;  // it began in the reasoning: malformed text goes back there
  int calls_in_block_ = 0;
  std::string block_pending_;  // block text read but not part of a call (separators)
  // The current call.
  bool call_open_ = false;
  std::string call_raw_;  // its text so far
  std::vector<std::string> param_names_;
  std::string call_name_;
  size_t typed_value_at_ = 0;  // TypedValue: where the value starts in buf_
  bool held_is_string_ = false;  // TypedValue: the parameter's string="true" flag
  std::string param_name_;
};

}  // namespace dsv4
