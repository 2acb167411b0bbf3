// Python bindings of the reduction-op table (jax_rccl._jax_rccl.RedOpTable) and of the low-level
// reduction-op helpers under `internal`.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ffi/bind/bindings.h"
#include "ffi/planner/redop.h"
#include "ffi/planner/types.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

StatusOr<ScalarResidence> ParseResidence(const std::string& s) {
  if (s == "host" || s == "host_immediate") return ScalarResidence::kHostImmediate;
  if (s == "device") return ScalarResidence::kDevice;
  return Status(Code::kInvalidArgument,
                "residence: unknown value '" + s + "'; allowed: host, device");
}

// The op argument: a name ("sum", ...) or an integer (a built-in value or a user handle).
int32_t OpFromObject(const nb::handle& op) {
  if (nb::isinstance<nb::str>(op)) return ValueOrThrow(ParseRedOp(nb::cast<std::string>(op)));
  if (nb::isinstance<nb::int_>(op) && !nb::isinstance<nb::bool_>(op)) {
    int64_t v;
    if (!nb::try_cast<int64_t>(op, v) || v < std::numeric_limits<int32_t>::min() ||
        v > std::numeric_limits<int32_t>::max()) {
      throw nb::value_error(("op: " + nb::cast<std::string>(nb::str(op)) +
                             " is garbage, not a reduction op; built-in ops are 0..4 (sum, prod, "
                             "max, min, avg); user op handles lie in 5..2147483647")
                                .c_str());
    }
    return static_cast<int32_t>(v);
  }
  throw nb::type_error("op: expected a name (sum, prod, max, min, avg) or an int handle");
}

// The bytes of a host-immediate PreMulSum scalar of `dtype`, in the low bytes of a uint64.
uint64_t HostScalarBits(const nb::handle& scalar, DataType dtype) {
  const bool isInt = nb::isinstance<nb::int_>(scalar) && !nb::isinstance<nb::bool_>(scalar);
  const bool isFloat = nb::isinstance<nb::float_>(scalar);
  if (!isInt && !isFloat) throw nb::type_error("scalar: expected a float or an int");
  if (IsFloating(dtype)) {
    double v = isFloat ? nb::cast<double>(scalar) : nb::cast<double>(nb::float_(scalar));
    return FloatBits(v, dtype);
  }
  // Integer types: the value must be integral and fit the type.
  const int nbits = 8 * static_cast<int>(DataTypeSize(dtype));
  const bool isSigned = IsSignedInteger(dtype);
  int64_t s = 0;
  uint64_t u = 0;
  bool neg = false;
  if (isFloat) {
    double d = nb::cast<double>(scalar);
    if (!std::isfinite(d) || d != std::floor(d)) {
      throw nb::value_error(("scalar: " + std::to_string(d) + " is not an integer, but dtype is " +
                             DataTypeName(dtype))
                                .c_str());
    }
    if (d < 0) {
      neg = true;
      if (d < -9223372036854775808.0) throw nb::value_error("scalar: out of range for dtype");
      s = static_cast<int64_t>(d);
    } else {
      if (d >= 18446744073709551616.0) throw nb::value_error("scalar: out of range for dtype");
      u = static_cast<uint64_t>(d);
    }
  } else if (!nb::try_cast<uint64_t>(scalar, u)) {
    if (!nb::try_cast<int64_t>(scalar, s)) {
      throw nb::value_error("scalar: integer out of the 64-bit range");
    }
    neg = true;
  }
  // Range of the type.
  const uint64_t maxU = nbits >= 64 ? ~uint64_t(0) : (uint64_t(1) << nbits) - 1;
  const uint64_t maxS = maxU >> 1;
  bool fits = neg ? isSigned && (nbits >= 64 || s >= -static_cast<int64_t>(maxS) - 1)
                  : u <= (isSigned ? maxS : maxU);
  if (!fits) {
    std::string shown = neg ? std::to_string(s) : std::to_string(u);
    throw nb::value_error(
        ("scalar: " + shown + " is out of range for dtype " + DataTypeName(dtype)).c_str());
  }
  return WrappedIntegerBits(neg ? static_cast<uint64_t>(s) : u, dtype);
}

nb::dict OpFullDict(const DevRedOpFull& full) {
  nb::dict d;
  d["op"] = DevRedOpName(full.op);
  d["scalar_arg"] = full.scalarArg;
  d["scalar_arg_is_ptr"] = full.scalarArgIsPtr;
  d["proxy_op"] = RedOpName(full.proxyOp);
  return d;
}

}  // namespace

