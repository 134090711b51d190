#pragma once
// Checkpoint layouts and tensor naming. The engine speaks the official native names
// ("layers.3.attn.wq_a.weight"); other layouts are translated to them here, in one place.
#include <string>

namespace dsv4 {

enum class Layout { Native, HF };

const char* layout_name(Layout l);

// The name a tensor has in `layout`, given its native name. Native -> native is identity.
// FP8 scales: native "X.scale" maps to HF "X.weight_scale_inv".
std::string layout_tensor_name(Layout layout, const std::string& native);

}  // namespace dsv4
