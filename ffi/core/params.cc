#include "ffi/core/params.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

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

namespace {

// The `allowed` text of the parameter read from `env`.
const char* AllowedOf(const char* env) {
#define JAX_RCCL_PARAM_ALLOWED(name, env_, kind, def, allowed, doc) \
  if (std::strcmp(env, env_) == 0) return allowed;
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_ALLOWED)
#undef JAX_RCCL_PARAM_ALLOWED
  return "";
}

// Reads every parameter; `bad` gets (variable, "is not an integer" / "is not a number") for each
// value that does not parse (it keeps its default).
Params ReadParams(std::vector<std::pair<const char*, const char*>>* bad) {
  Params p;
#define JAX_RCCL_PARAM_READ_Int(name, env) \
  if (!ReadInt(v, &p.name)) bad->emplace_back(env, "is not an integer");
#define JAX_RCCL_PARAM_READ_Float(name, env) \
  if (!ReadFloat(v, &p.name)) bad->emplace_back(env, "is not a number");
#define JAX_RCCL_PARAM_READ_String(name, env) p.name = v;
#define JAX_RCCL_PARAM_READ(name, env, kind, def, allowed, doc) \
  if (const char* v = std::getenv(env)) {                       \
    JAX_RCCL_PARAM_READ_##kind(name, env)                       \
  }
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_READ)
#undef JAX_RCCL_PARAM_READ
  return p;
}

}  // namespace

std::string SettingError(const char* env, const std::string& problem) {
  return detail::StrCat("jax_rccl: ", env, "='", EnvText(env), "' ", problem,
                        "; allowed: ", AllowedOf(env));
}

Params LoadParams(std::vector<std::string>* warnings) {
  std::vector<std::pair<const char*, const char*>> bad;
  Params p = ReadParams(&bad);
  if (warnings != nullptr) {
    for (const auto& [env, problem] : bad) {
      warnings->push_back(SettingError(env, problem) + "; using the default");
    }
  }
  return p;
}

StatusOr<Params> LoadValidParams() {
  // Settings errors carry no file:line frames: they are about the user's environment, not a
  // path through jax_rccl.
  std::vector<std::pair<const char*, const char*>> unparsed;
  Params p = ReadParams(&unparsed);
  if (!unparsed.empty()) {
    return Status(Code::kInvalidArgument,
                  SettingError(unparsed.front().first, unparsed.front().second) +
                      " (unset it for the default)");
  }
  auto bad = [](const char* env, const char* problem = "is out of range") {
    return Status(Code::kInvalidArgument, SettingError(env, problem));
  };
  if (!(std::isfinite(p.timeout) && p.timeout > 0)) return bad("JAX_RCCL_TIMEOUT");
  if (!(std::isfinite(p.stall_grace) && p.stall_grace >= 0)) return bad("JAX_RCCL_STALL_GRACE");
  if (p.nchannels < 0 || p.nchannels > 64) return bad("JAX_RCCL_NCHANNELS");
  if (p.p2p_ll_threshold < 0) return bad("JAX_RCCL_P2P_LL_THRESHOLD");
  if (p.huge_pages != 0 && p.huge_pages != 1) return bad("JAX_RCCL_HUGE_PAGES");
  if (p.cpu_oneshot < 0) return bad("JAX_RCCL_CPU_ONESHOT");
  if (p.net_threads < 0 || p.net_threads > 64) return bad("JAX_RCCL_NET_THREADS");
  if (p.net_nchannels < 0 || p.net_nchannels > 64) return bad("JAX_RCCL_NET_NCHANNELS");
  if (p.net_streams < 0 || p.net_streams > 64) return bad("JAX_RCCL_NET_STREAMS");
  // The Simple buffers (within a host, across hosts) take the same sizes.
  const auto buffSizeOk = [](int64_t b) {
    return b >= (int64_t(1) << 16) && b <= (int64_t(1) << 26) && b % 4096 == 0;
  };
  if (!buffSizeOk(p.buffsize)) return bad("JAX_RCCL_BUFFSIZE");
  if (!buffSizeOk(p.net_buffsize)) return bad("JAX_RCCL_NET_BUFFSIZE");
  if (p.check_calls != 0 && p.check_calls != 1) return bad("JAX_RCCL_CHECK_CALLS");
  for (char& c : p.debug) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (p.debug != "WARN" && p.debug != "INFO" && p.debug != "TRACE")
    return bad("JAX_RCCL_DEBUG", "is not allowed");
  if (p.transport != "auto" && p.transport != "shm" && p.transport != "socket") {
    return bad("JAX_RCCL_TRANSPORT", "is not allowed");
  }
  if (p.net != "auto" && p.net != "socket" && p.net != "ucx") {
    return bad("JAX_RCCL_NET", "is not allowed");
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
    if (!ok) return bad("JAX_RCCL_LAX", "is not allowed");
  }
  if (!p.socket_ifaddr.empty()) {
    unsigned char addr[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, p.socket_ifaddr.c_str(), addr) != 1 &&
        inet_pton(AF_INET6, p.socket_ifaddr.c_str(), addr) != 1) {
      return bad("JAX_RCCL_SOCKET_IFADDR", "is not an IPv4 or IPv6 address");
    }
  }
  if (!p.socket_ifname.empty()) {
    // NCCL's syntax: '^' (exclude), then '=' (exact names), then comma-separated names.
    size_t at = p.socket_ifname[0] == '^' ? 1 : 0;
    if (at < p.socket_ifname.size() && p.socket_ifname[at] == '=') ++at;
    if (p.socket_ifname.find_first_not_of(", \t", at) == std::string::npos) {
      return bad("JAX_RCCL_SOCKET_IFNAME", "names no interface");
    }
  }
  if (!p.net_trace.empty()) {
    struct stat st;
    if (stat(p.net_trace.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        access(p.net_trace.c_str(), W_OK | X_OK) != 0) {
      return bad("JAX_RCCL_NET_TRACE", "is not a folder this process can write");
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
#define JAX_RCCL_PARAM_DESCRIBE(name, env, kind, def, allowed, doc) \
  out.push_back({#name, env, JAX_RCCL_PARAM_KIND_##kind, Show(d.name), Show(p.name), allowed, doc});
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_DESCRIBE)
#undef JAX_RCCL_PARAM_DESCRIBE
  return out;
}

}  // namespace jax_rccl
