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

// Copies between host memory and device `ordinal` in the order they are issued, on a
// non-blocking stream of its own: for a host thread (the network proxy) that must neither wait for
// nor be ordered behind the kernels on XLA's streams. Not thread-safe: one thread uses it.
class CopyStream {
 public:
  explicit CopyStream(int ordinal) : ordinal_(ordinal) {}
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  // Issued, not waited for: `src` must stay as it is until the next Wait.
  Status ToDevice(void* dst, const void* src, int64_t bytes);
  // Issued and waited for, with every copy before it.
  Status ToHost(void* dst, const void* src, int64_t bytes);
  Status Wait();

 private:
  Status Issue(void* dst, const void* src, int64_t bytes, bool toDevice);
  int ordinal_;
  void* stream_ = nullptr;
};

// Page-locked host memory (a copy from it to a device runs without staging).
StatusOr<void*> PinnedAlloc(int64_t bytes);
void PinnedFree(void* p);

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
