#include "batch_engine.h"

#include <algorithm>
#include <cstring>

#include "forward_io.h"

namespace lora_share {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::make_tensor_ptr;
using executorch::extension::TensorPtr;
using executorch::runtime::EValue;
using executorch::runtime::MethodMeta;

SizesType dim(size_t n) { return static_cast<SizesType>(n); }

// decode_batch's input `i`: its upper-bound sizes (empty when unreadable).
std::vector<int64_t> input_sizes(const MethodMeta& meta, size_t i) {
  auto info = meta.input_tensor_meta(i);
  if (!info.ok()) return {};
  return std::vector<int64_t>(info->sizes().begin(), info->sizes().end());
}

}  // namespace

struct BatchEngine::Impl {
  SharedProgram* program = nullptr;
  size_t slots = 0, rows = 0;
  // decode_batch's most tokens per row: 1 on a program exported before drafts
  // (exporter revision 13 and earlier), whose K/V the engine writes after a
  // step; later programs write them themselves, before any token attends.
  size_t row_tokens = 1;
  // Per envelope slot: A [rows, r, in] and B [rows, out, r] for a step's
  // rank r (at most max_rank; room for max_rank).
  std::vector<std::vector<float>> a_rows, b_rows;
  // Per row: forward's LoRA inputs over its adapter's data (prefill), empty until set_row.
  std::vector<std::vector<TensorPtr>> row_lora;
  // Per row: its adapter's data (nullptr: base), and per envelope slot the
  // rank its A/B rows are laid out at now (0: not yet).
  std::vector<const LoraData*> row_data;
  std::vector<std::vector<int64_t>> laid;
  // Per row: the envelope slots its adapter leaves alone (its prefill skips them).
  std::vector<SlotMask> row_absent;

  int64_t rank_of(size_t row, size_t s) const {
    const LoraData* lora = row_data[row];
    if (lora == nullptr) return 0;
    return std::min(lora->slots()[s].rank, program->lora_shapes()[s].max_rank);
  }

  // Row `row`'s A [r, in] and B [out, r] of envelope slot `s` at its place
  // in buffers laid out at rank r; ranks past its own are zero (adding
  // exactly nothing).
  void lay_out(size_t row, size_t s, int64_t r) {
    const LoraShape& shape = program->lora_shapes()[s];
    int64_t in = shape.in, out = shape.out;
    float* a = a_rows[s].data() + row * r * in;
    float* b = b_rows[s].data() + row * out * r;
    std::fill(a, a + r * in, 0.0f);
    std::fill(b, b + out * r, 0.0f);
    int64_t own = rank_of(row, s);
    if (own > 0) {
      const LoraData::Slot& slot = row_data[row]->slots()[s];
      std::memcpy(a, slot.a, static_cast<size_t>(own * in) * sizeof(float));
      for (int64_t o = 0; o < out; ++o)
        std::memcpy(b + o * r, slot.b + o * slot.rank, static_cast<size_t>(own) * sizeof(float));
    }
    laid[row][s] = r;
  }

  Status check_row(size_t row, const char* what) const {
    if (row >= rows)
      return Status::usage(std::string(what) + ": row " + std::to_string(row) + " is outside the engine's " +
                           std::to_string(rows) + " rows");
    if (row_lora[row].empty())
      return Status::usage(std::string(what) + ": row " + std::to_string(row) + " has no adapter yet (set_row first)");
    return Status();
  }
  Status check_slot(size_t slot, const char* what) const {
    if (slot >= slots)
      return Status::usage(std::string(what) + ": slot " + std::to_string(slot) + " is outside the engine's " +
                           std::to_string(slots) + " KV slots");
    return Status();
  }

