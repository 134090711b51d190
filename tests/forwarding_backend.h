#pragma once
// A Backend that hands every op to another one, for tests that change one behaviour of a real
// backend (override the ops concerned). matmuls, expert_rows_at_once, argmax and sample keep
// Backend's defaults, so a grouped matmul reaches the overriding class's matmul one by one.
#include <memory>
#include <utility>
#include <vector>

#include "model/backend.h"

namespace dsv4::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> in) : in_(std::move(in)) {}

  const char* name() const override { return in_->name(); }
  SequenceState new_sequence() const override { return in_->new_sequence(); }
  SequenceState fork(const SequenceState& st) const override { return in_->fork(st); }
  void truncate(SequenceState& st, int64_t pos, Stack stack) const override { in_->truncate(st, pos, stack); }
  int64_t max_rows() const override { return in_->max_rows(); }
  bool batched() const override { return in_->batched(); }
  int64_t decode_bucket(int64_t n) const override { return in_->decode_bucket(n); }
  SequenceState& padding_sequence() override { return in_->padding_sequence(); }
  Step begin(const StepPlan& plan) override { return in_->begin(plan); }
  void end(Step& s) override { in_->end(s); }
  float* tmp(Step& s, Tmp which, int64_t n) override { return in_->tmp(s, which, n); }
  int32_t* tmp_ints(Step& s, Tmp which, int64_t n) override { return in_->tmp_ints(s, which, n); }
  void hc_pre(int64_t layer, Sub sub, Step& s) override { in_->hc_pre(layer, sub, s); }
  void hc_post(Step& s) override { in_->hc_post(s); }
  void matmul(Step& s, const Matmul& m) override { in_->matmul(s, m); }
  void rmsnorm(Step& s, const RmsNorm& n) override { in_->rmsnorm(s, n); }
  void vec_ops(Step& s, const VecOps& v) override { in_->vec_ops(s, v); }
  void scale(Step& s, float* x, int64_t n, float f) override { in_->scale(s, x, n, f); }
  void compress(Step& s, const CompressFeed& c) override { in_->compress(s, c); }
  void index_topk(Step& s, const IndexTopk& k) override { in_->index_topk(s, k); }
  void attend(Step& s, const Attend& a) override { in_->attend(s, a); }
  void route(Step& s, const Route& r) override { in_->route(s, r); }
  RowList dispatch(Step& s, const std::vector<int32_t>& rows, const std::vector<float>& w) override {
    return in_->dispatch(s, rows, w);
  }
  void zero_f(Step& s) override { in_->zero_f(s); }
  void gather(Step& s, const float* x, const int32_t* rows, int64_t n, int64_t dim, float* y) override {
    in_->gather(s, x, rows, n, dim, y);
  }
  void scatter_add(Step& s, const float* y, const int32_t* rows, int64_t n, int64_t dim, float* out) override {
    in_->scatter_add(s, y, rows, n, dim, out);
  }
  void swiglu(Step& s, const Swiglu& g) override { in_->swiglu(s, g); }
  void add(Step& s, float* y, const float* x, int64_t n) override { in_->add(s, y, x, n); }
  bool moe_on_device(const Step& s) const override { return in_->moe_on_device(s); }
  void routed_experts(Step& s, const RoutedExperts& r) override { in_->routed_experts(s, r); }
  void read_hidden(Step& s, const std::vector<int64_t>& rows, float* out) override { in_->read_hidden(s, rows, out); }
  void hc_head(Stack stack, Step& s, const std::vector<int64_t>& rows) override { in_->hc_head(stack, s, rows); }
  void logits(Step& s, int64_t n, float* out) override { in_->logits(s, n, out); }

 private:
  std::unique_ptr<Backend> in_;
};

}  // namespace dsv4::testing
