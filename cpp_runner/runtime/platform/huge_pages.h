// Backs the process's packed weights with 2 MiB pages.
//
// Why: every decoded token streams all of XNNPACK's packed weights (540 MB at
// SmolLM2-135M in float32) through the CPU once. XNNPACK packs them into
// plain heap memory, which Linux maps with 4 KiB pages unless the program
// asks otherwise (transparent huge pages default to "madvise" on most
// distributions): one TLB entry per 4 KiB streamed. 2 MiB pages cut the page
// walks 512-fold. llama.cpp gets them without asking: its memory-mapped GGUF
// sits in the page cache's 2 MiB folios (FilePmdMapped in smaps). Measured
// here: decode +2 to +4% (SmolLM2-135M, fp32 and 8da4w, 2 threads), load
// +0.25 s for 450 MB collapsed.
#pragma once

namespace lora_share {

// Collapses into 2 MiB pages every 2 MiB-aligned range of private anonymous
// memory whose 4 KiB pages are all resident (MADV_COLLAPSE, Linux 6.1+): the
// packed weights once a program has loaded, without growing the process (a
// range with one page absent is left as it is). Nothing changes where the
// kernel has no MADV_COLLAPSE or transparent huge pages are off; the kernel's
// AnonHugePages (memory_stats.h, huge_kb) says what was collapsed.
// `threads` share the kernel's copying (0: one per core, at most 8).
void collapse_resident_memory(int threads);

}  // namespace lora_share
