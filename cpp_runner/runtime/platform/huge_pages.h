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

// Reads the file `fd` into the page cache in 2 MiB folios, so that every
// process mapping it (XNNPACK maps the packed-weights file, packed_cache.h)
// gets 2 MiB pages. Why: a file written with write() sits in the page cache
// in 4 KiB folios, and a mapping of those streams the weights through 4 KiB
// TLB entries: measured here, fp32 decode of SmolLM2-135M from the mapped
// file ran at 43 tokens/s against 57 packed in memory. The cache's folios are
// chosen when the pages are read, so `drop_cached` first drops the file's
// clean cached pages (a file this process just wrote and synced, mapped by no
// one), then a read through a MADV_HUGEPAGE mapping brings it back in 2 MiB
// folios (FilePmdMapped in smaps); later processes find it so (~3 ms for
// 540 MB). Nothing changes where the kernel or the file system cannot.
void settle_file_in_huge_folios(int fd, bool drop_cached);

}  // namespace lora_share
