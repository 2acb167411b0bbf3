// The native extension module jax_rccl._jax_rccl.
#include <nanobind/nanobind.h>

#include "ffi/bind/bindings.h"

namespace nb = nanobind;

NB_MODULE(_jax_rccl, m) {
  m.doc() = "jax_rccl native module: the planner and (later) the FFI handlers";
  nb::module_ internal = m.def_submodule("internal", "Low-level planner entry points for tests");
  jax_rccl::BindParams(m);
  jax_rccl::BindPlanner(m);
  jax_rccl::BindRedop(m, internal);
  jax_rccl::BindSelectInternals(internal);
  jax_rccl::BindCollInternals(internal);
  jax_rccl::BindP2pInternals(internal);
  jax_rccl::BindRuntime(m);
#if defined(JAX_RCCL_WITH_GPU)
  jax_rccl::BindGpu(m);
#endif
}
