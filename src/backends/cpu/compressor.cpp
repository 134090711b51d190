#include "backends/cpu/compressor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/ops.h"
#include "core/formats.h"

namespace dsv4 {

void compress_project(const CompressorW& w, const float* x, int64_t T, float* a, float* g) {
  matmul(w.wkv, x, T, a);
  matmul(w.wgate, x, T, g);
}

int64_t compress_feed(const ModelConfig& c, const CompressorW& w, CompressorState& s, const RopeTable& rope, const float* a,
                      const float* g, int64_t T, int64_t p0, Comp which, std::vector<float>& entries) {
  const int64_t width = s.width, dout = w.out_dim, ratio = w.ratio;
  int64_t added = 0;
  std::vector<float> entry(static_cast<size_t>(dout));
  std::vector<float> sc, va;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = p0 + t, slot = pos % ratio;
    const float* ape = w.ape.data() + slot * width;
    float* ra = s.a_row(pos);
    float* rs = s.s_row(pos);
    for (int64_t k = 0; k < width; ++k) {
      ra[k] = a[t * width + k];
      rs[k] = g[t * width + k] + ape[k];  // ape biases the scores only
    }
    if (slot != ratio - 1) continue;
    // Block b = pos / ratio closes here. CSA pools the previous block (when there is one)
    // through channels [0, dout) and this block through [dout, 2*dout); HCA pools this block.
    const int64_t b = pos / ratio, first = b * ratio;
    const bool overlap = ModelConfig::kind_of_ratio(ratio) == LayerKind::CSA;
    const int64_t off = overlap ? dout : 0;
    for (int64_t ch = 0; ch < dout; ++ch) {
      sc.clear();
      va.clear();
      if (overlap && b > 0)
        for (int64_t p = first - ratio; p < first; ++p) sc.push_back(s.s_row(p)[ch]), va.push_back(s.a_row(p)[ch]);
      for (int64_t p = first; p < first + ratio; ++p) sc.push_back(s.s_row(p)[off + ch]), va.push_back(s.a_row(p)[off + ch]);
      float mx = *std::max_element(sc.begin(), sc.end()), den = 0, num = 0;
      for (size_t i = 0; i < sc.size(); ++i) {
        float p = std::exp(sc[i] - mx);
        den += p;
        num += p * va[i];
      }
      entry[ch] = num / den;
    }
    rmsnorm(entry.data(), w.norm.data(), dout, c.eps, entry.data());
    rope.apply(entry.data(), dout, first);  // at the block's first position
    if (which == Comp::Index) {
      hadamard(entry.data(), dout);
      fp4sim(entry.data(), static_cast<size_t>(dout), 32);
    } else {
      fp8sim(entry.data(), static_cast<size_t>(dout - c.rope_dim), 64);
    }
    entries.insert(entries.end(), entry.begin(), entry.end());
    ++added;
  }
  return added;
}

int64_t compress(const ModelConfig& c, const CompressorW& w, CompressorState& s, const RopeTable& rope, const float* x,
                 int64_t T, int64_t p0, Comp which, std::vector<float>& entries) {
  std::vector<float> a(static_cast<size_t>(T * s.width)), g(static_cast<size_t>(T * s.width));
  compress_project(w, x, T, a.data(), g.data());
  return compress_feed(c, w, s, rope, a.data(), g.data(), T, p0, which, entries);
}

}  // namespace dsv4
