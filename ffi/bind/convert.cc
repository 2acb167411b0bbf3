// Python values to native ones, shared by the Python module and the test module: errors as
// Python exceptions, topology dicts, tuners, the world table.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/comm/hmac.h"
#include "ffi/comm/net.h"
#include "ffi/comm/socket_listen.h"
#include "ffi/comm/world.h"
#include "ffi/planner/planner.h"

namespace nb = nanobind;

namespace jax_rccl {

void ThrowIfError(const Status& status) {
  if (status.ok()) return;
  std::string msg = status.ToString();
  switch (status.code()) {
    case Code::kInvalidArgument:
    case Code::kInvalidUsage:
      throw nb::value_error(msg.c_str());
    case Code::kUnsupported:
      PyErr_SetString(PyExc_NotImplementedError, msg.c_str());
      throw nb::python_error();
    case Code::kTimeout:
      PyErr_SetString(PyExc_TimeoutError, msg.c_str());
      throw nb::python_error();
    case Code::kSystem:
      PyErr_SetString(PyExc_OSError, msg.c_str());
      throw nb::python_error();
    default:
      throw std::runtime_error(msg);
  }
}

template <typename T>
T Get(const nb::handle& v, const char* key) {
  try {
    return nb::cast<T>(v);
  } catch (const std::exception&) {
    throw nb::value_error(
        (std::string("topology.") + key + ": wrong type " + nb::type_name(v.type()).c_str())
            .c_str());
  }
}

namespace {

// TopologyView's fields, in the order of a topology dict (its keys are the field names).
#define JR_TOPOLOGY_FIELDS(X) \
  X(nRanks)                   \
  X(nNodes)                   \
  X(arch)                     \
  X(intraLink)                \
  X(interLink)                \
  X(bwIntra)                  \
  X(bwInter)                  \
  X(nChannels)                \
  X(p2pnChannels)             \
  X(p2pnChannelsPerPeer)      \
  X(buffSizes)                \
  X(p2pChunkSize)             \
  X(ll128Enabled)             \
  X(treeDefined)              \
  X(pivotA2ANumBiRings)       \
  X(workFifoDepth)            \
  X(directPeers)

// A field from its Python value (`key` names it in errors): numbers and flags as they are, the
// architecture and links by name, buffSizes as a list of one size per protocol.
template <typename T>
void FieldFromPy(const nb::handle& v, const char* key, T* out) {
  *out = Get<T>(v, key);
}
void FieldFromPy(const nb::handle& v, const char* key, Arch* out) {
  *out = ValueOrThrow(ParseArch(Get<std::string>(v, key)));
}
void FieldFromPy(const nb::handle& v, const char* key, LinkKind* out) {
  *out = ValueOrThrow(ParseLink(Get<std::string>(v, key)));
}
void FieldFromPy(const nb::handle& v, const char* key, int64_t (*out)[kNumProtos]) {
  auto sizes = Get<std::vector<int64_t>>(v, key);
  if (sizes.size() != kNumProtos)
    throw nb::value_error("topology.buffSizes: 3 sizes (ll, ll128, simple)");
  for (int p = 0; p < kNumProtos; ++p) (*out)[p] = sizes[p];
}

// A field as its Python value: the reverse of FieldFromPy.
template <typename T>
nb::object FieldToPy(const T& x) {
  return nb::cast(x);
}
nb::object FieldToPy(Arch a) {
  return nb::str(ArchName(a));
}
nb::object FieldToPy(LinkKind l) {
  return nb::str(LinkName(l));
}
nb::object FieldToPy(const int64_t (&sizes)[kNumProtos]) {
  nb::list out;
  for (int p = 0; p < kNumProtos; ++p) out.append(sizes[p]);
  return out;
}

}  // namespace

TopologyView TopologyFromDict(const nb::dict& d) {
  TopologyView t;
  for (auto [k, v] : d) {
    const std::string key = nb::cast<std::string>(k);
#define JR_FIELD_FROM_PY(f)   \
  if (key == #f) {            \
    FieldFromPy(v, #f, &t.f); \
    continue;                 \
  }
    JR_TOPOLOGY_FIELDS(JR_FIELD_FROM_PY)
#undef JR_FIELD_FROM_PY
#define JR_FIELD_NAME(f) ", " #f
    // The names after the first ", ".
    const char* allowed = JR_TOPOLOGY_FIELDS(JR_FIELD_NAME) + 2;
#undef JR_FIELD_NAME
    throw nb::value_error(("topology: unknown field '" + key + "'; allowed: " + allowed).c_str());
  }
  return t;
}

nb::dict TopologyDict(const TopologyView& t) {
  nb::dict d;
#define JR_FIELD_TO_PY(f) d[#f] = FieldToPy(t.f);
  JR_TOPOLOGY_FIELDS(JR_FIELD_TO_PY)
#undef JR_FIELD_TO_PY
  return d;
}

// Wraps a Python tuner (declared in ffi/bind/bindings.h): fn(coll, nbytes, num_pipe_ops) -> None |
// (algorithm, protocol, nchannels).
TunerFn WrapTuner(nb::object fn) {
  return [fn](const TunerQuery& q, TunerChoice* out) -> Status {
    nb::object r;
    try {
      r = fn(CollName(q.coll), q.nBytes, q.numPipeOps);
    } catch (nb::python_error& e) {
      return Status(Code::kInvalidUsage, std::string("tuner raised: ") + e.what());
    }
    if (r.is_none()) return Status::Ok();
    nb::tuple t;
    if (!nb::try_cast(r, t) || t.size() != 3) {
      return Status(Code::kInvalidUsage,
                    "tuner must return None or (algorithm|None, protocol|None, nchannels)");
    }
    if (!t[0].is_none()) {
      auto a = ParseAlgo(nb::cast<std::string>(t[0]));
      if (!a.ok()) return Status(Code::kInvalidUsage, "tuner: " + a.status().message());
      out->algo = a.value();
    }
    if (!t[1].is_none()) {
      auto p = ParseProto(nb::cast<std::string>(t[1]));
      if (!p.ok()) return Status(Code::kInvalidUsage, "tuner: " + p.status().message());
      out->proto = p.value();
    }
    // The planner checks the choice (GetTunerInfo): one place for the ranges.
    out->nChannels = t[2].is_none() ? 0 : nb::cast<int>(t[2]);
    return Status::Ok();
  };
}

namespace {

nb::object Field(const nb::dict& d, const char* key, const char* where) {
  if (!d.contains(key)) {
    throw nb::value_error(detail::StrCat("set_world: ", where, " has no '", key, "'").c_str());
  }
  return nb::borrow(d[key]);
}

}  // namespace

void SetWorld(const nb::dict& world) {
  comm::WorldTable t;
  try {
    t.process = nb::cast<int>(Field(world, "process", "world"));
    t.nprocesses = nb::cast<int>(Field(world, "nprocesses", "world"));
    t.session = nb::cast<std::string>(Field(world, "session", "world"));
    nb::object devs = Field(world, "devices", "world");
    size_t i = 0;
    for (nb::handle h : devs) {
      const std::string where = detail::StrCat("devices[", i++, "]");
      nb::dict d = nb::cast<nb::dict>(h);
      comm::WorldDevice wd;
      wd.id = nb::cast<int64_t>(Field(d, "id", where.c_str()));
      wd.process = nb::cast<int>(Field(d, "process", where.c_str()));
      wd.host = nb::cast<std::string>(Field(d, "host", where.c_str()));
      t.devices.push_back(std::move(wd));
    }
    if (world.contains("endpoints")) {
      for (nb::handle h : nb::borrow(world["endpoints"])) {
        t.endpoints.push_back(nb::cast<std::string>(h));
      }
    }
    if (world.contains("pids")) {
      for (nb::handle h : nb::borrow(world["pids"])) t.pids.push_back(nb::cast<int64_t>(h));
    }
    if (world.contains("pid_namespaces")) {
      for (nb::handle h : nb::borrow(world["pid_namespaces"])) {
        t.pidNamespaces.push_back(nb::cast<uint64_t>(h));
      }
    }
  } catch (const nb::cast_error&) {
    throw nb::type_error(
        "set_world: expected {'process': int, 'nprocesses': int, 'session': str, 'devices': "
        "[{'id': int, 'process': int, 'host': str}, ...], 'endpoints': [str, ...], 'pids': [int, "
        "...], 'pid_namespaces': [int, ...] (the last three optional)}");
  }
  if (world.contains("secret")) {  // optional here: the bootstrap sets it before it listens
    nb::bytes secret;
    if (!nb::try_cast(nb::borrow(world["secret"]), secret)) {
      throw nb::type_error("set_world: 'secret' must be bytes");
    }
    ThrowIfError(comm::SetSessionSecret(std::string(secret.c_str(), secret.size())));
  }
  ThrowIfError(comm::SetWorldTable(std::move(t)));
}

void BindSocketSetup(nb::module_& m, bool testing) {
  const char* same = "The function of jax_rccl._jax_rccl of that name, for this module's runtime.";
  m.def(
      "set_session_secret",
      [](nb::bytes secret) {
        ThrowIfError(comm::SetSessionSecret(std::string(secret.c_str(), secret.size())));
      },
      nb::arg("secret"),
      testing
          ? same
          : "Sets the run's secret (16..256 random bytes, the same in every process of the run; "
            "once per process): socket connections prove it in their handshake, "
            "shared-memory names carry a tag derived from it.");
  m.def(
      "socket_listen",
      [](const std::string& address) { return ValueOrThrow(comm::SocketListen(address)); },
      nb::arg("address"),
      testing ? same
              : "Starts this process's TCP listener for the socket transport (once), bound to "
                "`address` (a numeric IPv4 or IPv6 address) on an ephemeral port, and returns the "
                "port. Needs the session secret.");
  m.def(
      "socket_listener_counts",
      []() {
        const comm::ListenerCounts c = comm::SocketListenerCounts();
        nb::dict d;
        d["accepted"] = c.accepted;
        d["dropped"] = c.dropped;
        d["unauthorized"] = c.unauthorized;
        return d;
      },
      testing ? same
              : "Connections the listener accepted (handshake done) and dropped (of which "
                "unauthorized).");
  m.def(
      "net_ucx_info",
      [](bool load) {
        const comm::UcxInfo u = comm::DescribeUcx(load);
        nb::dict d;
        d["built"] = u.built;
        d["loaded"] = u.loaded;
        d["version"] = u.version;
        d["path"] = u.path;
        d["memory_types"] = u.memoryTypes;
        d["error"] = u.error;
        return d;
      },
      nb::arg("load") = false,
      testing ? same
              : "The UCX network backend (JAX_RCCL_NET): {'built': this build has it, 'loaded': "
                "libucp is loaded in this process, 'version', 'path', 'memory_types': what it "
                "can move ('host', 'host, cuda', ...), 'error': why not built or loaded}; "
                "`load`: load UCX first (jax_rccl._ucx.load() prefers a system UCX, then the "
                "libucx wheel).");
}

}  // namespace jax_rccl
