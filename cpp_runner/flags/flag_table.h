// One way to read a command line, for build/runner (cli/flags.cpp) and
// build/lora-share-server (server/server_flags.cpp): each executable writes
// one table of its flags (name, value, default, help, and what a value does),
// and --help and the parser are made from that same table, so they never
// disagree.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "status.h"

namespace lora_share::flags {

struct Flag {
  const char* name;          // without the leading "--"
  const char* value;         // the value's name in --help ("DIR"); nullptr: a switch
  const char* default_text;  // "[default: ...]" in --help; "" for none
  const char* help;
  // Applies the value ("" for a switch); a usage error names the flag.
  std::function<Status(const std::string& value)> set;
};

// Applies argv's flags in order, "--name value" or "--name=value". An
// argument that is no flag, an unknown flag, a switch given a value or a
// flag missing its value is a usage error naming it.
Status parse(const std::vector<Flag>& table, int argc, char** argv);

// --help's lines: "  --name VALUE" padded to `column`, the help, the default.
std::string help(const std::vector<Flag>& table, size_t column);

// The whole of `text` as a base-10 integer (surrounding whitespace allowed).
bool parse_int64(const std::string& text, int64_t* out);

// The whole of `text` as a finite number.
bool parse_double(const std::string& text, double* out);

// "600MiB", "1.5GiB", "800MB", "123456" -> bytes; a usage error naming
// `flag` otherwise.
StatusOr<uint64_t> parse_size(const std::string& text, const std::string& flag);

}  // namespace lora_share::flags
