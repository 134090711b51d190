#include "model/compressor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/threads.h"
#include "model/ops.h"
#include "core/formats.h"

namespace dsv4 {

// Feeds the compressor the rows of positions p0..p0+T-1 and appends every entry whose block
// closes inside the chunk to `entries` (out_dim floats each). Returns the number appended.
int64_t compress(const ModelConfig& c, const CompressorW& w, CompressorState& s, const RopeTable& rope, const float* x,
                 int64_t T, int64_t p0, bool indexer, std::vector<float>& entries) {
  const int64_t width = s.width, dout = w.out_dim, ratio = w.ratio;
  std::vector<float> a(static_cast<size_t>(T * width)), g(static_cast<size_t>(T * width));
  matmul(w.wkv, x, T, a.data());
  matmul(w.wgate, x, T, g.data());
  int64_t added = 0;
  std::vector<float> entry(static_cast<size_t>(dout));
  std::vector<float> sc, va;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = p0 + t, slot = pos % ratio;
    const float* ape = w.ape.data() + slot * width;
    for (int64_t k = 0; k < width; ++k) {
      s.cur_a[slot * width + k] = a[t * width + k];
      s.cur_s[slot * width + k] = g[t * width + k] + ape[k];  // ape biases the scores only
    }
    s.n_cur = slot + 1;
    if (slot != ratio - 1) continue;
    // Block b = pos / ratio closes here. Ratio 4 pools the previous block through channels
    // [0, dout) and this block through [dout, 2*dout); other ratios pool this block only.
    const bool overlap = ratio == 4;
    const int64_t off = overlap ? dout : 0;
    for (int64_t ch = 0; ch < dout; ++ch) {
      sc.clear();
      va.clear();
      if (overlap && s.has_prev)
        for (int64_t r = 0; r < ratio; ++r) sc.push_back(s.prev_s[r * width + ch]), va.push_back(s.prev_a[r * width + ch]);
      for (int64_t r = 0; r < ratio; ++r) sc.push_back(s.cur_s[r * width + off + ch]), va.push_back(s.cur_a[r * width + off + ch]);
      float mx = *std::max_element(sc.begin(), sc.end()), den = 0, num = 0;
      for (size_t i = 0; i < sc.size(); ++i) {
        float p = std::exp(sc[i] - mx);
        den += p;
        num += p * va[i];
      }
      entry[ch] = num / den;
    }
    rmsnorm(entry.data(), w.norm.data(), dout, c.eps, entry.data());
    rope.apply(entry.data(), dout, (pos / ratio) * ratio);  // at the block's first position
    if (indexer) {
      hadamard(entry.data(), dout);
      fp4sim(entry.data(), static_cast<size_t>(dout), 32);
    } else {
      fp8sim(entry.data(), static_cast<size_t>(dout - c.rope_dim), 64);
    }
    entries.insert(entries.end(), entry.begin(), entry.end());
    ++added;
    if (overlap) {
      std::swap(s.prev_a, s.cur_a);
      std::swap(s.prev_s, s.cur_s);
      s.has_prev = true;
    }
    s.n_cur = 0;
  }
  return added;
}

}  // namespace dsv4
