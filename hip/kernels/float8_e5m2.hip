// The collective kernel for reductions over float8_e5m2 (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(float8_e5m2, int(DataType::kFp8E5M2), ::jax_rccl::Fp8E5M2)
#endif
}  // namespace gpu
}  // namespace jax_rccl
