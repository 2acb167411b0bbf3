// Small device-control calls the FFI handlers need besides hip/runtime.h: which device is
// current, peer access, stream-ordered memset, and capture-mode guards. Plain C++ interface;
// implemented in ffi/gpu/device_ctl.cc over hip/portability.h (CUDA or HIP runtime).
#pragma once

#include <cstdint>

#include "ffi/core/status.h"

namespace jax_rccl {
namespace gpu {

// The device current on this thread.
StatusOr<int> CurrentDevice();
// Makes `ordinal` current on this thread when it is not already (cheap when it is).
Status EnsureDevice(int ordinal);

// Makes `ordinal` current for the guard's lifetime, then restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

// While alive, this thread may make calls that a stream capture in progress elsewhere would
// otherwise forbid (allocations, synchronous copies on other streams): XLA may be recording a
// command buffer when a collective runs for the first time.
class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int mode_ = 0;
};

// Lets device `from` (current during the call) read and write memory of device `to`. Once per
// pair per process; an error when the pair has no peer path.
Status EnablePeerAccess(int from, int to);

// Zeroes `bytes` at `dst` in stream order (captured like any other stream operation).
Status MemsetAsync(void* dst, int64_t bytes, void* stream);

// Copies `bytes` from `src` to `dst` (device memory) in stream order (captured like any other
// stream operation).
Status CopyAsync(void* dst, const void* src, int64_t bytes, void* stream);

// How many devices this process sees.
StatusOr<int> DeviceCount();

// Inter-process handles of device memory (several processes on one host, also sharing one GPU).
constexpr int kIpcHandleBytes = 64;
// The handle of the allocation at `p` (from DeviceAlloc/AllocRegion) into `out`.
Status IpcHandleOf(void* p, char out[kIpcHandleBytes]);
// Maps another process's allocation into this process on the current device.
StatusOr<void*> IpcOpen(const char handle[kIpcHandleBytes]);

}  // namespace gpu
}  // namespace jax_rccl
