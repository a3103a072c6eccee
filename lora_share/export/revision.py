"""What names an export, for the code that writes and checks a deployment without exporting
(``lora-share add``, deploy/writer.py): no torch import."""

FOUNDATION_TAG = "foundation"  # -> foundation.ptd
# The revision of the exported graph. Part of every program's signature and of the check that
# keeps an earlier build's files: raise it whenever the model or the export passes change what
# a program computes or how, so that a rebuild exports again instead of reusing stale programs.
# 2: attention over the written prefix, prefill chunks, the KV cache updated in place.
# 3: the KV cache belongs to the runtime and is handed to forward in place, one slab per layer, K/V
#    and key/value head; past keys and LoRA weights are the delegate's inputs (model/decoder.py, _partitioner).
# 4: LoRA weights are forward's inputs, one program per envelope (model/envelope.py); adapters are data.
# 5: views, static slices and float32 <-> float16 casts run inside XNNPACK (export/xnnpack_ops.py).
# 6: an asymmetric int4 grid's group sums by a row of ones, once per input (model.Linear.group_sums).
# 7: a quantized foundation's q/k/v and gate/up as one linear each (model.fused_linear).
# 8: the position is forward's input; the slabs' views may be longer than the past (model.kv_view_rows).
# 9: a second method, decode: one token, each layer's attention one lora_share::attend call.
# 10: decode's attention from the projections to o_proj's input one lora_share::rope_attend call.
# 11: a third method, decode_batch, in every build: one token for each of several rows, each its own
#     position, KV slot and LoRA (docs/batching.md); runtimes with several slots run it.
# 12: decode_batch with a quantized embedding too (constant propagation's scalars kept per method).
# 13: decode_batch's LoRA inputs untransposed, A [B, r, in] and B [B, out, r], the first operand of
#     their products: XNNPACK packs a product's second operand at every call, and packing the rows'
#     At/Bt was most of a step's LoRA cost; the rows' activations are packed instead (one column).
# 14: decode_batch's rows carry 1..MAX_DRAFTS + 1 tokens each (a row's last token and drafts to verify,
#     tokens [B, T]), and its attention (lora_share::rope_write_attend_rows) writes every entry's keys and
#     values into its KV slot before any entry attends; Gemma 3's rings keep MAX_DRAFTS spare slots
#     (get_ring_size), so that drafts written ahead never overwrite a position the window still reads.
EXPORTER_REVISION = 14
