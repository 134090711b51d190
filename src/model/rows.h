#pragma once
namespace dsv4 {
// Which rows of a sequence's chunk a step returns (logits or hidden state): none, the last, all.
enum class Rows { None, Last, All };
}  // namespace dsv4
