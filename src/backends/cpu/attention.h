#pragma once
// Pieces of sparse attention shared by every backend's reference: the sink softmax over a set
// of key/value vectors (K = V in DeepSeek-V4) and the CSA indexer's top-k selection.
#include <cstdint>
#include <vector>

#include "kernels/cpu/indexer_scores.h"

namespace dsv4 {

// All H heads of one query over the same n keys (K = V, contiguous [n, d]):
// out[h] = sum_j p_hj K_j, p_hj = exp(q_h.K_j*scale) / (sum_j' exp(q_h.K_j'*scale) + exp(sink[h])).
// Q is [H, d]; out [H, d] is overwritten. Scores and the weighted sum run as matrix products on
// the pool (gemm_nt, gemm_nn); call it from one thread at a time.
void attend_heads(const float* Q, int64_t H, const float* K, int64_t n, int64_t d, const float* sink, float scale, float* out);

// The forward uses the two halves of attend_heads below (scores for a block of queries at once,
// then attend_scores per query); attend_heads is the one-query composition.
// The same with the scores already computed: p [H, n] holds q_h . K_j (before `scale`) and is
// overwritten with the attention weights. K here is the keys' rows (K[j]: d floats), read where
// they lie (a query's keys are scattered over its window and its selected entries). (A query's
// scores may come from a larger product: each is the same dot, one fma chain over d, whatever
// the product.)
// RunOn::Caller runs it on the calling thread (for callers already on the pool: the same
// bits, the pool is not reentrant).
enum class RunOn { Pool, Caller };
void attend_scores(float* p, int64_t H, const float* const* K, int64_t n, int64_t d, const float* sink, float scale,
                   float* out, RunOn where = RunOn::Pool);

// S[i * n + j] = Q_i . K_j for nq query rows and n keys (Q [nq, d]; K[j]: d floats), each one
// fma chain over d in order (gemm_nt): the same float in any product, so a block of queries
// scored against the union of their keys gives each query attend_heads' scores bit for bit.
// Runs on the pool.
// FLOPs are not counted here: a caller counts the scores it uses.
void query_key_scores(const float* Q, int64_t nq, const float* const* K, int64_t n, int64_t d, float* S);

// Indexer selections of nq queries over the same keys: query t's top min(k, vis[t]) of keys
// [0, vis[t]) by score (kernels/cpu/indexer_scores.h: from the FP4 keys as cached, the same
// floats on every ISA), best first, ties to the lower index, into sel[t * k ...], their count
// into sel_n[t]. Runs on the pool.
void indexer_select(const float* q, const float* w, int64_t nq, const int64_t* vis, const Fp4Keys& keys, int64_t heads,
                    int64_t dim, int64_t k, int32_t* sel, int32_t* sel_n);

}  // namespace dsv4