  // A step's row: batch row `row` feeding `tokens` tokens from `pos` on slot `slot`. `row_seen`, `slot_seen`:
  // the step's rows so far (n of them).
  Status check_step_row(const char* what, size_t row, size_t slot, int64_t pos, size_t tokens, size_t n,
                        std::vector<bool>* row_seen, std::vector<bool>* slot_seen) const {
    if (row >= n || (*row_seen)[row])
      return Status::usage(std::string(what) + ": the rows of a step must be rows 0.." + std::to_string(n - 1) +
                           ", each once (row " + std::to_string(row) + ")");
    Status s = check_row(row, what);
    if (!s.ok()) return s;
    s = check_slot(slot, what);
    if (!s.ok()) return s;
    if ((*slot_seen)[slot]) return Status::usage(std::string(what) + ": two rows on KV slot " + std::to_string(slot));
    int64_t max_seq = program->max_seq_len();
    if (pos < 0 || pos + static_cast<int64_t>(tokens) > max_seq)
      return Status::usage(std::string(what) + ": row " + std::to_string(row) + "'s position" +
                           (tokens > 1 ? "s " + std::to_string(pos) + ".." + std::to_string(pos + tokens - 1)
                                       : " " + std::to_string(pos)) +
                           (tokens > 1 ? " run" : " is") + " outside its KV cache of " + std::to_string(max_seq) +
                           " (max_seq_len)");
    (*row_seen)[row] = (*slot_seen)[slot] = true;
    return Status();
  }
  Status check_token(const char* what, size_t row, int64_t token) const {
    if (token < 0 || token >= program->vocab_size())
      return Status::usage(std::string(what) + ": row " + std::to_string(row) + "'s token " + std::to_string(token) +
                           " is outside the vocabulary of " + std::to_string(program->vocab_size()));
    return Status();
  }
};

BatchEngine::BatchEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchEngine::~BatchEngine() = default;

StatusOr<std::unique_ptr<BatchEngine>> BatchEngine::create(SharedProgram& program, size_t slots) {
  const std::string& pte = program.pte();
  if (!program.file_has_batch())
    return Status::usage(pte +
                         ": built by an older lora-share (no decode_batch method): "
                         "rebuild it with this version to run several requests at once");
  if (!program.has_batch() || program.kv().data == nullptr)
    return Status::usage(pte +
                         ": loaded with one KV slot and no drafts to verify (speculation off, or a program "
                         "exported before drafts); batching needs several KV slots (ls_options.parallel > 1)");
  if (slots < 1 || slots > program.kv_slots())
    return Status::usage(pte + ": " + std::to_string(slots) + " slots asked for; the program " + "was opened with " +
                         std::to_string(program.kv_slots()));
  MethodMeta meta = program.batch_meta();
  const KvLayout& kv = program.kv().layout;
  const std::vector<LoraShape>& shapes = program.lora_shapes();
  size_t expected = 3 + static_cast<size_t>(kv.slabs) + 2 * shapes.size();
  std::vector<int64_t> tokens = input_sizes(meta, 0), pool = input_sizes(meta, 3);
  if (meta.num_inputs() != expected || tokens.size() != 2 || pool.size() != 3 ||
      meta.num_outputs() != 1 + static_cast<size_t>(kv.groups))
    return Status::failure(pte + ": decode_batch takes " + std::to_string(meta.num_inputs()) + " inputs and returns " +
                           std::to_string(meta.num_outputs()) + "; the export contract (docs/batching.md) takes " +
                           std::to_string(expected) + " and returns " + std::to_string(1 + kv.groups));
  if (static_cast<int64_t>(slots) > pool[0])
    return Status::usage(pte + ": decode_batch takes at most " + std::to_string(pool[0]) + " KV slots; " +
                         std::to_string(slots) + " asked for");
  auto impl = std::make_unique<Impl>();
  impl->program = &program;
  impl->slots = slots;
  impl->rows = std::min<size_t>(slots, static_cast<size_t>(std::max<int64_t>(tokens[0], 1)));
  impl->row_tokens = static_cast<size_t>(std::max<int64_t>(tokens[1], 1));
  for (size_t s = 0; s < shapes.size(); ++s) {
    std::vector<int64_t> a = input_sizes(meta, 3 + kv.slabs + 2 * s);
    std::vector<int64_t> b = input_sizes(meta, 4 + kv.slabs + 2 * s);
    const LoraShape& shape = shapes[s];
    if (a != std::vector<int64_t>{tokens[0], shape.max_rank, shape.in} ||
        b != std::vector<int64_t>{tokens[0], shape.out, shape.max_rank})
      return Status::failure(pte + ": decode_batch's LoRA inputs of envelope slot " + std::to_string(s) +
                             " are not A [rows, " + std::to_string(shape.max_rank) + ", " + std::to_string(shape.in) +
                             "] and B [rows, " + std::to_string(shape.out) + ", " + std::to_string(shape.max_rank) +
                             "] (rebuild a program exported "
                             "before lora-share's exporter revision 13)");
    impl->a_rows.emplace_back(impl->rows * shape.in * shape.max_rank, 0.0f);
    impl->b_rows.emplace_back(impl->rows * shape.max_rank * shape.out, 0.0f);
  }
  impl->row_lora.resize(impl->rows);
  impl->row_data.resize(impl->rows, nullptr);
  impl->laid.assign(impl->rows, std::vector<int64_t>(shapes.size(), 0));
  impl->row_absent.assign(impl->rows, SlotMask(shapes.size(), true));
  return std::unique_ptr<BatchEngine>(new BatchEngine(std::move(impl)));
}

