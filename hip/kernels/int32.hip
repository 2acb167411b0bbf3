// The collective kernel for reductions over int32 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
JR_DEFINE_COLL_KERNEL(int32, int(DataType::kInt32), int32_t)
}  // namespace gpu
}  // namespace jax_rccl
