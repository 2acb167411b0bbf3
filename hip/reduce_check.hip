// Device-side compile check of the reduce functors and the narrow float conversions shared with
// the CPU executor (hip/reduce_functors.h, hip/dtypes.h): one kernel per (functor, type) reduces
// two inputs element-wise with the same Load/PreOp/Reduce/PostOp/Store steps the host uses.
#include <stdint.h>

#include "hip/portability.h"
#include "hip/reduce_functors.h"

namespace jax_rccl {

template <typename F>
__global__ void ReduceTwo(const typename F::Elem* a, const typename F::Elem* b,
                          typename F::Elem* out, uint64_t n, uint64_t opArg) {
  using T = typename F::Elem;
  using Tr = ElemTraits<T>;
  const F fn(opArg);
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    auto x = fn.PreOp(Tr::Load(a[i]));
    auto y = fn.PreOp(Tr::Load(b[i]));
    out[i] = Tr::Store(fn.PostOp(fn.Reduce(x, y)));
  }
}

template <typename T>
void InstantiateAll() {
  (void)&ReduceTwo<FuncSum<T>>;
  (void)&ReduceTwo<FuncProd<T>>;
  (void)&ReduceTwo<FuncMinMax<T>>;
  (void)&ReduceTwo<FuncPreMulSum<T>>;
  (void)&ReduceTwo<FuncSumPostDiv<T>>;
}

void InstantiateReduceChecks() {
  InstantiateAll<int8_t>();
  InstantiateAll<uint8_t>();
  InstantiateAll<int16_t>();
  InstantiateAll<uint16_t>();
  InstantiateAll<int32_t>();
  InstantiateAll<uint32_t>();
  InstantiateAll<int64_t>();
  InstantiateAll<uint64_t>();
  InstantiateAll<float>();
  InstantiateAll<double>();
  InstantiateAll<Half>();
  InstantiateAll<BFloat16>();
  InstantiateAll<Fp8E4M3>();
  InstantiateAll<Fp8E5M2>();
}

}  // namespace jax_rccl
