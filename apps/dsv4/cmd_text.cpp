// dsv4 tokenize / detokenize / chat-template.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "args.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace dsv4::cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void print_ids(const std::vector<int32_t>& ids, bool json) {
  std::string out = json ? "[" : "";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? (json ? ", " : ",") : "") + std::to_string(ids[i]);
  out += json ? "]\n" : "\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace

int cmd_tokenize(const Args& a) {
  const std::string dir = a.str("tokenizer");
  const bool json = a.flag("json");
  std::string text;
  if (a.has("text") == a.has("file")) throw Usage("give exactly one of --text or --file");
  text = a.has("text") ? a.str("text") : read_file(a.str("file"));
  a.check_all_used();
  print_ids(Tokenizer::load(dir).encode(text), json);
  return 0;
}

int cmd_detokenize(const Args& a) {
  const std::string dir = a.str("tokenizer");
  std::vector<int32_t> ids = parse_tokens(a.str("ids"));
  a.check_all_used();
  Tokenizer tok = Tokenizer::load(dir);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= tok.vocab_size())
      throw Error("--ids: token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) + " is >= the tokenizer's " +
                  std::to_string(tok.vocab_size()) + " tokens");
  std::string text = tok.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int cmd_chat_template(const Args& a) {
  const std::string path = a.str("messages");
  const std::string mode = a.str("mode", "thinking");
  const std::string effort = a.str("reasoning-effort", "");
  const bool ids = a.flag("ids");
  const std::string tdir = ids ? a.str("tokenizer") : a.str("tokenizer", "");
  a.check_all_used();
  ChatOptions o;
  if (mode == "thinking")
    o.mode = ChatMode::Thinking;
  else if (mode == "chat")
    o.mode = ChatMode::Chat;
  else
    throw Usage("--mode must be thinking or chat, got '" + mode + "'");
  o.reasoning_effort = effort;
  nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(read_file(path), nullptr, false);
  if (msgs.is_discarded()) throw Error(path + ": not valid JSON");
  // Accept a bare list of messages or an OpenAI request body {"messages": [...], "tools": [...]}.
  if (msgs.is_object() && msgs.contains("messages")) {
    nlohmann::ordered_json body = msgs;
    msgs = body["messages"];
    if (body.contains("tools") && !msgs.empty()) msgs[0]["tools"] = body["tools"];
  }
  std::string prompt = render_chat(msgs, o);
  if (ids) {
    print_ids(Tokenizer::load(tdir).encode(prompt), false);
  } else {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  }
  return 0;
}

}  // namespace dsv4::cli
