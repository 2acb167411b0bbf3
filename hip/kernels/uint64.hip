// The collective kernel for reductions over uint64 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(uint64, int(DataType::kUint64), uint64_t)
#endif
}  // namespace gpu
}  // namespace jax_rccl
