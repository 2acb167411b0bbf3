// Reduction ops: host op -> device op (hostToDevRedOp) and user-created PreMulSum ops
// (ncclRedOpCreatePreMulSum / ncclRedOpDestroy) with their free list and handle mangling.
#pragma once

#include <cstdint>
#include <vector>

#include "ffi/core/status.h"
#include "ffi/planner/types.h"

namespace jax_rccl {

// Where a PreMulSum scalar lives (ncclScalarResidence_t).
enum class ScalarResidence : int8_t {
  kDevice = 0,         // a device pointer to one element, read by the kernel
  kHostImmediate = 1,  // the value itself, copied at creation
};

struct UserRedOp {
  int freeNext = 0;  // -1 while allocated
  DataType dtype = DataType::kFloat32;
  DevRedOpFull opFull;
};

// The user ops of one communicator. Handles are mangled with a hash of `commId` so a handle from
// another communicator is caught rather than silently reused.
class RedOpTable {
 public:
  explicit RedOpTable(uint64_t commId = 0) : commId_(commId) {}

  // `scalar` points to one element of `dtype` (kHostImmediate), or `scalar` is the device
  // address of one (kDevice). Returns the new op handle.
  StatusOr<int32_t> CreatePreMulSum(const void* scalar, DataType dtype, ScalarResidence residence);
  Status Destroy(int32_t op);
  // The op a handle names, or an error naming why it is not usable.
  StatusOr<UserRedOp> Lookup(int32_t op) const;
  // ncclUserRedOpMangle: built-in values pass through; others are xor-ed with the comm hash.
  int32_t Mangle(int32_t op) const;

  uint64_t commId() const { return commId_; }
  int capacity() const { return static_cast<int>(ops_.size()); }
  int freeHead() const { return freeHead_; }
  int liveCount() const;

 private:
  uint64_t commId_;
  std::vector<UserRedOp> ops_;
  int freeHead_ = 0;
};

// hostToDevRedOp: sum/prod as themselves; min/max as MinMax with the xor mask (sign bit for
// signed integers, all bits for max); avg as SumPostDiv(nRanks) for integers and PreMulSum(1/n)
// for floating types; user ops from `userOps`.
StatusOr<DevRedOpFull> HostToDevRedOp(int32_t op, DataType dtype, int nRanks,
                                      const RedOpTable* userOps);

// Bit patterns of a double in each floating type (round to nearest even), as used for the
// PreMulSum scalar argument.
uint64_t FloatBits(double value, DataType dtype);
// The bytes of `value` in `dtype`, in the low bytes of a uint64 and nothing above them: as
// FloatBits for floating types; for integer types the value truncated toward zero and wrapped to
// the type's width (NaN 0, values past the 64-bit range clamped). The one encoding of a scalar
// (the immediate PreMulSum scalar of a call, the test binding's, planner.make_op's).
uint64_t ScalarBits(double value, DataType dtype);
// An integer scalar's two's-complement bits cut to the width of `dtype` (ScalarBits's integer
// encoding, for callers that hold the value as a 64-bit integer).
uint64_t WrappedIntegerBits(uint64_t twosComplement, DataType dtype);
// The inverse, for explain() and tests.
double FloatFromBits(uint64_t bits, DataType dtype);

}  // namespace jax_rccl
