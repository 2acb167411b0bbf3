// HIP names on both platforms: the device code under hip/ is written in HIP; on NVIDIA it is
// compiled by nvcc with these names mapped onto CUDA (HIP's own NVIDIA headers do not build with
// CUDA 13). On AMD, hipcc provides the names itself. Also the few device helpers whose spelling
// differs by vendor: a nanosecond clock, loads that bypass the non-coherent L1, and fences.
#pragma once

#include <stdint.h>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define JAX_RCCL_WARP_SIZE 64
#define JAX_RCCL_AMD 1
// Kernel arguments live in memory on AMD: taking their address costs nothing.
#define JR_GRID_CONSTANT
// hipLimitStackSize: ROCm 6 and later.
#if defined(HIP_VERSION_MAJOR) && HIP_VERSION_MAJOR >= 6
#define JR_HAS_STACK_LIMIT 1
#else
#define JR_HAS_STACK_LIMIT 0
#endif
#else
#include <cuda_runtime.h>

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
using hipGraph_t = cudaGraph_t;
using hipGraphExec_t = cudaGraphExec_t;
constexpr hipError_t hipSuccess = cudaSuccess;
// A kernel parameter whose address is taken (the kernels pass their argument block by reference)
// stays in parameter space instead of being copied to every thread's stack.
#define JR_GRID_CONSTANT __grid_constant__

#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceCount cudaGetDeviceCount
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(p, n, f) cudaHostAlloc((p), (n), (f))
#define hipHostFree cudaFreeHost
#define hipHostMallocMapped cudaHostAllocMapped
#define hipHostGetDevicePointer cudaHostGetDevicePointer
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemset cudaMemset
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemsetAsync cudaMemsetAsync
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#define hipStreamNonBlocking cudaStreamNonBlocking
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipStreamWaitEvent cudaStreamWaitEvent
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipStreamCaptureModeRelaxed cudaStreamCaptureModeRelaxed
#define hipStreamCaptureModeGlobal cudaStreamCaptureModeGlobal
#define hipStreamCaptureMode cudaStreamCaptureMode
#define hipThreadExchangeStreamCaptureMode cudaThreadExchangeStreamCaptureMode
#define hipStreamIsCapturing cudaStreamIsCapturing
#define hipStreamCaptureStatus cudaStreamCaptureStatus
#define hipStreamCaptureStatusNone cudaStreamCaptureStatusNone
#define hipGraphInstantiate(e, g, a, b, c) cudaGraphInstantiate((e), (g), 0)
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#define hipIpcMemHandle_t cudaIpcMemHandle_t
#define hipIpcGetMemHandle cudaIpcGetMemHandle
#define hipIpcOpenMemHandle cudaIpcOpenMemHandle
#define hipIpcCloseMemHandle cudaIpcCloseMemHandle
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipDeviceCanAccessPeer cudaDeviceCanAccessPeer
#define hipDeviceEnablePeerAccess cudaDeviceEnablePeerAccess
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncGetAttributes cudaFuncGetAttributes
#define hipFuncAttributes cudaFuncAttributes
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceGetPCIBusId cudaDeviceGetPCIBusId
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define JR_HAS_STACK_LIMIT 1
#define hipDeviceGetLimit cudaDeviceGetLimit
#define hipDeviceSetLimit cudaDeviceSetLimit
#define hipLimitStackSize cudaLimitStackSize
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#define JAX_RCCL_WARP_SIZE 32
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
namespace jax_rccl {
namespace gpu {

// Nanoseconds from a clock that runs at a constant rate (for deadlines, not for timing).
__device__ inline uint64_t NowNs() {
#if defined(JAX_RCCL_AMD)
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_s_memrealtime() * 10;  // the 100 MHz real-time counter of gfx90a/gfx942
#else
  return 0;
#endif
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

// Loads of memory another agent writes (FIFO slots, buffers written earlier in the launch):
// cached in L2 only, never in the non-coherent L1.
__device__ inline uint4 LoadCG(const uint4* p) {
#if defined(JAX_RCCL_AMD)
  uint4 v;
  v.x = __builtin_nontemporal_load(&p->x);
  v.y = __builtin_nontemporal_load(&p->y);
  v.z = __builtin_nontemporal_load(&p->z);
  v.w = __builtin_nontemporal_load(&p->w);
  return v;
#else
  return __ldcg(p);
#endif
}
__device__ inline uint64_t LoadCG(const uint64_t* p) {
#if defined(JAX_RCCL_AMD)
  return __builtin_nontemporal_load(p);
#else
  return __ldcg(reinterpret_cast<const unsigned long long*>(p));
#endif
}

// A 16-byte access as two words (LL128: a lane's two words; the flag lane's second is the flag).
__device__ inline uint64_t LoWord(const uint4& q) {
  return uint64_t(q.x) | (uint64_t(q.y) << 32);
}
__device__ inline uint64_t HiWord(const uint4& q) {
  return uint64_t(q.z) | (uint64_t(q.w) << 32);
}
__device__ inline uint4 TwoWords(uint64_t lo, uint64_t hi) {
  uint4 q;
  q.x = uint32_t(lo);
  q.y = uint32_t(lo >> 32);
  q.z = uint32_t(hi);
  q.w = uint32_t(hi >> 32);
  return q;
}

// A 16-byte load and store that the compiler neither splits across time nor caches (LL lines).
__device__ inline uint4 LoadVolatile(const uint4* p) {
#if defined(JAX_RCCL_AMD)
  // Two 8-byte loads: each half (data word + flag word) is read in one access.
  const volatile uint64_t* v = reinterpret_cast<const volatile uint64_t*>(p);
  const uint64_t lo = v[0], hi = v[1];
  return TwoWords(lo, hi);
#else
  uint4 r;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
#endif
}
__device__ inline void StoreVolatile(uint4* p, uint4 v) {
#if defined(JAX_RCCL_AMD)
  // Two 8-byte stores: each half (data word + flag word) lands in one access.
  uint64_t* q = reinterpret_cast<uint64_t*>(p);
  __builtin_nontemporal_store(LoWord(v), q);
  __builtin_nontemporal_store(HiWord(v), q + 1);
#else
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
#endif
}

// Warp-wide lane exchange, vote and reconvergence (every lane of the warp takes part).
__device__ inline int WarpShfl(int v, int srcLane) {
#if defined(JAX_RCCL_AMD)
  return __shfl(v, srcLane);
#else
  return __shfl_sync(0xffffffffu, v, srcLane);
#endif
}
__device__ inline bool WarpAll(int pred) {
#if defined(JAX_RCCL_AMD)
  return __all(pred) != 0;
#else
  return __all_sync(0xffffffffu, pred) != 0;
#endif
}
__device__ inline void WarpSync() {
#if defined(JAX_RCCL_AMD)
#if defined(__HIP_DEVICE_COMPILE__)
  __builtin_amdgcn_wave_barrier();
#endif
#else
  __syncwarp();
#endif
}

}  // namespace gpu
}  // namespace jax_rccl
#endif
