// The collective kernels (one per element type, and one for data movement: the units
// hip/gen_kernels.py writes into the build folder) and the element types they are compiled for
// (device code only: included by hip/runtime.hip).
#pragma once

#include <stdint.h>

#include "ffi/compute/dtypes.h"
#include "hip/device_conn.h"
#include "hip/portability.h"

// The kernel space, declared once in hip/gen_kernels.py: its generated hip/kernel_set.h (in the
// build folder) defines JR_DEVICE_DTYPES(X), X(name, DataType enumerator, element type) for each
// element type whose reduction kernel this build holds (all of them, or the build's filter:
// JAX_RCCL_DEVICE_TYPES, JAX_RCCL_DEVICE_QUICK); data movement (CollKernel_copy) never needs a
// type. DeviceHasDtype tells the host what is in.
#include "hip/kernel_set.h"

namespace jax_rccl {
namespace gpu {

#define JR_DECLARE_COLL_KERNEL(name, enumName, T) \
  __global__ void CollKernel_##name(const JR_GRID_CONSTANT KernelArgs a);
JR_DEVICE_DTYPES(JR_DECLARE_COLL_KERNEL)
JR_DECLARE_COLL_KERNEL(copy, -, uint8_t)
#undef JR_DECLARE_COLL_KERNEL
__global__ void CopyKernel(const char* from, char* to, int64_t bytes);

}  // namespace gpu
}  // namespace jax_rccl
