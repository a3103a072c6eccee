// Process-wide hooks into ExecuTorch's platform layer.
//
// ExecuTorch prints its own log lines to stderr and calls abort() on internal
// fatal errors. The runner promises one clear "error: ..." line and an exit
// code instead, so it routes the log into a small buffer (quoted in error
// messages, printed only with --verbose) and turns an abort or a crash into
// an error line naming what the runner was doing at the time.
#pragma once

#include <string>

namespace lora_share {

// Registers the log/abort hooks, installs the crash guard and initialises the
// ExecuTorch runtime. Call once, first thing in main.
void init_platform(bool verbose);

// For the library (lora_share.h): routes ExecuTorch's log into the buffer
// and initialises the runtime, once per process, unless init_platform already
// did. It installs no signal handlers and no exit-on-abort: those belong to
// the application that embeds the library.
void init_platform_for_library();

// Describes the current phase ("loading a.pte with foundation.ptd") for the
// crash guard's message.
void set_phase(const std::string& phase);

// The most recent ExecuTorch error-level log line, or "" if none; cleared by
// clear_last_runtime_error().
std::string last_runtime_error();
void clear_last_runtime_error();

}  // namespace lora_share
