// Python view of the CPU runtime: the FFI targets and the state type to register with JAX, the
// runtime's counters and the topology it plans with; the socket handshake's crypto (for tests).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/comm/hmac.h"
#include "ffi/comm/shm.h"
#include "ffi/comm/socket_listen.h"
#include "ffi/comm/world.h"
#include "ffi/core/params.h"
#include "ffi/core/stats.h"
#include "ffi/cpu/comm.h"
#include "ffi/handlers/collective.h"
#include "ffi/handlers/common.h"
#include "ffi/planner/types.h"

namespace nb = nanobind;

namespace jax_rccl {

namespace {

nb::object GetWorld() {
  std::shared_ptr<const comm::WorldTable> t = comm::GetWorldTable();
  if (!t) return nb::none();
  nb::dict d;
  d["process"] = t->process;
  d["nprocesses"] = t->nprocesses;
  d["session"] = t->session;
  nb::list devs;
  for (const comm::WorldDevice& wd : t->devices) {
    nb::dict e;
    e["id"] = wd.id;
    e["process"] = wd.process;
    e["host"] = wd.host;
    devs.append(e);
  }
  d["devices"] = devs;
  if (!t->endpoints.empty()) {
    nb::list eps;
    for (const std::string& e : t->endpoints) eps.append(e);
    d["endpoints"] = eps;
  }
  if (!t->pids.empty()) {
    nb::list pids, namespaces;
    for (int64_t p : t->pids) pids.append(p);
    for (uint64_t ns : t->pidNamespaces) namespaces.append(ns);
    d["pids"] = pids;
    d["pid_namespaces"] = namespaces;
  }
  return d;
}

nb::bytes DigestBytes(const comm::Digest& d) {
  return nb::bytes(d.data(), d.size());
}

void BindCrypto(nb::module_& m) {
  m.def(
      "sha256",
      [](const nb::bytes& data, const std::string& backend) {
        const comm::CryptoBackend b = ValueOrThrow(comm::ParseCryptoBackend(backend));
        comm::Digest d;
        {
          nb::gil_scoped_release release;
          d = comm::Sha256(data.data(), data.size(), b);
        }
        return DigestBytes(d);
      },
      nb::arg("data"), nb::arg("backend") = "default",
      "SHA-256 of `data` (32 bytes) through `backend`: 'default' (libcrypto when linked, else "
      "builtin), 'builtin' or 'openssl' (see crypto_backends()). For tests: the socket "
      "transport's handshake calls the same code.");
  m.def(
      "hmac_sha256",
      [](const nb::bytes& key, const nb::bytes& msg, const std::string& backend) {
        const comm::CryptoBackend b = ValueOrThrow(comm::ParseCryptoBackend(backend));
        comm::Digest d;
        {
          nb::gil_scoped_release release;
          d = comm::HmacSha256(key.data(), key.size(), msg.data(), msg.size(), b);
        }
        return DigestBytes(d);
      },
      nb::arg("key"), nb::arg("msg"), nb::arg("backend") = "default",
      "HMAC-SHA-256 of `msg` under `key` (32 bytes) through `backend`, as sha256.");
  m.def(
      "crypto_backends",
      []() {
        std::vector<std::string> out = {"builtin"};
        if (comm::HaveOpenSsl()) out.push_back("openssl");
        return out;
      },
      "The crypto backends of this build: 'builtin', and 'openssl' when it links libcrypto "
      "('default' is the last of them).");
  m.def(
      "constant_time_equal",
      [](const nb::bytes& a, const nb::bytes& b) {
        return a.size() == b.size() && comm::ConstantTimeEqual(a.data(), b.data(), a.size());
      },
      nb::arg("a"), nb::arg("b"),
      "Whether `a` and `b` are equal, in time independent of where they differ (False for "
      "different lengths). For tests.");
  m.def(
      "random_bytes",
      [](int64_t n) {
        if (n < 0) throw nb::value_error("random_bytes: n must be >= 0");
        std::string buf(static_cast<size_t>(n), '\0');
        ThrowIfError(comm::RandomBytes(buf.data(), buf.size()));
        return nb::bytes(buf.data(), buf.size());
      },
      nb::arg("n"), "`n` bytes from the kernel's CSPRNG. For tests.");
}

// Runs `fn` (jax_rccl._bootstrap.ensure_world) from the thread that connects a group first: an
// XLA execution thread, which holds no interpreter lock (JAX releases it while a program runs,
// as for its host callbacks).
void SetWorldProvider(nb::callable fn) {
  nb::handle f = fn.inc_ref();  // kept for the process's life (world.cc never frees providers)
  comm::SetWorldProvider([f]() -> Status {
#if PY_VERSION_HEX >= 0x030D0000
    const bool finalizing = Py_IsFinalizing() != 0;
#else
    const bool finalizing = _Py_IsFinalizing() != 0;
#endif
    if (!Py_IsInitialized() || finalizing) {
      return Status(Code::kInvalidUsage,
                    "jax_rccl: the interpreter is shutting down; the processes cannot meet now");
    }
    nb::gil_scoped_acquire gil;
    try {
      f();
    } catch (nb::python_error& e) {
      // The exception's own text (no traceback): the bootstrap's messages name the process.
      const bool timeout = e.matches(PyExc_TimeoutError);
      std::string text = nb::cast<std::string>(nb::str(e.value()));
      return Status(timeout ? Code::kTimeout : Code::kInvalidUsage, std::move(text));
    } catch (const std::exception& e) {
      return Status(Code::kInternal, e.what());
    }
    return Status::Ok();
  });
}

}  // namespace

void BindRuntime(nb::module_& m) {
  BindCrypto(m);
  m.def("set_world", &SetWorld, nb::arg("world"),
        "Installs the world table of a multi-process run: {'process': this process's index, "
        "'nprocesses', 'session': hex str (same in every process, unique per run), 'devices': "
        "[{'id': global device id, 'process', 'host'}, ...], 'endpoints': ['host:port' of each "
        "process's socket listener, by process] (optional), 'secret': bytes (optional: "
        "set_session_secret)}. Replica groups spanning processes "
        "then run over shared memory within a host and TCP sockets between hosts "
        "(JAX_RCCL_TRANSPORT).");
  m.def("set_world_provider", &SetWorldProvider, nb::arg("fn"),
        "Installs `fn()` as the way this process meets the others: the runtime calls it (under "
        "the interpreter's lock) once, when the first replica group is connected, and `fn` calls "
        "set_world (or nothing, in a single-process program). An exception it raises fails that "
        "collective with its text.");
  BindSocketSetup(m, false);
  m.def("socket_listener_port", &comm::SocketListenerPort,
        "The port this process listens on for the socket transport, or 0 when it does not.");
  m.def(
      "network_interfaces",
      []() {
        nb::list out;
        for (const comm::NetworkInterface& i : comm::NetworkInterfaces()) {
          out.append(nb::make_tuple(i.name, i.address));
        }
        return out;
      },
      "This host's network interfaces with an address: [(name, numeric address), ...] (IPv4 "
      "first, then IPv6 other than link-local).");
  m.def("world", &GetWorld, "The world table set by set_world, or None.");
  m.def(
      "reap_shm_session", [](const std::string& session) { return comm::ReapSession(session); },
      nb::arg("session"),
      "Unlinks the shared-memory segments of `session` whose creating process has exited; "
      "returns how many.");
  m.def(
      "call_attribute_names", []() { return CallAttributeNames(); },
      "The custom calls' attribute names (ffi/handlers/common.h: JAX_RCCL_CALL_ATTRS), then "
      "'abi_version'.");
  m.def(
      "cpu_ffi_targets",
      []() {
        nb::dict out;
        for (const FfiTarget& t : CpuFfi().targets) {
          nb::dict stages;
          stages["instantiate"] = nb::capsule(t.instantiate);
          stages["execute"] = nb::capsule(t.execute);
          out[t.name] = stages;
        }
        return out;
      },
      "The CPU FFI targets: {name: {'instantiate': capsule, 'execute': capsule}}.");
  m.def(
      "cpu_ffi_types",
      []() {
        nb::dict reg;
        reg["type_id"] = nb::capsule(CpuFfi().typeId);
        reg["type_info"] = nb::capsule(CpuFfi().typeInfo);
        nb::dict out;
        out[CpuFfi().stateTypeName] = reg;
        return out;
      },
      "The CPU state type: {name: {'type_id': capsule, 'type_info': capsule}}.");
  m.def(
      "runtime_stats",
      []() {
        nb::dict d;
        for (const auto& [name, value] : StatsSnapshot()) d[name] = value;
        return d;
      },
      "Counters of the runtime (communicators and rendezvous_pending are gauges; net_*: the "
      "network proxies of GPU groups across hosts).");
  m.def(
      "reset_runtime_stats", []() { ResetStats(); },
      "Zeroes the runtime counters (not the gauges) and every call site's.");
  m.def(
      "call_site_stats",
      []() {
        nb::list out;
        for (const CallSiteStats* s : CallSiteRecords()) {
          nb::dict d;
          d["call_site"] = s->callSite;
          d["name"] = s->name;
          d["kind"] = s->kind;
          d["group_size"] = s->groupSize;
          d["executions"] = s->executions.load();
          d["calls"] = s->calls.load();
          d["bytes"] = s->bytes.load();
          d["ns"] = s->ns.load();
          const int32_t a = s->algo.load(), p = s->proto.load();
          d["algorithm"] = a == CallSiteStats::kP2p ? "p2p"
                           : a < 0                  ? ""
                                                    : AlgoName(static_cast<Algo>(a));
          d["protocol"] = p < 0 ? "" : ProtoName(static_cast<Proto>(p));
          out.append(d);
        }
        return out;
      },
      "Per call site (the custom call's `call_site`): name, kind, group_size, executions (one per "
      "device and call), calls (in this process), bytes, ns, algorithm, protocol, in the "
      "order the sites were first instantiated.");
  m.def(
      "cpu_topology",
      [](int nranks) {
        if (nranks < 1) throw nb::value_error("cpu_topology: nranks must be >= 1");
        return TopologyDict(cpu::CpuTopology(nranks, LoadParams()));
      },
      nb::arg("nranks"),
      "The topology the CPU runtime plans with for a group of `nranks` (a TopologyView dict).");
  m.def(
      "gpu_topology",
      [](int nranks, int nnodes, const std::string& arch, bool ll128) {
        if (nranks < 1 || nnodes < 1 || nranks % nnodes != 0) {
          throw nb::value_error(
              "gpu_topology: nranks must be >= 1 and a multiple of nnodes (>= 1)");
        }
        const Arch a = ValueOrThrow(ParseArch(arch));
        const Params p = LoadParams();
        return TopologyDict(
            GpuGroupTopology(a, nranks, nnodes, p.nchannels, p.buffsize, p.net_buffsize, ll128));
      },
      nb::arg("nranks"), nb::arg("nnodes") = 1, nb::arg("arch") = "sm90", nb::arg("ll128") = false,
      "The topology the GPU runtime starts from for a group of `nranks` GPUs on `nnodes` hosts "
      "under the current settings (a TopologyView dict), for `arch` and `ll128` as given (the "
      "runtime: its build's target, LL128 where the device code has it). The runtime may then "
      "take fewer channels: the fewest any rank can keep resident, and across hosts at most "
      "JAX_RCCL_NET_NCHANNELS.");
}

}  // namespace jax_rccl
