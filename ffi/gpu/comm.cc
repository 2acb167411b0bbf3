// See ffi/gpu/comm.h.
#include "ffi/gpu/comm.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "ffi/comm/group.h"
#include "ffi/core/stats.h"
#include "ffi/gpu/device_ctl.h"
#include "hip/portability.h"

namespace jax_rccl {
namespace gpu {
namespace {

struct DeviceTable {
  std::mutex mu;
  bool set = false;
  std::vector<int64_t> idOfOrdinal;  // -1: not a device of this process
  std::map<int64_t, int> ordinalOfId;
};

DeviceTable& Table() {
  static DeviceTable* t = new DeviceTable();  // never destroyed: used by XLA's threads
  return *t;
}

struct CommRegistry {
  std::mutex mu;
  std::map<std::vector<int64_t>, std::unique_ptr<GpuComm>> comms;
};

CommRegistry& Registry() {
  // Never destroyed: device memory is released with the process, not by static destructors
  // that would run after the GPU runtime has shut down.
  static CommRegistry* r = new CommRegistry();
  return *r;
}

std::string ListText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

void SetLocalDevices(const std::vector<std::pair<int, int64_t>>& devices) {
  DeviceTable& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.idOfOrdinal.clear();
  t.ordinalOfId.clear();
  for (const auto& [ordinal, id] : devices) {
    if (ordinal < 0) continue;
    if (static_cast<size_t>(ordinal) >= t.idOfOrdinal.size()) {
      t.idOfOrdinal.resize(static_cast<size_t>(ordinal) + 1, -1);
    }
    t.idOfOrdinal[static_cast<size_t>(ordinal)] = id;
    t.ordinalOfId[id] = ordinal;
  }
  t.set = true;
}

StatusOr<int64_t> GlobalIdOfOrdinal(int ordinal) {
  DeviceTable& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.set) return static_cast<int64_t>(ordinal);
  JR_REQUIRE(ordinal >= 0 && static_cast<size_t>(ordinal) < t.idOfOrdinal.size() &&
                 t.idOfOrdinal[static_cast<size_t>(ordinal)] >= 0,
             Code::kInternal, "GPU ordinal ", ordinal,
             " is not in jax_rccl's device table (built from jax.local_devices() at "
             "registration)");
  return t.idOfOrdinal[static_cast<size_t>(ordinal)];
}

int OrdinalOfGlobalId(int64_t id) {
  DeviceTable& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.set) return id >= 0 && id < (int64_t(1) << 30) ? static_cast<int>(id) : -1;
  auto it = t.ordinalOfId.find(id);
  return it == t.ordinalOfId.end() ? -1 : it->second;
}

TopologyView GpuTopology(int nRanks, int nNodes, const Params& params) {
#if defined(JAX_RCCL_AMD)
  const Arch arch = Arch::kGfx942;
#else
  const Arch arch = Arch::kSm90;
#endif
  return GpuGroupTopology(arch, nRanks, nNodes, params.nchannels, params.buffsize,
                          params.net_buffsize, DeviceHasLL128());
}

GpuComm::GpuComm(std::vector<int64_t> devices, std::vector<int> ordinals, TopologyView topo,
                 double timeout)
    : devices_(std::move(devices)),
      ordinals_(std::move(ordinals)),
      topo_(topo),
      geo_(GeometryOf(topo)),
      planTopo_(topo),
      timeout_(timeout),
      timeoutNs_(static_cast<uint64_t>(std::max(0.001, timeout) * 1e9)),
      groupText_(ListText(devices_)),
      ranks_(devices_.size()),
      published_(devices_.size(), nullptr) {
  for (size_t r = 1; r < ordinals_.size(); ++r) {
    if (ordinals_[r] != ordinals_[0]) systemFence_ = true;
  }
}

Status GpuComm::Init() {
  // A group of one GPU moves nothing between ranks, but its kernels (ragged_all_to_all's copy to
  // itself) may report a bad operand in its status word.
  JR_ASSIGN_OR_RETURN(status_, MappedAlloc(int64_t(nRanks()) * int64_t(sizeof(DevStatus))));
  JR_ASSIGN_OR_RETURN(abort_, MappedAlloc(64));
  return Status::Ok();
}

Status GpuComm::SetShared(comm::GroupPlacement placement, std::unique_ptr<comm::ShmGroup> shm,
                          const NetSettings& net) {
  placement_ = std::move(placement);
  netChannels_ = net.channels;
  netStreams_ = net.streams;
  netTrace_ = net.trace;
  shm_ = std::move(shm);
  crossProcess_ = true;
  systemFence_ = true;
  otherHost_.assign(size_t(nRanks()), 0);
  for (int r = 0; r < nRanks(); ++r) {
    otherHost_[size_t(r)] = placement_.host[size_t(r)] != placement_.thisHost ? 1 : 0;
    crossHost_ = crossHost_ || otherHost_[size_t(r)];
  }
  netGroup_ = NetGroupOf(devices_);
  // The records' exchange, then the proxy, use it (comm_net.cc).
  if (crossHost_) {
    comm::NetOptions o;
    o.backend = net.backend;
    o.session = placement_.session;
    o.process = placement_.thisProcess;
    o.threads = net.threads;
    o.streams = net.streams;
    o.info = net.info;
    JR_ASSIGN_OR_RETURN(net_, comm::MakeNet(o));
  }
  return Status::Ok();
}

Status GpuComm::Failure() {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = failure_;
  JR_STATUS_FRAME_(s);
  return s;
}

std::string GpuComm::RankText(int rank) const {
  if (!crossProcess_)
    return detail::StrCat("rank ", rank, " (device ", devices_[size_t(rank)], ")");
  return detail::StrCat("rank ", rank, " (device ", devices_[size_t(rank)], ", process ",
                        placement_.process[size_t(rank)], ", host '", placement_.host[size_t(rank)],
                        "')");
}

Status GpuComm::Fail(Status s, bool tell, bool primary) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.load(std::memory_order_relaxed)) {
      first = true;
      failure_ = s;
      failed_.store(true, std::memory_order_release);
      RaiseAbort();
    }
    cv_.notify_all();
  }
  if (!first) return s;
  // Ranks of other hosts learn why before anything of this host resets a connection to them (the
  // proxy's own failures come here through its callback, once it has failed); then the processes
  // of this host (which reset their own connections when they learn it).
  if (tell && crossHost_) TellOtherHosts(s, primary);
  if (shm_ != nullptr) shm_->MarkFailed(s.message(), s.code());
  comm::NetProxy* proxy = liveProxy_.load(std::memory_order_acquire);
  if (proxy != nullptr) proxy->Abort(s.message());
  return s;
}

