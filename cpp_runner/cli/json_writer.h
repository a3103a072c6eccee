// A minimal JSON writer: the runner only writes flat objects, arrays of
// numbers and strings, so a few dozen lines beat a dependency.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lora_share {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& name);
  JsonWriter& value(const std::string& s);
  JsonWriter& value(const char* s) { return value(std::string(s)); }
  JsonWriter& value(int64_t v);
  JsonWriter& value(double v);                 // non-finite -> null
  JsonWriter& value(std::optional<double> v);  // nullopt -> null
  JsonWriter& value(bool v);
  JsonWriter& value(const std::vector<int64_t>& v);
  JsonWriter& null();

  const std::string& str() const { return out_; }

 private:
  void separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace lora_share
