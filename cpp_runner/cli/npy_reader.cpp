#include "npy_reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

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

// numpy writes headers of a few hundred bytes and itself refuses ones over
// 10,000 by default; anything far larger is not a .npy written by numpy.
constexpr size_t kMaxHeader = 65536;
constexpr size_t kMaxRank = 16;  // ExecuTorch's kTensorDimensionLimit
// Data from a pipe or device arrives in pieces of this size, so memory grows
// with what was received, never ahead of it to what the header declares.
constexpr size_t kChunk = 1 << 20;

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

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

// The physical memory of this machine: a pipe's data larger than that cannot
// be held, so it is refused before any of it is read.
uint64_t physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : UINT64_MAX;
}

}  // namespace

std::string npy_descr(int32_t dtype) {
  for (const Descr& d : kDescrs)
    if (d.dtype == dtype) return d.numpy;
  return "";
}

// The header is read and checked before any data, and at most the bytes it
// declares are read after it: a regular file's size is checked against them
// first; a pipe or device (/dev/zero, a FIFO) is read in chunks up to them and
// never further, so a source that never ends cannot grow memory past them.
StatusOr<NpyArray> read_npy(const std::string& path, const std::string& flag) {
  auto bad = [&](const std::string& why) { return Status::usage(flag + " " + path + ": " + why); };
  File file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) return bad(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fileno(file.get()), &st) != 0) return bad(std::string("cannot read: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return bad("is a folder, not a .npy file");

  unsigned char fixed[12];
  if (std::fread(fixed, 1, 8, file.get()) != 8 || std::memcmp(fixed, "\x93NUMPY", 6) != 0)
    return bad("not a .npy file (numpy.save writes one; a .npz holds several: give one .npy per input)");
  unsigned major = fixed[6];
  if (major < 1 || major > 3) return bad(".npy format version " + std::to_string(major) + " is not read");
  size_t len_bytes = major == 1 ? 2 : 4, header_len = 0;
  if (std::fread(fixed + 8, 1, len_bytes, file.get()) != len_bytes) return bad("truncated .npy header");
  for (size_t i = 0; i < len_bytes; ++i) header_len |= static_cast<size_t>(fixed[8 + i]) << (8 * i);
  if (header_len > kMaxHeader)
    return bad("its header declares " + std::to_string(header_len) + " bytes, more than the " +
               std::to_string(kMaxHeader) + " a .npy header holds: not a .npy file");
  std::string header(header_len, '\0');
  if (std::fread(header.data(), 1, header_len, file.get()) != header_len) return bad("truncated .npy header");
  uint64_t data_start = 8 + len_bytes + header_len;

  NpyArray a;
  std::string descr = field(header, "descr");
  if (descr.size() < 2) return bad("its header names no dtype");
  a.descr = descr.substr(1, descr.size() - 2);
  if (a.descr.size() == 3 && a.descr[0] == '=') a.descr[0] = a.descr[2] == '1' ? '|' : '<';
  const Descr* d = nullptr;
  for (const Descr& c : kDescrs)
    if (a.descr == c.numpy) d = &c;
  if (d == nullptr)
    return bad("dtype '" + a.descr.substr(0, 20) +
               "' is not one the runner reads (little-endian "
               "float16/32/64, int8/16/32/64, uint8, bool)");
  a.dtype = d->dtype;
  if (field(header, "fortran_order") != "False")
    return bad("Fortran-ordered: save it C-ordered (numpy.ascontiguousarray)");
  std::string shape = field(header, "shape");
  if (shape.size() < 2 || shape.front() != '(') return bad("its header names no shape");
  uint64_t want = d->size;  // data bytes: the sizes' product times the element size, overflow-checked
  bool overflow = false;
  std::string item;
  for (char c : shape.substr(1)) {
    if (c >= '0' && c <= '9') {
      item += c;
    } else if ((c == ',' || c == ')') && !item.empty()) {
      if (a.shape.size() == kMaxRank)
        return bad("its shape " + shape.substr(0, 60) + " has more than " + std::to_string(kMaxRank) + " dimensions");
      int64_t size = 0;
      for (char digit : item)
        overflow = overflow || __builtin_mul_overflow(size, int64_t{10}, &size) ||
                   __builtin_add_overflow(size, int64_t{digit - '0'}, &size);
      a.shape.push_back(size);
      overflow = overflow || __builtin_mul_overflow(want, static_cast<uint64_t>(size), &want);
      item.clear();
    } else if (c != ' ' && c != ',' && c != ')') {
      return bad("its shape " + shape.substr(0, 60) + " is not a tuple of sizes");
    }
  }
  if (overflow) return bad("its shape " + shape.substr(0, 60) + " holds more elements than memory can");

  if (S_ISREG(st.st_mode)) {
    uint64_t have = static_cast<uint64_t>(st.st_size) >= data_start ? st.st_size - data_start : 0;
    if (have != want)
      return bad("holds " + std::to_string(have) + " data bytes, its shape " + shape + " needs " +
                 std::to_string(want) + ": truncated or not a .npy file");
  } else if (want > physical_memory()) {
    return bad("declares " + std::to_string(want) + " data bytes (shape " + shape.substr(0, 60) +
               "), more than this machine's memory");
  }
  try {
    size_t got = 0;
    if (S_ISREG(st.st_mode)) {  // it holds exactly `want` bytes (checked above): one read
      a.data.resize(want);
      got = std::fread(a.data.data(), 1, want, file.get());
    } else {  // a pipe or device: chunks, appended as they arrive, up to `want` and no further
      while (got < want) {
        size_t step = static_cast<size_t>(std::min<uint64_t>(kChunk, want - got));
        a.data.resize(got + step);
        size_t n = std::fread(a.data.data() + got, 1, step, file.get());
        got += n;
        if (n < step) break;
      }
    }
    if (got != want)
      return bad("holds " + std::to_string(got) + " data bytes, its shape " + shape.substr(0, 60) + " needs " +
                 std::to_string(want) + ": truncated");
    a.data.resize(got);
  } catch (const std::bad_alloc&) {
    return bad("its " + std::to_string(want) + " data bytes do not fit in memory");
  }
  return a;
}

}  // namespace lora_share
