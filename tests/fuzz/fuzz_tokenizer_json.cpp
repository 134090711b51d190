// Fuzz target: loading a tokenizer.json (Tokenizer::parse, the path Tokenizer::load takes after
// reading the file). Any input must either load or throw dsv4::Error; a tokenizer that loads
// must encode a few texts into ids inside its vocabulary and decode them back without failing.
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    const dsv4::Tokenizer tok = dsv4::Tokenizer::parse(in, "fuzz-tokenizer.json");
    for (std::string_view text : {std::string_view("the thing in 2024, 東京 <think>"), std::string_view("\xff\xfe  \n\tx"),
                                  std::string_view("<｜begin▁of▁sentence｜>a")}) {
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) __builtin_trap();  // an id outside the vocabulary
      (void)tok.decode(ids);
    }
  } catch (const dsv4::Error&) {
    // refused with a message: fine
  }
  return 0;
}
