#include "text/completion_stream.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <optional>

#include "core/error.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;

namespace {

const std::string kDsml = kDsmlText;
const std::string kThinkEnd = kThinkEndText, kEos = kEosText;
const std::string kBlockStart = kToolCallsOpenText;
const std::string kCallsEnd = "</" + kDsml + "tool_calls>";
const std::string kInvoke = "<" + kDsml + "invoke", kInvokeEnd = "</" + kDsml + "invoke";
const std::string kParam = "<" + kDsml + "parameter", kParamEnd = "/" + kDsml + "parameter";
// A parameter value ends at "<" or "<\n" before "/｜DSML｜parameter" (parse_completion's rule).
const std::string kValueEnd = "<" + kParamEnd, kValueEndNl = "<\n" + kParamEnd;
const std::string kStringTrue = "\" string=\"true\">", kStringFalse = "\" string=\"false\">";
const std::string kNameOpen = "name=\"", kParamNameOpen = " name=\"";

constexpr int kPartial = -1, kNone = -2;

struct Found {
  size_t pos;
  int which;  // index of the stop that matches at pos, kPartial (the text ends inside one), kNone
};

// The first position from `from` where one of `stops` occurs or the text ends inside one (a
// stop's start). Earlier positions can hold neither, whatever text follows: the streaming scan
// can resume there. At one position the first stop in list order decides, as read_until does.
Found find_stop(std::string_view s, size_t from, std::initializer_list<std::string_view> stops) {
  for (size_t i = from; i < s.size(); ++i) {
    for (size_t k = 0; k < stops.size(); ++k) {
      const std::string_view stop = stops.begin()[k];
      const size_t n = std::min(stop.size(), s.size() - i);
      if (s.compare(i, n, stop.substr(0, n)) != 0) continue;
      return {i, n == stop.size() ? static_cast<int>(k) : kPartial};
    }
  }
  return {s.size(), kNone};
}

// The index of the alternative `s` starts with, kPartial when `s` is still the start of one,
// kNone when it can be none of them.
int match_literal(std::string_view s, std::initializer_list<std::string_view> alts) {
  bool partial = false;
  for (size_t k = 0; k < alts.size(); ++k) {
    const std::string_view a = alts.begin()[k];
    if (s.starts_with(a)) return static_cast<int>(k);
    if (a.starts_with(s)) partial = true;
  }
  return partial ? kPartial : kNone;
}

// The length of s[0, n) without an incomplete UTF-8 sequence at its end (one that more bytes
// could complete), so a delta never splits a character.
size_t utf8_complete(std::string_view s, size_t n) {
  size_t j = n;
  int cont = 0;
  while (j > 0 && cont < 4 && (static_cast<unsigned char>(s[j - 1]) & 0xC0) == 0x80) {
    --j;
    ++cont;
  }
  if (j == 0) return n;
  const unsigned char c = static_cast<unsigned char>(s[j - 1]);
  const size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
  return n - (j - 1) < need ? j - 1 : n;
}

// The tool name of an invoke header (the text between "<｜DSML｜invoke" and the next tag), as
// parse_completion reads it: whitespace, `name="`, the name, `">\n` or `">\n\n`.
std::optional<std::string> invoke_name(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (s.compare(i, kNameOpen.size(), kNameOpen) != 0) return std::nullopt;
  const std::string_view rest = s.substr(i + kNameOpen.size());
  if (rest.ends_with("\">\n\n")) return std::string(rest.substr(0, rest.size() - 4));
  if (rest.ends_with("\">\n")) return std::string(rest.substr(0, rest.size() - 3));
  return std::nullopt;
}

// A string as the inside of a JSON string (Python's escaping, as parse_completion writes it).
std::string json_string_body(std::string_view s) {
  const std::string q = to_python_json(std::string(s));
  return q.substr(1, q.size() - 2);
}

}  // namespace

CompletionStream::CompletionStream(ChatMode mode, const ojson& tools)
    : mode_(mode), check_names_(!tools.is_null()), tools_(tools),
      state_(mode == ChatMode::Thinking ? State::Reasoning : State::Content) {}

std::vector<CompletionEvent> CompletionStream::feed(std::string_view text) {
  if (finished_) throw Error("completion stream: text fed after finish()");
  text_.append(text);
  if (state_ != State::Ended) buf_.append(text);
  while (step()) {
  }
  return std::exchange(out_, {});
}

std::vector<CompletionEvent> CompletionStream::finish() {
  if (finished_) throw Error("completion stream: finish() called twice");
  finishing_ = true;
  while (step()) {
  }
  finished_ = true;
  result_.ended = state_ == State::Ended;
  try {
    (void)parse_completion(text_, mode_, tools_);
    result_.well_formed = !refused_;
  } catch (const Error&) {
    result_.well_formed = false;
  }
  return std::exchange(out_, {});
}

