// The routed experts of a decode step without the host (cuda_ops.h "MoE on the device"): the
// per-expert weight tables qmatmul_experts reads, and the combine that adds the experts' outputs
// per token in ascending expert id, the order the CPU's expert loop adds them in.
#include <vector>

#include "kernels/cuda/common.cuh"

namespace dsv4::gpu {
namespace {

constexpr int kMaxSlots = 32;  // experts per token (route's limit)

// One block per token t: its k slots sorted by expert id (ties by slot), then
// f[t, c] = ((0 + y[s0, c]) + y[s1, c]) + ... (zero_f then scatter_add per expert on the CPU).
__global__ void moe_combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ ids, int k, int64_t D,
                                   float* __restrict__ f) {
  __shared__ int order[kMaxSlots];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int j = 0; j < k; ++j) {
      int i = j;
      while (i > 0 && ids[t * k + order[i - 1]] > ids[t * k + j]) {
        order[i] = order[i - 1];
        --i;
      }
      order[i] = j;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc = __fadd_rn(acc, y[(t * k + order[j]) * D + c]);
    f[t * D + c] = acc;
  }
}

}  // namespace

DeviceExpertTable make_expert_table(const std::vector<const DeviceWeight*>& experts) {
  if (experts.empty()) bad_arg("make_expert_table", "no experts");
  const DeviceWeight& e0 = *experts[0];
  std::vector<WeightView> views;
  for (const DeviceWeight* e : experts) {
    if (e->fmt != e0.fmt || e->rows != e0.rows || e->cols != e0.cols)
      bad_arg("make_expert_table", "expert '" + e->name + "' differs in format or shape from '" + e0.name + "'");
    views.push_back(e->view());
  }
  DeviceExpertTable d;
  d.views = to_device(views);
  d.table.views = d.views.as<const WeightView>();
  d.table.count = static_cast<int64_t>(views.size());
  d.table.rows = e0.rows;
  d.table.cols = e0.cols;
  d.table.fmt = e0.fmt;
  return d;
}

void moe_combine(const float* y, const int32_t* ids, int64_t T, int64_t k, int64_t D, float* f, Stream stream) {
  if (k <= 0 || k > kMaxSlots) bad_arg("moe_combine", "k must be in [1, 32]");
  if (T <= 0 || D <= 0) return;
  DSV4_LAUNCH(static_cast<unsigned>(T), 256, 0, stream, moe_combine_kernel)(y, ids, static_cast<int>(k), D, f);
  DSV4_CUDA_LAUNCHED("moe_combine_kernel");
}

}  // namespace dsv4::gpu