Status GpuComm::Join(int rank, const std::string& who) {
  RankState& rs = ranks_[static_cast<size_t>(rank)];
  if (rs.joined.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard<std::mutex> joinLock(rs.joinMu);
  if (rs.joined.load(std::memory_order_acquire)) return Status::Ok();
  const int n = nRanks();
  RelaxedCapture relaxed;
  DeviceGuard guard(ordinal(rank));
  JR_CHECK(guard.status());
  // Every kernel loaded and the stack limit raised now, while no peer can have a kernel waiting
  // for this rank (none launches before every rank published): done later, at a plan's upload, it
  // could wait for a peer's kernel that waits for this rank (hip/runtime.h: PrepareDevice).
  {
    Status s = PrepareDevice();
    if (!s.ok()) return n == 1 ? s : Fail(s);
  }
  if (n == 1) {
    rs.joined.store(true, std::memory_order_release);
    return Status::Ok();
  }
  // A join that failed before (its peers will not trade again): its error, at once.
  if (failed_.load(std::memory_order_acquire)) return Failure();
  if (rs.region == nullptr) {
    StatusOr<void*> region = AllocRegion(geo_);
    if (!region.ok()) return Fail(region.status());
    rs.region = region.value();
  }
  if (crossProcess_) {
    Status s = TradeRegions(rank, who);
    if (!s.ok()) return Fail(s);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (published_[static_cast<size_t>(rank)] == nullptr) {
      published_[static_cast<size_t>(rank)] = rs.region;
      ++nPublished_;
      cv_.notify_all();
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_));
    while (nPublished_ < n && !failed_.load(std::memory_order_relaxed)) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && nPublished_ < n) break;
    }
    if (failed_.load(std::memory_order_relaxed)) {
      Status s = failure_;
      JR_STATUS_FRAME_(s);
      return s;
    }
    if (nPublished_ < n) {
      std::string missing;
      for (int r = 0; r < n; ++r) {
        if (published_[static_cast<size_t>(r)] == nullptr) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (device " +
                     std::to_string(devices_[static_cast<size_t>(r)]) + ")";
        }
      }
      Status s(Code::kTimeout, detail::StrCat("jax_rccl '", who, "': rank ", rank, " of GPU group ",
                                              groupText_, " waited ", timeout_,
                                              " s (JAX_RCCL_TIMEOUT) for the other ranks' "
                                              "first call; missing rank(s) ",
                                              missing));
      Stats().rendezvousTimeouts.fetch_add(1);
      lock.unlock();
      return Fail(s);
    }
  }
  for (int r = 0; r < n; ++r) {
    if (ordinal(r) < 0 || ordinal(r) == ordinal(rank)) continue;  // other processes: IPC
    Status s = EnablePeerAccess(ordinal(rank), ordinal(r));
    if (!s.ok()) return Fail(s);
  }
  if (rs.regionTable == nullptr) {
    StatusOr<void*> table = DeviceAlloc(int64_t(n) * int64_t(sizeof(void*)));
    if (!table.ok()) return Fail(table.status());
    rs.regionTable = table.value();
    Status s = CopyToDevice(rs.regionTable, published_.data(), int64_t(n) * int64_t(sizeof(void*)));
    if (!s.ok()) return Fail(s);
  }
  rs.joined.store(true, std::memory_order_release);
  if (crossProcess_) StartWatch();
  return Status::Ok();
}

