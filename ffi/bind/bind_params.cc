// Python view of the parameters (ffi/core/params.h): every JAX_RCCL_* setting with its value,
// and the check that raises for a bad one.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/core/params.h"

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
          d["doc"] = i.doc;
          out.append(d);
        }
        return nb::make_tuple(out, warnings);
      },
      "Every parameter (name, env, type, default, value, doc) and warnings about bad values.");
  m.def(
      "check_params",
      []() {
        StatusOr<Params> p = LoadValidParams();
        ThrowIfError(p.status());
      },
      "Raises ValueError naming the variable when a JAX_RCCL_* setting is not allowed.");
}

}  // namespace jax_rccl
