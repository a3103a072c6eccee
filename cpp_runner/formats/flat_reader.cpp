#include "flat_reader.h"

#include <cstring>

namespace lora_share {

FlatReader::FlatReader(const uint8_t* data, uint64_t start, uint64_t end) : data_(data), start_(start), end_(end) {
  if (end_ < start_ || end_ - start_ < 8)
    fail("flatbuffer of " + std::to_string(end_ > start_ ? end_ - start_ : 0) +
         " bytes is too short to hold a root table");
}

void FlatReader::fail(const std::string& message) {
  if (error_.empty()) error_ = message;
}

bool FlatReader::need(uint64_t pos, uint64_t size, const char* what) {
  if (failed()) return false;
  if (pos < start_ || pos > end_ || size > end_ - pos) {
    fail(std::string("malformed flatbuffer: ") + what + " at byte " + std::to_string(pos) + " (+" +
         std::to_string(size) + ") is outside the flatbuffer");
    return false;
  }
  return true;
}

uint32_t FlatReader::load_u32(uint64_t pos) const {
  uint32_t v;
  std::memcpy(&v, data_ + pos, 4);  // little-endian hosts only (x86, arm)
  return v;
}

std::string FlatReader::identifier() const {
  if (end_ - start_ < 8) return "";
  return std::string(reinterpret_cast<const char*>(data_ + start_ + 4), 4);
}

FlatReader::Table FlatReader::table_from(uint64_t pos, const char* type_name) {
  Table t;
  if (!need(pos, 4, type_name)) return t;
  int32_t soffset;
  std::memcpy(&soffset, data_ + pos, 4);
  int64_t vtable = static_cast<int64_t>(pos) - soffset;
  if (vtable < static_cast<int64_t>(start_)) {
    fail(std::string("malformed flatbuffer: ") + type_name + " vtable is outside the flatbuffer");
    return t;
  }
  if (!need(vtable, 4, type_name)) return t;
  uint16_t vt_size, size;
  std::memcpy(&vt_size, data_ + vtable, 2);
  std::memcpy(&size, data_ + vtable + 2, 2);
  if (vt_size < 4 || vt_size % 2 || size < 4) {
    fail(std::string("malformed flatbuffer: ") + type_name + " has an impossible vtable");
    return t;
  }
  if (!need(vtable, vt_size, type_name) || !need(pos, size, type_name)) return t;
  t.pos = pos;
  t.vtable = static_cast<uint64_t>(vtable);
  t.vtable_size = vt_size;
  t.size = size;
  t.present = true;
  return t;
}

FlatReader::Table FlatReader::root(const char* type_name) {
  if (!need(start_, 4, type_name)) return Table();
  return table_from(start_ + load_u32(start_), type_name);
}

uint64_t FlatReader::field(const Table& t, int slot, uint64_t size) {
  if (failed() || !t.present) return 0;
  uint64_t entry = 4 + 2 * static_cast<uint64_t>(slot);
  if (entry + 2 > t.vtable_size) return 0;
  uint16_t offset;
  std::memcpy(&offset, data_ + t.vtable + entry, 2);
  if (offset == 0) return 0;
  if (offset + size > t.size) {
    fail("malformed flatbuffer: a field runs past the end of its table");
    return 0;
  }
  return t.pos + offset;
}

uint64_t FlatReader::target(const Table& t, int slot) {
  uint64_t pos = field(t, slot, 4);
  if (pos == 0 || !need(pos, 4, "offset")) return 0;
  return pos + load_u32(pos);
}

FlatReader::Table FlatReader::table(const Table& t, int slot, const char* type_name) {
  uint64_t pos = target(t, slot);
  return pos == 0 ? Table() : table_from(pos, type_name);
}

FlatReader::Vector FlatReader::vector(const Table& t, int slot, uint64_t element_size) {
  Vector v;
  uint64_t pos = target(t, slot);
  if (pos == 0 || !need(pos, 4, "vector length")) return v;
  uint32_t count = load_u32(pos);
  if (!need(pos + 4, static_cast<uint64_t>(count) * element_size, "vector")) return v;
  v.first = pos + 4;
  v.count = count;
  v.present = true;
  return v;
}

FlatReader::Table FlatReader::table_at(const Vector& v, uint32_t i, const char* type_name) {
  if (failed() || !v.present || i >= v.count) return Table();
  uint64_t slot = v.first + 4 * static_cast<uint64_t>(i);
  return table_from(slot + load_u32(slot), type_name);
}

std::string FlatReader::string(const Table& t, int slot) {
  Vector v = vector(t, slot, 1);
  if (!v.present) return "";
  return std::string(reinterpret_cast<const char*>(data_ + v.first), v.count);
}

uint8_t FlatReader::u8(const Table& t, int slot, uint8_t fallback) {
  uint64_t pos = field(t, slot, 1);
  return pos == 0 ? fallback : data_[pos];
}

uint32_t FlatReader::u32(const Table& t, int slot, uint32_t fallback) {
  uint64_t pos = field(t, slot, 4);
  return pos == 0 ? fallback : load_u32(pos);
}

uint64_t FlatReader::u64(const Table& t, int slot, uint64_t fallback) {
  uint64_t pos = field(t, slot, 8);
  if (pos == 0) return fallback;
  uint64_t v;
  std::memcpy(&v, data_ + pos, 8);
  return v;
}

uint32_t FlatReader::u32_at(const Vector& v, uint32_t i) const {
  return load_u32(v.first + 4 * static_cast<uint64_t>(i));
}

int32_t FlatReader::i32_at(const Vector& v, uint32_t i) const {
  int32_t x;
  std::memcpy(&x, data_ + v.first + 4 * static_cast<uint64_t>(i), 4);
  return x;
}

uint8_t FlatReader::u8_at(const Vector& v, uint32_t i) const { return data_[v.first + i]; }

}  // namespace lora_share
