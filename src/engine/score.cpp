#include "engine/score.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

void score(Engine& e, std::vector<ScoreJob>& jobs) {
  const int64_t V = e.info().vocab;
  std::vector<Sequence> seqs;
  for (size_t j = 0; j < jobs.size(); ++j) {
    ScoreJob& job = jobs[j];
    const int64_t T = static_cast<int64_t>(job.tokens.size());
    if (T == 0) throw Error("sequence " + std::to_string(j) + ": no tokens");
    if (job.prefill < 0 || job.prefill > T)
      throw Error("sequence " + std::to_string(j) + ": prefill " + std::to_string(job.prefill) + " outside [0, " + std::to_string(T) + "]");
    if (job.chunk < 0) throw Error("chunk must be >= 0");
    job.logits.assign(static_cast<size_t>(T * V), 0.0f);
    if (job.mtp) job.mtp_logits.assign(static_cast<size_t>((T - 1) * V), 0.0f);
    SequenceOptions so;
    so.mtp = job.mtp;
    so.max_positions = std::min(T, e.info().context);
    seqs.push_back(e.new_sequence(so));
  }
  // Each step: the next piece of every unfinished sequence (a prefill chunk or one token).
  std::vector<int64_t> at(jobs.size(), 0);
  for (;;) {
    std::vector<StepRequest> reqs;
    std::vector<size_t> who;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const ScoreJob& job = jobs[j];
      const int64_t T = static_cast<int64_t>(job.tokens.size()), p = at[j];
      if (p >= T) continue;
      const int64_t step = job.chunk == 0 ? std::max<int64_t>(job.prefill, 1) : job.chunk;
      const int64_t n = p < job.prefill ? std::min(step, job.prefill - p) : 1;
      StepRequest r;
      r.seq = &seqs[j];
      r.tokens.assign(job.tokens.begin() + p, job.tokens.begin() + p + n);
      r.logits = Rows::All;
      r.mtp_logits = job.mtp;
      reqs.push_back(std::move(r));
      who.push_back(j);
    }
    if (reqs.empty()) break;
    std::vector<StepResult> res = e.step(reqs);
    for (size_t i = 0; i < who.size(); ++i) {
      ScoreJob& job = jobs[who[i]];
      const int64_t p = at[who[i]], n = static_cast<int64_t>(reqs[i].tokens.size());
      std::copy(res[i].logits.begin(), res[i].logits.end(), job.logits.begin() + p * V);
      if (job.mtp && !res[i].mtp_logits.empty())
        std::copy(res[i].mtp_logits.begin(), res[i].mtp_logits.end(), job.mtp_logits.begin() + res[i].mtp_first * V);
      at[who[i]] = p + n;
    }
  }
}

std::vector<float> score_tokens(Engine& e, const std::vector<int32_t>& tokens, int64_t prefill, int64_t chunk) {
  std::vector<ScoreJob> jobs(1);
  jobs[0].tokens = tokens;
  jobs[0].prefill = prefill;
  jobs[0].chunk = chunk;
  score(e, jobs);
  return std::move(jobs[0].logits);
}

}  // namespace dsv4
