// lora_share_diag.h's ls_diag_slots_*: the slot table alone, so that tests
// check it against lora_share/inference/batching.py's Slots without a program.
#include <new>

#include "lora_share_diag.h"
#include "slot_table.h"

struct ls_diag_slots {
  lora_share::SlotTable table;
};

extern "C" {

ls_diag_slots* ls_diag_slots_new(size_t slots, int ring) {
  return new (std::nothrow) ls_diag_slots{lora_share::SlotTable(slots, ring != 0)};
}

void ls_diag_slots_free(ls_diag_slots* table) { delete table; }

int ls_diag_slots_claim(ls_diag_slots* table, uint64_t adapter, const int64_t* tokens, size_t n, size_t* slot,
                        size_t* kept) {
  auto claim = table->table.claim(adapter, std::vector<int64_t>(tokens, tokens + n));
  if (!claim) return 1;
  *slot = claim->slot;
  *kept = claim->kept;
  return 0;
}

void ls_diag_slots_fed(ls_diag_slots* table, size_t slot, const int64_t* tokens, size_t n) {
  table->table.fed(slot, tokens, n);
}

void ls_diag_slots_release(ls_diag_slots* table, size_t slot) { table->table.release(slot); }

void ls_diag_slots_hits(const ls_diag_slots* table, uint64_t* hits, uint64_t* tokens) {
  *hits = table->table.prefix_hits();
  *tokens = table->table.prefix_tokens();
}

}  // extern "C"
