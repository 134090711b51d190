#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

RopeTable layer_rope(const ModelConfig& c, int64_t l) {
  const bool compressed = c.kind(l) != LayerKind::Window;
  return make_rope(c.rope_dim, compressed ? c.compress_rope_theta : c.rope_theta, compressed, c.yarn_factor, c.yarn_original,
                   c.yarn_beta_fast, c.yarn_beta_slow);
}

RopeTable make_rope(int64_t rope_dim, double base, bool yarn, double factor, int64_t original, double beta_fast, double beta_slow) {
  RopeTable t;
  t.rope_dim = rope_dim;
  const int64_t half = rope_dim / 2;
  t.freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    t.freq[i] = static_cast<float>(1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rope_dim)));
  if (yarn) {
    const double pi = 3.14159265358979323846;
    auto cd = [&](double n) { return rope_dim * std::log(original / (n * 2 * pi)) / (2 * std::log(base)); };
    double low = std::max(std::floor(cd(beta_fast)), 0.0);
    double high = std::min(std::ceil(cd(beta_slow)), static_cast<double>(rope_dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
      t.freq[i] = t.freq[i] / static_cast<float>(factor) * ramp + t.freq[i] * (1.0f - ramp);
    }
  }
  return t;
}

RopeTable::At RopeTable::at(int64_t pos) const {
  At a;
  a.cos.resize(freq.size());
  a.sin.resize(freq.size());
  for (size_t i = 0; i < freq.size(); ++i) {
    // float32 angle, as the reference builds its table.
    const float ang = static_cast<float>(pos) * freq[i];
    a.cos[i] = static_cast<float>(std::cos(static_cast<double>(ang)));
    a.sin[i] = static_cast<float>(std::sin(static_cast<double>(ang)));
  }
  return a;
}

void RopeTable::At::apply(float* v, int64_t n, bool inverse) const {
  float* p = v + (n - 2 * static_cast<int64_t>(cos.size()));
  for (size_t i = 0; i < cos.size(); ++i) {
    const float c = cos[i], s = inverse ? -sin[i] : sin[i];
    const float a = p[2 * i], b = p[2 * i + 1];
    p[2 * i] = a * c - b * s;
    p[2 * i + 1] = a * s + b * c;
  }
}

void RopeTable::apply(float* v, int64_t n, int64_t pos, bool inverse) const { at(pos).apply(v, n, inverse); }

}  // namespace dsv4
