// The collective kernel for reductions over float16 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(float16, int(DataType::kFloat16), ::jax_rccl::Half)
#endif
}  // namespace gpu
}  // namespace jax_rccl
