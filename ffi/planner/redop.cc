// Reduction ops: the host -> device op mapping and the table of user-created PreMulSum ops.
//
// After RCCL rocm-6.2.0: hostToDevRedOp (src/enqueue.cc), ncclRedOpCreatePreMulSum and
// ncclRedOpDestroy (src/enqueue.cc), ncclUserRedOpMangle (src/include/comm.h), the user-op check
// of ArgsCheck (src/misc/argcheck.cc).
//
// Where this file departs from RCCL:
//  - The handle hash is taken of a 64-bit communicator id instead of the ncclComm pointer.
//  - CreatePreMulSum validates its arguments (RCCL takes any datatype and residence): bool is
//    refused (a multiplier makes no sense for it), a null host pointer and a zero device address
//    are refused, and the residence must be one of the two enum values.
//  - Lookup/HostToDevRedOp check that a user handle is live before reading its slot (RCCL leaves
//    that to ArgsCheck, which runs first there).
//  - A user op's proxyOp is the handle itself (RCCL copies whatever the slot held; its proxy maps
//    PreMulSum to sum anyway, so nothing reads it).
//  - The extra data types: int16 is a signed integer (sign-bit xor for min/max), uint16 unsigned;
//    both average with SumPostDiv like RCCL's integers. bool min/max is unsigned; bool avg is an
//    error.
//  - fp8: RCCL's rccl_float8/rccl_bfloat8 on MI300 are the FNUZ formats. We follow the OCP
//    formats JAX uses, float8_e4m3fn (bias 7, no infinities, NaN = S.1111.111, max 448) and
//    float8_e5m2 (bias 15, IEEE-like with infinities). Rounding is to nearest even and does not
//    saturate, matching ml_dtypes' casts: e4m3fn values past 464 (and +-inf) become NaN, e5m2
//    values from 61440 on become +-inf.
#include "ffi/planner/redop.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace jax_rccl {
namespace {

// The bytes of `from` as a To of the same size (std::bit_cast of C++20).
template <typename To, typename From>
To BitCast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

bool ValidDataType(DataType t) {
  int v = static_cast<int>(t);
  return v >= 0 && v < kNumDataTypes;
}

const char* kOpRanges =
    "built-in ops are 0..4 (sum, prod, max, min, avg); user op handles lie in 5..2147483647";

// Why a handle cannot name an op of `table`, or OK with the slot index in *ix.
Status CheckUserHandle(const RedOpTable& table, const std::vector<UserRedOp>& ops, int32_t op,
                       const char* what, int* ix) {
  if (op < 0 || op > kMaxRedOp) {
    JR_FAIL(Code::kInvalidArgument, what, ": op ", op, " is garbage, not a reduction op; ",
            kOpRanges);
  }
  if (op < kNumRedOps) {
    JR_FAIL(Code::kInvalidArgument, what, ": op ", op, " (", RedOpName(op),
            ") is a built-in op, not a user op made by create_premul");
  }
  int i = table.Mangle(op) - kNumRedOps;
  if (i < 0 || i >= static_cast<int>(ops.size()) || ops[i].freeNext != -1) {
    JR_FAIL(Code::kInvalidArgument, what, ": op ", op, " is unknown to this RedOpTable (comm_id 0x",
            std::hex, table.commId(), std::dec,
            "): it was destroyed already, made by another communicator's table, or never made");
  }
  *ix = i;
  return Status::Ok();
}

// Encodes |x| (finite, not NaN) into a binary format with `manBits` stored mantissa bits and
// exponent bias `bias`, rounding to nearest even. Returns the code without the sign; codes past
// the largest finite one are left for the caller to map to inf or NaN.
uint64_t EncodeMagnitude(double ax, int manBits, int bias) {
  if (ax == 0) return 0;
  const int eMin = 1 - bias;  // exponent of the smallest normal
  int fexp;
  std::frexp(ax, &fexp);  // ax = f * 2^fexp, f in [0.5, 1)
  int e = fexp - 1;       // ax in [2^e, 2^(e+1))
  bool normal = e >= eMin;
  int quantumExp = (normal ? e : eMin) - manBits;
  double n = std::ldexp(ax, -quantumExp);  // exact: a power-of-two scale
  double fl = std::floor(n);
  double frac = n - fl;
  uint64_t r = static_cast<uint64_t>(fl);
  if (frac > 0.5 || (frac == 0.5 && (r & 1))) ++r;
  // A mantissa carry (r == 2^(manBits+1), or 2^manBits for subnormals) lands on the next
  // exponent's code by itself.
  if (!normal) return r;
  return (static_cast<uint64_t>(e + bias) << manBits) + r - (uint64_t(1) << manBits);
}

double DecodeMagnitude(uint64_t code, int manBits, int bias) {
  uint64_t expField = code >> manBits;
  uint64_t man = code & ((uint64_t(1) << manBits) - 1);
  if (expField == 0) return std::ldexp(static_cast<double>(man), 1 - bias - manBits);
  return std::ldexp(static_cast<double>(man | (uint64_t(1) << manBits)),
                    static_cast<int>(expField) - bias - manBits);
}

// IEEE-like formats (float16, float8_e5m2): all-ones exponent holds inf and NaN.
uint64_t IeeeBits(float f, int expBits, int manBits, uint64_t quietNan) {
  const int bias = (1 << (expBits - 1)) - 1;
  const uint64_t sign = std::signbit(f) ? uint64_t(1) << (expBits + manBits) : 0;
  const uint64_t infCode = ((uint64_t(1) << expBits) - 1) << manBits;
  if (std::isnan(f)) {
    // Keep the float's top mantissa bits, as a quiet NaN.
    const uint32_t u = BitCast<uint32_t>(f);
    uint64_t top = (u & 0x7fffff) >> (23 - manBits);
    return sign | infCode | quietNan | top;
  }
  if (std::isinf(f)) return sign | infCode;
  uint64_t code = EncodeMagnitude(std::fabs(static_cast<double>(f)), manBits, bias);
  if (code >= infCode) code = infCode;
  return sign | code;
}

double IeeeFromBits(uint64_t bits, int expBits, int manBits) {
  const int bias = (1 << (expBits - 1)) - 1;
  const bool neg = (bits >> (expBits + manBits)) & 1;
  const uint64_t mag = bits & ((uint64_t(1) << (expBits + manBits)) - 1);
  const uint64_t infCode = ((uint64_t(1) << expBits) - 1) << manBits;
  double v;
  if (mag == infCode) {
    v = std::numeric_limits<double>::infinity();
  } else if (mag > infCode) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else {
    v = DecodeMagnitude(mag, manBits, bias);
  }
  return neg ? -v : v;
}

// float8_e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, 0x7e = 448 is the largest finite.
uint64_t E4M3FnBits(float f) {
  const uint64_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f) || std::isinf(f)) return sign | 0x7f;
  uint64_t code = EncodeMagnitude(std::fabs(static_cast<double>(f)), 3, 7);
  if (code > 0x7e) code = 0x7f;
  return sign | code;
}

