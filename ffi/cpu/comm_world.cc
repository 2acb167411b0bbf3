// The communicators of this process (World) and how a group across processes gets its
// transports: shared memory within a host, sockets between hosts (or everywhere when
// JAX_RCCL_TRANSPORT=socket), the topology every process derives alike.
#include <algorithm>
#include <cstdio>

#include "ffi/comm/shm.h"
#include "ffi/cpu/comm.h"
#include "ffi/cpu/net_links.h"
#include "ffi/cpu/shm_region.h"
#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace cpu {

namespace {

// Rank r's node for the topology: its host, or its process when sockets are forced.
std::vector<std::string> NodeKeys(const GroupPlacement& g, bool forceSocket) {
  std::vector<std::string> keys;
  for (size_t r = 0; r < g.process.size(); ++r) {
    keys.push_back(forceSocket ? detail::StrCat("process ", g.process[r]) : g.host[r]);
  }
  return keys;
}

}  // namespace

// Per channel the bandwidth a TCP socket of the host runtime gets between two nodes (GB/s), the
// topology's bwInter (the cost model's CPU network row takes it): 0.6 measured over loopback
// with 4 processes on 2 cores (a Ring all_reduce of 16 MB, benchmarks/multiprocess.py).
constexpr float kCpuSocketBwGBs = 0.6f;

static StatusOr<std::unique_ptr<Communicator>> CrossProcessCommunicator(
    const std::vector<int64_t>& devices, const GroupPlacement& placement, const Params& params,
    TopologyView topo) {
  const std::string& mode = params.transport;
  JR_REQUIRE(mode == "auto" || mode == "shm" || mode == "socket", Code::kInvalidArgument,
             "jax_rccl: JAX_RCCL_TRANSPORT='", mode,
             "' is not a transport; allowed: auto, shm, socket");
  const int n = static_cast<int>(devices.size());
  const bool forceSocket = mode == "socket";
  // Per rank of another process: a socket when sockets are forced or its host differs.
  std::vector<uint8_t> socketRank(size_t(n), 0), onHost(size_t(n), 0);
  bool anySocket = false, anyShmPeer = false;
  std::vector<std::string> otherHosts;
  for (int r = 0; r < n; ++r) {
    if (placement.local[size_t(r)]) {
      onHost[size_t(r)] = 1;
      continue;
    }
    const bool sameHost = placement.host[size_t(r)] == placement.thisHost;
    socketRank[size_t(r)] = forceSocket || !sameHost ? 1 : 0;
    onHost[size_t(r)] = socketRank[size_t(r)] ? 0 : 1;
    anySocket = anySocket || socketRank[size_t(r)];
    anyShmPeer = anyShmPeer || onHost[size_t(r)];
    if (!sameHost) otherHosts.push_back(placement.host[size_t(r)]);
  }
  if (mode == "shm" && !otherHosts.empty()) {
    JR_FAIL(Code::kInvalidArgument, "jax_rccl: JAX_RCCL_TRANSPORT=shm, but the group of devices ",
            ListString(devices), " spans hosts ('", placement.thisHost, "' and '",
            otherHosts.front(), "'); shared memory joins processes of one host only (use auto)");
  }
  if (anySocket) {
    for (int r = 0; r < n; ++r) {
      JR_REQUIRE(!socketRank[size_t(r)] || !placement.endpoint[size_t(r)].empty(),
                 Code::kUnsupported, "jax_rccl: rank ", r, " (device ", devices[size_t(r)],
                 ", process ", placement.process[size_t(r)],
                 ") must be reached over a socket but its process published no endpoint (the "
                 "world table has no 'endpoints')");
    }
  }
  // The topology every process derives alike: shm links within a node, socket links between
  // nodes (hosts; processes when sockets are forced), which the host executor's rows cost.
  topo.intraLink = LinkKind::kShm;
  topo.directPeers = false;
  const int nNodes = CountNodes(NodeKeys(placement, forceSocket));
  if (nNodes > 1) {
    topo.nNodes = nNodes;
    topo.interLink = LinkKind::kSocket;
    topo.bwInter = kCpuSocketBwGBs;
  }
  auto transport = std::make_unique<HostFifoTransport>(topo, /*shared=*/true);
  uint64_t h = 0x243f6a8885a308d3ull;
  for (int64_t d : devices) h = HashMix(h, static_cast<uint64_t>(d));
  std::unique_ptr<ShmGroup> shm;
  if (anyShmPeer) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    shm = std::make_unique<ShmGroup>(
        detail::StrCat("/jrccl.", placement.session, ".", hex, ".", ShmNameTag(hex)), placement,
        HostRegionLayout(transport->geometry()), onHost);
    JR_CHECK(shm->CreateLocal());
  }
  std::unique_ptr<NetLinks> links;
  if (anySocket) {
    // Regions this process keeps privately: the socket ranks' proxies, and its own ranks' when
    // no other process shares the host.
    std::vector<uint8_t> own(size_t(n), 0);
    for (int r = 0; r < n; ++r) own[size_t(r)] = socketRank[size_t(r)] || !shm ? 1 : 0;
    for (int r = 0; r < n; ++r) {
      if (!placement.local[size_t(r)] && !socketRank[size_t(r)]) own[size_t(r)] = 0;
    }
    std::vector<int64_t> devs = devices;
    GroupPlacement pl = placement;
    auto rankString = [devs, pl](int r) {
      return detail::StrCat("rank ", r, " (device ", devs[size_t(r)], ", process ",
                            pl.process[size_t(r)], ", host '", pl.host[size_t(r)], "')");
    };
    comm::NetOptions net;
    net.backend = params.net;
    net.session = placement.session;
    net.process = placement.thisProcess;
    // The proxy's own thread moves the TCP bytes (a step hands over between two threads of a
    // process, not four), sleeping on the sockets and the ranks' doorbells at once.
    net.threads = 0;
    net.sleeps = true;
    net.streams = int(params.net_streams);
    net.info = params.debug == "INFO" || params.debug == "TRACE";
    links = std::make_unique<NetLinks>(h, placement, socketRank, own, placement.endpoint,
                                       transport.get(), rankString, std::move(net));
    JR_CHECK(links->AllocateRegions());
  }
  return std::make_unique<Communicator>(devices, topo, std::move(transport), placement,
                                        std::move(shm), std::move(links));
}

