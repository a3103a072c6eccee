// Where one HTTP/1.1 request ends in the bytes a connection has received, so
// the transport (transport.h) hands a worker thread only whole requests: the
// head (request line and headers, up to the blank line), then a body of
// Content-Length bytes or chunked (RFC 9112 section 7.1, no trailers, as
// cpp-httplib reads it). Incremental: each call looks only at the bytes added
// since the last. It checks what the framing needs and refuses what could make
// it disagree with httplib's reading (both Content-Length and
// Transfer-Encoding, a second Content-Length, a bare CR or LF in the head);
// everything else in the head is httplib's to judge.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lora_share::server {

class RequestFraming {
 public:
  enum class State { kHead, kBody, kDone, kError };

  // The largest head (request line and headers) in bytes: longer is a 431.
  static constexpr size_t kMaxHead = 32 * 1024;

  explicit RequestFraming(uint64_t max_body) : max_body_(max_body) {}

  // `bytes`: everything received from the request's first byte on (it may
  // hold the next request too, pipelined). Returns where the request stands.
  State scan(std::string_view bytes);

  State state() const { return state_; }
  // Once the head is in (kBody or kDone):
  const std::string& method() const { return method_; }
  bool expects_continue() const { return expect_continue_; }
  size_t head_size() const { return head_size_; }
  // The body's length when it is declared (Content-Length), else 0.
  uint64_t declared_body() const { return chunked_ ? 0 : content_length_; }
  // kDone: the request's bytes are bytes[0, request_size()).
  size_t request_size() const { return request_size_; }
  // kError: the HTTP status to answer and why.
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // The head with its Expect header removed: the transport answers
  // "100 Continue" itself, and httplib would send a second one.
  static std::string without_expect(std::string_view head);

 private:
  State fail(int status, std::string message);
  State parse_head(std::string_view head);
  State scan_chunks(std::string_view bytes);

  uint64_t max_body_;
  State state_ = State::kHead;
  size_t scanned_ = 0;  // bytes looked at so far (the head's search, the chunks' walk)
  std::string method_;
  bool chunked_ = false;
  bool expect_continue_ = false;
  uint64_t content_length_ = 0;
  size_t head_size_ = 0;
  size_t request_size_ = 0;
  // Chunked bodies: the walk's position and state.
  enum class Chunk { kSize, kData, kDataEnd, kLastEnd } chunk_ = Chunk::kSize;
  uint64_t chunk_left_ = 0;
  uint64_t body_bytes_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace lora_share::server
