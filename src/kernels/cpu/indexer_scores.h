#pragma once
// The CSA indexer's scores straight from the cached FP4 keys (docs/design.md "Indexer scan").
//
// For query t < nq, head h < heads and key b < n:
//   dot(t, h, b) = the fma chain over c = 0, 1, ..., dim-1 of q[(t*heads + h)*dim + c] * key_b[c]
//   score(t, b)  = the fma chain over h = 0, 1, ... of w[t*heads + h] * max(dot(t, h, b), +0)
// (both chains start at +0), key_b[c] being its Fp4Codec value (E2M1 code times the block's
// E8M0 scale, kv/codec.h). Every ISA computes exactly these operations in this order, so a
// score is the same float on AVX-512, AVX2 and the scalar path, whatever n, nq, the key's place
// in its strip or page and the thread split: prefill, decode and any batch select the same keys.
//
// Why a kernel of its own: as a qmatmul (keys as an F32 weight of 128 columns, heads as tokens)
// every key was first decoded to floats in memory, and the canonical qmatmul order sums 16
// lane-chains of 8 terms with a reduction tree per output, which a K of 128 cannot amortise
// (~90 GFLOP/s of a 234 GFLOP/s FMA peak on Zen 4). Here 32 keys at a time are decoded,
// transposed, into an L1 buffer and the heads run down the columns: one fma per weight and
// query, no reduction tree, no dot ever stored.
#include <cstdint>

namespace dsv4 {

// Keys in Fp4Codec bytes (dim/2 code bytes, then dim/32 scale bytes), page by page: key b at
// pages[b / page_rows] + (b % page_rows) * row_bytes.
struct Fp4Keys {
  const uint8_t* const* pages = nullptr;
  int64_t page_rows = 0;  // a multiple of kIndexerStrip, unless every key is on the first page
  int64_t row_bytes = 0;  // from one key to the next (at least dim/2 + dim/32)
};

constexpr int64_t kIndexerStrip = 32;  // keys decoded together

// scores[t*ld + b] for t < nq, b < n as above (dim a multiple of 32). Runs on the pool (call it
// from one thread at a time).
void indexer_scores(const float* q, const float* w, int64_t nq, int64_t heads, int64_t dim, const Fp4Keys& keys,
                    int64_t n, float* scores, int64_t ld);

}  // namespace dsv4
