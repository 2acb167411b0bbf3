#include "ffi/core/status.h"

#include <cstring>

namespace jax_rccl {

std::string ErrnoText(int e) {
  return detail::StrCat(std::strerror(e), " (errno ", e, ")");
}

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kInvalidUsage:
      return "invalid usage";
    case Code::kUnsupported:
      return "unsupported";
    case Code::kInternal:
      return "internal error";
    case Code::kTimeout:
      return "timeout";
    case Code::kSystem:
      return "system error";
  }
  return "unknown";
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