void BindRedop(nb::module_& m, nb::module_& internal) {
  nb::class_<RedOpTable>(
      m, "RedOpTable",
      "User-created reduction ops of one communicator (ncclRedOpCreatePreMulSum / "
      "ncclRedOpDestroy); handles are mangled with a hash of comm_id. A planner.Task's `op` may "
      "name a handle when planner.plan gets the table as `user_ops`.\n\n"
      "Example:\n"
      "    >>> from jax_rccl import planner\n"
      "    >>> ops = planner.RedOpTable()\n"
      "    >>> half = ops.create_premul(0.5, \"float32\")  # x * 0.5, then a sum\n"
      "    >>> task = planner.Task(\"all_reduce\", 1024, \"float32\", op=half)\n"
      "    >>> planner.plan(task, \"mi300x-8\", user_ops=ops).tasks[0][\"dev_op\"]\n"
      "    'premulsum'\n"
      "    >>> ops.destroy(half)\n"
      "    >>> ops.live_count\n"
      "    0\n")
      .def(
          "__init__", [](RedOpTable* self, uint64_t commId) { new (self) RedOpTable(commId); },
          nb::arg("comm_id") = 0)
      .def(
          "create_premul",
          [](RedOpTable& self, nb::object scalar, const std::string& dtype,
             const std::string& residence) {
            DataType dt = ValueOrThrow(ParseDataType(dtype));
            ScalarResidence res = ValueOrThrow(ParseResidence(residence));
            if (res == ScalarResidence::kDevice) {
              uint64_t addr = 0;
              if (nb::isinstance<nb::bool_>(scalar) || !nb::isinstance<nb::int_>(scalar) ||
                  !nb::try_cast<uint64_t>(scalar, addr)) {
                throw nb::value_error(
                    "scalar: with residence 'device' it must be the device address of the "
                    "element, a non-negative int");
              }
              const void* p = reinterpret_cast<const void*>(static_cast<uintptr_t>(addr));
              return ValueOrThrow(self.CreatePreMulSum(p, dt, res));
            }
            if (dt == DataType::kBool) {
              // Let the table give its error (it names the allowed types).
              uint64_t zero = 0;
              return ValueOrThrow(self.CreatePreMulSum(&zero, dt, res));
            }
            uint64_t bits = HostScalarBits(scalar, dt);
            return ValueOrThrow(self.CreatePreMulSum(&bits, dt, res));
          },
          nb::arg("scalar"), nb::arg("dtype"), nb::arg("residence") = "host",
          "Creates a PreMulSum op (multiply by `scalar`, then sum). residence 'host' copies the "
          "value; 'device' takes the device address of one element. Returns the op handle.")
      .def(
          "destroy",
          [](RedOpTable& self, nb::object op) { ThrowIfError(self.Destroy(OpFromObject(op))); },
          nb::arg("op"), "Frees the op of handle `op` (its handle may be given out again).")
      .def(
          "lookup",
          [](const RedOpTable& self, nb::object op) {
            int32_t v = OpFromObject(op);
            UserRedOp u = ValueOrThrow(self.Lookup(v));
            nb::dict d = OpFullDict(u.opFull);
            d["dtype"] = DataTypeName(u.dtype);
            d["index"] = self.Mangle(v) - static_cast<int>(kNumRedOps);
            return d;
          },
          nb::arg("op"),
          "The op of handle `op`: what it computes (op, scalar_arg, proxy_op), its dtype and its "
          "index in the table.")
      .def("mangle", &RedOpTable::Mangle, nb::arg("op"),
           "The handle `op` as the device sees it (mangled with the hash of comm_id).")
      .def_prop_ro("capacity", &RedOpTable::capacity)
      .def_prop_ro("free_head", &RedOpTable::freeHead)
      .def_prop_ro("live_count", &RedOpTable::liveCount)
      .def_prop_ro("comm_id", &RedOpTable::commId)
      .def("__repr__", [](const RedOpTable& self) {
        return "RedOpTable(comm_id=" + std::to_string(self.commId()) +
               ", live=" + std::to_string(self.liveCount()) +
               ", capacity=" + std::to_string(self.capacity()) + ")";
      });

  internal.def(
      "host_to_dev_red_op",
      [](nb::object op, const std::string& dtype, int nranks, const RedOpTable* table) {
        int32_t v = OpFromObject(op);
        DataType dt = ValueOrThrow(ParseDataType(dtype));
        return OpFullDict(ValueOrThrow(HostToDevRedOp(v, dt, nranks, table)));
      },
      nb::arg("op"), nb::arg("dtype"), nb::arg("nranks"), nb::arg("table").none() = nb::none(),
      "hostToDevRedOp: {op, scalar_arg, scalar_arg_is_ptr, proxy_op}.");
  internal.def(
      "float_bits",
      [](double value, const std::string& dtype) {
        return FloatBits(value, ValueOrThrow(ParseDataType(dtype)));
      },
      nb::arg("value"), nb::arg("dtype"),
      "Bit pattern of `value` in `dtype` (round to nearest even; integers: truncated value).");
  internal.def(
      "float_from_bits",
      [](uint64_t bits, const std::string& dtype) {
        return FloatFromBits(bits, ValueOrThrow(ParseDataType(dtype)));
      },
      nb::arg("bits"), nb::arg("dtype"), "The value a bit pattern of `dtype` stands for.");
}

}  // namespace jax_rccl
