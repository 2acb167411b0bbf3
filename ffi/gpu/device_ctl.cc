// See ffi/gpu/device_ctl.h. Host code over the vendor runtime API (hip/portability.h maps the HIP
// names onto CUDA in the NVIDIA build).
#include "ffi/gpu/device_ctl.h"

#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "hip/portability.h"

namespace jax_rccl {
namespace gpu {
namespace {
#if defined(JAX_RCCL_AMD)
constexpr hipError_t kPeerAlreadyEnabled = hipErrorPeerAccessAlreadyEnabled;
#else
constexpr hipError_t kPeerAlreadyEnabled = cudaErrorPeerAccessAlreadyEnabled;
#endif
}  // namespace

StatusOr<int> CurrentDevice() {
  int d = -1;
  const hipError_t err = hipGetDevice(&d);
  JR_REQUIRE(err == hipSuccess, Code::kSystem,
             "querying the current GPU: ", hipGetErrorString(err));
  return d;
}

Status EnsureDevice(int ordinal) {
  int d = -1;
  if (hipGetDevice(&d) == hipSuccess && d == ordinal) return Status::Ok();
  const hipError_t err = hipSetDevice(ordinal);
  JR_REQUIRE(err == hipSuccess, Code::kSystem, "making GPU ", ordinal,
             " current: ", hipGetErrorString(err));
  return Status::Ok();
}

DeviceGuard::DeviceGuard(int ordinal) {
  if (hipGetDevice(&previous_) != hipSuccess) previous_ = -1;
  if (previous_ != ordinal) status_ = EnsureDevice(ordinal);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)hipSetDevice(previous_);
}

RelaxedCapture::RelaxedCapture() {
  hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed;
  (void)hipThreadExchangeStreamCaptureMode(&mode);
  mode_ = static_cast<int>(mode);
}

RelaxedCapture::~RelaxedCapture() {
  hipStreamCaptureMode mode = static_cast<hipStreamCaptureMode>(mode_);
  (void)hipThreadExchangeStreamCaptureMode(&mode);
}

Status EnablePeerAccess(int from, int to) {
  if (from == to) return Status::Ok();
  static std::mutex mu;
  static std::set<std::pair<int, int>>* done = new std::set<std::pair<int, int>>();
  std::lock_guard<std::mutex> lock(mu);
  if (done->count({from, to}) != 0) return Status::Ok();
  int can = 0;
  hipError_t err = hipDeviceCanAccessPeer(&can, from, to);
  JR_REQUIRE(err == hipSuccess, Code::kSystem, "asking whether GPU ", from, " can reach GPU ", to,
             ": ", hipGetErrorString(err));
  JR_REQUIRE(can != 0, Code::kUnsupported, "GPU ", from, " cannot access the memory of GPU ", to,
             " (no peer path); jax_rccl needs peer access between the GPUs of a group in one "
             "process");
  DeviceGuard guard(from);
  JR_CHECK(guard.status());
  err = hipDeviceEnablePeerAccess(to, 0);
  if (err == kPeerAlreadyEnabled) {
    (void)hipGetLastError();  // enabled by XLA or an earlier communicator: clear the last error
  } else {
    JR_REQUIRE(err == hipSuccess, Code::kSystem, "enabling peer access from GPU ", from, " to GPU ",
               to, ": ", hipGetErrorString(err));
  }
  done->insert({from, to});
  return Status::Ok();
}

Status MemsetAsync(void* dst, int64_t bytes, void* stream) {
  if (bytes <= 0) return Status::Ok();
  const hipError_t err =
      hipMemsetAsync(dst, 0, static_cast<size_t>(bytes), static_cast<hipStream_t>(stream));
  JR_REQUIRE(err == hipSuccess, Code::kInternal, "zeroing ", bytes,
             " bytes of a result: ", hipGetErrorString(err));
  return Status::Ok();
}

Status CopyAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  if (bytes <= 0 || dst == src) return Status::Ok();
  const hipError_t err = hipMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                        hipMemcpyDeviceToDevice, static_cast<hipStream_t>(stream));
  JR_REQUIRE(err == hipSuccess, Code::kInternal, "copying ", bytes,
             " bytes into a result: ", hipGetErrorString(err));
  return Status::Ok();
}

StatusOr<int> DeviceCount() {
  int n = 0;
  const hipError_t err = hipGetDeviceCount(&n);
  JR_REQUIRE(err == hipSuccess, Code::kSystem, "counting GPUs: ", hipGetErrorString(err));
  return n;
}

static_assert(sizeof(hipIpcMemHandle_t) <= kIpcHandleBytes, "IPC handle size");

Status IpcHandleOf(void* p, char out[kIpcHandleBytes]) {
  hipIpcMemHandle_t h;
  const hipError_t err = hipIpcGetMemHandle(&h, p);
  JR_REQUIRE(err == hipSuccess, Code::kSystem,
             "exporting a GPU connection region to other processes: ", hipGetErrorString(err));
  std::memset(out, 0, kIpcHandleBytes);
  std::memcpy(out, &h, sizeof(h));
  return Status::Ok();
}

StatusOr<void*> IpcOpen(const char handle[kIpcHandleBytes]) {
  hipIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof(h));
  void* p = nullptr;
  const hipError_t err = hipIpcOpenMemHandle(&p, h, hipIpcMemLazyEnablePeerAccess);
  JR_REQUIRE(err == hipSuccess, Code::kSystem,
             "mapping another process's GPU connection region: ", hipGetErrorString(err));
  return p;
}

}  // namespace gpu
}  // namespace jax_rccl
