#include "ffi/params.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdlib>
#include <sstream>

#include "ffi/bindings.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

bool ReadInt(const char* s, int64_t* out) {
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 0);
  if (end == s || *end != '\0') return false;
  *out = v;
  return true;
}

bool ReadFloat(const char* s, double* out) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || *end != '\0') return false;
  *out = v;
  return true;
}

template <typename T>
std::string Show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Params LoadParams(std::vector<std::string>* warnings) {
  Params p;
#define JAX_RCCL_PARAM_READ_Int(name, env) \
  if (!ReadInt(v, &p.name) && warnings)    \
    warnings->push_back(std::string(env) + "='" + v + "' is not an integer; using the default");
#define JAX_RCCL_PARAM_READ_Float(name, env) \
  if (!ReadFloat(v, &p.name) && warnings)    \
    warnings->push_back(std::string(env) + "='" + v + "' is not a number; using the default");
#define JAX_RCCL_PARAM_READ_String(name, env) p.name = v;
#define JAX_RCCL_PARAM_READ(name, env, kind, def, doc) \
  if (const char* v = std::getenv(env)) {              \
    JAX_RCCL_PARAM_READ_##kind(name, env)              \
  }
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_READ)
#undef JAX_RCCL_PARAM_READ
  return p;
}

std::vector<ParamInfo> DescribeParams(const Params& p) {
  std::vector<ParamInfo> out;
  const Params d;
#define JAX_RCCL_PARAM_KIND_Int "int"
#define JAX_RCCL_PARAM_KIND_Float "float"
#define JAX_RCCL_PARAM_KIND_String "string"
#define JAX_RCCL_PARAM_DESCRIBE(name, env, kind, def, doc) \
  out.push_back({#name, env, JAX_RCCL_PARAM_KIND_##kind, Show(d.name), Show(p.name), doc});
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_DESCRIBE)
#undef JAX_RCCL_PARAM_DESCRIBE
  return out;
}

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
}

}  // namespace jax_rccl
