// The collective kernel for reductions over int16 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(int16, int(DataType::kInt16), int16_t)
#endif
}  // namespace gpu
}  // namespace jax_rccl
