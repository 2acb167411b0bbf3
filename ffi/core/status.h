// One family of status macros for all host code.
//
// A failing call returns a Status; every frame that passes it on adds one "file:line" line, so
// an error reads as a short backtrace (the habit of NCCL's NCCLCHECK). Conversion to
// ffi::Error or to a Python exception happens in exactly one place each (ffi/).
#pragma once

#include <sstream>
#include <string>
#include <utility>

namespace jax_rccl {

enum class Code : int {
  kOk = 0,
  kInvalidArgument,  // a value passed in is out of range (maps to ValueError)
  kInvalidUsage,     // a valid value used in an invalid way (maps to ValueError)
  kUnsupported,      // a combination this build cannot run (maps to NotImplementedError)
  kInternal,         // a bug in jax_rccl (maps to RuntimeError)
  kTimeout,          // a peer did not arrive before the deadline (maps to TimeoutError)
  kSystem,           // an OS or driver call failed (maps to OSError)
};

const char* CodeName(Code code);

// "No such file or directory (errno 2)": an errno value for messages.
std::string ErrnoText(int e);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // The message followed by the frames it passed through, innermost first.
  std::string ToString() const;
  // Adds "  at file:line" to the trace.
  Status& AddFrame(const char* file, int line);

 private:
  Code code_ = Code::kOk;
  std::string message_;
  std::string trace_;
};

namespace detail {
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// A value or an error.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  Status& status() { return status_; }
  T& value() { return value_; }
  const T& value() const { return value_; }
  T&& take() { return std::move(value_); }

 private:
  Status status_;
  T value_{};
};

}  // namespace jax_rccl

#define JR_STATUS_FRAME_(s) (s).AddFrame(__FILE__, __LINE__)

// Returns the status of `expr` from the enclosing function if it is an error.
#define JR_CHECK(expr)                 \
  do {                                 \
    ::jax_rccl::Status _jr_s = (expr); \
    if (!_jr_s.ok()) {                 \
      JR_STATUS_FRAME_(_jr_s);         \
      return _jr_s;                    \
    }                                  \
  } while (0)

// Returns a new error with a message built from the remaining arguments (streamed).
#define JR_FAIL(code, ...)                                                   \
  do {                                                                       \
    ::jax_rccl::Status _jr_s(code, ::jax_rccl::detail::StrCat(__VA_ARGS__)); \
    JR_STATUS_FRAME_(_jr_s);                                                 \
    return _jr_s;                                                            \
  } while (0)

// Fails with `code` and the message when `cond` does not hold.
#define JR_REQUIRE(cond, code, ...)          \
  do {                                       \
    if (!(cond)) JR_FAIL(code, __VA_ARGS__); \
  } while (0)

// Assigns the value of a StatusOr expression to `lhs`, or returns its error.
#define JR_ASSIGN_OR_RETURN(lhs, expr)              \
  auto JR_CONCAT_(_jr_so_, __LINE__) = (expr);      \
  JR_CHECK(JR_CONCAT_(_jr_so_, __LINE__).status()); \
  lhs = JR_CONCAT_(_jr_so_, __LINE__).take()
#define JR_CONCAT_INNER_(a, b) a##b
#define JR_CONCAT_(a, b) JR_CONCAT_INNER_(a, b)
