#pragma once
// Command-line options of the dsv4 subcommands: "--key value" pairs and boolean flags.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsv4::cli {

// Bad usage: exit status 2 instead of 1.
struct Usage : Error {
  using Error::Error;
};

class Args {
 public:
  // `flags` are options that take no value (e.g. "show-reasoning"); "-n" is "--n".
  Args(int argc, char** argv, int first, const std::set<std::string>& flags = {}) {
    for (int i = first; i < argc; ++i) {
      const std::string a = std::string(argv[i]) == "-n" ? std::string("--n") : std::string(argv[i]);
      if (a.rfind("--", 0) != 0) throw Usage(std::string("unexpected argument '").append(a).append("'"));
      std::string key = a.substr(2);
      if (flags.count(key)) {
        kv_.insert_or_assign(key, std::string(1, '1'));
        continue;
      }
      if (i + 1 >= argc) throw Usage("option " + a + " needs a value");
      const bool multi = key == "stop" || key == "tokens" || key == "out";  // may repeat
      if (kv_.count(key) && !multi) throw Usage("option " + a + " given twice");
      if (multi) multi_[key].push_back(argv[i + 1]);
      kv_[key] = argv[++i];
    }
  }
  bool has(const std::string& k) const { return kv_.count(k) != 0; }
  bool flag(const std::string& k) const {
    used_[k] = true;
    return has(k);
  }
  std::string str(const std::string& k) const {
    auto it = kv_.find(k);
    if (it == kv_.end()) throw Usage("missing required option --" + k);
    used_[k] = true;
    return it->second;
  }
  std::string str(const std::string& k, const std::string& def) const { return has(k) ? str(k) : def; }
  // Every value of an option that may repeat (--stop, --tokens, --out), in order.
  std::vector<std::string> all(const std::string& k) const {
    used_[k] = true;
    auto it = multi_.find(k);
    return it == multi_.end() ? std::vector<std::string>{} : it->second;
  }
  std::vector<std::string> all_stop() const { return all("stop"); }
  int64_t integer(const std::string& k, int64_t def) const {
    if (!has(k)) return def;
    std::string v = str(k);
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') throw Usage("option --" + k + " expects an integer, got '" + v + "'");
    return x;
  }
  double number(const std::string& k, double def) const {
    if (!has(k)) return def;
    std::string v = str(k);
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') throw Usage("option --" + k + " expects a number, got '" + v + "'");
    return x;
  }
  void check_all_used() const {
    for (const auto& [k, v] : kv_)
      if (!used_.count(k)) throw Usage("unknown option --" + k + (k == "n" ? " (-n)" : ""));
  }

 private:
  std::map<std::string, std::string> kv_;
  std::map<std::string, std::vector<std::string>> multi_;
  mutable std::map<std::string, bool> used_;
};

// --load auto|mmap|read (default auto).
inline WeightLoad load_mode_option(const Args& a) {
  try {
    return parse_weight_load(a.str("load", "auto"));
  } catch (const Usage&) {
    throw;
  } catch (const Error& e) {
    throw Usage(std::string("--load: ") + e.what());
  }
}

// --memory-budget MB | auto | none: what the sequences' caches may reserve together (default
// auto: 90% of the memory available after loading). A sequence that would not fit is refused
// before anything runs.
inline int64_t memory_budget_option(const Args& a) {
  const std::string v = a.str("memory-budget", "auto");
  if (v == "auto") return kAutoMemoryBudget;
  if (v == "none") return 0;
  char* end = nullptr;
  const double mb = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(mb > 0) || mb > 1e9)
    throw Usage("--memory-budget must be a size in MB, auto or none, got '" + v + "'");
  return static_cast<int64_t>(mb * 1024 * 1024);
}

// --parallel none|ep (default none): how the ranks of `mpirun -np N dsv4 ...` split the model
// (docs/parallel.md).
inline Parallel parallel_option(const Args& a) {
  try {
    return parse_parallel(a.str("parallel", "none"));
  } catch (const Usage&) {
    throw;
  } catch (const Error& e) {
    throw Usage(e.what());
  }
}

// Comma-separated token ids.
std::vector<int32_t> parse_tokens(const std::string& s);

// Subcommands; each returns the exit status.
int cmd_score(const Args& a);
int cmd_make_tiny(const Args& a);
int cmd_inspect(const Args& a);
int cmd_bench(const Args& a);
int cmd_generate(const Args& a);
int cmd_chat(const Args& a);
int cmd_tokenize(const Args& a);
int cmd_detokenize(const Args& a);
int cmd_chat_template(const Args& a);
int cmd_serve(const Args& a);

}  // namespace dsv4::cli
