#include "xgrammar_log.h"

#include <stdexcept>

namespace lora_share::constraint {
namespace {

thread_local XgrammarWarnings* current = nullptr;

}  // namespace

XgrammarWarnings::XgrammarWarnings() : outer_(current) { current = this; }
XgrammarWarnings::~XgrammarWarnings() { current = outer_; }

void record_xgrammar_warning(const std::string& message) {
  for (XgrammarWarnings* w = current; w != nullptr; w = w->outer_) w->warnings_.push_back(message);
}

}  // namespace lora_share::constraint

// The two handlers xgrammar's support/logging.h declares when it is built with
// XGRAMMAR_LOG_CUSTOMIZE=1 (its internal header: the signatures are repeated here).
namespace xgrammar {

constexpr int kLogLevelWarning = 2;  // XGRAMMAR_LOG_LEVEL_WARNING

[[noreturn]] void LogFatalImpl(const std::string& file, int lineno, const std::string& message);
void LogMessageImpl(const std::string& file, int lineno, int level, const std::string& message);

// The message alone: the caller names the request field it came from; xgrammar's
// source file and line would mean nothing to the one who wrote the schema.
void LogFatalImpl(const std::string&, int, const std::string& message) { throw std::runtime_error(message); }

// Info and debug lines are dropped; warnings are kept for the compile that logged them.
void LogMessageImpl(const std::string&, int, int level, const std::string& message) {
  if (level >= kLogLevelWarning) lora_share::constraint::record_xgrammar_warning(message);
}

}  // namespace xgrammar