size_t BatchEngine::slots() const { return impl_->slots; }
size_t BatchEngine::rows() const { return impl_->rows; }
size_t BatchEngine::slot_bytes() const { return impl_->program->kv().layout.bytes(); }

size_t BatchEngine::bytes() const {
  size_t lora = 0;
  for (size_t s = 0; s < impl_->a_rows.size(); ++s)
    lora += (impl_->a_rows[s].size() + impl_->b_rows[s].size()) * sizeof(float);
  return impl_->slots * slot_bytes() + lora;
}

int64_t BatchEngine::vocab_size() const { return impl_->program->vocab_size(); }
int64_t BatchEngine::max_seq_len() const { return impl_->program->max_seq_len(); }
int64_t BatchEngine::prefill_chunk() const { return impl_->program->prefill_chunk(); }
bool BatchEngine::ring() const { return impl_->program->kv().layout.ring > 0; }
size_t BatchEngine::max_row_tokens() const { return impl_->row_tokens; }

Status BatchEngine::set_row(size_t row, const LoraData* lora) {
  Impl& e = *impl_;
  if (row >= e.rows)
    return Status::usage("set_row: row " + std::to_string(row) + " is outside the engine's " + std::to_string(e.rows) +
                         " rows");
  const std::vector<LoraShape>& shapes = e.program->lora_shapes();
  if (lora != nullptr && lora->slots().size() != shapes.size())
    return Status::usage("set_row: the adapter has " + std::to_string(lora->slots().size()) +
                         " LoRA slots; the program's envelope " + std::to_string(shapes.size()));
  // decode lays the row's A/B out at the rank of the step it runs in.
  e.row_data[row] = lora;
  std::fill(e.laid[row].begin(), e.laid[row].end(), 0);
  e.row_lora[row] = lora_input_tensors(lora, shapes, e.program->zeros());
  e.row_absent[row] = absent_slots(lora, shapes.size());
  return Status();
}

Status BatchEngine::prefill(size_t row, size_t slot, const std::vector<int64_t>& tokens, int64_t pos,
                            std::vector<float>* logits) {
  Impl& e = *impl_;
  Status s = e.check_row(row, "prefill");
  if (!s.ok()) return s;
  s = e.check_slot(slot, "prefill");
  if (!s.ok()) return s;
  if (static_cast<int64_t>(tokens.size()) > prefill_chunk())
    return Status::usage("prefill: " + std::to_string(tokens.size()) +
                         " tokens in one chunk; the program takes at most " + std::to_string(prefill_chunk()));
  return e.program->step_in(e.program->kv().at_slot(slot), e.row_lora[row], e.row_absent[row], tokens, pos, logits,
                            e.program->pte() + " (row " + std::to_string(row) + ", slot " + std::to_string(slot) + ")");
}

Status BatchEngine::copy_slot(size_t from, size_t to, int64_t positions) {
  Impl& e = *impl_;
  Status s = e.check_slot(from, "copy_slot");
  if (!s.ok()) return s;
  s = e.check_slot(to, "copy_slot");
  if (!s.ok()) return s;
  if (from == to) return Status();
  const KvCache& kv = e.program->kv();
  const KvLayout& layout = kv.layout;
  KvCache source = kv.at_slot(from), target = kv.at_slot(to);
  size_t row_bytes = static_cast<size_t>(layout.head_dim) * layout.value_bytes();
  for (int64_t j = 0; j < layout.slabs; ++j) {
    // Position p is row p + 1 (row 0 the sink); a ring's rows hold its last W positions in turn.
    int64_t rows = layout.is_ring[j] ? layout.rows(j) : std::min(positions + 1, layout.rows(j));
    std::memcpy(target.slab(j), source.slab(j), static_cast<size_t>(rows) * row_bytes);
  }
  return Status();
}

