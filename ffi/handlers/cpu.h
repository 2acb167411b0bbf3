// The XLA FFI handlers of the CPU runtime: one stateful target per collective kind (see the
// contract in docs and jax_rccl/_ffi.py), sharing one state type.
#pragma once

#include <vector>

namespace jax_rccl {
namespace cpu {

// The name the state type is registered under (jax.ffi.register_ffi_type).
inline constexpr const char* kCpuStateTypeName = "jax_rccl_cpu_state";

struct FfiTarget {
  const char* name;   // "jax_rccl_all_reduce", ...
  void* instantiate;  // XLA_FFI_Handler*
  void* execute;      // XLA_FFI_Handler*
};

// The seven targets, in the contract's order.
const std::vector<FfiTarget>& CpuFfiTargets();
// &CpuState::id (an XLA_FFI_TypeId*) and the state's XLA_FFI_TypeInfo*.
void* CpuStateTypeId();
void* CpuStateTypeInfo();

}  // namespace cpu
}  // namespace jax_rccl
