#include "file_check.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "flat_reader.h"
#include "lora_record.h"
#include "xnnpack_keys.h"

namespace lora_share {

Status check_readable_file(const std::string& path, const std::string& flag) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    int err = errno;
    return Status::failure(flag + " " + path + ": " +
                           (err == ENOENT ? std::string("no such file") : std::strerror(err)));
  }
  struct stat st;
  bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular) return Status::failure(flag + " " + path + ": not a regular file");
  return Status();
}

namespace {

// A read-only mapping of a whole file, unmapped on destruction.
class Mapping {
 public:
  ~Mapping() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  Status open(const std::string& path, const std::string& flag) {
    Status readable = check_readable_file(path, flag);
    if (!readable.ok()) return readable;
    int fd = ::open(path.c_str(), O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      if (fd >= 0) ::close(fd);
      return Status::failure(flag + " " + path + ": cannot read the file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED)
        data_ = nullptr;
      else
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
    if (size_ > 0 && data_ == nullptr) return Status::failure(flag + " " + path + ": could not map the file");
    return Status();
  }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Bytes per element of executorch_flatbuffer.ScalarType; 0 = unknown.
uint64_t element_size(int8_t scalar_type) {
  switch (scalar_type) {
    case 0:
    case 1:
    case 11:
    case 12:
    case 13:
    case 16:
    case 17:
    case 23:
    case 24:
    case 25:
    case 26:
      return 1;
    case 2:
    case 5:
    case 15:
    case 22:
    case 27:
      return 2;
    case 3:
    case 6:
    case 14:
    case 28:
      return 4;
    case 4:
    case 7:
    case 29:
      return 8;
    default:
      return 0;
  }
}

// A segment's absolute range, checked to lie in the segment data.
// An absolute byte range in the file.
struct Range {
  uint64_t start = 0, size = 0;
};

// Reads DataSegment tables (offset slot 0, size slot 1) relative to `base`,
// each inside [base, base + data_size).
bool read_segments(FlatReader& fb, const FlatReader::Vector& v, uint64_t base, uint64_t data_size,
                   std::vector<Range>* out) {
  for (uint32_t i = 0; i < v.count && !fb.failed(); ++i) {
    FlatReader::Table seg = fb.table_at(v, i, "DataSegment");
    uint64_t offset = fb.u64(seg, 0), size = fb.u64(seg, 1);
    if (fb.failed()) return false;
    if (offset > data_size || size > data_size - offset) {
      fb.fail("segment " + std::to_string(i) + " runs past the end of the segment data: the file may be truncated");
      return false;
    }
    out->push_back({base + offset, size});
  }
  return !fb.failed();
}

// Header + region checks shared by both file kinds; `what` prefixes errors.
Status check_region(uint64_t file_size, uint64_t fb_end, uint64_t base, uint64_t data_size, const std::string& what) {
  if (fb_end > file_size)
    return Status::failure(what + ": flatbuffer ends at byte " + std::to_string(fb_end) + ", past the end of the " +
                           std::to_string(file_size) + "-byte file: the file may be truncated");
  if (base > file_size || data_size > file_size - base)
    return Status::failure(what + ": segment data runs past the end of the " + std::to_string(file_size) +
                           "-byte file: the file may be truncated");
  if (data_size > 0 && base < fb_end) return Status::failure(what + ": segment data overlaps the flatbuffer");
  return Status();
}

std::string magic_hint(const uint8_t* data, uint64_t size) {
  return size >= 8 ? std::string(reinterpret_cast<const char*>(data + 4), 4) : std::string();
}

// What tells the two kinds of file apart, and what their fixed headers need.
struct FileKind {
  const char* ident;         // flatbuffer file identifier at byte 4
  const char* header_magic;  // the header's own magic at byte 8
  uint64_t header_bytes;     // the file must at least hold this much
  const char* name;          // for "not <name>"
  const char* ext;
  const char* header_name;
  const char* other_ident;  // the other kind, named when it is passed instead
  const char* other_name;
};
const FileKind kPtdKind{"FT01", "FH01",           48, "an ExecuTorch data file (.ptd)", ".ptd", "FlatTensor header",
                        "ET12", "a program, .pte"};
const FileKind kPteKind{
    "ET12", "eh00", 40, "an ExecuTorch program (.pte)", ".pte", "extended header", "FT01", "a data file, .ptd"};

// Maps `path` into `m` and checks what every file of `kind` starts with:
// its identifier, a whole fixed header, the header's magic.
Status open_checked(Mapping* m, const std::string& path, const std::string& flag, const FileKind& kind) {
  std::string what = flag + " " + path;
  Status s = m->open(path, flag);
  if (!s.ok()) return s;
  const uint8_t* d = m->data();
  uint64_t n = m->size();
  std::string ident = magic_hint(d, n);
  if (n >= 8 && ident != kind.ident)
    return Status::failure(what + ": not " + kind.name + ": wrong magic" +
                           (ident == kind.other_ident ? std::string(" (that is ") + kind.other_name + ")" : ""));
  if (n < kind.header_bytes)
    return Status::failure(what + ": " + std::to_string(n) + " bytes, shorter than the " + kind.ext +
                           " header: the file is truncated or empty");
  if (std::memcmp(d + 8, kind.header_magic, 4) != 0)
    return Status::failure(what + ": no " + kind.header_name + " (wrong magic at byte 8)");
  return Status();
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  size_t i = 0, n = text.size();
  while (i < n) {
    auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
    unsigned char c = byte(0);
    size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : (c & 0xF0) == 0xE0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (byte(k) & 0xC0) == 0x80;
    // No overlong forms, UTF-16 surrogates or code points past U+10FFFF.
    if (ok && len == 3) ok = !(c == 0xE0 && byte(1) < 0xA0) && !(c == 0xED && byte(1) >= 0xA0);
    if (ok && len == 4) ok = !(c == 0xF0 && byte(1) < 0x90) && !(c == 0xF4 && byte(1) >= 0x90);
    if (ok && len == 1) ok = c >= 0x20 && c != 0x7F;
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    out.append(text, i, len);
    i += len;
  }
  return out;
}

StatusOr<PtdInfo> check_ptd(const std::string& path, const std::string& flag) {
  std::string what = flag + " " + path;
  Mapping m;
  Status s = open_checked(&m, path, flag, kPtdKind);
  if (!s.ok()) return s;
  const uint8_t* d = m.data();
  uint64_t n = m.size();
  uint32_t length = le32(d + 12);
  uint64_t fb_offset = le64(d + 16), fb_size = le64(d + 24);
  uint64_t base = le64(d + 32), data_size = le64(d + 40);
  if (length < 40 || fb_offset > n || fb_size > n || 8 + static_cast<uint64_t>(length) > fb_offset + fb_size)
    return Status::failure(what + ": corrupt .ptd header");
  s = check_region(n, fb_offset + fb_size, base, data_size, what);
  if (!s.ok()) return s;

  FlatReader fb(d, 0, fb_offset + fb_size);
  FlatReader::Table root = fb.root("FlatTensor");
  if (!fb.failed() && fb.u32(root, 0) != 0) fb.fail("unsupported FlatTensor version");
  FlatReader::Vector seg_vec = fb.vector(root, 1, 4);
  FlatReader::Vector named = fb.vector(root, 2, 4);
  if (!fb.failed() && (!seg_vec.present || !named.present))
    fb.fail("FlatTensor has no segments or no named_data table");
  std::vector<Range> segments;
  read_segments(fb, seg_vec, base, data_size, &segments);
  PtdInfo info;
  Range record_range;
  bool has_record = false;
  for (uint32_t i = 0; i < named.count && !fb.failed(); ++i) {
    FlatReader::Table nd = fb.table_at(named, i, "NamedData");
    std::string key = fb.string(nd, 0);
    uint32_t index = fb.u32(nd, 1);
    FlatReader::Table layout = fb.table(nd, 2, "TensorLayout");
    if (fb.failed()) break;
    if (key.empty() || info.keys.count(key)) {
      fb.fail("named_data[" + std::to_string(i) + "] has an empty or repeated key");
      break;
    }
    if (index >= segments.size()) {
      fb.fail("key " + key + " points at a segment that does not exist");
      break;
    }
    if (layout.present) {
      uint64_t elem = element_size(static_cast<int8_t>(fb.u8(layout, 0)));
      FlatReader::Vector sizes = fb.vector(layout, 1, 4);
      FlatReader::Vector order = fb.vector(layout, 2, 1);
      if (fb.failed()) break;
      // nbytes saturates just above the segment size, so it cannot overflow.
      uint64_t limit = segments[index].size, nbytes = elem;
      bool ok = elem != 0 && sizes.count == order.count;
      std::vector<bool> seen(ok ? order.count : 0, false);
      for (uint32_t k = 0; ok && k < sizes.count; ++k) {
        int32_t dim = fb.i32_at(sizes, k);
        uint8_t o = fb.u8_at(order, k);
        ok = dim >= 0 && o < order.count && !seen[o];
        if (ok) seen[o] = true;
        if (ok && dim > 0 && nbytes > limit / static_cast<uint64_t>(dim))
          nbytes = limit + 1;
        else if (ok)
          nbytes *= static_cast<uint64_t>(dim);
      }
      if (!ok || nbytes > limit) {
        fb.fail("key " + key + ": its tensor layout does not fit its data");
        break;
      }
    }
    info.keys[key] = {segments[index].size, layout.present};
    if (key == kFoundationKey) {
      record_range = segments[index];
      has_record = true;
    }
  }
  if (fb.failed()) return Status::failure(what + ": corrupt .ptd: " + fb.error());
  if (has_record) {
    s = decode_record(d, record_range.start, record_range.size, /*adapter=*/false, what, &info.record);
    if (!s.ok()) return s;
  }
  return info;
}

namespace {

// What the program needs from a .ptd: XNNPACK named constants and EXTERNAL
// tensors, from every method. Program slots: execution_plan 1,
// backend_delegate_data 3; ExecutionPlan: values 2, delegates 7.
bool collect_needs(FlatReader& fb, const uint8_t* d, FlatReader::Table root, const std::vector<Range>& segments,
                   PteInfo* info) {
  FlatReader::Vector inline_data = fb.vector(root, 3, 4);
  FlatReader::Vector plans = fb.vector(root, 1, 4);
  for (uint32_t p = 0; p < plans.count && !fb.failed(); ++p) {
    FlatReader::Table plan = fb.table_at(plans, p, "ExecutionPlan");
    FlatReader::Vector delegates = fb.vector(plan, 7, 4);
    for (uint32_t i = 0; i < delegates.count && !fb.failed(); ++i) {
      FlatReader::Table del = fb.table_at(delegates, i, "BackendDelegate");
      FlatReader::Table ref = fb.table(del, 1, "BackendDelegateDataReference");
      std::string id = fb.string(del, 0);
      uint8_t location = fb.u8(ref, 0);
      uint32_t index = fb.u32(ref, 1);
      if (fb.failed() || id != "XnnpackBackend") continue;
      Range payload;
      if (location == 0 && index < inline_data.count) {
        FlatReader::Vector bytes = fb.vector(fb.table_at(inline_data, index, "BackendDelegateInlineData"), 0, 1);
        payload = {bytes.first, bytes.count};
      } else if (location == 1 && index < segments.size()) {
        payload = segments[index];
      } else {
        fb.fail("a delegate points at a payload that does not exist");
        break;
      }
      std::string error;
      if (!fb.failed() && !xnnpack_named_constants(d, payload.start, payload.size, &info->delegate_constants, &error))
        fb.fail(error);
    }
    FlatReader::Vector values = fb.vector(plan, 2, 4);
    for (uint32_t v = 0; v < values.count && !fb.failed(); ++v) {
      FlatReader::Table value = fb.table_at(values, v, "EValue");
      if (fb.u8(value, 0) != 5) continue;  // KernelTypes.Tensor
      FlatReader::Table extra = fb.table(fb.table(value, 1, "Tensor"), 9, "ExtraTensorInfo");
      if (extra.present && fb.u8(extra, 2) == 1)  // TensorDataLocation.EXTERNAL
        info->external_tensors.insert(fb.string(extra, 1));
    }
  }
  return !fb.failed();
}

}  // namespace

StatusOr<PteInfo> check_pte(const std::string& path, const std::string& flag) {
  std::string what = flag + " " + path;
  Mapping m;
  Status s = open_checked(&m, path, flag, kPteKind);
  if (!s.ok()) return s;
  const uint8_t* d = m.data();
  uint64_t n = m.size();
  uint32_t length = le32(d + 12);
  uint64_t program_size = le64(d + 16), base = le64(d + 24);
  uint64_t data_size = length >= 32 ? le64(d + 32) : (base < n ? n - base : 0);
  if (length < 24 || 8 + static_cast<uint64_t>(length) > program_size)
    return Status::failure(what + ": corrupt .pte header");
  s = check_region(n, program_size, base, data_size, what);
  if (!s.ok()) return s;

  FlatReader fb(d, 0, program_size);
  FlatReader::Table root = fb.root("Program");
  if (!fb.failed() && fb.u32(root, 0) != 0) fb.fail("unsupported Program version");
  std::vector<Range> segments;
  read_segments(fb, fb.vector(root, 4, 4), base, data_size, &segments);
  FlatReader::Vector named = fb.vector(root, 7, 4);
  PteInfo info;
  Range record_range;
  bool has_record = false;
  for (uint32_t i = 0; i < named.count && !fb.failed(); ++i) {
    FlatReader::Table nd = fb.table_at(named, i, "NamedData");
    std::string key = fb.string(nd, 0);
    uint32_t index = fb.u32(nd, 1);
    if (fb.failed()) break;
    if (index >= segments.size()) {
      fb.fail("named data " + key + " points at a segment that does not exist");
      break;
    }
    info.own_keys.insert(key);
    info.own_ranges[key] = {segments[index].start, segments[index].size};
    if (key == kAdapterKey) {
      record_range = segments[index];
      has_record = true;
    }
  }
  if (!fb.failed()) collect_needs(fb, d, root, segments, &info);
  if (fb.failed()) return Status::failure(what + ": corrupt .pte: " + fb.error());
  if (has_record) {
    s = decode_record(d, record_range.start, record_range.size, /*adapter=*/true, what, &info.record);
    if (!s.ok()) return s;
    const Record& r = info.record;
    uint64_t end = record_range.start + record_range.size;
    if (r.content_bytes != 0 &&
        (r.content_bytes != n || crc32(crc32(0, d, record_range.start), d + end, n - end) != r.content_crc32))
      return Status::failure(what +
                             ": does not match the size and checksum it "
                             "was written with: the file is damaged");
  }
  return info;
}

const PtdEntry* DataFiles::find(const std::string& key, std::string* path) const {
  auto found = foundation.keys.find(key);
  if (found != foundation.keys.end()) {
    *path = ptd;
    return &found->second;
  }
  found = shared.keys.find(key);
  if (shared_ptd.empty() || found == shared.keys.end()) return nullptr;
  *path = shared_ptd;
  return &found->second;
}

namespace {

// "a, b, c, ... (7 in all)": at most three keys, so the message stays one
// readable line.
std::string key_list(const std::vector<std::string>& keys) {
  std::string list;
  for (size_t i = 0; i < keys.size() && i < 3; ++i) list += (i ? ", " : "") + keys[i];
  if (keys.size() > 3) list += ", ... (" + std::to_string(keys.size()) + " in all)";
  return list;
}

bool is_content_hash(const std::string& key) {
  return key.size() == 64 && key.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

StatusOr<DataFiles> check_data_files(const std::string& ptd, const std::string& shared_ptd) {
  DataFiles files;
  files.ptd = ptd;
  files.shared_ptd = shared_ptd;
  auto foundation = check_ptd(ptd, "--ptd");
  if (!foundation.ok()) return foundation.status();
  files.foundation = std::move(foundation.value());
  if (shared_ptd.empty()) return files;
  auto shared = check_ptd(shared_ptd, "--shared-ptd");
  if (!shared.ok()) return shared.status();
  files.shared = std::move(shared.value());

  std::vector<std::string> in_both;
  for (const auto& entry : files.shared.keys)
    if (files.foundation.keys.count(entry.first)) in_both.push_back(entry.first);
  if (in_both.empty()) return files;
  // A foundation given twice (or another build's) is the likely mistake.
  return Status::failure("--ptd " + ptd + " and --shared-ptd " + shared_ptd + " both hold " + key_list(in_both) + ": " +
                         (files.shared.record.present
                              ? "--shared-ptd is a foundation; pass the build's "
                                "adapters_shared.ptd"
                              : "pass the foundation.ptd and adapters_shared.ptd of one build"));
}

std::string missing_keys_message(const std::string& pte, const std::string& ptd, const std::string& shared_ptd,
                                 const std::vector<std::string>& missing, bool built_for_foundation) {
  std::string line = pte + " needs weights that " +
                     (shared_ptd.empty() ? ptd + " does not have" : "neither " + ptd + " nor " + shared_ptd + " has") +
                     " (" + key_list(missing) + ")";
  size_t hashes = 0;
  for (const std::string& key : missing) hashes += is_content_hash(key);
  if (hashes == 0) return line + ": was the adapter exported against this foundation?";
  // XNNPACK names the weights it takes by the sha256 of their bytes, so a
  // missing hash means other weights, not merely other names: a different
  // foundation, or adapter tensors the build stored once in
  // adapters_shared.ptd. Matching records rule out the first.
  const char* differ =
      "the foundation's weights differ from the ones the "
      "adapter was exported with";
  line += hashes == 1 ? ", a content hash: " : ", content hashes: ";
  if (!shared_ptd.empty())
    return line + (built_for_foundation ? "pass the adapters_shared.ptd of the build that "
                                          "wrote this adapter"
                                        : differ);
  line +=
      "if the adapter's build set dedup.shared_adapter_tensors: hoist, "
      "pass its adapters_shared.ptd with --shared-ptd";
  return built_for_foundation ? line : line + "; otherwise " + differ;
}

bool needs_data_file(const PteInfo& info) {
  for (const std::string& key : info.external_tensors)
    if (!info.own_keys.count(key)) return true;
  for (const auto& entry : info.delegate_constants)
    if (!info.own_keys.count(entry.first)) return true;
  for (const LoraKeys& keys : info.record.lora)
    if (!info.own_keys.count(keys.a) || !info.own_keys.count(keys.b)) return true;
  return false;
}

Status check_pair(const std::string& pte, const PteInfo& adapter, const DataFiles& files, bool verify) {
  // What ExecuTorch and XNNPACK would read without checking it themselves,
  // in whichever file holds it.
  std::string holder;
  for (const std::string& key : adapter.external_tensors) {
    const PtdEntry* found = files.find(key, &holder);
    if (found != nullptr && !found->has_layout)
      return Status::failure(holder + " holds " + key + " without a tensor layout, but " + pte +
                             " reads it as a tensor: the file is corrupt");
  }
  for (const auto& [key, bytes] : adapter.delegate_constants) {
    const PtdEntry* found = files.find(key, &holder);
    if (found != nullptr && !adapter.own_keys.count(key) && found->size < bytes)
      return Status::failure(holder + " holds " + std::to_string(found->size) + " bytes for " + key + ", but " + pte +
                             " reads " + std::to_string(bytes) + ": the file is corrupt");
  }
  const Record &a = adapter.record, &f = files.foundation.record;
  const std::string& ptd = files.ptd;
  if (verify) {
    const char* skip = "; --no-verify skips this check";
    if (!a.present)
      return Status::failure(pte + " has no lora-share adapter record (" + kAdapterKey +
                             "): rebuild it with lora-share" + skip);
    if (!f.present)
      return Status::failure(ptd + " has no lora-share foundation record (" + kFoundationKey +
                             "): rebuild it with lora-share" + skip);
    if (a.fingerprint != f.fingerprint)
      return Status::failure(pte + " was built for foundation " + a.fingerprint + ", but " + ptd + " is foundation " +
                             f.fingerprint + ": use the foundation.ptd built with this adapter" + skip);
  }
  // Last, so that a mismatched foundation is reported as one (above): its
  // keys are all missing too. The runtime would otherwise stop at the first
  // missing key with an error code.
  std::vector<std::string> missing;
  for (const std::string& key : adapter.external_tensors)
    if (!adapter.own_keys.count(key) && !files.find(key, &holder)) missing.push_back(key);
  for (const auto& entry : adapter.delegate_constants)
    if (!adapter.own_keys.count(entry.first) && !files.find(entry.first, &holder)) missing.push_back(entry.first);
  for (const LoraKeys& keys : a.lora)
    for (const std::string* key : {&keys.a, &keys.b})
      if (!adapter.own_keys.count(*key) && !files.find(*key, &holder)) missing.push_back(*key);
  if (missing.empty()) return Status();
  bool built_for_foundation = a.present && f.present && a.fingerprint == f.fingerprint;
  return Status::failure(missing_keys_message(pte, ptd, files.shared_ptd, missing, built_for_foundation));
}

}  // namespace lora_share
