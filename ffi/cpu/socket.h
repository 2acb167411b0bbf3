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
// avoid that head-of-line blocking). The lower rank connects; the connection starts with the
// authenticated handshake of socket_listen.h (group, channel, ranks, both sides proving the run's
// secret), after which the higher rank's process parks it until its communicator claims it. Frames:
// a 64-byte header (type, channel, from, to, step, bytes, and a data step's StepTag), then the
// payload. Besides data steps the connections carry control frames between progress threads: a
// failure notice (a process whose communicator failed sends its reason on every connection
// before closing them, so its peers report the first failure, not the closed socket), and a
// status query and its answer (how many calls the peer's rank has started: a rank that timed out
// asks every peer, to name the ranks that never arrived).
//
// Connections open at the group's first execution, under its deadline. A peer that goes away
// (EOF, ECONNRESET) marks the links failed at once; the executor then stops as soon as it cannot
// progress, with an error naming the rank and its process. A connection that closes without a
// failure notice means its process exited.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ffi/comm/shm.h"
#include "ffi/comm/socket_listen.h"
#include "ffi/comm/world.h"
#include "ffi/core/status.h"
#include "ffi/host/executor.h"
#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace cpu {

// The host executor's types this layer uses (ffi/host/).
using comm::AcceptFor;
using comm::DialListener;
using comm::GroupPlacement;
using comm::LinkKey;
using comm::PrepareStream;
using comm::SocketListenerPort;
using host::Clock;
using host::HostConn;
using host::HostFifoTransport;
using host::RankRegion;
using host::StepTag;
using host::TransportGeometry;

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

  // Whether a connection failed (the peer went away, a frame was wrong, a peer sent a failure
  // notice); *reason says which.
  bool Failed(std::string* reason) const;
  // Sends `reason` (if not empty) to every peer as a failure notice (waiting at most half a
  // second for it to go out), then closes every connection (the peers see the stream end) and
  // stops the progress thread's work.
  void Shutdown(const std::string& reason = "");

  // By rank, the calls each local rank has started (the communicator's counters; answers status
  // queries). Set before Connect.
  // Also each local rank's call identity and text: a data step of another call at the same
  // number fails the links at once.
  void SetEnteredSource(const std::atomic<uint64_t>* entered, const std::atomic<uint64_t>* calls,
                        std::function<std::string(int)> callText) {
    entered_ = entered;
    calls_ = calls;
    callText_ = std::move(callText);
  }
  // Asks every socket rank how many calls it has started and waits at most `wait` for the
  // answers. Then PeerStatus(r): 1 answered (*entered, *call and *text, the text of its call, set),
  // 0 no answer, -1 its process exited (a connection closed without a failure notice).
  void QueryPeers(std::chrono::milliseconds wait);
  int PeerStatus(int rank, uint64_t* entered, uint64_t* call, std::string* text) const;
  // Waits until every step local rank `rank` put into its send FIFOs is on the wire (before an
  // execution returns: the process may exit right after). False on a failure or the deadline.
  bool WaitDrained(int rank, Clock::time_point deadline);

  // Counters, for tests and statistics.
  int64_t framesSent() const { return framesSent_.load(); }
  int64_t framesReceived() const { return framesReceived_.load(); }

 private:
  void ProgressLoop();
  bool PumpSend(SocketLink& link, bool* wantWrite);
  bool PumpRecv(SocketLink& link, bool* wantRead);
  // A connection of `link`'s peer went away: reported after a grace period unless a failure
  // notice from that process comes first.
  void PeerGone(SocketLink& link, std::string reason);
  void SetFailed(const std::string& reason);
  void Wake();
  void QueueControl(SocketLink& link, uint32_t type, const std::string& payload);  // needs mu_

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
  mutable std::mutex mu_;  // reason_, the status answers, the links' control queues
  std::string reason_;
  const std::atomic<uint64_t>* entered_ = nullptr;
  const std::atomic<uint64_t>* calls_ = nullptr;
  std::function<std::string(int)> callText_;
  std::vector<uint64_t> peerCall_;     // by rank: its answer's call identity
  std::vector<std::string> peerText_;  // by rank: its answer's call text ("call #S 'name' (...)")
  std::string reasonPending_;          // a failure seen by the progress thread, to report
  std::string eofReason_;              // a connection closed without a notice, reported later
  Clock::time_point eofAt_;
  std::vector<uint8_t> noticeFrom_;      // by rank: its process sent a failure notice
  std::vector<int> answered_;            // by rank: 1 answered the last query, -1 exited
  std::vector<uint64_t> peerEntered_;    // by rank: its answer
  std::atomic<int64_t> controlSent_{0};  // control frames written
  std::atomic<int64_t> framesSent_{0};
  std::atomic<int64_t> framesReceived_{0};
};

}  // namespace cpu
}  // namespace jax_rccl