double E4M3FnFromBits(uint64_t bits) {
  const bool neg = bits & 0x80;
  const uint64_t mag = bits & 0x7f;
  double v = mag == 0x7f ? std::numeric_limits<double>::quiet_NaN() : DecodeMagnitude(mag, 3, 7);
  return neg ? -v : v;
}

// bfloat16 from float, as hip_bfloat16's rounding constructor: add 0x7fff plus the lowest kept
// bit (round to nearest even) unless the exponent is all ones; a NaN whose kept mantissa bits
// would all be zero gets the lowest one set so it stays a NaN.
uint64_t Bfloat16Bits(float f) {
  uint32_t u = BitCast<uint32_t>(f);
  if ((~u & 0x7f800000u) != 0) {
    u += 0x7fffu + ((u >> 16) & 1);
  } else if ((u & 0xffffu) != 0) {
    u |= 0x10000u;
  }
  return u >> 16;
}

// Integer types: the value truncated toward zero and wrapped to the type's width (two's
// complement); NaN gives 0, values past the 64-bit range clamp to it.
uint64_t IntegerBits(double value, DataType dtype) {
  uint64_t v;
  if (std::isnan(value)) {
    v = 0;
  } else if (dtype == DataType::kBool) {
    v = value != 0 ? 1 : 0;
  } else if (value >= 18446744073709551616.0) {
    v = ~uint64_t(0);
  } else if (value >= 9223372036854775808.0) {
    v = static_cast<uint64_t>(value);
  } else if (value < -9223372036854775808.0) {
    v = uint64_t(1) << 63;
  } else {
    v = static_cast<uint64_t>(static_cast<int64_t>(value));
  }
  int nbits = 8 * static_cast<int>(DataTypeSize(dtype));
  return nbits >= 64 ? v : v & ((uint64_t(1) << nbits) - 1);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// RedOpTable

// After RCCL's ncclUserRedOpMangle (src/include/comm.h): a 32-bit Fibonacci hash of the id,
// masked to ncclMaxRedOp, xor-ed into the handle. Built-in values pass through, and so does any
// value whose image would be a built-in one, which keeps the map its own inverse.
int32_t RedOpTable::Mangle(int32_t op) const {
  if (op < kNumRedOps) return op;
  uint64_t h = commId_;
  h ^= h >> 32;
  h *= 0x9e3779b97f4a7c13ull;
  h >>= 32;
  h &= static_cast<uint64_t>(kMaxRedOp);
  int32_t op1 = static_cast<int32_t>(h) ^ op;
  return op1 < kNumRedOps ? op : op1;
}

int RedOpTable::liveCount() const {
  int n = 0;
  for (const UserRedOp& u : ops_) n += u.freeNext == -1 ? 1 : 0;
  return n;
}

// After RCCL's ncclRedOpCreatePreMulSum.
StatusOr<int32_t> RedOpTable::CreatePreMulSum(const void* scalar, DataType dtype,
                                              ScalarResidence residence) {
  JR_REQUIRE(ValidDataType(dtype), Code::kInvalidArgument, "create_premul: dtype value ",
             static_cast<int>(dtype), " is not a data type");
  JR_REQUIRE(dtype != DataType::kBool, Code::kInvalidArgument,
             "create_premul: dtype bool cannot carry a PreMulSum multiplier; allowed: int8, "
             "uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, "
             "float64, float8_e4m3fn, float8_e5m2");
  JR_REQUIRE(residence == ScalarResidence::kDevice || residence == ScalarResidence::kHostImmediate,
             Code::kInvalidArgument, "create_premul: residence value ", static_cast<int>(residence),
             " is unknown; allowed: device (0), host (1)");
  JR_REQUIRE(scalar != nullptr, Code::kInvalidArgument, "create_premul: scalar is null (",
             residence == ScalarResidence::kDevice ? "device address 0" : "no host value", ")");

  const int cap = capacity();
  if (freeHead_ == cap) {
    // Grow by doubling (at least 4); the new slots chain onto the free list in order.
    int newCap = cap * 2 < 4 ? 4 : cap * 2;
    ops_.resize(newCap);
    for (int ix = cap; ix < newCap; ++ix) ops_[ix].freeNext = ix + 1;
  }
  const int ix = freeHead_;
  UserRedOp& user = ops_[ix];
  freeHead_ = user.freeNext;

  user.freeNext = -1;
  user.dtype = dtype;
  user.opFull = DevRedOpFull();
  user.opFull.op = DevRedOp::kPreMulSum;
  if (residence == ScalarResidence::kHostImmediate) {
    // The element's bytes go to the low bytes of the 64-bit argument (little-endian host).
    user.opFull.scalarArgIsPtr = false;
    std::memcpy(&user.opFull.scalarArg, scalar, DataTypeSize(dtype));
  } else {
    user.opFull.scalarArgIsPtr = true;
    user.opFull.scalarArg = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(scalar));
  }
  const int32_t handle = Mangle(kNumRedOps + ix);
  user.opFull.proxyOp = static_cast<RedOp>(handle);
  return handle;
}

