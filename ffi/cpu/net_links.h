// The CPU runtime's links to ranks of other processes that it reaches over the network (between
// hosts, or between any processes when JAX_RCCL_TRANSPORT=socket): the FIFO steps move through the
// network proxy and network interface that GPU groups use (ffi/comm/proxy.h, net.h), on our TCP or
// on UCX (JAX_RCCL_NET).
//
// The executor does not know about the network: it keeps talking to HostConn FIFOs in local
// memory (transport_host.h). For a rank r of another process, this process keeps a private
// "proxy" region for r, laid out as r's own region would be (RankRegion), and attaches it to the
// transport; the network proxy serves those FIFOs as it serves a GPU kernel's:
//
//   send side:  the local rank l fills Conn(c, l, r) in r's proxy region (slot, size, StepTag,
//               then tail) and rings r's proxy doorbell; the proxy ships each filled step with its
//               size and tag (net.h: NetInfo) and posts `head` once the network took it, ringing l;
//   recv side:  the proxy keeps receives posted into the free slots of Conn(c, r, l) in l's
//               region (a shared-memory segment, or private memory when no process of the group
//               shares the host), writes each step's size and tag, posts `tail` and rings l.
//
// The idle proxy sleeps on an eventfd that the local ranks' doorbells and the network's helper
// threads write (ProxyHooks), so an idle group costs no CPU. A step that lands carrying another
// call than the one its receiving rank runs at that number fails the links at once (the rank
// itself may be blocked elsewhere and never read it).
//
// Faults. A communicator that fails sends its reason to every process of the group it reaches
// over the network (failure notices, ffi/comm/notice.h: the listener's authenticated handshake)
// and then resets its connections; a peer whose proxy sees a connection fail waits up to 300 ms
// for such a notice and reports it, else asks the peer's listener whether its process is still
// there ("exited" when nothing listens any more). A rank that times out asks every rank it reaches
// over the network how many calls it has started (status queries, answered by each process's
// listener thread even while its own threads are blocked: socket_listen.h AnswerOnListener), to
// name the ranks that never arrived or ran another call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ffi/comm/net.h"
#include "ffi/comm/notice.h"
#include "ffi/comm/proxy.h"
#include "ffi/comm/world.h"
#include "ffi/core/status.h"
#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace cpu {

// The network side of one communicator, as seen from this process.
class NetLinks {
 public:
  // `netRank[r]`: rank r is reached over the network (a rank of another process); `ownRegion[r]`:
  // this object allocates rank r's region (the network ranks' proxies, and the local ranks' when
  // no process of the group shares this host). `endpoints` by rank ("host:port" of its process),
  // `rankString` names a rank in messages; `net` the network to use (comm::MakeNet's options).
  NetLinks(uint64_t group, const comm::GroupPlacement& placement, std::vector<uint8_t> netRank,
           std::vector<uint8_t> ownRegion, std::vector<std::string> endpoints,
           host::HostFifoTransport* transport, std::function<std::string(int)> rankString,
           comm::NetOptions net);
  ~NetLinks();
  NetLinks(const NetLinks&) = delete;
  NetLinks& operator=(const NetLinks&) = delete;

  bool netRank(int r) const { return netRank_[size_t(r)] != 0; }
  // Allocates the regions this object owns (zeroed, laid out as RankRegion).
  Status AllocateRegions();
  // Rank r's region when this object owns it, else null.
  char* Region(int r) const { return regions_[size_t(r)]; }

  // Opens every connection of this process's ranks (until `deadline`) and starts the proxy.
  // Errors name the rank and process that did not answer.
  Status Connect(host::Clock::time_point deadline, const std::string& name, double timeout);

  // Whether the links failed (a connection failed, a peer sent a failure notice, a step of
  // another call landed); *reason says which.
  bool Failed(std::string* reason) const;
  // Sends `reason` (if not empty, and not learned from a peer) to every process reached over the
  // network as a failure notice (waiting at most half a second), then resets every connection;
  // without a reason, stops the proxy once every step is out and closes in order.
  void Shutdown(const std::string& reason = "");

  // By rank, the calls each local rank has started and their identity (the communicator's
  // counters), and the text of a rank's call: status answers, and the check of a landing step.
  // Set before Connect.
  void SetEnteredSource(const std::atomic<uint64_t>* entered, const std::atomic<uint64_t>* calls,
                        std::function<std::string(int)> callText);
  // Asks every network rank how many calls it has started and waits at most `wait` for the
  // answers. Then PeerStatus(r): 1 answered (*entered, *call and *text, the text of its call, set),
  // 0 no answer, -1 its process exited (nothing listens at its endpoint any more), 2 it exited
  // after its failure notice reached this process (a failure of its own, not a missing rank).
  void QueryPeers(std::chrono::milliseconds wait);
  int PeerStatus(int rank, uint64_t* entered, uint64_t* call, std::string* text) const;
  // Waits until every step local rank `rank` put into its send FIFOs is on the wire (before an
  // execution returns: the process may exit right after). False on a failure or the deadline.
  bool WaitDrained(int rank, host::Clock::time_point deadline);

  // How each connection moves its bytes (the proxy's), once connected.
  std::vector<std::string> Transports() const;

 private:
  // The proxy failed (on its thread): a notice of the peer's, or what the proxy saw.
  void OnProxyFailure(const std::string& reason);
  // A landing step of another call than its local rank's at that number: the text, else empty.
  std::string CheckStep(const comm::ProxyConnection& c, const comm::NetInfo& info) const;
  void SetFailed(const std::string& reason);
  std::string Answer(int rank) const;

  const uint64_t group_;
  comm::GroupPlacement placement_;
  std::vector<uint8_t> netRank_;
  std::vector<uint8_t> ownRegion_;
  std::vector<std::string> endpoints_;
  host::HostFifoTransport* tr_;
  std::function<std::string(int)> rankString_;
  comm::NetOptions netOptions_;
  host::TransportGeometry geo_;
  int64_t regionBytes_ = 0;
  std::vector<char*> regions_;

  std::unique_ptr<comm::NetProxy> proxy_;
  int wakeFd_ = -1;
  std::shared_ptr<void> answering_;  // the listener answers status queries while it lives
  std::atomic<bool> failed_{false};
  std::atomic<bool> shut_{false};
  mutable std::mutex mu_;  // reason_, the status answers
  std::string reason_;
  const std::atomic<uint64_t>* entered_ = nullptr;
  const std::atomic<uint64_t>* calls_ = nullptr;
  std::function<std::string(int)> callText_;
  std::vector<int> answered_;          // by rank: 1 answered the last query, -1 exited
  std::vector<uint64_t> peerEntered_;  // by rank: its answer
  std::vector<uint64_t> peerCall_;     // by rank: its answer's call identity
  std::vector<std::string> peerText_;  // by rank: its answer's call text
  std::set<int> noticeFrom_;           // processes whose failure notice this process took
};

}  // namespace cpu
}  // namespace jax_rccl
