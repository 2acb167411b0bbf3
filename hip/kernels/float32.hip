// The collective kernel for reductions over float32 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
JR_DEFINE_COLL_KERNEL(float32, int(DataType::kFloat32), float)
}  // namespace gpu
}  // namespace jax_rccl
