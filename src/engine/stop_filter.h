#pragma once
// Streams generated text while watching for stop strings: text whose tail could still become a
// stop string is held back until it cannot, and nothing from the first stop string on is ever
// emitted. Held-back text never splits a UTF-8 character. Used by generation and the server.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class StopFilter {
 public:
  using Sink = std::function<void(std::string_view)>;
  // `sink` receives the text that is final (may be empty: then only `text()` accumulates it).
  StopFilter(std::vector<std::string> stops, Sink sink);

  // Takes more text; returns true when a stop string completed (the text before it has been
  // emitted; later pushes are ignored).
  bool push(std::string_view text);
  // Emits what is held back (generation ended without a stop string).
  void finish();
  const std::string& text() const { return out_; }  // everything emitted so far
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that ended it

 private:
  void emit(std::string_view t);
  std::vector<std::string> stops_;
  Sink sink_;
  std::string out_, pending_, matched_;
  bool stopped_ = false;
};

}  // namespace dsv4
