#include "npy_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "lora_record.h"

namespace lora_share {
namespace {

void put16(std::string& s, uint32_t v) {
  s += static_cast<char>(v & 0xff);
  s += static_cast<char>((v >> 8) & 0xff);
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xffff);
  put16(s, v >> 16);
}

// A zip of `members` stored (not compressed), as numpy.savez writes them.
std::string zip_stored(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out, central;
  for (const auto& [name, data] : members) {
    uint32_t crc = crc32(0, reinterpret_cast<const uint8_t*>(data.data()), data.size());
    uint32_t offset = static_cast<uint32_t>(out.size());
    std::string common;  // version, flags, method 0 (stored), time, date, crc, sizes, name length
    put16(common, 20);
    put16(common, 0);
    put16(common, 0);
    put16(common, 0);
    put16(common, 0x21);
    put32(common, crc);
    put32(common, static_cast<uint32_t>(data.size()));
    put32(common, static_cast<uint32_t>(data.size()));
    put16(common, static_cast<uint16_t>(name.size()));
    put32(out, 0x04034b50);
    out += common;
    put16(out, 0);  // extra field length
    out += name;
    out += data;
    put32(central, 0x02014b50);
    put16(central, 20);  // version made by
    central += common;
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);  // extra, comment, disk
    put16(central, 0);
    put32(central, 0);  // attributes
    put32(central, offset);
    central += name;
  }
  uint32_t central_offset = static_cast<uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint16_t>(members.size()));
  put16(out, static_cast<uint16_t>(members.size()));
  put32(out, static_cast<uint32_t>(central.size()));
  put32(out, central_offset);
  put16(out, 0);
  return out;
}

Status write_file(const std::string& path, const std::string& bytes, const std::string& flag) {
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return Status::failure(flag + " " + path + ": " + std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::failure(flag + " " + path + ": write failed");
  }
  return Status();
}

}  // namespace

std::string npy_bytes(const NpyTensor& t) {
  std::string shape;  // "(1, 8, 32, )": a Python tuple for any rank, "()" for a scalar
  for (int64_t d : t.shape) shape += std::to_string(d) + ", ";
  std::string header = "{'descr': '" + t.descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces
  // and ended by '\n' so the data starts on a 64-byte boundary.
  size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  put16(out, static_cast<uint32_t>(header.size()));
  out += header;
  // Data in the machine's byte order, which '<' declares as little-endian:
  // true of every platform the runner builds for.
  out.append(static_cast<const char*>(t.data), t.nbytes);
  return out;
}

Status write_npy_float32(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  return write_file(path, npy_bytes({"<f4", {rows, cols}, data.data(), data.size() * sizeof(float)}), "--dump-logits");
}

Status write_tensors(const std::string& path, const std::vector<NpyTensor>& tensors, const std::string& flag) {
  auto ends_with = [&](const char* s) {
    size_t n = std::strlen(s);
    return path.size() >= n && path.compare(path.size() - n, n, s) == 0;
  };
  if (tensors.size() == 1) {
    if (!ends_with(".npy")) return Status::usage(flag + " " + path + ": forward returns one tensor: name a .npy file");
    return write_file(path, npy_bytes(tensors[0]), flag);
  }
  if (!ends_with(".npz"))
    return Status::usage(flag + " " + path + ": forward returns " + std::to_string(tensors.size()) +
                         " tensors: name a .npz file");
  std::vector<std::pair<std::string, std::string>> members;
  for (size_t i = 0; i < tensors.size(); ++i)
    members.emplace_back("output_" + std::to_string(i) + ".npy", npy_bytes(tensors[i]));
  return write_file(path, zip_stored(members), flag);
}

}  // namespace lora_share
