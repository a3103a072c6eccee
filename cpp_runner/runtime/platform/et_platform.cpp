#include "et_platform.h"

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>

namespace lora_share {
namespace {

bool g_verbose = false;
// Per thread: runtimes of the library may run on several threads at once,
// and each quotes the error its own call logged.
thread_local std::string g_last_error;
bool g_crash_guard = false;  // init_platform installed the crash handlers
std::once_flag g_runtime_once;

// The crash guard's message lives in a fixed buffer: a signal handler may only
// call async-signal-safe functions, so it cannot format or allocate.
char g_crash_message[1024] = "error: the runner crashed\n";
size_t g_crash_message_len = std::strlen(g_crash_message);

void emit_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*, size_t line,
              const char* message, size_t length) {
  std::string text(message, length);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (level == kError || level == kFatal) g_last_error = text;
  if (g_verbose) {
    std::fprintf(stderr, "[executorch %c %s:%zu] %s\n", static_cast<char>(level), filename ? filename : "?", line,
                 text.c_str());
  }
}

// ExecuTorch calls this on internal fatal errors (ET_CHECK). Exit with the
// run-error code and a readable line rather than SIGABRT.
void on_abort() {
  std::fprintf(stderr, "error: ExecuTorch stopped on an internal check%s%s\n", g_last_error.empty() ? "" : ": ",
               g_last_error.c_str());
  std::fflush(stderr);
  _exit(1);
}

void on_crash(int) {
  ssize_t ignored = write(STDERR_FILENO, g_crash_message, g_crash_message_len);
  (void)ignored;
  _exit(1);
}

// Registers the PAL and initialises the runtime, once; `abort_hook` only
// takes effect on the first call.
void init_runtime_once(void (*abort_hook)()) {
  std::call_once(g_runtime_once, [abort_hook] {
    executorch::runtime::register_pal(executorch::runtime::PalImpl::create(
        /*init=*/nullptr, /*abort=*/abort_hook, /*current_ticks=*/nullptr,
        /*ticks_to_ns_multiplier=*/nullptr, /*emit_log_message=*/emit_log,
        /*allocate=*/nullptr, /*free=*/nullptr, __FILE__));
    executorch::runtime::runtime_init();
  });
}

}  // namespace

void init_platform_for_library() { init_runtime_once(/*abort_hook=*/nullptr); }

void init_platform(bool verbose) {
  g_verbose = verbose;
  init_runtime_once(on_abort);
  g_crash_guard = true;

  // A foundation whose tensors have the right names but the wrong shapes can
  // make a delegate read past a mapped tensor. Report that as a run error
  // instead of dying by signal.
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_crash;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &action, nullptr);
  // A reader that goes away (e.g. a --serve client) should make writes fail,
  // not kill the process silently.
  signal(SIGPIPE, SIG_IGN);
}

void set_phase(const std::string& phase) {
  if (!g_crash_guard) return;  // the library: no handler reads the message
  std::string text = "error: the runner crashed while " + phase + "\n";
  size_t n = std::min(text.size(), sizeof(g_crash_message) - 1);
  // Blocking the signals while the buffer changes keeps the handler from
  // printing half of an old and half of a new message.
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  std::memcpy(g_crash_message, text.data(), n);
  g_crash_message[n] = '\0';
  g_crash_message_len = n;
  sigprocmask(SIG_SETMASK, &old, nullptr);
}

std::string last_runtime_error() { return g_last_error; }
void clear_last_runtime_error() { g_last_error.clear(); }

}  // namespace lora_share
