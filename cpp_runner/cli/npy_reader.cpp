#include "npy_reader.h"

#include <fstream>
#include <iterator>

namespace lora_share {
namespace {

struct Descr {
  const char* numpy;
  int32_t dtype;  // ExecuTorch ScalarType
  size_t size;
};
constexpr Descr kDescrs[] = {
    {"|u1", 0, 1}, {"|i1", 1, 1}, {"<i2", 2, 2}, {"<i4", 3, 4},  {"<i8", 4, 8},
    {"<f2", 5, 2}, {"<f4", 6, 4}, {"<f8", 7, 8}, {"|b1", 11, 1},
};

// The text of `key`'s value in numpy's header dict: "'<f4'", "False", "(1, 8, )".
std::string field(const std::string& header, const std::string& key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) return "";
  size_t colon = header.find(':', at);
  if (colon == std::string::npos) return "";
  size_t start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) return "";
  size_t end = header[start] == '(' ? header.find(')', start) + 1 : header.find_first_of(",}", start);
  return end == std::string::npos || end == 0 ? "" : header.substr(start, end - start);
}

}  // namespace

std::string npy_descr(int32_t dtype) {
  for (const Descr& d : kDescrs)
    if (d.dtype == dtype) return d.numpy;
  return "";
}

StatusOr<NpyArray> read_npy(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::usage(flag + " " + path + ": no such file, or not readable");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return Status::usage(flag + " " + path + ": " + why); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    return bad("not a .npy file (numpy.save writes one; a .npz holds several: give one .npy per input)");
  unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t len_bytes = major == 1 ? 2 : 4, header_len = 0;
  if (major < 1 || major > 3) return bad(".npy format version " + std::to_string(major) + " is not read");
  if (bytes.size() < 8 + len_bytes) return bad("truncated .npy header");
  for (size_t i = 0; i < len_bytes; ++i)
    header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  size_t data_start = 8 + len_bytes + header_len;
  if (bytes.size() < data_start) return bad("truncated .npy header");
  std::string header = bytes.substr(8 + len_bytes, header_len);
  NpyArray a;
  std::string descr = field(header, "descr");
  if (descr.size() < 2) return bad("its header names no dtype");
  a.descr = descr.substr(1, descr.size() - 2);
  if (a.descr.size() == 3 && a.descr[0] == '=') a.descr[0] = a.descr[2] == '1' ? '|' : '<';
  const Descr* d = nullptr;
  for (const Descr& c : kDescrs)
    if (a.descr == c.numpy) d = &c;
  if (d == nullptr)
    return bad("dtype '" + a.descr +
               "' is not one the runner reads (little-endian "
               "float16/32/64, int8/16/32/64, uint8, bool)");
  a.dtype = d->dtype;
  if (field(header, "fortran_order") != "False")
    return bad("Fortran-ordered: save it C-ordered (numpy.ascontiguousarray)");
  std::string shape = field(header, "shape");
  if (shape.size() < 2 || shape.front() != '(') return bad("its header names no shape");
  size_t elements = 1;
  std::string item;
  for (char c : shape.substr(1)) {
    if (c >= '0' && c <= '9') {
      item += c;
    } else if ((c == ',' || c == ')') && !item.empty()) {
      if (item.size() > 12) return bad("a size of its shape is too large");
      a.shape.push_back(std::stoll(item));
      elements *= static_cast<size_t>(a.shape.back());
      item.clear();
    } else if (c != ' ' && c != ',' && c != ')') {
      return bad("its shape " + shape + " is not a tuple of sizes");
    }
  }
  size_t want = elements * d->size;
  if (bytes.size() - data_start != want)
    return bad("holds " + std::to_string(bytes.size() - data_start) + " data bytes, its shape " + shape + " needs " +
               std::to_string(want) + ": truncated or not a .npy file");
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_start), bytes.end());
  return a;
}

}  // namespace lora_share
