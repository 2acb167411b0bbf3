// The collective kernel for reductions over uint16 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(uint16, int(DataType::kUint16), uint16_t)
#endif
}  // namespace gpu
}  // namespace jax_rccl
