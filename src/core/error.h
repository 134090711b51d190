#pragma once
// Two tiers of failure (../shared/STYLE.md, item 10):
// - dsv4::Error: a failure the caller can act on (a bad file, config, argument or request; a
//   budget that does not fit). It carries a kind a server maps to a status (400 / 503 / 501 /
//   500). The CLI prints what() on one line and exits non-zero.
// - DSV4_CHECK: a broken internal invariant. It aborts with file:line: continuing would compute
//   garbage or corrupt a sequence, and no caller can repair it.
#include <stdexcept>
#include <string>

namespace dsv4 {

enum class ErrorKind {
  BadInput,           // the request or file is wrong: fix it and retry
  ResourceExhausted,  // valid, but does not fit now (memory, context, queue): retry later or smaller
  Unsupported,        // valid, but this build / backend cannot do it
  Internal,           // a failure inside the engine that is not a broken invariant (e.g. a device error)
};

struct Error : std::runtime_error {
  explicit Error(const std::string& what, ErrorKind k = ErrorKind::BadInput) : std::runtime_error(what), kind(k) {}
  // A copy owns its text. std::runtime_error's copies share one reference-counted string, and
  // errors cross threads (a job's failure goes from the scheduler to an HTTP thread): the last
  // release could then free the text in one thread while another reads it, ordered only by the
  // count's atomics inside libstdc++, which ThreadSanitizer cannot see (session 41's CI failure).
  Error(const Error& other) : std::runtime_error(std::string(other.what())), kind(other.kind) {}
  Error& operator=(const Error& other) {
    if (this != &other) {
      std::runtime_error::operator=(std::runtime_error(std::string(other.what())));
      kind = other.kind;
    }
    return *this;
  }
  ErrorKind kind;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& detail);

}  // namespace dsv4

#define DSV4_CHECK(cond)                                                    \
  do {                                                                      \
    if (!(cond)) ::dsv4::check_failed(__FILE__, __LINE__, #cond, {});       \
  } while (0)
// With a message built only on failure.
#define DSV4_CHECK_MSG(cond, msg)                                           \
  do {                                                                      \
    if (!(cond)) ::dsv4::check_failed(__FILE__, __LINE__, #cond, (msg));    \
  } while (0)
