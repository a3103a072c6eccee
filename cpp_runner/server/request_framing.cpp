#include "request_framing.h"

#include <algorithm>
#include <cctype>

namespace lora_share::server {
namespace {

constexpr std::string_view kCrlf = "\r\n";
constexpr size_t kMaxChunkLine = 1024;  // a size in hex and its extensions

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// At most this many characters of a client's text go into a message.
std::string quoted(std::string_view s) {
  constexpr size_t kShown = 40;
  std::string out = "'" + std::string(s.substr(0, kShown)) + (s.size() > kShown ? "...'" : "'");
  for (char& c : out) {
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return out;
}

}  // namespace

RequestFraming::State RequestFraming::fail(int status, std::string message) {
  error_status_ = status;
  error_message_ = std::move(message);
  return state_ = State::kError;
}

RequestFraming::State RequestFraming::scan(std::string_view bytes) {
  if (state_ == State::kHead) {
    // The blank line may straddle the previous call's end: look 3 bytes back.
    const size_t from = scanned_ < 3 ? 0 : scanned_ - 3;
    const size_t end = bytes.find("\r\n\r\n", from);
    if (end == std::string_view::npos || end + 4 > kMaxHead) {
      scanned_ = bytes.size();
      if (bytes.size() > kMaxHead) {
        return fail(431, "the request's head (request line and headers) is longer than " +
                             std::to_string(kMaxHead / 1024) + " KiB");
      }
      return state_;
    }
    head_size_ = end + 4;
    if (parse_head(bytes.substr(0, head_size_)) == State::kError) return state_;
    scanned_ = head_size_;
    state_ = State::kBody;
  }
  if (state_ != State::kBody) return state_;
  if (!chunked_) {
    if (bytes.size() - head_size_ >= content_length_) {
      request_size_ = head_size_ + static_cast<size_t>(content_length_);
      state_ = State::kDone;
    }
    return state_;
  }
  return scan_chunks(bytes);
}

RequestFraming::State RequestFraming::parse_head(std::string_view head) {
  for (size_t i = 0; i < head.size(); ++i) {
    const char c = head[i];
    if (c == '\0') return fail(400, "the request's head holds a NUL byte");
    // httplib splits lines at LF and skips lines without CR: a bare CR or LF
    // would make it read other headers than these.
    if ((c == '\r' && (i + 1 >= head.size() || head[i + 1] != '\n')) ||
        (c == '\n' && (i == 0 || head[i - 1] != '\r'))) {
      return fail(400, "the request's head has a line not ended by CRLF");
    }
  }
  const size_t line_end = head.find(kCrlf);
  const std::string_view request_line = head.substr(0, line_end);
  method_ = std::string(request_line.substr(0, request_line.find(' ')));
  if (method_.empty() || method_.size() == request_line.size()) {
    return fail(400, "the request line " + quoted(request_line) + " is not 'METHOD /path HTTP/1.1'");
  }
  bool has_length = false, has_encoding = false;
  for (size_t pos = line_end + 2; pos + 2 < head.size();) {
    const size_t next = head.find(kCrlf, pos);
    const std::string_view line = head.substr(pos, next - pos);
    pos = next + 2;
    const size_t colon = line.find(':');
    const std::string_view name = line.substr(0, colon);
    if (colon == std::string_view::npos || name.empty() || name.find_first_of(" \t") != std::string_view::npos) {
      return fail(400, "the header line " + quoted(line) + " is not 'Name: value'");
    }
    const std::string_view value = trim(line.substr(colon + 1));
    if (equals_ignoring_case(name, "Content-Length")) {
      if (has_length) return fail(400, "the request has two Content-Length headers");
      has_length = true;
      if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string_view::npos) {
        return fail(400, "Content-Length " + quoted(value) + " is not a number of bytes");
      }
      content_length_ = std::stoull(std::string(value));
    } else if (equals_ignoring_case(name, "Transfer-Encoding")) {
      if (has_encoding) return fail(400, "the request has two Transfer-Encoding headers");
      has_encoding = true;
      if (!equals_ignoring_case(value, "chunked")) {
        return fail(501, "Transfer-Encoding " + quoted(value) +
                             " is not served: send the body with a Content-Length, or chunked");
      }
      chunked_ = true;
    } else if (equals_ignoring_case(name, "Expect")) {
      expect_continue_ = equals_ignoring_case(value, "100-continue");
    }
  }
  if (has_length && has_encoding) {
    return fail(400, "the request has both Content-Length and Transfer-Encoding: send one of them");
  }
  if (content_length_ > max_body_) {
    return fail(413, "the request body (" + std::to_string(content_length_) +
                         " bytes) is larger than the server's --max-body (" + std::to_string(max_body_) + " bytes)");
  }
  return state_;
}

RequestFraming::State RequestFraming::scan_chunks(std::string_view bytes) {
  size_t pos = scanned_;
  while (pos < bytes.size()) {
    if (chunk_ == Chunk::kData) {
      const uint64_t take = std::min<uint64_t>(chunk_left_, bytes.size() - pos);
      pos += static_cast<size_t>(take);
      chunk_left_ -= take;
      if (chunk_left_ == 0) chunk_ = Chunk::kDataEnd;
      continue;
    }
    if (chunk_ == Chunk::kDataEnd || chunk_ == Chunk::kLastEnd) {
      if (bytes.size() - pos < 2) break;
      if (bytes.substr(pos, 2) != kCrlf) {
        return fail(400, chunk_ == Chunk::kDataEnd ? "a chunk of the body is not followed by CRLF"
                                                   : "the chunked body has trailers, which are not served");
      }
      pos += 2;
      if (chunk_ == Chunk::kLastEnd) {
        request_size_ = pos;
        scanned_ = pos;
        return state_ = State::kDone;
      }
      chunk_ = Chunk::kSize;
      continue;
    }
    // kSize: "HEX[;extensions]\r\n".
    const size_t end = bytes.find(kCrlf, pos);
    if (end == std::string_view::npos) {
      if (bytes.size() - pos > kMaxChunkLine) return fail(400, "a chunk size line is longer than 1 KiB");
      break;
    }
    const std::string_view line = bytes.substr(pos, end - pos);
    const size_t digits = std::min(line.find(';'), line.size());
    if (digits == 0 || digits > 15 ||
        line.substr(0, digits).find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos) {
      return fail(400, "the chunk size " + quoted(line) + " is not a hexadecimal number");
    }
    const uint64_t size = std::stoull(std::string(line.substr(0, digits)), nullptr, 16);
    pos = end + 2;
    body_bytes_ += size;
    if (body_bytes_ > max_body_) {
      return fail(413, "the chunked request body is larger than the server's --max-body (" + std::to_string(max_body_) +
                           " bytes)");
    }
    chunk_left_ = size;
    chunk_ = size == 0 ? Chunk::kLastEnd : Chunk::kData;
  }
  scanned_ = pos;
  return state_;
}

std::string RequestFraming::without_expect(std::string_view head) {
  std::string out;
  out.reserve(head.size());
  for (size_t pos = 0; pos < head.size();) {
    const size_t next = std::min(head.find(kCrlf, pos), head.size() - 2) + 2;
    const std::string_view line = head.substr(pos, next - pos);
    if (!(line.size() > 7 && equals_ignoring_case(line.substr(0, 7), "Expect:"))) out.append(line);
    pos = next;
  }
  return out;
}

}  // namespace lora_share::server