// After RCCL's ncclRedOpDestroy.
Status RedOpTable::Destroy(int32_t op) {
  int ix = -1;
  JR_CHECK(CheckUserHandle(*this, ops_, op, "destroy", &ix));
  ops_[ix].freeNext = freeHead_;
  freeHead_ = ix;
  return Status::Ok();
}

StatusOr<UserRedOp> RedOpTable::Lookup(int32_t op) const {
  int ix = -1;
  JR_CHECK(CheckUserHandle(*this, ops_, op, "lookup", &ix));
  return ops_[ix];
}

// ---------------------------------------------------------------------------------------------
// hostToDevRedOp

StatusOr<DevRedOpFull> HostToDevRedOp(int32_t op, DataType dtype, int nRanks,
                                      const RedOpTable* userOps) {
  JR_REQUIRE(ValidDataType(dtype), Code::kInvalidArgument, "dtype value ", static_cast<int>(dtype),
             " is not a data type");
  JR_REQUIRE(nRanks >= 1, Code::kInvalidArgument, "nranks must be >= 1, got ", nRanks);
  JR_REQUIRE(op >= 0 && op <= kMaxRedOp, Code::kInvalidArgument, "op ", op,
             " is garbage, not a reduction op; ", kOpRanges);

  DevRedOpFull full;
  full.proxyOp = static_cast<RedOp>(op);
  full.scalarArgIsPtr = false;
  full.scalarArg = 0;

  const int nbits = 8 * static_cast<int>(DataTypeSize(dtype));
  const uint64_t allBits = ~uint64_t(0) >> (64 - nbits);
  const uint64_t signBit = allBits ^ (allBits >> 1);

  switch (op) {
    case kSum:
      full.op = DevRedOp::kSum;
      break;
    case kProd:
      full.op = DevRedOp::kProd;
      break;
    case kMin:
    case kMax:
      // The kernel's min/max works on unsigned bits after xor-ing this mask: the sign bit turns
      // signed order into unsigned order, all bits turn max into min.
      full.op = DevRedOp::kMinMax;
      if (IsSignedInteger(dtype)) full.scalarArg ^= signBit;
      if (op == kMax) full.scalarArg ^= allBits;
      break;
    case kAvg:
      if (dtype == DataType::kBool) {
        JR_FAIL(Code::kInvalidArgument,
                "op avg is not defined for dtype bool; use sum, prod, min or max, or another "
                "dtype");
      }
      if (IsFloating(dtype)) {
        // A multiplier of 1/nRanks in the element's own format (RCCL rounds 1.0/n to float
        // first, then to the narrow type).
        full.op = DevRedOp::kPreMulSum;
        full.scalarArg = FloatBits(1.0 / nRanks, dtype);
      } else {
        full.op = DevRedOp::kSumPostDiv;
        full.scalarArg = static_cast<uint64_t>(nRanks);
      }
      break;
    default: {
      JR_REQUIRE(userOps != nullptr, Code::kInvalidArgument, "op ", op,
                 " is a user op handle, but no RedOpTable was given to look it up in");
      JR_ASSIGN_OR_RETURN(UserRedOp user, userOps->Lookup(op));
      if (user.dtype != dtype) {
        JR_FAIL(Code::kInvalidArgument, "op ", op,
                ": data type supplied to a user op does not match the type it was created with "
                "(created for ",
                DataTypeName(user.dtype), ", used with ", DataTypeName(dtype), ")");
      }
      full = user.opFull;
      full.proxyOp = static_cast<RedOp>(op);
      break;
    }
  }
  return full;
}

