// lora_share_diag.h's ls_diag_drafter_* and ls_diag_accept_sampled: the
// drafter and the sampled acceptance alone, so that tests check them without a
// program (the acceptance's distribution against the target's over many seeds).
#include <algorithm>
#include <new>
#include <random>
#include <vector>

#include "drafter.h"
#include "drafts.h"
#include "lora_share_diag.h"
#include "step_width.h"

struct ls_diag_drafter {
  lora_share::Drafter drafter;
};

extern "C" {

ls_diag_drafter* ls_diag_drafter_new(const int64_t* prompt, size_t n_prompt, const int64_t* prediction,
                                     size_t n_prediction, size_t max_drafts) {
  if ((prompt == nullptr && n_prompt > 0) || (prediction == nullptr && n_prediction > 0)) return nullptr;
  lora_share::DrafterOptions options;
  options.max_drafts = max_drafts;
  return new (std::nothrow)
      ls_diag_drafter{lora_share::Drafter(std::vector<int64_t>(prompt, prompt + n_prompt),
                                          std::vector<int64_t>(prediction, prediction + n_prediction), options)};
}

void ls_diag_drafter_free(ls_diag_drafter* drafter) { delete drafter; }

void ls_diag_drafter_extend(ls_diag_drafter* drafter, const int64_t* tokens, size_t n) {
  drafter->drafter.extend(tokens, n);
}

size_t ls_diag_drafter_propose(ls_diag_drafter* drafter, int64_t* drafts, size_t room) {
  std::vector<int64_t> proposed = drafter->drafter.propose();
  size_t n = std::min(room, proposed.size());
  std::copy(proposed.begin(), proposed.begin() + static_cast<std::ptrdiff_t>(n), drafts);
  return n;
}

void ls_diag_drafter_feedback(ls_diag_drafter* drafter, size_t drafted, size_t accepted) {
  drafter->drafter.feedback(drafted, accepted);
}

size_t ls_diag_accept_sampled(const int64_t* tokens, size_t n, const float* probs, int64_t vocab,
                              const float* draft_probs, uint64_t seed, int64_t* gained) {
  if (tokens == nullptr || probs == nullptr || gained == nullptr || n == 0 || vocab < 1) return 0;
  std::mt19937_64 rng(seed);
  std::vector<int64_t> out =
      lora_share::accept_sampled(std::vector<int64_t>(tokens, tokens + n), probs, vocab, draft_probs, rng);
  std::copy(out.begin(), out.end(), gained);
  return out.size();
}

double ls_diag_drafter_acceptance(const ls_diag_drafter* drafter) { return drafter->drafter.acceptance(); }

size_t ls_diag_best_width(const double* ms, size_t max_rows, size_t max_width, const size_t* drafts,
                          const double* acceptance, size_t rows) {
  if (ms == nullptr || (rows > 0 && (drafts == nullptr || acceptance == nullptr))) return 0;
  lora_share::StepCosts costs(max_rows, max_width);
  for (size_t r = 1; r <= max_rows; ++r)
    for (size_t w = 1; w <= max_width; ++w)
      if (ms[(r - 1) * max_width + w - 1] > 0) costs.record(r, w, ms[(r - 1) * max_width + w - 1]);
  std::vector<lora_share::RowDrafts> proposed(rows);
  for (size_t i = 0; i < rows; ++i)
    if (drafts[i] > 0) proposed[i].expected_kept = lora_share::chained_kept(acceptance[i], drafts[i]);
  return lora_share::best_width(proposed, costs);
}

}  // extern "C"