const StreamedCompletion& CompletionStream::result() const {
  if (!finished_) throw Error("completion stream: result() before finish()");
  return result_;
}

void CompletionStream::emit(CompletionEvent::Kind kind, std::string_view text, int index) {
  using K = CompletionEvent::Kind;
  const bool delta = kind == K::Reasoning || kind == K::Content || kind == K::ToolCallArguments;
  if (delta && text.empty()) return;
  if (kind == K::Reasoning) result_.parsed.reasoning_content.append(text);
  if (kind == K::Content) result_.parsed.content.append(text);
  if (kind == K::ToolCallArguments)
    result_.parsed.tool_calls[static_cast<size_t>(index)]["function"]["arguments"].get_ref<std::string&>().append(text);
  if (delta && !out_.empty() && out_.back().kind == kind && out_.back().index == index) {
    out_.back().text.append(text);
    return;
  }
  out_.push_back(CompletionEvent{kind, index, std::string(text)});
}

void CompletionStream::emit_text(bool reasoning, std::string_view text) {
  emit(reasoning ? CompletionEvent::Kind::Reasoning : CompletionEvent::Kind::Content, text);
}

bool CompletionStream::step() {
  switch (state_) {
    case State::Reasoning: return step_text(true);
    case State::Content: return step_text(false);
    case State::Ended: buf_.clear(); return false;
    default: return step_block();
  }
}

// Reasoning or content: plain text up to the first tag of the phase.
bool CompletionStream::step_text(bool reasoning) {
  const Found f = reasoning ? find_stop(buf_, 0, {kThinkEnd, kBlockStart, kEos})
                            : find_stop(buf_, 0, {kBlockStart, kEos});
  if (f.which >= 0) {
    const std::string& stop = reasoning ? (f.which == 0 ? kThinkEnd : f.which == 1 ? kBlockStart : kEos)
                                        : (f.which == 0 ? kBlockStart : kEos);
    emit_text(reasoning, std::string_view(buf_).substr(0, f.pos));
    buf_.erase(0, f.pos + stop.size());
    if (&stop == &kThinkEnd) {
      state_ = State::Content;
    } else if (&stop == &kEos) {
      state_ = State::Ended;
      buf_.clear();
    } else {
      state_ = State::BlockOpen;
      block_in_reasoning_ = reasoning;
      calls_in_block_ = 0;
      block_pending_ = kBlockStart;
    }
    return true;
  }
  if (buf_.empty()) return false;
  // No tag: the text up to a possible start of one is plain (all of it at the end).
  const size_t n = finishing_ ? buf_.size() : utf8_complete(buf_, f.pos);
  emit_text(reasoning, std::string_view(buf_).substr(0, n));
  buf_.erase(0, n);
  return finishing_;
}

void CompletionStream::begin_call(const std::string& name, size_t header_end) {
  ojson call = ojson::object();
  call["type"] = "function";
  call["function"] = ojson::object();
  call["function"]["name"] = name;
  call["function"]["arguments"] = "";
  result_.parsed.tool_calls.push_back(std::move(call));
  result_.tool_call_dsml.emplace_back();
  const int index = static_cast<int>(result_.parsed.tool_calls.size()) - 1;
  emit(CompletionEvent::Kind::ToolCallBegin, name, index);
  call_name_ = name;
  emit(CompletionEvent::Kind::ToolCallArguments, "{", index);
  call_raw_ = buf_.substr(0, header_end);
  buf_.erase(0, header_end);
  block_pending_.clear();
  ++calls_in_block_;
  call_open_ = true;
  param_names_.clear();
}

// `complete`: the call's text ran through "</｜DSML｜invoke>" (call_raw_ holds it).
void CompletionStream::end_call(bool complete) {
  const int index = static_cast<int>(result_.parsed.tool_calls.size()) - 1;
  emit(CompletionEvent::Kind::ToolCallArguments, "}", index);
  emit(CompletionEvent::Kind::ToolCallEnd, "", index);
  if (complete) result_.tool_call_dsml.back() = call_raw_;
  call_open_ = false;
  call_raw_.clear();
  param_names_.clear();
}

void CompletionStream::emit_string_value(size_t n) {
  if (n == 0) return;
  const int index = static_cast<int>(result_.parsed.tool_calls.size()) - 1;
  emit(CompletionEvent::Kind::ToolCallArguments, json_string_body(std::string_view(buf_).substr(0, n)), index);
  call_raw_.append(buf_, 0, n);
  buf_.erase(0, n);
}