Status BatchEngine::decode(const std::vector<BatchRow>& rows, std::vector<float>* logits) {
  Impl& e = *impl_;
  size_t n = rows.size();
  if (n == 0 || n > e.rows)
    return Status::usage("decode: " + std::to_string(n) + " rows; the engine runs 1.." + std::to_string(e.rows));
  // Batch index b is the row's LoRA buffer row: rows 0..n-1 of them, read in place.
  std::vector<int64_t> tokens(n), pos(n), slots(n);
  std::vector<bool> row_seen(n, false), slot_seen(e.slots, false);
  for (const BatchRow& r : rows) {
    Status s = e.check_step_row("decode", r.row, r.slot, r.pos, 1, n, &row_seen, &slot_seen);
    if (!s.ok()) return s;
    s = e.check_token("decode", r.row, r.token);
    if (!s.ok()) return s;
    tokens[r.row] = r.token;
    pos[r.row] = r.pos;
    slots[r.row] = static_cast<int64_t>(r.slot);
  }
  std::vector<float> all;
  Status s = run(n, 1, tokens, pos, slots, &all);
  if (!s.ok()) return s;
  size_t vocab = static_cast<size_t>(vocab_size());
  logits->resize(n * vocab);
  for (size_t i = 0; i < n; ++i)
    std::memcpy(logits->data() + i * vocab, all.data() + rows[i].row * vocab, vocab * sizeof(float));
  return Status();
}

Status BatchEngine::verify(const std::vector<DraftRow>& rows, std::vector<float>* logits) {
  Impl& e = *impl_;
  size_t n = rows.size();
  if (e.row_tokens < 2)
    return Status::usage(e.program->pte() +
                         ": built by an older lora-share (its decode_batch takes one token per row): rebuild it "
                         "with this version to verify drafts");
  if (n == 0 || n > e.rows)
    return Status::usage("verify: " + std::to_string(n) + " rows; the engine runs 1.." + std::to_string(e.rows));
  size_t steps = 1;
  for (const DraftRow& r : rows) steps = std::max(steps, r.tokens.size());
  std::vector<int64_t> tokens(n * steps), pos(n), slots(n);
  std::vector<bool> row_seen(n, false), slot_seen(e.slots, false);
  for (const DraftRow& r : rows) {
    if (r.tokens.empty() || r.tokens.size() > e.row_tokens)
      return Status::usage("verify: row " + std::to_string(r.row) + " carries " + std::to_string(r.tokens.size()) +
                           " tokens; a row carries 1.." + std::to_string(e.row_tokens) +
                           " (its last token and its drafts)");
    Status s = e.check_step_row("verify", r.row, r.slot, r.pos, r.tokens.size(), n, &row_seen, &slot_seen);
    if (!s.ok()) return s;
    for (int64_t token : r.tokens) {
      s = e.check_token("verify", r.row, token);
      if (!s.ok()) return s;
    }
    // Padded with its last token: the padding runs after the row's tokens and is never read back.
    int64_t* mine = tokens.data() + r.row * steps;
    std::copy(r.tokens.begin(), r.tokens.end(), mine);
    std::fill(mine + r.tokens.size(), mine + steps, r.tokens.back());
    pos[r.row] = r.pos;
    slots[r.row] = static_cast<int64_t>(r.slot);
  }
  std::vector<float> all;
  Status s = run(n, steps, tokens, pos, slots, &all);
  if (!s.ok()) return s;
  size_t vocab = static_cast<size_t>(vocab_size()), total = 0;
  for (const DraftRow& r : rows) total += r.tokens.size();
  logits->resize(total * vocab);
  float* out = logits->data();
  for (const DraftRow& r : rows) {
    size_t count = r.tokens.size();
    std::memcpy(out, all.data() + r.row * steps * vocab, count * vocab * sizeof(float));
    out += count * vocab;
  }
  return Status();
}

