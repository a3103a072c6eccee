#include "stop_strings.h"

#include <algorithm>

namespace lora_share::requests {

std::string StopStrings::push(const std::string& piece) {
  if (stopped_) return "";
  held_ += piece;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // The longest end of the text that begins a stop string stays held. Every
  // stop string is whole UTF-8, so what is sent ends on a character boundary.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(stop.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::finish() {
  std::string out = stopped_ ? "" : held_;
  held_.clear();
  return out;
}

}  // namespace lora_share::requests
