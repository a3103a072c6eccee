// xgrammar's log lines and fatal errors, routed through lora-share (xgrammar
// is built with XGRAMMAR_LOG_CUSTOMIZE, cmake/xgrammar.cmake): a library must
// not print on its host's stderr, and what xgrammar only warns about (a JSON
// schema keyword it ignores, a range it cannot enforce) must become a
// refusal, or an answer would not follow the constraint the caller gave.
//
// Fatal errors (XGRAMMAR_CHECK on a bad grammar, schema or regex) are thrown
// as std::runtime_error carrying xgrammar's message; callers catch them.
#pragma once

#include <string>
#include <vector>

namespace lora_share::constraint {

// Hands `message` to every XgrammarWarnings alive on this thread (the log handler's).
void record_xgrammar_warning(const std::string& message);

// The warnings xgrammar logs on this thread while one is alive (nested ones
// each see what was logged during their own life).
class XgrammarWarnings {
 public:
  XgrammarWarnings();
  ~XgrammarWarnings();
  XgrammarWarnings(const XgrammarWarnings&) = delete;
  XgrammarWarnings& operator=(const XgrammarWarnings&) = delete;
  const std::vector<std::string>& list() const { return warnings_; }

 private:
  friend void record_xgrammar_warning(const std::string& message);
  std::vector<std::string> warnings_;
  XgrammarWarnings* outer_;
};

}  // namespace lora_share::constraint
