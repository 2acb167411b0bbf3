// The collective kernel for reductions over float64 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(float64, int(DataType::kFloat64), double)
#endif
}  // namespace gpu
}  // namespace jax_rccl
