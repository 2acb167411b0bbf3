// Placeholder until the CPU runtime lands.
#include "ffi/bindings.h"
namespace jax_rccl {
void BindRuntime(nanobind::module_&) {}
}  // namespace jax_rccl
