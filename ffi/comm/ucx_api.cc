// UCX's UCP library loaded at run time (ucx_api.h).
#include "ffi/comm/ucx_api.h"

#include <dlfcn.h>

#include <mutex>

namespace jax_rccl {
namespace comm {
namespace ucx {
namespace {

constexpr char kDefaultLibrary[] = "libucp.so.0";

struct Loader {
  std::mutex mu;
  Api api;
  bool loaded = false;
  std::string library = kDefaultLibrary;
};

Loader& TheLoader() {
  static Loader* l = new Loader();  // never destroyed: the library stays loaded with the process
  return *l;
}

}  // namespace

void SetLibraryName(const std::string& name) {
  Loader& L = TheLoader();
  std::lock_guard<std::mutex> lock(L.mu);
  L.library = name.empty() ? kDefaultLibrary : name;
}

bool Loaded() {
  Loader& L = TheLoader();
  std::lock_guard<std::mutex> lock(L.mu);
  return L.loaded;
}

StatusOr<const Api*> Load() {
  Loader& L = TheLoader();
  std::lock_guard<std::mutex> lock(L.mu);
  if (L.loaded) return static_cast<const Api*>(&L.api);
  // RTLD_LOCAL: UCX's symbols stay out of the process's global namespace (as the libucx wheel's
  // loader keeps them); RTLD_NOW: a library missing a symbol fails here, not in a call.
  void* h = dlopen(L.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    JR_FAIL(Code::kUnsupported, "jax_rccl: UCX could not be loaded (", err ? err : L.library,
            "): install it with `pip install jax_rccl[ucx]` (the libucx-cu13 wheel) or put a "
            "system UCX's libucp.so.0 on the library path");
  }
  Api api;
#define JAX_RCCL_UCX_LOOKUP(name)                                                           \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(h, #name));                         \
  if (api.name == nullptr) {                                                                \
    dlclose(h);                                                                             \
    JR_FAIL(Code::kUnsupported, "jax_rccl: the UCX library ", L.library, " has no ", #name, \
            " (jax_rccl needs UCP ", kMinMajor, ".", kMinMinor, " or newer)");              \
  }
  JAX_RCCL_UCX_FUNCTIONS(JAX_RCCL_UCX_LOOKUP)
#undef JAX_RCCL_UCX_LOOKUP
  unsigned major = 0, minor = 0, release = 0;
  api.ucp_get_version(&major, &minor, &release);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(api.ucp_get_version), &info) != 0 && info.dli_fname) {
    api.path = info.dli_fname;
  }
  api.version = detail::StrCat(major, ".", minor, ".", release);
  if (major != kMinMajor || minor < kMinMinor) {
    dlclose(h);
    JR_FAIL(Code::kUnsupported, "jax_rccl: the UCX at ", api.path, " is version ", api.version,
            "; jax_rccl needs UCP ", kMinMajor, ".", kMinMinor, " or newer (a 1.x release)");
  }
  L.api = api;
  L.loaded = true;
  return static_cast<const Api*>(&L.api);
}

std::string StatusText(const Api& api, ucs_status_t s) {
  const char* t = api.ucs_status_string != nullptr ? api.ucs_status_string(s) : nullptr;
  return t != nullptr ? std::string(t) : detail::StrCat("UCX status ", int(s));
}

}  // namespace ucx
}  // namespace comm
}  // namespace jax_rccl
