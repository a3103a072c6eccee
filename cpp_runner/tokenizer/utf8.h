// UTF-8 helpers the tokenizer needs, with the exact semantics of the Rust
// `tokenizers` library (Rust strings are UTF-8, so its byte offsets are ours).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lora_share::tok {

// Length in bytes of the UTF-8 character starting with `lead` (1 for stray bytes).
size_t utf8_char_len(unsigned char lead);

// Splits valid UTF-8 into its characters (each a string_view into `s`).
std::vector<std::string_view> utf8_chars(std::string_view s);

// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, char32_t cp);

// Decodes one character of valid UTF-8 at s[i]; advances i.
char32_t next_code_point(std::string_view s, size_t& i);

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// True when `bytes` is entirely valid UTF-8.
bool utf8_valid(std::string_view bytes);

// GPT-2's byte <-> printable character table used by the ByteLevel components.
const std::string& byte_to_char(unsigned char b);  // UTF-8 of the char for byte b
// The byte a ByteLevel character stands for, or -1 if `cp` is not one.
int char_to_byte(char32_t cp);

}  // namespace lora_share::tok
