// OpenAI's `stop`: generation ends at the first of these strings, and no part
// of it reaches the client. Text arrives piece by piece (one decoded token at
// a time) and a stop string may span pieces, so the end of the text that
// could still be the start of one is held back until the next piece says
// whether it is.
#pragma once

#include <string>
#include <vector>

namespace lora_share::requests {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Takes the next piece of text; returns what may be sent now. Once a stop
  // string appears, the text before it is returned, stopped() is true and
  // nothing more comes out.
  std::string push(const std::string& piece);
  // The text still held back, once generation has ended without a stop.
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace lora_share::requests
