#pragma once
// Shared helpers for tests that use the golden cases in tests/data/golden (and ../shared/golden).
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

}  // namespace dsv4::testing
