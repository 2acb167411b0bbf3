// The collective kernel for reductions over float8_e4m3fn (see hip/kernel_impl.h).
#include "hip/kernel_impl.h"

namespace jax_rccl {
namespace gpu {
#if !defined(JR_DEVICE_QUICK)
JR_DEFINE_COLL_KERNEL(float8_e4m3fn, int(DataType::kFp8E4M3), ::jax_rccl::Fp8E4M3)
#endif
}  // namespace gpu
}  // namespace jax_rccl
