// The collective kernel for reductions over bfloat16 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
JR_DEFINE_COLL_KERNEL(bfloat16, int(DataType::kBfloat16), ::jax_rccl::BFloat16)
}  // namespace gpu
}  // namespace jax_rccl
