// Fuzz target: the real DeepSeek-V4 tokenizer on arbitrary bytes. Encoding never fails, ids are
// inside the vocabulary, and for valid UTF-8 decode(encode(s)) == s. The tokenizer.json comes
// from $DSV4_TOKENIZER (a file) or build/deps/tokenizer/tokenizer.json next to the binary's
// build tree (scripts/fetch-tokenizer.sh).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

const dsv4::Tokenizer& tokenizer() {
  static const dsv4::Tokenizer tok = [] {
    const char* env = std::getenv("DSV4_TOKENIZER");
    std::string path = env && *env ? env : DSV4_DEFAULT_TOKENIZER;
    if (!std::filesystem::exists(path)) {
      std::fprintf(stderr, "fuzz_tokenizer: no tokenizer.json at %s (set DSV4_TOKENIZER)\n", path.c_str());
      std::abort();
    }
    return dsv4::Tokenizer::load(path);
  }();
  return tok;
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const dsv4::Tokenizer& tok = tokenizer();
  const std::string s(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.encode(s);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  const std::string back = tok.decode(ids);
  if (valid_utf8(s) && back != s) {
    std::fprintf(stderr, "fuzz_tokenizer: decode(encode(s)) != s for a valid UTF-8 input of %zu bytes\n", size);
    std::abort();
  }
  return 0;
}
