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

inline std::string temp_dir(const std::string& tag) {
  auto p = std::filesystem::temp_directory_path() / ("dsv4-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// The real tokenizer fetched by scripts/test.sh: $DSV4_TOKENIZER_DIR, else build/deps/tokenizer.
inline std::string tokenizer_dir() {
  if (const char* env = std::getenv("DSV4_TOKENIZER_DIR"); env && *env) return env;
  return (std::filesystem::path(DSV4_BIN).parent_path() / "deps" / "tokenizer").string();
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
