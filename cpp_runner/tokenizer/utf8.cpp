#include "utf8.h"

#include <algorithm>
#include <array>

namespace lora_share::tok {

size_t utf8_char_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_char_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

char32_t next_code_point(std::string_view s, size_t& i) {
  unsigned char lead = static_cast<unsigned char>(s[i]);
  size_t n = std::min(utf8_char_len(lead), s.size() - i);
  char32_t cp = n == 1 ? lead : lead & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

namespace {

// Bytes of the valid UTF-8 prefix of the sequence starting at s[i] (its
// "maximal subpart" in Unicode's terms), and whether it is a complete char.
size_t valid_prefix(std::string_view s, size_t i, bool& complete) {
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  complete = false;
  if (b0 < 0x80) {
    complete = true;
    return 1;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // never a lead byte
  }
  size_t k = 1;
  for (; k < need && i + k < s.size(); ++k) {
    unsigned char b = static_cast<unsigned char>(s[i + k]);
    bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
  }
  complete = k == need;
  return k;
}

}  // namespace

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool complete;
    size_t n = valid_prefix(bytes, i, complete);
    if (complete) {
      out.append(bytes.substr(i, n));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += n;
  }
  return out;
}

bool utf8_valid(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    bool complete;
    i += valid_prefix(bytes, i, complete);
    if (!complete) return false;
  }
  return true;
}

namespace {

// GPT-2: printable Latin-1 bytes stand for themselves, the others are
// shifted to U+0100 and up, in byte order.
struct ByteTable {
  std::array<std::string, 256> to_char;
  std::array<int, 512> from_char;  // every ByteLevel char is below U+0200
  ByteTable() {
    from_char.fill(-1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + shifted++);
      append_utf8(to_char[b], cp);
      from_char[cp] = b;
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

}  // namespace

const std::string& byte_to_char(unsigned char b) { return table().to_char[b]; }

int char_to_byte(char32_t cp) { return cp < 512 ? table().from_char[cp] : -1; }

}  // namespace lora_share::tok