// What a rank's segment holds (its region, comm/shm.h): the rank's IPC record.
struct alignas(64) IpcRecord {
  std::atomic<uint32_t> ready;  // 1 once the fields below are written (release)
  int32_t pid;
  char handle[kIpcHandleBytes];
  GpuRecord gpu;
};

constexpr int64_t kIpcRecordOffset = 0;
constexpr int64_t kShmRecordBytes = (int64_t(sizeof(IpcRecord)) + 4095) / 4096 * 4096;

namespace {

// Per physical GPU (GpuRecord::gpu): the most ranks on it any group of this process has seen. A
// group counts only its own ranks; a later group of fewer ranks on the GPU (one axis of a mesh)
// still plans for the processes an earlier one saw there.
std::mutex& SharersMu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::map<std::string, int>& KnownSharers() {
  static std::map<std::string, int>* m = new std::map<std::string, int>();
  return *m;
}

// This machine, for telling GPUs apart across processes: the boot id (processes that claim
// different hosts on one machine share their GPUs), else the host name.
std::string MachineKey() {
  char buf[64] = {0};
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    const size_t got = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    std::string id(buf, got);
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    if (!id.empty()) return id;
  }
  if (gethostname(buf, sizeof(buf) - 1) == 0) return std::string(buf);
  return "unknown";
}

std::string GpuOf(const GpuRecord& r) {
  return std::string(r.gpu, strnlen(r.gpu, sizeof(r.gpu)));
}

}  // namespace

StatusOr<GpuRecord> GpuComm::OwnRecord() const {
  GpuRecord rec;
  std::memset(&rec, 0, sizeof(rec));
  JR_ASSIGN_OR_RETURN(std::string bus, DeviceBusId());
  JR_ASSIGN_OR_RETURN(DeviceCapacity cap, QueryDeviceCapacity());
  const std::string gpu = MachineKey() + "/" + bus;
  std::memcpy(rec.gpu, gpu.data(), std::min(gpu.size(), sizeof(rec.gpu) - 1));
  rec.residentBlocks = cap.residentBlocks;
  {
    std::lock_guard<std::mutex> lock(SharersMu());
    auto it = KnownSharers().find(gpu);
    rec.knownSharers = it == KnownSharers().end() ? 1 : it->second;
  }
  rec.nChannels = geo_.nChannels;
  rec.netChannels = netChannels_;
  rec.netStreams = netStreams_;
  for (int p = 0; p < kNumProtocols; ++p) rec.stepBytes[p] = geo_.stepBytes[p];
  return rec;
}

