#include "ffi/core/status.h"

#include <cstring>
#include <iterator>

namespace jax_rccl {

std::string ErrnoText(int e) {
  return detail::StrCat(std::strerror(e), " (errno ", e, ")");
}

const char* CodeName(Code code) {
  // In Code's order, from kOk = 0.
  static constexpr const char* kNames[] = {"ok",          "invalid argument", "invalid usage",
                                           "unsupported", "internal error",   "timeout",
                                           "system error"};
  static_assert(std::size(kNames) == static_cast<size_t>(Code::kSystem) + 1, "a name per code");
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "unknown";
}

Status& Status::AddFrame(const char* file, int line) {
  if (ok()) return *this;
  // Keep paths short: from the project's top folder on.
  const char* shown = file;
  for (const char* top : {"ffi/", "hip/"}) {
    const char* p = std::strstr(file, top);
    if (p != nullptr) {
      shown = p;
      break;
    }
  }
  trace_ += "\n  at ";
  trace_ += shown;
  trace_ += ":";
  trace_ += std::to_string(line);
  return *this;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return message_ + trace_;
}

}  // namespace jax_rccl
