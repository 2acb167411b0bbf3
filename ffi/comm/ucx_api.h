// UCX's UCP library, loaded at run time (dlopen), for the UCX backend of the network interface
// (net_ucx.h). The build compiles against UCX's headers (the libucx wheel's, found at configure
// time) but links no UCX library: a process loads libucp.so.0 the first time a network asks for
// UCX, from the system's library path, or from the libucx wheel once jax_rccl/_ucx.py has loaded
// it (libucx.load_library(): the wheel's libraries then answer to their sonames). A process where
// neither is present runs on our TCP backend.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

#include "ffi/core/status.h"

namespace jax_rccl {
namespace comm {
namespace ucx {

// The UCP and UCS functions the backend calls (one pointer each, found by dlsym).
#define JAX_RCCL_UCX_FUNCTIONS(X)   \
  X(ucp_get_version)                \
  X(ucp_get_version_string)         \
  X(ucp_config_read)                \
  X(ucp_config_release)             \
  X(ucp_init_version)               \
  X(ucp_cleanup)                    \
  X(ucp_context_query)              \
  X(ucp_worker_create)              \
  X(ucp_worker_destroy)             \
  X(ucp_worker_query)               \
  X(ucp_worker_release_address)     \
  X(ucp_worker_progress)            \
  X(ucp_worker_get_efd)             \
  X(ucp_worker_arm)                 \
  X(ucp_worker_set_am_recv_handler) \
  X(ucp_ep_create)                  \
  X(ucp_ep_close_nbx)               \
  X(ucp_ep_query)                   \
  X(ucp_am_send_nbx)                \
  X(ucp_am_recv_data_nbx)           \
  X(ucp_am_data_release)            \
  X(ucp_request_check_status)       \
  X(ucp_request_free)               \
  X(ucp_mem_map)                    \
  X(ucp_mem_unmap)                  \
  X(ucs_status_string)

struct Api {
#define JAX_RCCL_UCX_POINTER(name) decltype(&::name) name = nullptr;
  JAX_RCCL_UCX_FUNCTIONS(JAX_RCCL_UCX_POINTER)
#undef JAX_RCCL_UCX_POINTER
  std::string version;  // "1.22.0"
  std::string path;     // the file libucp was loaded from
};

// The oldest UCP this backend runs on (ucp_ep_query's transports, ucp_am_send_nbx's flags).
constexpr unsigned kMinMajor = 1, kMinMinor = 15;

// Loads libucp.so.0 (once it succeeded; a failure is tried again at the next call, after Python
// may have loaded the wheel) and checks its version. Errors say why, in words for a user.
StatusOr<const Api*> Load();

// Whether Load succeeded before (without trying).
bool Loaded();

// Test hook: the library name Load opens (empty: libucp.so.0), for a process where it must fail.
void SetLibraryName(const std::string& name);

// "UCS_ERR_...": the text of a UCX status.
std::string StatusText(const Api& api, ucs_status_t s);

}  // namespace ucx
}  // namespace comm
}  // namespace jax_rccl