Status BatchEngine::run(size_t n, size_t steps, const std::vector<int64_t>& tokens, const std::vector<int64_t>& pos,
                        const std::vector<int64_t>& slots, std::vector<float>* logits) {
  Impl& e = *impl_;
  int64_t vocab = vocab_size(), max_seq = max_seq_len();
  const KvCache& kv = e.program->kv();
  const KvLayout& layout = kv.layout;
  std::vector<TensorPtr> tensors;
  tensors.push_back(make_tensor_ptr({dim(n), dim(steps)}, const_cast<int64_t*>(tokens.data()), ScalarType::Long));
  tensors.push_back(make_tensor_ptr({dim(n)}, const_cast<int64_t*>(pos.data()), ScalarType::Long));
  tensors.push_back(make_tensor_ptr({dim(n)}, const_cast<int64_t*>(slots.data()), ScalarType::Long));
  // Every pool whole, in place: slot 0's slab j starts pool j.
  for (int64_t j = 0; j < layout.slabs; ++j)
    tensors.push_back(make_tensor_ptr(
        {dim(kv.pool_slots), static_cast<SizesType>(layout.rows(j)), static_cast<SizesType>(layout.head_dim)},
        kv.at_slot(0).slab(j), layout.dtype));
  const std::vector<LoraShape>& shapes = e.program->lora_shapes();
  // The slots no row of the step has: the step runs the program without them (program_variants.h).
  SlotMask absent(shapes.size(), false);
  for (size_t s = 0; s < shapes.size(); ++s) {
    // The step's rank: the largest of its rows' (at least 1), not the envelope's: the products'
    // work scales with it (the demo's rank-8 adapters sit in a rank-16 envelope). Rows are laid out
    // again only when the step's rank changes (a row of a larger rank joins, or the largest leaves).
    int64_t rank = 0;
    for (size_t b = 0; b < n; ++b) rank = std::max(rank, e.rank_of(b, s));
    absent[s] = rank == 0;
    rank = std::max<int64_t>(rank, 1);
    // Rows laid out at another rank overlap this step's places: lay them out again when they run.
    for (std::vector<int64_t>& row : e.laid)
      if (row[s] != rank) row[s] = 0;
    for (size_t b = 0; b < n; ++b)
      if (e.laid[b][s] != rank) e.lay_out(b, s, rank);
    SizesType in = static_cast<SizesType>(shapes[s].in), out = static_cast<SizesType>(shapes[s].out);
    SizesType r = static_cast<SizesType>(rank);
    tensors.push_back(make_tensor_ptr({dim(n), r, in}, e.a_rows[s].data(), ScalarType::Float));
    tensors.push_back(make_tensor_ptr({dim(n), out, r}, e.b_rows[s].data(), ScalarType::Float));
  }
  std::vector<EValue> inputs;
  for (const TensorPtr& t : tensors) inputs.emplace_back(*t);
  auto outputs = e.program->run_batch(inputs, absent);
  if (!outputs.ok()) return outputs.status();
  std::string what = e.program->pte() + ": decode_batch";
  size_t entries = n * steps;
  const EValue& head = (*outputs)[0];
  if (!head.isTensor() || head.toTensor().scalar_type() != ScalarType::Float ||
      static_cast<size_t>(head.toTensor().numel()) != entries * static_cast<size_t>(vocab))
    return Status::failure(what + " did not return float32 logits [" + std::to_string(entries) + ", " +
                           std::to_string(vocab) + "]");
  const float* all = head.toTensor().const_data_ptr<float>();
  logits->assign(all, all + entries * static_cast<size_t>(vocab));

  // Output g + 1: [entries, heads, hd], each entry's new key or value of slabs g * heads.. at its position.
  // A program that takes drafts has written them into the pools already.
  if (e.row_tokens > 1) return Status();
  int64_t heads = layout.slabs_per_group();
  size_t row_bytes = static_cast<size_t>(layout.head_dim) * layout.value_bytes();
  for (int64_t g = 0; g < layout.groups; ++g) {
    const EValue& value = (*outputs)[static_cast<size_t>(g) + 1];
    if (!value.isTensor() || value.toTensor().scalar_type() != layout.dtype ||
        static_cast<size_t>(value.toTensor().numel()) != entries * heads * layout.head_dim)
      return Status::failure(what + ": output " + std::to_string(g + 1) + " is not [" + std::to_string(entries) + ", " +
                             std::to_string(heads) + ", " + std::to_string(layout.head_dim) + "] " +
                             (layout.dtype == ScalarType::Half ? "float16" : "float32") +
                             " (the new rows of KV slabs " + std::to_string(g * heads) + "..)");
    const uint8_t* block = static_cast<const uint8_t*>(value.toTensor().const_data_ptr());
    for (size_t b = 0; b < n; ++b) {
      KvCache slot = kv.at_slot(static_cast<size_t>(slots[b]));
      for (int64_t h = 0; h < heads; ++h) {
        int64_t slab = g * heads + h;
        int64_t at = layout.is_ring[slab] ? 1 + pos[b] % layout.ring : pos[b] + 1;
        // The context's last position has no row: no later call reads it.
        if (!layout.is_ring[slab] && at >= max_seq) continue;
        std::memcpy(slot.slab(slab) + at * row_bytes, block + (b * heads + h) * row_bytes, row_bytes);
      }
    }
  }
  return Status();
}

}  // namespace lora_share
