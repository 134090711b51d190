#pragma once
// DeepSeek-V4 chat encoding: OpenAI-style messages -> the exact prompt text the official
// `encoding/encoding_dsv4.py` of the DeepSeek-V4 release renders, and a model completion -> its
// reasoning, content and tool calls (the DSML tool-call format).
//
// Messages are a JSON array of objects. Roles: system, developer, user, assistant, tool,
// latest_reminder. Fields read (as the official encoder does):
//   system / developer: content, tools (OpenAI {"type":"function","function":{...}} list),
//                       response_format; developer needs a non-empty content.
//   user:               content (string); tool messages merge into user turns.
//   tool:               content (string, or a list of {"type":"text","text":...} blocks),
//                       tool_call_id (tool results are reordered to the order of the calls).
//   assistant:          reasoning_content, content, tool_calls (OpenAI format, "arguments" a JSON
//                       string), wo_eos (no end-of-sentence after the turn: a prefill).
//                       A tool call may carry "dsml": the exact text the model wrote for it, from
//                       "<｜DSML｜invoke" through "</｜DSML｜invoke>" (CompletionStream's
//                       tool_call_dsml, completion_stream.h); it is written instead of the call
//                       rendered from its name and arguments, so a conversation re-renders byte
//                       for byte as sampled. It must be one well-formed invoke with the call's name
//                       and arguments (compared as JSON values), else dsv4::Error.
//   latest_reminder:    content.
//   any:                task, one of action|query|authority|domain|title|read_url (the
//                       "quick instruction" classification tasks).
//
// Key order matters: tool schemas and response_format are written as Python's json.dumps writes
// them, keys in input order. nlohmann::ordered_json keeps that order; the nlohmann::json overload
// exists for convenience but that type sorts keys, so its tool schemas come out sorted.
//
// Where the official encoder crashes or writes Python's "None" (null content of a tool or
// latest_reminder message, arguments that decode to a non-object, unknown roles or tasks anywhere)
// we throw dsv4::Error instead. One deliberate difference: "arguments" given as a JSON object (not
// a string) are taken as the arguments; the official encoder would wrap them in one parameter
// named "arguments". parse_completion also accepts a text without the end-of-sentence, quotes a
// string="false" parameter value that is not JSON as a JSON string (the official decoder writes
// it as it is: invalid arguments JSON) and rejects an empty tool name. A system message after a
// user or developer turn (only system messages between) ends with the assistant opener the user
// turn would have had: the official encoder writes none there, leaving a prompt that does not
// open the assistant's turn.
#include <string>

#include <nlohmann/json.hpp>

#include "text/tool_schema.h"

namespace dsv4 {

// Special-token texts of the DeepSeek-V4 tokenizer (U+FF5C fullwidth bars, U+2581 blocks).
inline constexpr const char* kBosText = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kEosText = "<｜end▁of▁sentence｜>";
inline constexpr const char* kUserText = "<｜User｜>";
inline constexpr const char* kAssistantText = "<｜Assistant｜>";
inline constexpr const char* kLatestReminderText = "<｜latest_reminder｜>";
inline constexpr const char* kThinkStartText = "<think>";
inline constexpr const char* kThinkEndText = "</think>";
inline constexpr const char* kDsmlText = "｜DSML｜";
// How the model opens a tool-call block ("\n\n<" + kDsmlText + "tool_calls").
inline constexpr const char* kToolCallsOpenText = "\n\n<｜DSML｜tool_calls";
// Fill-in-the-middle tokens (added tokens of the V4 tokenizer, ids 128800-128802).
inline constexpr const char* kFimBeginText = "<｜fim▁begin｜>";
inline constexpr const char* kFimHoleText = "<｜fim▁hole｜>";
inline constexpr const char* kFimEndText = "<｜fim▁end｜>";

// A fill-in-the-middle prompt in the prefix-suffix-middle order DeepSeek's models are trained
// on (the V3 technical report: <fim_begin> prefix <fim_hole> suffix <fim_end>, the middle then
// written up to the end-of-sentence token), after the begin-of-sentence token a document starts
// with. DeepSeek's API offers it as /completions with `suffix`.
inline std::string render_fim(const std::string& prefix, const std::string& suffix) {
  return std::string(kBosText) + kFimBeginText + prefix + kFimHoleText + suffix + kFimEndText;
}

enum class ChatMode { Thinking, Chat };

struct ChatOptions {
  ChatMode mode = ChatMode::Thinking;
  // "" (default), "high" or "max": the values the official encoder accepts. Only "max" changes
  // the prompt (a fixed instruction before the first message), and only in thinking mode.
  std::string reasoning_effort;
  // After a final user/developer message: "<｜Assistant｜>" + "<think>" (thinking) or "</think>"
  // (chat), or the task token(s) of a message with a task. false leaves that suffix out.
  bool add_generation_prompt = true;
  // Thinking mode: drop the reasoning of assistant turns before the last user/developer turn
  // (and developer turns before it). Ignored (as if false) when any message carries tools.
  bool drop_thinking = true;
  // The begin-of-sentence text once at the start (only when `context` is empty).
  bool add_bos = true;
  // Messages already encoded earlier (a prompt prefix): they take part in the decisions (tool
  // result order, last user turn, dropping) but only `messages` are rendered.
  nlohmann::ordered_json context = nlohmann::ordered_json::array();
};

// The exact prompt text. Throws dsv4::Error for invalid messages (unknown role, bad content,
// bad tool_calls, bad task, ...), naming the message index and the field.
// Whether `e` is a ChatOptions::reasoning_effort the encoder accepts ("", "high", "max").
bool valid_reasoning_effort(const std::string& e);

std::string render_chat(const nlohmann::ordered_json& messages, const ChatOptions& opt = {});
std::string render_chat(const nlohmann::json& messages, const ChatOptions& opt = {});

struct ParsedCompletion {
  std::string reasoning_content, content;
  // OpenAI format: [{"type":"function","function":{"name":..,"arguments":"<JSON string>"}}].
  nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();
};

// The inverse of one assistant turn: `text` is what the model wrote after the prompt (thinking
// mode: after "<think>", so reasoning + "</think>" + answer; chat mode: the answer), possibly
// ending with the end-of-sentence text. Throws dsv4::Error when the text is not in that format
// (thinking mode without "</think>", malformed DSML, special tokens inside the content, text
// after the end of sentence). With `tools`, argument values are typed by their schema
// (tool_schema.h); without, they are as written.
ParsedCompletion parse_completion(const std::string& text, ChatMode mode, const ToolSchemas& tools = {});

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in the object's
// order, floats as Python's repr. Used for tool schemas, response_format and non-string
// tool-call arguments.
std::string to_python_json(const nlohmann::ordered_json& value);

}  // namespace dsv4
