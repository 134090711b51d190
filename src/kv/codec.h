#pragma once
// Compact storage of cached vectors, lossless for the values the model puts there.
//
// KvCodec: an attention KV vector or compressed entry of `dim` values whose first dim - rope
// values went through fp8sim (block 64): stored as E4M3 codes + one E8M0 (power-of-two) scale
// per 64, and the last `rope` values as float32. (BF16 RoPE values, as the reference's BF16
// cache has them, move the golden logits by ~1e-2: the golden semantics keep them exact.)
//
// Fp4Codec: an indexer key that went through fp4sim (block 32): E2M1 codes, two per byte (low
// nibble first), + one E8M0 scale per 32.
#include <cstddef>
#include <cstdint>

namespace dsv4 {

struct KvCodec {
  int64_t dim = 0, rope = 0;
  size_t bytes() const;                              // per vector
  void encode(const float* v, uint8_t* out) const;   // exact when v's nope part is fp8sim'd
  void decode(const uint8_t* in, float* v) const;
};

struct Fp4Codec {
  int64_t dim = 0;
  size_t bytes() const;
  void encode(const float* v, uint8_t* out) const;   // exact when v is fp4sim'd
  void decode(const uint8_t* in, float* v) const;
};

}  // namespace dsv4
