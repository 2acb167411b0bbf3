// Python view of the parameters (ffi/core/params.h): every JAX_RCCL_* setting with its value,
// and the check that raises for a bad one.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/core/params.h"
#include "ffi/planner/types.h"

namespace nb = nanobind;

namespace jax_rccl {

void BindParams(nb::module_& m) {
  m.def(
      "params",
      []() {
        std::vector<std::string> warnings;
        Params p = LoadParams(&warnings);
        nb::list out;
        for (const ParamInfo& i : DescribeParams(p)) {
          nb::dict d;
          d["name"] = i.name;
          d["env"] = i.env;
          d["type"] = i.kind;
          d["default"] = i.defaultValue;
          d["value"] = i.value;
          d["allowed"] = i.allowed;
          d["doc"] = i.doc;
          out.append(d);
        }
        return nb::make_tuple(out, warnings);
      },
      "Every parameter (name, env, type, default, value, doc) and warnings about bad values.");
  m.def(
      "check_params",
      []() {
        // The message alone: a settings error is about the environment, so no file:line frames.
        auto raise = [](const Status& s) {
          if (!s.ok()) throw nb::value_error(s.message().c_str());
        };
        StatusOr<Params> p = LoadValidParams();
        raise(p.status());
        raise(ParseAlgoMask(p.value().algo, "jax_rccl: JAX_RCCL_ALGO").status());
        raise(ParseProtoMask(p.value().proto, "jax_rccl: JAX_RCCL_PROTO").status());
      },
      "Raises ValueError naming the variable, its value and the allowed values when a "
      "JAX_RCCL_* setting is not allowed (JAX_RCCL_ALGO and JAX_RCCL_PROTO included).");
}

}  // namespace jax_rccl
