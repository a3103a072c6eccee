// Status and StatusOr: how every step of the library, the runner and the
// server reports failure.
//
// None of them throws or aborts on bad input: each step returns a Status (or a
// value plus a Status); the library's C API turns the first failure into an
// ls_status and its message, and the runner's main() into a single
// "error: ..." line and an exit code. Two kinds of failure exist,
// because scripts need to tell them apart: a usage error (the command line or
// request is wrong, exit 2) and a run error (a file could not be loaded or the
// program failed while running, exit 1).
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace lora_share {

enum class ExitCode : int { kOk = 0, kRunError = 1, kUsageError = 2 };

class Status {
 public:
  Status() = default;
  static Status usage(std::string message) { return Status(ExitCode::kUsageError, std::move(message)); }
  static Status failure(std::string message) { return Status(ExitCode::kRunError, std::move(message)); }

  bool ok() const { return code_ == ExitCode::kOk; }
  ExitCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(ExitCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ExitCode code_ = ExitCode::kOk;
  std::string message_;
};

// A value or the Status explaining why there is none.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit on purpose
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T* operator->() { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace lora_share
