#include "row_constraint.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace lora_share::constraint {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t nanoseconds_since(Clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

std::vector<int> as_int(const std::vector<int64_t>& ids) { return std::vector<int>(ids.begin(), ids.end()); }

}  // namespace

MaskWorker::MaskWorker() : thread_([this] { loop(); }) {}

MaskWorker::~MaskWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void MaskWorker::submit(RowConstraint* row) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(row);
  }
  wake_.notify_one();
}

void MaskWorker::wait(RowConstraint* row) {
  std::unique_lock<std::mutex> lock(mu_);
  auto queued = std::find(queue_.begin(), queue_.end(), row);
  if (queued != queue_.end()) {
    queue_.erase(queued);
    lock.unlock();
    row->fill();
    return;
  }
  done_.wait(lock, [&] { return filling_ != row; });
}

void MaskWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    RowConstraint* row = queue_.front();
    queue_.pop_front();
    filling_ = row;
    lock.unlock();
    row->fill();
    lock.lock();
    filling_ = nullptr;
    done_.notify_all();
  }
}

RowConstraint::RowConstraint(std::shared_ptr<const Compiled> compiled, const std::vector<int64_t>& stop_ids,
                             Stats* stats)
    : compiled_(std::move(compiled)),
      matcher_(compiled_->grammar, as_int(stop_ids)),
      bitmask_(static_cast<size_t>(xgrammar::GetBitmaskSize(compiled_->grammar.GetTokenizerInfo().GetVocabSize())), 0),
      stats_(stats) {}

RowConstraint::~RowConstraint() {
  if (worker_ != nullptr) worker_->wait(this);
}

void RowConstraint::fill() {
  const auto start = Clock::now();
  int64_t shape[1] = {static_cast<int64_t>(bitmask_.size())};
  DLTensor mask{};
  mask.data = bitmask_.data();
  mask.device = DLDevice{kDLCPU, 0};
  mask.ndim = 1;
  mask.dtype = xgrammar::GetBitmaskDLType();
  mask.shape = shape;
  matcher_.FillNextTokenBitmask(&mask);
  const TokenBytes& vocab = *compiled_->bytes;
  if (compiled_->json)
    for (size_t w = 0; w < bitmask_.size(); ++w) bitmask_[w] &= vocab.no_control[w];
  utf8_.restrict(vocab, bitmask_);
  filled_ = true;
  if (stats_ != nullptr) {
    ++stats_->masked_tokens;
    stats_->mask_ns += nanoseconds_since(start);
  }
}

void RowConstraint::prepare(MaskWorker* worker) {
  filled_ = false;
  worker_ = worker;
  if (worker != nullptr) worker->submit(this);
}

void RowConstraint::apply(float* logits, int64_t vocab) {
  const auto start = Clock::now();
  if (worker_ != nullptr) worker_->wait(this);
  worker_ = nullptr;
  if (!filled_) fill();
  if (stats_ != nullptr) stats_->mask_wait_ns += nanoseconds_since(start);
  const float forbidden = -std::numeric_limits<float>::infinity();
  for (int64_t word = 0; word * 32 < vocab; ++word) {
    const uint32_t bits = static_cast<uint32_t>(bitmask_[static_cast<size_t>(word)]);
    if (bits == 0xFFFFFFFFu) continue;  // most words of a free stretch of text: nothing forbidden
    for (int64_t id = word * 32; id < std::min<int64_t>(vocab, word * 32 + 32); ++id)
      if (!((bits >> (id - word * 32)) & 1u)) logits[id] = forbidden;
  }
}

bool RowConstraint::accept(int64_t token) {
  if (!matcher_.AcceptToken(static_cast<int32_t>(token))) return false;
  const std::vector<std::string>& bytes = compiled_->bytes->bytes;
  if (token >= 0 && static_cast<size_t>(token) < bytes.size()) utf8_.advance(bytes[static_cast<size_t>(token)]);
  return true;
}

}  // namespace lora_share::constraint
