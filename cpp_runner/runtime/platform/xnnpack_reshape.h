// Re-plans an XNNPACK runtime only when one of its inputs changed shape.
//
// Why: ExecuTorch's XNNPACK delegate (XNNExecutor::prepare_args, 1.5.1) calls
// xnn_reshape_runtime on every execute. That re-runs every operator's reshape
// (output shapes, tiling, workspace sizes) even when no input changed shape,
// which is the case for every decoded token: the decode method's delegates
// take one token and fixed-size LoRA inputs. At SmolLM2-135M 8da4w that is
// ~2,000 operators a token, 11% of decode on 2 threads (perf), spent on the
// calling thread while the pool's other thread spins. XNNPACK's own contract
// is: reshape when a shape changes, setup when a pointer changes; the delegate
// still sets every runtime up on every call, so new buffers are always seen.
//
// How: this library defines xnn_reshape_external_value, xnn_reshape_runtime
// and xnn_delete_runtime with default visibility. The delegate calls them
// through its PLT, and liblora_share precedes libexecutorch_backend_xnnpack in
// the dynamic linker's lookup order (it depends on it), so these definitions
// run and forward to the backend's (dlsym RTLD_NEXT). A runtime is reshaped
// for real on its first call, after any input's shape changed, and after a
// failed reshape; otherwise the call returns success at once. A runtime that
// shares its workspace with another stays correct when the other grows it:
// XNNPACK moves every user's pointers and sets them up again.
//
// LORA_SHARE_XNNPACK_RESHAPE=every-call turns the skipping off (the delegate's
// own behaviour), for comparison.
#pragma once

#include <cstdint>

namespace lora_share {

struct ReshapeCounts {
  uint64_t run = 0;      // xnn_reshape_runtime calls passed to XNNPACK
  uint64_t skipped = 0;  // calls answered without it (no input changed shape)
};

// Process-wide counts since the library loaded.
ReshapeCounts reshape_counts();

}  // namespace lora_share
