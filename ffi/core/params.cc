#include "ffi/core/params.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace jax_rccl {
namespace {

bool ReadInt(const char* s, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

bool ReadFloat(const char* s, double* out) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || *end != '\0') return false;
  *out = v;
  return true;
}

const char* EnvText(const char* env) {
  const char* v = std::getenv(env);
  return v == nullptr ? "" : v;
}

template <typename T>
std::string Show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Params LoadParams(std::vector<std::string>* warnings) {
  Params p;
#define JAX_RCCL_PARAM_READ_Int(name, env) \
  if (!ReadInt(v, &p.name) && warnings)    \
    warnings->push_back(std::string(env) + "='" + v + "' is not an integer; using the default");
#define JAX_RCCL_PARAM_READ_Float(name, env) \
  if (!ReadFloat(v, &p.name) && warnings)    \
    warnings->push_back(std::string(env) + "='" + v + "' is not a number; using the default");
#define JAX_RCCL_PARAM_READ_String(name, env) p.name = v;
#define JAX_RCCL_PARAM_READ(name, env, kind, def, doc) \
  if (const char* v = std::getenv(env)) {              \
    JAX_RCCL_PARAM_READ_##kind(name, env)              \
  }
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_READ)
#undef JAX_RCCL_PARAM_READ
  return p;
}

StatusOr<Params> LoadValidParams() {
  std::vector<std::string> warnings;
  Params p = LoadParams(&warnings);
  JR_REQUIRE(
      warnings.empty(), Code::kInvalidArgument, "jax_rccl: ",
      warnings.empty() ? std::string() : warnings.front().substr(0, warnings.front().find(';')),
      " (unset it for the default)");
  auto bad = [](const char* env, const std::string& allowed) {
    return Status(Code::kInvalidArgument, detail::StrCat("jax_rccl: ", env, "='", EnvText(env),
                                                         "' is out of range; allowed: ", allowed));
  };
  if (!(std::isfinite(p.timeout) && p.timeout > 0)) {
    return bad("JAX_RCCL_TIMEOUT", "a finite number of seconds > 0");
  }
  if (!(std::isfinite(p.stall_grace) && p.stall_grace >= 0)) {
    return bad("JAX_RCCL_STALL_GRACE", "a finite number of seconds >= 0 (0: off)");
  }
  if (p.nchannels < 0 || p.nchannels > 64) {
    return bad("JAX_RCCL_NCHANNELS", "an integer 0..64 (0: the topology's count)");
  }
  if (p.p2p_ll_threshold < 0) return bad("JAX_RCCL_P2P_LL_THRESHOLD", "an integer >= 0");
  if (p.huge_pages != 0 && p.huge_pages != 1) return bad("JAX_RCCL_HUGE_PAGES", "0 or 1");
  if (p.net_threads < 0 || p.net_threads > 64) {
    return bad("JAX_RCCL_NET_THREADS", "an integer 0..64 (0: the proxy's own thread)");
  }
  if (p.net_nchannels < 0 || p.net_nchannels > 64) {
    return bad("JAX_RCCL_NET_NCHANNELS", "an integer 0..64 (0: no cap)");
  }
  if (p.net_streams < 0 || p.net_streams > 64) {
    return bad("JAX_RCCL_NET_STREAMS", "an integer 0..64 (0: a stream per channel)");
  }
  // The Simple buffers (within a host, across hosts) take the same sizes.
  const auto buffSizeOk = [](int64_t b) {
    return b >= (int64_t(1) << 16) && b <= (int64_t(1) << 26) && b % 4096 == 0;
  };
  constexpr const char* kBuffSizes = "a multiple of 4096 from 65536 to 67108864 bytes";
  if (!buffSizeOk(p.buffsize)) return bad("JAX_RCCL_BUFFSIZE", kBuffSizes);
  if (!buffSizeOk(p.net_buffsize)) return bad("JAX_RCCL_NET_BUFFSIZE", kBuffSizes);
  if (p.check_calls != 0 && p.check_calls != 1) return bad("JAX_RCCL_CHECK_CALLS", "0 or 1");
  for (char& c : p.debug) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (p.debug != "WARN" && p.debug != "INFO" && p.debug != "TRACE") {
    return bad("JAX_RCCL_DEBUG", "WARN, INFO or TRACE (any case)");
  }
  if (p.transport != "auto" && p.transport != "shm" && p.transport != "socket") {
    return bad("JAX_RCCL_TRANSPORT", "auto, shm, socket");
  }
  if (!p.lax.empty() && p.lax != "0" && p.lax != "1") {
    std::string rest = p.lax;
    bool ok = true;
    while (ok) {
      const size_t comma = rest.find(',');
      const std::string item = rest.substr(0, comma);
      ok = item == "cpu" || item == "cuda" || item == "rocm";
      if (comma == std::string::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (!ok) return bad("JAX_RCCL_LAX", "empty, 0, 1, or a comma-separated list of cpu, cuda, rocm");
  }
  if (!p.net_trace.empty()) {
    struct stat st;
    if (stat(p.net_trace.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        access(p.net_trace.c_str(), W_OK | X_OK) != 0) {
      return bad("JAX_RCCL_NET_TRACE", "a folder this process can write (empty: none)");
    }
  }
  return p;
}

std::vector<ParamInfo> DescribeParams(const Params& p) {
  std::vector<ParamInfo> out;
  const Params d;
#define JAX_RCCL_PARAM_KIND_Int "int"
#define JAX_RCCL_PARAM_KIND_Float "float"
#define JAX_RCCL_PARAM_KIND_String "string"
#define JAX_RCCL_PARAM_DESCRIBE(name, env, kind, def, doc) \
  out.push_back({#name, env, JAX_RCCL_PARAM_KIND_##kind, Show(d.name), Show(p.name), doc});
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_DESCRIBE)
#undef JAX_RCCL_PARAM_DESCRIBE
  return out;
}

}  // namespace jax_rccl
