// TCP sockets between processes (between hosts, or between any processes when
// JAX_RCCL_TRANSPORT=socket), driven by one progress thread per communicator.
//
// The executor does not know about sockets: it keeps talking to HostConn FIFOs in local memory
// (transport_host.h). For a rank r reached over a socket, this process keeps a private "proxy"
// region for r, laid out as r's own region would be (RankRegion), and attaches it to the transport:
//
//   send side:  the local rank l fills Conn(c, l, r) in r's proxy region and rings r's proxy
//               doorbell; the progress thread ships each filled step (a frame) onto the socket
//               and advances `head` once the step is in the kernel's send buffer, ringing l;
//   recv side:  the progress thread reads frames from r into Conn(c, r, l) in l's region (a
//               shared-memory segment, or private memory when no process of the group shares the
//               host), one step at a time and only into a free slot (step - head < kSteps), then
//               advances `tail` and rings l. A full FIFO stops reading from that socket, so TCP's
//               flow control holds the sender back.
//
// Ringing a proxy doorbell wakes the progress thread through an eventfd (the transport writes it
// only while the thread sleeps in poll()).
//
// One TCP connection per channel and pair of ranks (l, r), carrying both directions: each
// direction of a TCP stream feeds exactly one FIFO, so a full FIFO never holds back another
// FIFO's data (one stream per process pair would need unbounded buffering on the receiver to
// avoid that head-of-line blocking). The lower rank connects; the connection starts with a hello
// (session, group, channel, ranks) that the higher rank's process matches (Accept below). Frames:
// a 32-byte header (type, channel, from, to, step, bytes), then the payload; besides data, the
// channel-0 connection carries each rank's call-site fingerprint on first use (comm.h).
//
// Connections open at the group's first execution, under its deadline. A peer that goes away
// (EOF, ECONNRESET) marks the links failed at once; the executor then stops as soon as it cannot
// progress, with an error naming the rank and its process.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ffi/cpu/executor.h"
#include "ffi/cpu/shm.h"
#include "ffi/cpu/transport_host.h"
#include "ffi/cpu/world.h"
#include "ffi/planner/status.h"

namespace jax_rccl {
namespace cpu {

// Starts this process's listener once (all interfaces, an ephemeral TCP port) and returns its
// port. Later calls return the same port.
StatusOr<int> SocketListenPort();

struct SocketLink;

// The socket side of one communicator, as seen from this process.
class SocketLinks {
 public:
  // `socketRank[r]`: rank r is reached over a socket (a rank of another process); `ownRegion[r]`:
  // this object allocates rank r's region (the socket ranks' proxies, and the local ranks' when
  // no process of the group shares this host). `endpoints` by rank ("host:port" of its process),
  // `rankString` names a rank in messages.
  SocketLinks(std::string session, uint64_t group, const GroupPlacement& placement,
              std::vector<uint8_t> socketRank, std::vector<uint8_t> ownRegion,
              std::vector<std::string> endpoints, HostFifoTransport* transport,
              std::function<std::string(int)> rankString);
  ~SocketLinks();
  SocketLinks(const SocketLinks&) = delete;
  SocketLinks& operator=(const SocketLinks&) = delete;

  bool socketRank(int r) const { return socketRank_[size_t(r)] != 0; }
  // Allocates the regions this object owns (zeroed, laid out as RankRegion).
  Status AllocateRegions();
  // Rank r's region when this object owns it, else null.
  char* Region(int r) const { return regions_[size_t(r)]; }

  // Opens every connection of this process's ranks (until `deadline`) and starts the progress
  // thread. Errors name the rank and process that did not answer.
  Status Connect(Clock::time_point deadline, const std::atomic<bool>* aborted,
                 const std::string& name, double timeout);

  // Whether a connection failed (the peer went away, a frame was wrong); *reason says which.
  bool Failed(std::string* reason) const;
  // Closes every connection (the peers see the stream end) and stops the progress thread's work.
  void Shutdown();
  // Waits until every step local rank `rank` put into its send FIFOs is on the wire (before an
  // execution returns: the process may exit right after). False on a failure or the deadline.
  bool WaitDrained(int rank, Clock::time_point deadline);

  // Call-site fingerprints (comm.h: CheckCallSite) for the ranks without a shared segment:
  // `rank`'s entry goes to every socket peer and stays here for this process's other ranks;
  // peers' entries are kept as they arrive.
  void PostFingerprint(int rank, int64_t callSite, const ShmFingerprint& fp);
  // 1 found, 0 not (yet).
  int FindFingerprint(int rank, int64_t callSite, ShmFingerprint* out) const;

  // Counters, for tests and statistics.
  int64_t framesSent() const { return framesSent_.load(); }
  int64_t framesReceived() const { return framesReceived_.load(); }

 private:
  void ProgressLoop();
  bool PumpSend(SocketLink& link, bool* wantWrite);
  bool PumpRecv(SocketLink& link, bool* wantRead);
  void SetFailed(const std::string& reason);
  void Wake();

  const std::string session_;
  const uint64_t group_;
  GroupPlacement placement_;
  std::vector<uint8_t> socketRank_;
  std::vector<uint8_t> ownRegion_;
  std::vector<std::string> endpoints_;
  HostFifoTransport* tr_;
  std::function<std::string(int)> rankString_;
  TransportGeometry geo_;
  int64_t regionBytes_ = 0;
  std::vector<char*> regions_;

  std::vector<std::unique_ptr<SocketLink>> links_;
  int wakeFd_ = -1;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;  // reason_, fingerprints_, the links' control queues
  std::string reason_;
  std::map<std::pair<int, int64_t>, ShmFingerprint> fingerprints_;
  std::atomic<int64_t> framesSent_{0};
  std::atomic<int64_t> framesReceived_{0};
};

}  // namespace cpu
}  // namespace jax_rccl
