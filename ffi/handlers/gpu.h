// The XLA FFI handlers of the GPU runtime (platforms CUDA and ROCM): the same seven stateful
// targets, attributes and state layout as the CPU ones (ffi/handlers/cpu.h), with a GPU state
// type.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ffi/handlers/cpu.h"

namespace jax_rccl {
namespace gpu {

// The name the state type is registered under (jax.ffi.register_ffi_type, platform CUDA/ROCM).
inline constexpr const char* kGpuStateTypeName = "jax_rccl_gpu_state";

// The seven targets, in the contract's order (the same names as the CPU targets).
const std::vector<cpu::FfiTarget>& GpuFfiTargets();
// &GpuState::id (an XLA_FFI_TypeId*) and the state's XLA_FFI_TypeInfo*.
void* GpuStateTypeId();
void* GpuStateTypeInfo();

}  // namespace gpu
}  // namespace jax_rccl
