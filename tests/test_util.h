#pragma once
// Shared test helpers: golden cases (tests/data/golden, ../shared/golden), the fetched tokenizer,
// temporary directories, running the dsv4 binary.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace dsv4::testing {

inline std::string golden_dir(const std::string& name) {
  std::filesystem::path local = std::filesystem::path(DSV4_TEST_DATA) / "golden" / name;
  if (std::filesystem::exists(local)) return local.string();
  std::filesystem::path shared = std::filesystem::path(DSV4_SHARED_DIR) / "golden" / name;
  if (std::filesystem::exists(shared)) return shared.string();
  return "";
}

inline std::vector<int32_t> read_tokens(const std::string& path) {
  std::ifstream f(path);
  std::vector<int32_t> out;
  std::string tok;
  while (std::getline(f, tok, ',')) out.push_back(std::stoi(tok));
  return out;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// A fresh directory under the system's temp directory, removed when the test process exits
// (every run would otherwise leave its model copies behind: gigabytes after a few hundred runs).
inline std::string temp_dir(const std::string& tag) {
  struct Made {
    std::vector<std::filesystem::path> dirs;
    ~Made() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Made made;
  auto p = std::filesystem::temp_directory_path() / ("dsv4-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  made.dirs.push_back(p);
  return p.string();
}

// A copy of tiny-native whose final norm and MTP norm keep only channels 0 and 1 (the other
// weights zero, those 128): the logits of both then depend on two numbers only, so the MTP block's greedy
// drafts agree with the main model often (not always). Random weights never let a draft be
// accepted; this model makes speculative decoding's acceptance path run. Made once per process.
inline std::string mtp_agreeing_model_dir() {
  static const std::string dir = [] {
    const std::string src = golden_dir("tiny-native");
    if (src.empty()) return std::string();
    const std::string out = temp_dir("mtp-agreeing");
    for (const auto& e : std::filesystem::directory_iterator(src + "/model")) std::filesystem::copy(e.path(), out);
    const std::string file = out + "/model.safetensors";
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    const nlohmann::json h = nlohmann::json::parse(header);
    for (const char* name : {"norm.weight", "mtp.0.norm.weight"}) {
      const auto& t = h.at(name);
      if (t.at("dtype") != "BF16") return std::string();
      const uint64_t begin = t.at("data_offsets")[0], end = t.at("data_offsets")[1];
      std::vector<uint16_t> v((end - begin) / 2, 0);
      v[0] = v[1] = 0x4300;  // 128: logits sharp enough for sampling to follow the argmax mostly
      f.seekp(static_cast<std::streamoff>(8 + n + begin));
      f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(end - begin));
    }
    return f.good() ? out : std::string();
  }();
  return dir;
}

// The real tokenizer fetched by scripts/test.sh: $DSV4_TOKENIZER_DIR, else build/deps/tokenizer.
inline std::string tokenizer_dir() {
  if (const char* env = std::getenv("DSV4_TOKENIZER_DIR"); env && *env) return env;
  return (std::filesystem::path(DSV4_BIN).parent_path() / "deps" / "tokenizer").string();
}

// That tokenizer, loaded once per test binary; null when it has not been fetched.
inline const Tokenizer* real_tokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    const std::string file = tokenizer_dir() + "/tokenizer.json";
    if (!std::filesystem::exists(file)) return nullptr;
    return new Tokenizer(Tokenizer::load(file));
  }();
  return tok;
}

struct CommandResult {
  int status = -1;     // exit status (128 + signal when killed)
  std::string output;  // what the command wrote to its stdout
};

// Runs a shell command and captures its stdout (redirect stderr inside `cmd` as needed).
inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace dsv4::testing
