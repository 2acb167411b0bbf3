// The collective kernel for data movement (all_gather, broadcast, send/recv) and the plain copy
// kernel of the one-rank path (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
JR_DEFINE_COPY_KERNELS()
}  // namespace gpu
}  // namespace jax_rccl
