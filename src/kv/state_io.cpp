#include "kv/state_io.h"

#include <cstring>

#include "core/error.h"

namespace dsv4 {

namespace {

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
void put_i64(std::vector<uint8_t>& out, int64_t v) { put_bytes(out, &v, sizeof v); }

struct Reader {
  const std::vector<uint8_t>& in;
  size_t& at;
  const std::string& what;
  void bytes(void* p, size_t n, const std::string& field) {
    if (n == 0) return;  // (an empty vector's data() may be null: no memcpy from or to it)
    if (n > in.size() - at) throw Error(what + ": ends inside " + field + " (a truncated or damaged file)");
    std::memcpy(p, in.data() + at, n);
    at += n;
  }
  int64_t i64(const std::string& field) {
    int64_t v = 0;
    bytes(&v, sizeof v, field);
    return v;
  }
  // A count written by write_state, checked against what the model's shapes allow.
  int64_t count(const std::string& field, int64_t lo, int64_t hi) {
    const int64_t v = i64(field);
    if (v < lo || v > hi)
      throw Error(what + ": " + field + " is " + std::to_string(v) + ", the model allows " + std::to_string(lo) + ".." +
                  std::to_string(hi));
    return v;
  }
};

void put_rows(std::vector<uint8_t>& out, const RowStore& r) {
  put_i64(out, r.size());
  for (int64_t i = 0; i < r.size(); ++i) put_bytes(out, r.row(i), r.row_bytes());
}

void put_comp(std::vector<uint8_t>& out, const CompressorState& c) {
  put_bytes(out, c.a.data(), c.a.size() * sizeof(float));
  put_bytes(out, c.s.data(), c.s.size() * sizeof(float));
}

// Rows of a store: at most one per position (compressed entries: one per `ratio`; a window
// layer has none).
void read_rows(Reader& r, RowStore& store, int64_t max_rows, const std::string& field) {
  const int64_t n = r.count(field + " rows", 0, max_rows);
  for (int64_t i = 0; i < n; ++i) r.bytes(store.append(), store.row_bytes(), field);
}

void read_comp(Reader& r, CompressorState& c, const std::string& field) {
  r.bytes(c.a.data(), c.a.size() * sizeof(float), field);
  r.bytes(c.s.data(), c.s.size() * sizeof(float), field);
}

}  // namespace

void write_state(const SequenceState& st, std::vector<uint8_t>& out) {
  DSV4_CHECK(!st.device);
  put_i64(out, st.pos);
  put_i64(out, st.mtp_pos);
  put_i64(out, static_cast<int64_t>(st.layers.size()));
  for (const LayerState& L : st.layers) {
    put_bytes(out, L.window_kv.data(), L.window_kv.size());
    put_rows(out, L.entries);
    put_rows(out, L.index_keys);
    put_comp(out, L.comp);
    put_comp(out, L.index_comp);
  }
}

void read_state(const std::vector<uint8_t>& in, size_t& at, SequenceState& st, const std::string& what) {
  Reader r{in, at, what};
  constexpr int64_t kMaxPositions = int64_t{1} << 40;
  st.pos = r.count("the position", 0, kMaxPositions);
  st.mtp_pos = r.count("the MTP position", 0, st.pos);
  const int64_t layers = static_cast<int64_t>(st.layers.size());
  r.count("the layer count", layers, layers);
  for (int64_t l = 0; l < layers; ++l) {
    LayerState& L = st.layers[static_cast<size_t>(l)];
    const std::string w = "layer " + std::to_string(l);
    r.bytes(L.window_kv.data(), L.window_kv.size(), w + " window ring");
    read_rows(r, L.entries, L.ratio > 0 ? st.pos / L.ratio : 0, w + " compressed entries");
    read_rows(r, L.index_keys, L.ratio > 0 ? st.pos / L.ratio : 0, w + " indexer keys");
    read_comp(r, L.comp, w + " compressor rows");
    read_comp(r, L.index_comp, w + " indexer compressor rows");
  }
}

}  // namespace dsv4
