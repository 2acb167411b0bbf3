// Device-side check of the work layout shared with the planner: the structs must have the same
// sizes and offsets under the device compilers as under the host compiler (the static_asserts in
// ffi/planner/work.h run here too), and a kernel must be able to walk a work list.
#include <stddef.h>

#include "ffi/planner/work.h"
#include "hip/portability.h"

namespace jax_rccl {

static_assert(offsetof(Work, elems) == 8, "elements start after the 8-byte header");
static_assert(offsetof(WorkElemColl, redOpArg) == 24, "WorkElemColl.redOpArg at byte 24");
static_assert(offsetof(WorkElemP2p, chunkSize) == 24, "WorkElemP2p.chunkSize at byte 24");

// Sums workCount over a channel's work list: block b starts at workHead[b] and follows workNext
// (offsets from workHead) until the work marked isLast, as the collective kernels will.
__global__ void WorkListTotals(const Work* workHead, unsigned long long* totals) {
  const Work* w = workHead + blockIdx.x;
  unsigned long long total = 0;
  while (true) {
    if (threadIdx.x == 0 && w->header.type == kWorkTypeColl) total += w->elems[0].workCount;
    if (w->header.isLast) break;
    w = workHead + w->header.workNext;
  }
  if (threadIdx.x == 0) totals[blockIdx.x] = total;
}

}  // namespace jax_rccl
