#pragma once
// The DeepSeek-V4 tokenizer: a Hugging Face tokenizer.json (byte-level BPE) reimplemented with
// the same results as HF `tokenizers` (encode without special tokens added, decode).
//
// encode(): added tokens ("added_tokens") are cut out first, leftmost-longest, in HF's two passes
// (tokens with normalized=false, then normalized=true on what is left; lstrip/rstrip/single_word
// honoured). Each remaining piece goes through the pre_tokenizer Sequence — the Split(Regex,
// Isolated) steps, each a hand-written linear scanner for one known pattern (unknown patterns are
// rejected at load) — then the ByteLevel byte-to-unicode map, then BPE by merge rank.
// Input that is not valid UTF-8 is accepted: each invalid byte is a character of class "other"
// and encodes to its byte token, so decode(encode(s)) == s for any bytes.
//
// decode(): concatenates the bytes of each token. A token whose characters are all in the
// byte-level alphabet becomes those bytes; any other token (e.g. "<｜User｜>") is its UTF-8 text,
// exactly HF's ByteLevel decoder. Unlike HF, no lossy UTF-8 repair is applied: the raw bytes are
// returned. Unknown ids are skipped (as HF does).
//
// The class is a cheap handle to immutable shared data: copies are free and all const methods
// are safe to call concurrently.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one. Throws dsv4::Error naming the
  // file when it is missing, not JSON, or uses a model/normalizer/pre-tokenizer this class
  // does not implement.
  static Tokenizer load(const std::string& path);
  // The same from the file's text already in memory; `name` stands for the file in errors.
  static Tokenizer parse(std::string_view json_text, const std::string& name);

  std::vector<int32_t> encode(std::string_view text) const;  // no BOS added
  std::string decode(const std::vector<int32_t>& ids) const;
  // Decoded bytes of one token (may be a partial UTF-8 character). Throws for an unknown id.
  std::string token_text(int32_t id) const;
  // Exact lookup of a token's string in the added tokens, then the model vocab (whose entries
  // are byte-level strings, e.g. "Ġthe").
  std::optional<int32_t> find_token(std::string_view token) const;
  int32_t vocab_size() const;                // max id + 1 over the vocab and added tokens
  bool is_special(int32_t id) const;         // an added token flagged "special"
  bool is_added(int32_t id) const;           // an added token (chat markup), special or not
  const std::string& file() const;           // the tokenizer.json that was loaded

  struct Impl;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns a stream of token ids into text without ever cutting a UTF-8 character in two: push()
// returns the complete characters available so far and holds back an unfinished multi-byte
// tail. Everything it returns is valid UTF-8: bytes that can never become a valid character
// (odd token sequences, e.g. from sampling) become U+FFFD, one per byte, and so does a tail left
// unfinished at flush(). For ids whose bytes are valid UTF-8, the concatenation of every push()
// plus flush() equals Tokenizer::decode() byte for byte.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);  // unknown ids add nothing (as in decode)
  std::string flush();           // U+FFFD if an unfinished character is held, else ""
  bool empty() const { return held_.empty(); }

 private:
  Tokenizer tok_;
  std::string held_;
};

}  // namespace dsv4
