// The kernels of hip/kernels/*.hip (one per element type, and one for data movement) and the
// element types they are compiled for (device code only: included by hip/kernel.hip and
// hip/runtime.hip).
#pragma once

#include <stdint.h>

#include "ffi/compute/dtypes.h"
#include "hip/device_conn.h"
#include "hip/portability.h"

// The kernel space: X(name, DataType enumerator, element type), one reduction kernel body per
// (type, op). A development build may define JR_DEVICE_QUICK to compile int32, float32 and
// bfloat16 only (data movement never needs a type); DeviceHasDtype tells the host what is in.
#define JR_DEVICE_DTYPES_ALL(X)                   \
  X(int8, kInt8, int8_t)                          \
  X(uint8, kUint8, uint8_t)                       \
  X(bool, kBool, uint8_t)                         \
  X(int16, kInt16, int16_t)                       \
  X(uint16, kUint16, uint16_t)                    \
  X(int32, kInt32, int32_t)                       \
  X(uint32, kUint32, uint32_t)                    \
  X(int64, kInt64, int64_t)                       \
  X(uint64, kUint64, uint64_t)                    \
  X(float16, kFloat16, ::jax_rccl::Half)          \
  X(bfloat16, kBfloat16, ::jax_rccl::BFloat16)    \
  X(float32, kFloat32, float)                     \
  X(float64, kFloat64, double)                    \
  X(float8_e4m3fn, kFp8E4M3, ::jax_rccl::Fp8E4M3) \
  X(float8_e5m2, kFp8E5M2, ::jax_rccl::Fp8E5M2)

#define JR_DEVICE_DTYPES_QUICK(X) \
  X(int32, kInt32, int32_t)       \
  X(float32, kFloat32, float)     \
  X(bfloat16, kBfloat16, ::jax_rccl::BFloat16)

#if defined(JR_DEVICE_QUICK)
#define JR_DEVICE_DTYPES(X) JR_DEVICE_DTYPES_QUICK(X)
#else
#define JR_DEVICE_DTYPES(X) JR_DEVICE_DTYPES_ALL(X)
#endif

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
