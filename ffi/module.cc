// The native extension module jax_rccl._jax_rccl.
#include <nanobind/nanobind.h>

#include <stdexcept>

#include "ffi/bindings.h"

namespace nb = nanobind;

namespace jax_rccl {

void ThrowIfError(const Status& status) {
  if (status.ok()) return;
  std::string msg = status.ToString();
  switch (status.code()) {
    case Code::kInvalidArgument:
    case Code::kInvalidUsage:
      throw nb::value_error(msg.c_str());
    case Code::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
      throw nb::python_error();
    case Code::kTimeout:
      PyErr_SetString(PyExc_TimeoutError, msg.c_str());
      throw nb::python_error();
    case Code::kSystem:
      PyErr_SetString(PyExc_OSError, msg.c_str());
      throw nb::python_error();
    default:
      throw std::runtime_error(msg);
  }
}

}  // namespace jax_rccl

NB_MODULE(_jax_rccl, m) {
  m.doc() = "jax_rccl native module: the planner and (later) the FFI handlers";
  nb::module_ internal = m.def_submodule("internal", "Low-level planner entry points for tests");
  jax_rccl::BindParams(m);
  jax_rccl::BindPlanner(m);
  jax_rccl::BindRedop(m, internal);
  jax_rccl::BindSelectInternals(internal);
  jax_rccl::BindCollInternals(internal);
  jax_rccl::BindP2pInternals(internal);
  jax_rccl::BindExecutorTest(internal);
  jax_rccl::BindRuntime(m);
#if defined(JAX_RCCL_WITH_GPU)
  jax_rccl::BindGpu(m);
#endif
}