// The block does not have the DSML form (see the header for the rule).
void CompletionStream::malformed() {
  if (call_open_) {
    if (state_ == State::StringValue)
      emit(CompletionEvent::Kind::ToolCallArguments, "\"", static_cast<int>(result_.parsed.tool_calls.size()) - 1);
    end_call(false);
  }
  if (calls_in_block_ == 0) {
    emit_text(block_in_reasoning_, kBlockStart);
    buf_ = block_pending_.substr(kBlockStart.size()) + buf_;
    state_ = block_in_reasoning_ ? State::Reasoning : State::Content;
  } else {
    buf_ = block_pending_ + buf_;
    state_ = State::Content;
  }
  block_pending_.clear();
  calls_in_block_ = 0;
  scan_from_ = 0;
}

bool CompletionStream::step_block() {
  const int index = static_cast<int>(result_.parsed.tool_calls.size()) - 1;
  switch (state_) {
    case State::BlockOpen: {
      const int m = match_literal(buf_, {">\n" + kInvoke, ">\n" + kCallsEnd});
      if (m == 0) {
        block_pending_ += ">\n";
        buf_.erase(0, 2);
        state_ = State::InvokeHeader;
        scan_from_ = header_ws_ = 0;
      } else if (m == 1) {  // an empty block
        buf_.erase(0, 2 + kCallsEnd.size());
        block_pending_.clear();
        state_ = State::Content;
      } else if (m == kNone || (finishing_ && !buf_.empty())) {
        malformed();
      } else if (finishing_) {  // the text ends right after the block's start: no calls
        block_pending_.clear();
        state_ = State::Content;
      } else {
        return false;
      }
      return true;
    }

    case State::InvokeHeader: {  // buf_ starts with "<｜DSML｜invoke"
      size_t i = std::max(header_ws_, kInvoke.size());
      while (i < buf_.size() && std::isspace(static_cast<unsigned char>(buf_[i]))) ++i;
      header_ws_ = i;
      const size_t n = std::min(kNameOpen.size(), buf_.size() - i);
      if (buf_.compare(i, n, kNameOpen, 0, n) != 0) {
        malformed();
        return true;
      }
      const Found f = find_stop(buf_, std::max(scan_from_, i), {kParam, kInvokeEnd});
      size_t header_end = f.pos;
      if (f.which < 0) {
        if (!finishing_) {
          scan_from_ = f.pos;
          return false;
        }
        header_end = buf_.size();  // parse_completion takes a header at the end of the text
      }
      const std::optional<std::string> name =
          invoke_name(std::string_view(buf_).substr(kInvoke.size(), header_end - kInvoke.size()));
      if (!name || name->empty() || (check_names_ && !tools_.has_tool(*name))) {
        if (name) refused_ = true;
        malformed();
        return true;
      }
      begin_call(*name, header_end);
      state_ = State::CallBody;
      return true;
    }

    case State::CallBody: {  // buf_ starts with "<｜DSML｜parameter" or "</｜DSML｜invoke" (or is empty)
      if (buf_.empty()) {
        if (!finishing_) return false;
        end_call(false);  // the text ends after the header: parse_completion takes the call
        state_ = State::Content;
        return true;
      }
      if (!buf_.starts_with(kInvokeEnd)) {
        state_ = State::ParamHeader;
        scan_from_ = 0;
        return true;
      }
      if (buf_.size() == kInvokeEnd.size()) {
        if (!finishing_) return false;
        buf_.clear();
        end_call(false);  // parse_completion takes a text that ends here too
        state_ = State::Content;
      } else if (buf_[kInvokeEnd.size()] == '>') {
        call_raw_ += kInvokeEnd + ">";
        buf_.erase(0, kInvokeEnd.size() + 1);
        end_call(true);
        state_ = State::AfterInvoke;
      } else {
        malformed();
      }
      return true;
    }

    case State::ParamHeader: {  // buf_ starts with "<｜DSML｜parameter"
      const size_t at = kParam.size(), name_at = at + kParamNameOpen.size();
      const size_t n = std::min(kParamNameOpen.size(), buf_.size() - at);
      if (buf_.compare(at, n, kParamNameOpen, 0, n) != 0) {
        malformed();
        return true;
      }
      const Found f = buf_.size() < name_at ? Found{buf_.size(), kNone}
                                            : find_stop(buf_, std::max(scan_from_, name_at),
                                                        {kStringTrue, kStringFalse, kParamEnd});
      if (f.which == 2 || (f.which < 0 && finishing_)) {
        malformed();
        return true;
      }
      if (f.which < 0) {
        scan_from_ = std::max(f.pos, name_at);
        return false;
      }
      std::string name = buf_.substr(name_at, f.pos - name_at);
      if (std::find(param_names_.begin(), param_names_.end(), name) != param_names_.end()) {
        malformed();
        return true;
      }
      param_names_.push_back(name);
      const size_t header_end = f.pos + (f.which == 0 ? kStringTrue : kStringFalse).size();
      const std::string key = (param_names_.size() > 1 ? ", " : "") + to_python_json(name) + ": ";
      // A string="true" value is streamed as it arrives when it stays a JSON string whatever
      // its text; one the schema may type otherwise is held whole, as string="false" values.
      if (f.which == 0 && string_value_stays_string(tools_.types(call_name_, name))) {
        emit(CompletionEvent::Kind::ToolCallArguments, key + "\"", index);
        call_raw_.append(buf_, 0, header_end);
        buf_.erase(0, header_end);
        state_ = State::StringValue;
      } else {
        param_name_ = std::move(name);
        held_is_string_ = f.which == 0;
        typed_value_at_ = header_end;
        scan_from_ = header_end;
        state_ = State::TypedValue;
      }
      return true;
    }

    case State::StringValue: {  // buf_ starts inside the value
      size_t from = 0;
      for (;;) {
        const Found f = find_stop(buf_, from, {kValueEnd, kValueEndNl, kParamEnd, kEos});
        if (f.which == 0 || f.which == 1) {
          emit_string_value(f.pos);
          emit(CompletionEvent::Kind::ToolCallArguments, "\"", index);
          const size_t len = (f.which == 0 ? kValueEnd : kValueEndNl).size();
          call_raw_.append(buf_, 0, len);
          buf_.erase(0, len);
          state_ = State::AfterParam;
          return true;
        }
        if (f.which == 2) {  // "/｜DSML｜parameter" without "<" before it
          emit_string_value(f.pos);
          malformed();
          return true;
        }
        // The end-of-sentence text inside a value is value text when more follows; at the end
        // of the text it is held back (it ends the completion).
        if (f.which == 3 && f.pos + kEos.size() < buf_.size()) {
          from = f.pos + kEos.size();
          continue;
        }
        if (finishing_) {
          emit_string_value(f.pos);
          malformed();
          return true;
        }
        emit_string_value(utf8_complete(buf_, f.pos));
        return false;
      }
    }

    case State::TypedValue: {  // buf_ starts with the parameter's tag; held until it closes
      const Found f = find_stop(buf_, std::max(scan_from_, typed_value_at_), {kValueEnd, kValueEndNl, kParamEnd});
      if (f.which == 2 || (f.which < 0 && finishing_)) {
        malformed();
        return true;
      }
      if (f.which < 0) {
        scan_from_ = f.pos;
        return false;
      }
      const std::string value = buf_.substr(typed_value_at_, f.pos - typed_value_at_);
      emit(CompletionEvent::Kind::ToolCallArguments,
           (param_names_.size() > 1 ? ", " : "") + to_python_json(param_name_) + ": " +
               typed_argument(value, held_is_string_, tools_.types(call_name_, param_name_)),
           index);
      const size_t end = f.pos + (f.which == 0 ? kValueEnd : kValueEndNl).size();
      call_raw_.append(buf_, 0, end);
      buf_.erase(0, end);
      state_ = State::AfterParam;
      return true;
    }

    case State::AfterParam: {
      const int m = match_literal(buf_, {">\n" + kParam, ">\n" + kInvokeEnd});
      if (m >= 0) {
        call_raw_ += ">\n";
        buf_.erase(0, 2);
        state_ = State::CallBody;
      } else if (m == kPartial && finishing_ && buf_ == ">\n") {
        buf_.clear();
        end_call(false);  // the text ends after a parameter: parse_completion takes the call
        state_ = State::Content;
      } else if (m == kNone || finishing_) {
        malformed();
      } else {
        return false;
      }
      return true;
    }

    case State::AfterInvoke: {
      const int m = match_literal(buf_, {"\n" + kInvoke, "\n" + kCallsEnd});
      if (m == 0) {
        block_pending_ += "\n";
        buf_.erase(0, 1);
        state_ = State::InvokeHeader;
        scan_from_ = header_ws_ = 0;
      } else if (m == 1) {
        buf_.erase(0, 1 + kCallsEnd.size());
        block_pending_.clear();
        calls_in_block_ = 0;
        state_ = State::Content;
      } else if (m == kNone || finishing_) {
        malformed();
      } else {
        return false;
      }
      return true;
    }

    default: return false;
  }
}

}  // namespace dsv4