// ---------------------------------------------------------------------------------------------
// Bit patterns

uint64_t WrappedIntegerBits(uint64_t twosComplement, DataType dtype) {
  const int nbits = 8 * static_cast<int>(DataTypeSize(dtype));
  return nbits >= 64 ? twosComplement : twosComplement & ((uint64_t(1) << nbits) - 1);
}

// FloatBits encodes the integer types too (IntegerBits: truncated, NaN 0, clamped to 64 bits).
uint64_t ScalarBits(double value, DataType dtype) {
  return FloatBits(value, dtype);
}

uint64_t FloatBits(double value, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat64:
      return BitCast<uint64_t>(value);
    case DataType::kFloat32:
      return BitCast<uint32_t>(static_cast<float>(value));
    // The narrow types go through float, as RCCL does (__float2half(float(x)) and friends). With
    // float's 24-bit significand the double rounding gives the same result as rounding once.
    case DataType::kFloat16:
      return IeeeBits(static_cast<float>(value), 5, 10, 0x200);
    case DataType::kBfloat16:
      return Bfloat16Bits(static_cast<float>(value));
    case DataType::kFp8E4M3:
      return E4M3FnBits(static_cast<float>(value));
    case DataType::kFp8E5M2:
      return IeeeBits(static_cast<float>(value), 5, 2, 0x2);
    default:
      return IntegerBits(value, dtype);
  }
}

double FloatFromBits(uint64_t bits, DataType dtype) {
  const int nbits = 8 * static_cast<int>(DataTypeSize(dtype));
  if (nbits > 0 && nbits < 64) bits &= (uint64_t(1) << nbits) - 1;
  switch (dtype) {
    case DataType::kFloat64:
      return BitCast<double>(bits);
    case DataType::kFloat32:
      return BitCast<float>(static_cast<uint32_t>(bits));
    case DataType::kFloat16:
      return IeeeFromBits(bits, 5, 10);
    case DataType::kBfloat16:
      return BitCast<float>(static_cast<uint32_t>(bits) << 16);
    case DataType::kFp8E4M3:
      return E4M3FnFromBits(bits);
    case DataType::kFp8E5M2:
      return IeeeFromBits(bits, 5, 2);
    case DataType::kBool:
      return bits != 0 ? 1.0 : 0.0;
    default:
      if (IsSignedInteger(dtype) && nbits > 0) {
        // Sign-extend from the type's width.
        uint64_t sign = uint64_t(1) << (nbits - 1);
        int64_t v = static_cast<int64_t>((bits ^ sign) - sign);
        return static_cast<double>(v);
      }
      return static_cast<double>(bits);
  }
}

}  // namespace jax_rccl