World& World::Get() {
  static World* world = new World();  // never destroyed: pool threads may outlive statics
  return *world;
}

StatusOr<Communicator*> World::GetOrCreate(const std::vector<int64_t>& devices,
                                           const Params& params) {
  JR_REQUIRE(!devices.empty(), Code::kInvalidArgument,
             "jax_rccl: a replica group needs at least one device");
  JR_CHECK(EnsureWorld());  // before the lock: it may run Python (the processes meet)
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(devices);
  if (it != comms_.end()) return it->second.get();
  JR_ASSIGN_OR_RETURN(GroupPlacement placement, PlaceGroup(devices));
  TopologyView topo = CpuTopology(static_cast<int>(devices.size()), params);
  std::unique_ptr<Communicator> comm;
  if (!placement.crossProcess) {
    JR_ASSIGN_OR_RETURN(std::unique_ptr<HostTransport> transport, host::MakeHostTransport(topo));
    comm = std::make_unique<Communicator>(devices, topo, std::move(transport));
  } else {
    JR_ASSIGN_OR_RETURN(comm, CrossProcessCommunicator(devices, placement, params, topo));
  }
  comm->SetCheckSteps(params.check_calls != 0);
  comm->SetStallGrace(params.stall_grace);
  Communicator* out = comm.get();
  comms_.emplace(devices, std::move(comm));
  return out;
}

}  // namespace cpu
}  // namespace jax_rccl
