// AdapterPool's mixes (adapter_pool.h, mix): several registered adapters with
// scales, run as one adapter. A deployment's adapters are inputs of one
// program, so a mix is data too: on each envelope slot, the terms' A stacked
// along the rank and their B scaled and stacked (LoraData::compose), while
// the summed rank fits the envelope.
#include <malloc.h>

#include <charconv>
#include <cmath>
#include <map>

#include "adapter_pool.h"
#include "lora_share.h"

namespace lora_share {
namespace {

// The shortest text that reads back as `x` ("0.5", "-1.1", "1").
std::string shortest(double x) {
  char text[32];
  auto end = std::to_chars(text, text + sizeof(text), x).ptr;
  return std::string(text, end);
}

std::string slot_name(const EnvelopeSlot& slot) { return slot.target + " in layer " + std::to_string(slot.layer); }

}  // namespace

StatusOr<size_t> AdapterPool::mix(const std::vector<std::pair<size_t, double>>& terms) {
  if (terms.empty()) return Status::usage("a mix needs at least one adapter (no terms given)");
  if (options_.stock)
    return Status::usage(
        "a mix runs through the shared program, which stock loading (a Module per "
        "adapter) does not load");
  const Entry& first = entries_[terms[0].first];
  std::string name;
  for (size_t i = 0; i < terms.size(); ++i) {
    const auto& [index, scale] = terms[i];
    const Entry& e = entries_[index];
    // NaN fails the comparison too (lora_share.h, LS_MAX_LORA_SCALE, says why the bound).
    if (!(std::fabs(scale) <= LS_MAX_LORA_SCALE))
      return Status::usage("term " + std::to_string(i) + " ('" + e.name + "'): the scale " + shortest(scale) +
                           " is outside [-" + shortest(LS_MAX_LORA_SCALE) + ", " + shortest(LS_MAX_LORA_SCALE) +
                           "]: give a scale within it (1 is the adapter as trained)");
    // Skip-absent builds give adapters with other slots another program
    // variant, whose absent slots are dead code: a mix needs all its LoRA live.
    if (e.program != first.program)
      return Status::usage("'" + first.name + "' and '" + e.name +
                           "' carry different program variants (lora_envelope.skip_absent gives "
                           "adapters on other slots their own): only adapters on the same slots mix");
    name += (i ? "+" : "") + e.name + "*" + shortest(scale);
  }
  int64_t known = find(name);
  if (known >= 0 && is_mix(static_cast<size_t>(known))) {
    mixes_[static_cast<size_t>(known)].holds++;
    return static_cast<size_t>(known);
  }
  if (known >= 0) return Status::usage("an adapter is named '" + name + "', the name of this mix: rename the file");

  // The summed rank on each slot against the envelope, from the records: no
  // file is mapped for a mix that cannot run.
  const Record& record = first.info.record;
  std::map<uint32_t, uint32_t> ranks;     // slot -> summed rank
  std::map<uint32_t, std::string> parts;  // slot -> "a 4 + b 3"
  uint64_t bytes = 0;                     // the mix's tensors: its terms', hoisted ones included
  for (const auto& [index, scale] : terms) {
    const Entry& e = entries_[index];
    for (const LoraKeys& keys : e.info.record.lora) {
      ranks[keys.slot] += keys.rank;
      parts[keys.slot] += (parts[keys.slot].empty() ? "" : " + ") + e.name + " " + std::to_string(keys.rank);
      for (const std::string* key : {&keys.a, &keys.b}) {
        auto own = e.info.own_ranges.find(*key);
        std::string path;
        const PtdEntry* shared = own == e.info.own_ranges.end() ? files_.find(*key, &path) : nullptr;
        bytes += own != e.info.own_ranges.end() ? own->second.second : shared ? shared->size : 0;
      }
    }
  }
  for (const auto& [slot, rank] : ranks)
    if (rank > record.envelope_max_rank)
      return Status::usage("the mix " + name + " sums rank " + std::to_string(rank) + " on " +
                           slot_name(record.envelope[slot]) + " (" + parts[slot] + "), above the envelope's max rank " +
                           std::to_string(record.envelope_max_rank) +
                           ": drop a term, or rebuild with a larger lora_envelope.max_rank");

  Entry mix;
  mix.name = name;
  mix.pte = first.pte;  // the file its program is read from
  mix.program = first.program;
  mix.terms = terms;
  mix.holds = 1;
  mix.cost = adapter_cost_bytes(bytes, options_.adapter_overhead_bytes);
  Status s = check_budget_holds(mix);
  if (!s.ok()) return s;
  size_t index = next_mix_++;
  mixes_.emplace(index, std::move(mix));
  return index;
}

StatusOr<bool> AdapterPool::release_mix(size_t index) {
  auto it = mixes_.find(index);
  if (it == mixes_.end() || it->second.removed)
    return Status::usage("not a mix held now: only a mix's handle is released, once per ls_adapter_mix");
  if (--it->second.holds > 0) return false;
  it->second.removed = true;
  return true;
}

void AdapterPool::drop_mix(size_t index) {
  mixes_.erase(index);
  malloc_trim(0);  // its composed tensors go back to the kernel, as an eviction's do
}

StatusOr<std::unique_ptr<LoraData>> AdapterPool::compose(const Entry& mix, const SharedProgram& program) {
  // Each term's data is mapped (or found in adapters_shared.ptd) as when it is
  // loaded, copied into the mix's, then unmapped.
  std::vector<std::unique_ptr<LoraData>> data;
  std::vector<LoraData::Term> terms;
  for (const auto& [index, scale] : mix.terms) {
    const Entry& e = entries_[index];
    if (e.removed)
      return Status::usage("the mix " + mix.name + " cannot be composed again: its adapter '" + e.name +
                           "' was removed");
    auto d = LoraData::open(e.pte, e.info, *foundation_, program.lora_shapes());
    if (!d.ok()) return d.status();
    data.push_back(std::move(d.value()));
    terms.push_back({data.back().get(), scale});
  }
  std::vector<std::string> names;
  for (const EnvelopeSlot& slot : entries_[mix.terms[0].first].info.record.envelope) names.push_back(slot_name(slot));
  return LoraData::compose(terms, program.lora_shapes(), names);
}

}  // namespace lora_share
