// The collective kernel for reductions over uint8 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(uint8, int(DataType::kUint8), uint8_t)
#endif
}  // namespace gpu
}  // namespace jax_rccl
