#pragma once
// The JSON mask (engine/json_constraint.h: first-byte buckets, the string-text fast path)
// against each token of the vocabulary tested alone with allows(), at one state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/json_constraint.h"

namespace dsv4::testing {

inline void expect_mask_is_allows(const JsonConstraint& at, int64_t V, const std::string& where) {
  std::vector<float> logits(static_cast<size_t>(V), 0.0f);
  const int64_t left = at.mask(logits.data());
  int64_t brute = 0;
  for (int64_t id = 0; id < V; ++id) {
    const bool ok = at.allows(static_cast<int32_t>(id));
    brute += ok;
    ASSERT_EQ(ok, std::isfinite(logits[static_cast<size_t>(id)])) << "token " << id << " after " << where;
  }
  EXPECT_EQ(left, brute) << where;
  EXPECT_GT(left, 0) << where;
}

}  // namespace dsv4::testing
