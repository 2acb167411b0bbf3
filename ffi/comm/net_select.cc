// The network JAX_RCCL_NET names (net.h: MakeNet), in builds with and without UCX.
#include <cstdio>
#include <cstring>
#include <memory>

#include "ffi/comm/net.h"
#ifdef JAX_RCCL_WITH_UCX
#include "ffi/comm/net_ucx.h"
#endif

namespace jax_rccl {
namespace comm {

#ifdef JAX_RCCL_WITH_UCX

UcxInfo DescribeUcx(bool load) {
  UcxInfo info;
  info.built = true;
  if (!load && !ucx::Loaded()) {
    info.error = "not loaded yet";
    return info;
  }
  StatusOr<const ucx::Api*> api = ucx::Load();
  if (!api.ok()) {
    info.error = api.status().message();
    return info;
  }
  info.loaded = true;
  info.version = api.value()->version;
  info.path = api.value()->path;
  // What it can move: a context's memory types (made for the question, then let go).
  ucp_config_t* config = nullptr;
  const ucx::Api& u = *api.value();
  if (u.ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return info;
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  unsigned major = 0, minor = 0, release = 0;
  u.ucp_get_version(&major, &minor, &release);
  ucp_context_h ctx = nullptr;
  const ucs_status_t s = u.ucp_init_version(
      UCP_API_MAJOR, minor < UCP_API_MINOR ? minor : UCP_API_MINOR, &params, config, &ctx);
  u.ucp_config_release(config);
  if (s != UCS_OK) {
    info.error = detail::StrCat("ucp_init: ", ucx::StatusText(u, s));
    return info;
  }
  ucp_context_attr_t ca;
  std::memset(&ca, 0, sizeof(ca));
  ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (u.ucp_context_query(ctx, &ca) == UCS_OK)
    info.memoryTypes = ucx::DescribeMemoryTypes(ca.memory_types);
  u.ucp_cleanup(ctx);
  return info;
}

#else

UcxInfo DescribeUcx(bool) {
  UcxInfo info;
  info.error =
      "this build of jax_rccl has no UCX backend (its build found no UCX headers: install the "
      "libucx-cu13 wheel, or `pip install jax_rccl[ucx]`, then build again)";
  return info;
}

#endif

void SetUcxLibrary(const std::string& name) {
#ifdef JAX_RCCL_WITH_UCX
  ucx::SetLibraryName(name);
#else
  (void)name;
#endif
}

StatusOr<std::unique_ptr<Net>> MakeNet(const NetOptions& o) {
  if (o.backend == "socket") {
    return MakeSocketNet(o.session, o.process, o.threads, o.streams);
  }
  JR_REQUIRE(o.backend == "auto" || o.backend == "ucx", Code::kInvalidArgument,
             "jax_rccl: JAX_RCCL_NET='", o.backend,
             "' is not a network; allowed: auto, socket, ucx");
#ifdef JAX_RCCL_WITH_UCX
  StatusOr<const ucx::Api*> api = ucx::Load();
  if (o.backend == "ucx") {
    if (!api.ok()) {
      return Status(api.status().code(), detail::StrCat(api.status().message(),
                                                        " (JAX_RCCL_NET=ucx; JAX_RCCL_NET=auto "
                                                        "or socket runs on our TCP)"));
    }
  }
  if (o.info) {
    if (api.ok()) {
      std::fprintf(stderr, "jax_rccl INFO net: JAX_RCCL_NET=%s: UCX %s from %s\n",
                   o.backend.c_str(), api.value()->version.c_str(), api.value()->path.c_str());
    } else {
      std::fprintf(stderr,
                   "jax_rccl INFO net: JAX_RCCL_NET=auto: no UCX (%s); connections go on "
                   "our TCP\n",
                   api.status().message().c_str());
    }
  }
  return MakeUcxNet(o, api.ok() ? api.value() : nullptr, o.backend == "auto");
#else
  JR_REQUIRE(o.backend != "ucx", Code::kUnsupported, "jax_rccl: JAX_RCCL_NET=ucx, but ",
             DescribeUcx(false).error, "; JAX_RCCL_NET=auto or socket runs on our TCP");
  return MakeSocketNet(o.session, o.process, o.threads, o.streams);
#endif
}

}  // namespace comm
}  // namespace jax_rccl