Status GpuComm::TradeRegions(int rank, const std::string& who) {
  const int n = nRanks();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_));
  RankState& rs = ranks_[static_cast<size_t>(rank)];
  std::vector<GpuRecord> recs(static_cast<size_t>(n));
  JR_ASSIGN_OR_RETURN(recs[size_t(rank)], OwnRecord());
  if (shm_ != nullptr) {
    // This rank's record: its region's handle and its GpuRecord.
    char* region = shm_->Region(rank);
    JR_REQUIRE(region != nullptr, Code::kInternal, "jax_rccl '", who, "': rank ", rank,
               "'s segment is not mapped");
    auto* rec = reinterpret_cast<IpcRecord*>(region + kIpcRecordOffset);
    JR_CHECK(IpcHandleOf(rs.region, rec->handle));
    rec->pid = static_cast<int32_t>(getpid());
    rec->gpu = recs[size_t(rank)];
    rec->ready.store(1, std::memory_order_release);
    int missing = -1;
    Status opened = shm_->OpenRemote(deadline, &failed_, &missing);
    if (!opened.ok()) {
      if (missing >= 0 && shm_->Liveness(missing) == comm::PeerLiveness::kExited) {
        return Status(
            Code::kTimeout,
            detail::StrCat("jax_rccl '", who, "': rank ", rank, " of GPU group ", groupText_, ": ",
                           RankText(missing), " exited before it published its connection region"));
      }
      if (missing >= 0) {
        return Status(Code::kTimeout,
                      detail::StrCat("jax_rccl '", who, "': rank ", rank, " of GPU group ",
                                     groupText_, " waited ", timeout_, " s (JAX_RCCL_TIMEOUT) for ",
                                     RankText(missing), " to publish its connection region"));
      }
      return opened;
    }
    for (int r = 0; r < n; ++r) {
      if (placement_.local[static_cast<size_t>(r)] || otherHost_[size_t(r)]) continue;
      auto* peerRec = reinterpret_cast<IpcRecord*>(shm_->Region(r) + kIpcRecordOffset);
      while (peerRec->ready.load(std::memory_order_acquire) == 0) {
        if (std::chrono::steady_clock::now() >= deadline || shm_->AnyFailed()) {
          return Status(
              Code::kTimeout,
              detail::StrCat("jax_rccl '", who, "': rank ", rank, " of GPU group ", groupText_,
                             " waited ", timeout_, " s (JAX_RCCL_TIMEOUT) for ", RankText(r),
                             " to export its connection region"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      recs[size_t(r)] = peerRec->gpu;
      JR_ASSIGN_OR_RETURN(void* peer, IpcOpen(peerRec->handle));
      std::lock_guard<std::mutex> lock(mu_);
      if (published_[static_cast<size_t>(r)] == nullptr) {
        published_[static_cast<size_t>(r)] = peer;
        ++nPublished_;
      }
    }
  }
  if (crossHost_) JR_CHECK(ExchangeRecords(rank, who, deadline, &recs));
  // Every rank's record is in: one geometry, and the channels every rank's launch may use so that
  // the blocks of one launch of all the ranks sharing each GPU are resident at once. Each process
  // runs one launch at a time (XLA's stream), so that is what the GPU must hold; every rank
  // computes the same count from the same records.
  for (int r = 0; r < n; ++r) {
    const GpuRecord& rec = recs[size_t(r)];
    bool same = rec.nChannels == geo_.nChannels;
    for (int p = 0; p < kNumProtocols; ++p) same = same && rec.stepBytes[p] == geo_.stepBytes[p];
    constexpr int kSimple = static_cast<int>(Proto::kSimple);
    JR_REQUIRE(same, Code::kInvalidArgument, "jax_rccl '", who, "': GPU group ", groupText_, ": ",
               RankText(r), " lays its connections out for ", rec.nChannels, " channels and ",
               rec.stepBytes[kSimple] * kSteps, " Simple buffer bytes, this process for ",
               geo_.nChannels, " and ", geo_.stepBytes[kSimple] * kSteps,
               ": every process must run with the same JAX_RCCL_NCHANNELS, ",
               crossHost_ ? "JAX_RCCL_NET_BUFFSIZE" : "JAX_RCCL_BUFFSIZE", " and build");
    JR_REQUIRE(!crossHost_ || rec.netStreams == netStreams_, Code::kInvalidArgument, "jax_rccl '",
               who, "': GPU group ", groupText_, ": ", RankText(r),
               " carries its channels across hosts on ", rec.netStreams,
               " TCP streams per peer, this process on ", netStreams_,
               " (0: one per channel): every process must run with the same JAX_RCCL_NET_STREAMS");
  }
  int channels = topo_.nChannels;
  int mySharers = 1;
  for (int r = 0; r < n; ++r) {
    int sharers = 0;
    for (int q = 0; q < n; ++q) sharers += GpuOf(recs[size_t(q)]) == GpuOf(recs[size_t(r)]) ? 1 : 0;
    if (r == rank) mySharers = sharers;
    const GpuRecord& rec = recs[static_cast<size_t>(r)];
    StatusOr<int> ch =
        ResidentChannels(topo_.nChannels, std::max(sharers, rec.knownSharers), rec.residentBlocks);
    if (!ch.ok()) {
      return Status(ch.status().code(), detail::StrCat("jax_rccl '", who, "': GPU group ",
                                                       groupText_, ", ", RankText(r), " (GPU ",
                                                       GpuOf(rec), "): ", ch.status().message()));
    }
    channels = std::min(channels, ch.value());
    // Across hosts every channel is a TCP connection each way per pair of ranks that crosses, and
    // 2 MiB of host memory in the window of each rank of another host (16 steps of 128 KiB). A
    // channel's ring keeps at most 8 steps in flight while each step's trip through the proxies is
    // long, so bandwidth grows with the channels (and helper threads) up to about 32
    // (docs/benchmarks.md, GPU groups across hosts).
    if (crossHost_ && rec.netChannels > 0) channels = std::min<int>(channels, rec.netChannels);
  }
  {
    std::lock_guard<std::mutex> lock(SharersMu());
    int& known = KnownSharers()[GpuOf(recs[size_t(rank)])];
    known = std::max(known, mySharers);
  }
  if (channels < planTopo_.nChannels) {
    planTopo_.nChannels = channels;
    int p2p = 1;
    while (p2p * 2 <= channels) p2p *= 2;
    planTopo_.p2pnChannels = std::min(planTopo_.p2pnChannels, p2p);
    planTopo_.p2pnChannelsPerPeer = std::min(planTopo_.p2pnChannelsPerPeer, planTopo_.p2pnChannels);
  }
  if (crossHost_) JR_CHECK(ConnectHosts(rank, who, deadline));
  if (shm_ != nullptr) shm_->MaybeUnlink();
  return Status::Ok();
}

Status GpuComm::Check(int rank, const std::string& who) {
  std::string why;
  Code code = Code::kTimeout;
  if (shm_ != nullptr && !failed_.load(std::memory_order_acquire) && shm_->AnyFailed(&why, &code)) {
    return Fail(Status(code, detail::StrCat("jax_rccl '", who, "': another process of GPU group ",
                                            groupText_, " reported its communicator failed",
                                            why.empty() ? std::string() : ": " + why)),
                false);
  }
  if (failed_.load(std::memory_order_acquire)) return Failure();
  const volatile DevStatus* st = static_cast<const volatile DevStatus*>(status_.host);
  if (st[rank].code == kDevFine) return Status::Ok();
  if (crossProcess_ && st[rank].code != kDevBadRagged) {
    // The watch (comm_check.cc) posts it to the other processes with the peers' calls named:
    // its error is the one kept.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (!failed_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (failed_.load(std::memory_order_acquire)) return Failure();
  }
  // The root cause first: a rank that timed out, else any failed rank.
  int culprit = rank;
  for (int r = 0; r < nRanks(); ++r) {
    if (st[r].code == kDevTimeout || st[r].code == kDevTooManyRanks || st[r].code == kDevMismatch) {
      culprit = r;
      break;
    }
  }
  {  // the kernel sets the code first and says when the other fields are in
    const auto written = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (st[culprit].code != kDevBadRagged && st[culprit].complete == 0 &&
           std::chrono::steady_clock::now() < written) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  DevStatus copy = ReadStatus(st[culprit]);
  if (copy.code == kDevBadRagged) {
    // Bad operands, not a broken communicator: both ends of the transfer skipped it alike, so the
    // FIFO counters stay in step. Reported once (the word is cleared); later calls run.
    volatile DevStatus* mine = static_cast<volatile DevStatus*>(status_.host) + culprit;
    mine->code = kDevFine;
    return Status(Code::kInvalidArgument,
                  detail::StrCat("jax_rccl '", who, "': an earlier ragged_all_to_all on GPU group ",
                                 groupText_, " had a bad offsets table: ", DescribeStatus(copy),
                                 " (its result kept the output's rows there)"));
  }
  return Fail(LaunchError(culprit, copy, who));
}

StatusOr<std::vector<std::array<int64_t, 6>>> GpuComm::Counters(int rank) const {
  std::vector<std::array<int64_t, 6>> out;
  const RankState& rs = ranks_[static_cast<size_t>(rank)];
  if (nRanks() == 1 || !rs.joined.load(std::memory_order_acquire)) return out;
  const int64_t bytes = RegionLayout::HeaderOffset(geo_, geo_.nChannels, 0);
  std::vector<ConnHeader> h(static_cast<size_t>(bytes) / sizeof(ConnHeader));
  DeviceGuard guard(ordinal(rank));
  JR_CHECK(guard.status());
  JR_CHECK(CopyToHost(h.data(), rs.region, bytes));
  for (int c = 0; c < geo_.nChannels; ++c) {
    for (int p = 0; p < nRanks(); ++p) {
      ConnHeader x = h[static_cast<size_t>(RegionLayout::ConnIndex(geo_, c, p))];
      if (p < int(windows_.size()) && windows_[size_t(p)].host != nullptr) {
        // A rank of another host: its connection's counters are in its window.
        if (c >= planTopo_.nChannels) continue;
        const char* win = static_cast<const char*>(windows_[size_t(p)].host);
        std::memcpy(&x, win + ProxyWindowLayout::HeaderOffset(c, 1), sizeof(x));
      }
      out.push_back({c, p, int64_t(x.tail), int64_t(x.head), int64_t(x.pad0[kSendPad]),
                     int64_t(x.pad1[kSendPad])});
    }
  }
  return out;
}

RankLaunch GpuComm::Launch(int rank, void* stream) const {
  RankLaunch rl;
  rl.rank = rank;
  rl.nRanks = nRanks();
  rl.stream = stream;
  rl.statusDev = static_cast<DevStatus*>(status_.dev) + rank;
  rl.abortDev = static_cast<int32_t*>(abort_.dev);
  rl.timeoutNs = timeoutNs_;
  if (nRanks() == 1) return rl;
  rl.regionsDev = static_cast<char* const*>(ranks_[static_cast<size_t>(rank)].regionTable);
  rl.ownRegion = static_cast<char*>(ranks_[static_cast<size_t>(rank)].region);
  rl.systemFence = systemFence_;
  return rl;
}

StatusOr<GpuComm*> GetOrCreateComm(const std::vector<int64_t>& devices, const Params& params,
                                   const std::string& who) {
  JR_CHECK(comm::EnsureWorld());  // before the lock: it may run Python (the processes meet)
  CommRegistry& reg = Registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.comms.find(devices);
  if (it != reg.comms.end()) return it->second.get();
  std::vector<int> ordinals;
  std::vector<int64_t> remote;
  for (int64_t d : devices) {
    const int o = OrdinalOfGlobalId(d);
    if (o < 0) remote.push_back(d);
    ordinals.push_back(o);
  }
  const int nRanks = static_cast<int>(devices.size());
  std::unique_ptr<GpuComm> comm;
  if (remote.empty()) {
    comm = std::make_unique<GpuComm>(devices, ordinals, GpuTopology(nRanks, 1, params),
                                     params.timeout);
  } else {
    // Devices of other processes: the world table places them.
    JR_ASSIGN_OR_RETURN(comm::GroupPlacement placement, comm::PlaceGroup(devices));
    int nLocal = 0;
    for (uint8_t l : placement.local) nLocal += l ? 1 : 0;
    JR_REQUIRE(nLocal == 1, Code::kUnsupported, "jax_rccl '", who, "': the GPU group ",
               ListText(devices), " spans processes and has ", nLocal,
               " devices in this one; across processes a group takes one device per process");
    // Ranks of other hosts are reached through the network proxy, at their processes' endpoints;
    // ranks of this host through IPC (a segment each).
    std::vector<uint8_t> onHost(devices.size(), 0);
    bool anyOnHost = false;
    for (size_t r = 0; r < devices.size(); ++r) {
      onHost[r] = placement.host[r] == placement.thisHost ? 1 : 0;
      anyOnHost = anyOnHost || (onHost[r] && !placement.local[r]);
      JR_REQUIRE(onHost[r] || !placement.endpoint[r].empty(), Code::kUnsupported, "jax_rccl '", who,
                 "': the GPU group ", ListText(devices), " spans hosts, but device ", devices[r],
                 " (host '", placement.host[r], "', process ", placement.process[r],
                 ") has no network endpoint (the world table has no 'endpoints')");
    }
    comm = std::make_unique<GpuComm>(devices, ordinals,
                                     GpuTopology(nRanks, comm::CountNodes(placement.host), params),
                                     params.timeout);
    std::unique_ptr<comm::ShmGroup> shm;
    if (anyOnHost) {
      // The segments carry only the IPC records (IpcRecord).
      comm::ShmRegionLayout records;
      records.nRanks = static_cast<int32_t>(devices.size());
      records.nChannels = 1;
      records.slotBytes = 64;
      records.bytes = kShmRecordBytes;
      uint64_t h = 0x13198a2e03707344ull;
      for (int64_t d : devices) h = comm::HashMix(h, static_cast<uint64_t>(d));
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
      shm = std::make_unique<comm::ShmGroup>(
          detail::StrCat("/jrccl.", placement.session, ".g", hex, ".",
                         comm::ShmNameTag(detail::StrCat("g", hex))),
          placement, std::move(records), onHost);
      JR_CHECK(shm->CreateLocal());
    }
    JR_CHECK(
        comm->SetShared(std::move(placement), std::move(shm),
                        GpuComm::NetSettings{int(params.net_threads), int(params.net_nchannels),
                                             int(params.net_streams), params.net_trace, params.net,
                                             params.debug == "INFO" || params.debug == "TRACE"}));
    if (comm->crossHost()) {
      // At exit the proxies close their connections in order, so that a peer still finishing its
      // last steps sees the end of the data, not a failure.
      static std::once_flag once;
      std::call_once(once, []() { std::atexit(StopProxies); });
    }
  }
  {
    RelaxedCapture relaxed;
    JR_CHECK(comm->Init());
  }
  GpuComm* p = comm.get();
  // Across processes the watch runs from here on: a peer that fails while this process joins
  // stops the join at once (its segment, its notice).
  if (p->shared()) p->StartWatch();
  reg.comms.emplace(devices, std::move(comm));
  Stats().communicators.fetch_add(1);
  return p;
}

void StopProxies() {
  CommRegistry& reg = Registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& [devices, comm] : reg.comms) comm->StopProxy();
}

void StopWatches() {
  CommRegistry& reg = Registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& [devices, comm] : reg.comms) comm->StopWatch();
}

GpuComm* FindComm(const std::vector<int64_t>& devices) {
  CommRegistry& reg = Registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.comms.find(devices);
  return it == reg.comms.end() ? nullptr : it->second.get();
}

int64_t CommCount() {
  CommRegistry& reg = Registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return static_cast<int64_t>(reg.comms.size());
}

}  // namespace gpu
}  // namespace jax_rccl
