// An adapter's name: its .pte file's stem ("out/x/support_bot.pte" ->
// "support_bot"), as the runner's --adapter and the library's by-name lookups
// use it. Header-only so the library does not depend on the runner's flags.
#pragma once

#include <string>

namespace lora_share {

inline std::string file_stem(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  size_t dot = base.find_last_of('.');
  return (dot == std::string::npos || dot == 0) ? base : base.substr(0, dot);
}

}  // namespace lora_share
