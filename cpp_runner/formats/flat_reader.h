// A bounds-checked flatbuffer reader: every offset, vtable, vector and
// string is checked against [start, end) before it is read, lengths are
// checked against the bytes really present, and arithmetic is done in 64 bits
// on values that cannot overflow (positions < 2^63, lengths < 2^35). The
// first failure is remembered as a message and later reads return zero, so
// callers check failed() once after a batch of reads.
//
// Written for the runner's own checks of .ptd/.pte files and lora-share's
// metadata (schema/lora_share.fbs) before ExecuTorch sees them; flatbuffers'
// C++ headers are not a dependency.
#pragma once

#include <cstdint>
#include <string>

namespace lora_share {

class FlatReader {
 public:
  struct Table {
    uint64_t pos = 0;
    uint64_t vtable = 0;
    uint16_t vtable_size = 0;
    uint16_t size = 0;
    bool present = false;
  };
  struct Vector {
    uint64_t first = 0;  // position of element 0
    uint32_t count = 0;
    bool present = false;
  };

  // The flatbuffer occupies data[start, end).
  FlatReader(const uint8_t* data, uint64_t start, uint64_t end);

  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

  // The 4-byte file identifier after the root offset.
  std::string identifier() const;
  Table root(const char* type_name);
  Table table(const Table& t, int slot, const char* type_name);
  // Element i of a vector of tables.
  Table table_at(const Vector& v, uint32_t i, const char* type_name);
  Vector vector(const Table& t, int slot, uint64_t element_size);
  // A string field (empty if absent).
  std::string string(const Table& t, int slot);

  uint8_t u8(const Table& t, int slot, uint8_t fallback = 0);
  uint32_t u32(const Table& t, int slot, uint32_t fallback = 0);
  uint64_t u64(const Table& t, int slot, uint64_t fallback = 0);
  // Element i of a scalar vector (the vector was bounds-checked when read).
  uint32_t u32_at(const Vector& v, uint32_t i) const;
  int32_t i32_at(const Vector& v, uint32_t i) const;
  uint8_t u8_at(const Vector& v, uint32_t i) const;

  void fail(const std::string& message);

 private:
  bool need(uint64_t pos, uint64_t size, const char* what);
  uint64_t field(const Table& t, int slot, uint64_t size);  // 0 = absent
  uint32_t load_u32(uint64_t pos) const;
  uint64_t target(const Table& t, int slot);  // 0 = absent
  Table table_from(uint64_t pos, const char* type_name);

  const uint8_t* data_;
  uint64_t start_, end_;
  std::string error_;
};

}  // namespace lora_share
