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

TopologyView TopologyFromDict(const nb::dict& d) {
  TopologyView t;
  for (auto [k, v] : d) {
    std::string key = nb::cast<std::string>(k);
    if (key == "nRanks")
      t.nRanks = Get<int>(v, "nRanks");
    else if (key == "nNodes")
      t.nNodes = Get<int>(v, "nNodes");
    else if (key == "arch")
      t.arch = ValueOrThrow(ParseArch(Get<std::string>(v, "arch")));
    else if (key == "intraLink")
      t.intraLink = ValueOrThrow(ParseLink(Get<std::string>(v, "intraLink")));
    else if (key == "interLink")
      t.interLink = ValueOrThrow(ParseLink(Get<std::string>(v, "interLink")));
    else if (key == "bwIntra")
      t.bwIntra = Get<float>(v, "bwIntra");
    else if (key == "bwInter")
      t.bwInter = Get<float>(v, "bwInter");
    else if (key == "nChannels")
      t.nChannels = Get<int>(v, "nChannels");
    else if (key == "p2pnChannels")
      t.p2pnChannels = Get<int>(v, "p2pnChannels");
    else if (key == "p2pnChannelsPerPeer")
      t.p2pnChannelsPerPeer = Get<int>(v, "p2pnChannelsPerPeer");
    else if (key == "buffSizes") {
      auto sizes = Get<std::vector<int64_t>>(v, "buffSizes");
      if (sizes.size() != kNumProtos)
        throw nb::value_error("topology.buffSizes: 3 sizes (ll, ll128, simple)");
      for (int p = 0; p < kNumProtos; ++p) t.buffSizes[p] = sizes[p];
    } else if (key == "p2pChunkSize")
      t.p2pChunkSize = Get<int64_t>(v, "p2pChunkSize");
    else if (key == "ll128Enabled")
      t.ll128Enabled = Get<bool>(v, "ll128Enabled");
    else if (key == "treeDefined")
      t.treeDefined = Get<bool>(v, "treeDefined");
    else if (key == "pivotA2ANumBiRings")
      t.pivotA2ANumBiRings = Get<int>(v, "pivotA2ANumBiRings");
    else if (key == "workFifoDepth")
      t.workFifoDepth = Get<int>(v, "workFifoDepth");
    else if (key == "directPeers")
      t.directPeers = Get<bool>(v, "directPeers");
    else
      throw nb::value_error(("topology: unknown field '" + key +
                             "'; allowed: nRanks, nNodes, arch, intraLink, interLink, bwIntra, "
                             "bwInter, nChannels, p2pnChannels, p2pnChannelsPerPeer, buffSizes, "
                             "p2pChunkSize, ll128Enabled, treeDefined, pivotA2ANumBiRings, "
                             "workFifoDepth, directPeers")
                                .c_str());
  }
  return t;
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
