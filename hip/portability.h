// HIP names on both platforms: the device code under hip/ is written in HIP; on NVIDIA it is
// compiled by nvcc with these names mapped onto CUDA (HIP's own NVIDIA headers do not build with
// CUDA 13). On AMD, hipcc provides the names itself.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define JAX_RCCL_WARP_SIZE 64
#else
#include <cuda_runtime.h>

using hipError_t = cudaError_t;
using hipStream_t = cudaStream_t;
using hipEvent_t = cudaEvent_t;
constexpr hipError_t hipSuccess = cudaSuccess;

#define hipGetErrorString cudaGetErrorString
#define hipGetLastError cudaGetLastError
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemsetAsync cudaMemsetAsync
#define hipStreamSynchronize cudaStreamSynchronize
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#define JAX_RCCL_WARP_SIZE 32
#endif
