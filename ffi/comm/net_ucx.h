// The UCX backend of the network interface (net.h), and JAX_RCCL_NET=auto, which picks UCX or our
// TCP per connection.
//
// Set-up. A connection starts as the TCP backend's does: its sender dials the receiver's listener
// and proves the run's secret (socket_listen.h; the key carries a flag of its own). Only then do
// the two ends trade, on that authenticated socket, an offer (sender -> receiver: whether it has
// UCX, its UCP worker's address and a random token) and an answer (receiver -> sender: the
// decision, its worker's address and token): a process that cannot prove the secret never
// learns a worker address or a token. The receiver decides: UCX ('U') when both ends have UCX,
// its endpoint reaches the sender, and (for auto) the endpoint's transports include one faster
// than TCP (any but tcp and UCX's staging copies: shared memory, cma, verbs, GPU IPC); else, for
// auto, our TCP ('S') on the same socket (the TCP backend's framing starts after the answer);
// for ucx, an error ('E') both ends report. A receiver answers every key it listens for while
// its process waits in any Connect or Accept of the network, so two processes that connect to
// each other before they accept never wait for each other.
//
// Data (UCP active messages on a worker per network; progress inside the calls, under the
// worker's lock). A message is one active message whose user header holds the receiving end's
// token, the message's index on its connection and its info word; the receiver finds the posted
// receive by the index (so messages that UCX delivers out of order still land right) and copies
// an eager message into it or lets UCX move a rendezvous one there directly. Credits as in the TCP
// backend: the receiver announces the receives it posted (an active message to the sender's
// token, the running count, half a window at a time), and a sender hands UCX a message only
// against one, so no message ever waits at the receiver for a receive. A message whose token
// names no connection (one closed since, or a forgery) is dropped; a rendezvous one is refused.
//
// Close and faults go over the authenticated socket, which each connection keeps: the sender's
// close says how many messages it sent, and once they all landed the receiver acknowledges; an
// end aborted resets the socket. The socket is what tells a peer's death (it ends without a
// close, or is reset), on every UCX transport at once; a UCX request that fails (the endpoint
// failed) fails its connection too.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ffi/comm/net.h"
#include "ffi/comm/ucx_api.h"

namespace jax_rccl {
namespace comm {
namespace ucx {

// Every active message's user header.
struct WireHeader {
  uint64_t token;  // the receiving end's connection
  uint64_t seq;    // data: the message's index on its connection; credit: receives posted so far
  NetInfo info;    // data: the message's info (net.h)
};

constexpr unsigned kAmData = 1;
constexpr unsigned kAmCredit = 2;

class Conn;

// Registered memory (ucp_mem_map).
struct Memory final : NetMemory {
  ucp_mem_h memh = nullptr;
  bool device = false;
};

// One posted send or receive.
struct Req final : NetRequest {
  Conn* conn = nullptr;  // null once its connection went while UCX still had it
  uint64_t seq = 0;
  char* data = nullptr;
  size_t bytes = 0;  // send: the message's; receive: the buffer's
  WireHeader header{};
  Memory* mem = nullptr;
  void* op = nullptr;    // UCX's request while in flight
  void* desc = nullptr;  // receive: UCX's descriptor of a message to fetch (rendezvous)
  bool started = false;  // send: handed to UCX; receive: a message is landing in it
  bool complete = false;
  size_t got = 0;  // receive: the message's bytes
};

// A UCP context and worker, and the connections on it (the network's; its ends hold it too).
class Worker {
 public:
  // `wakeups`: with UCX's wake-up feature and its event descriptor (efd), for a caller that
  // sleeps on it (Arm); without, or where UCX gives none, efd stays -1.
  static StatusOr<std::shared_ptr<Worker>> Create(const Api* api, bool wakeups = false);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // mu held: runs UCX's progress (active messages and completions come here), then what it
  // left to do (sends a credit allows, credits due).
  void Progress();
  // Creates an endpoint to the worker at `address` (mu held); its transports in words
  // ("posix/memory, cma/memory") in *transports, and *fast: one of them beats TCP. The endpoint
  // handles a peer's failure where its transports can tell one; where UCX finds a faster
  // transport only without that (its shared-memory ones), it takes that one when every transport
  // it picks is local to this machine (the connection's socket tells a peer's death).
  StatusOr<ucp_ep_h> Connect(const std::string& address, std::string* transports, bool* fast);
  // Closes `ep` (mu held): flushed, or at once (`force`); its end is left to Progress.
  void CloseEndpoint(ucp_ep_h ep, bool force);
  std::string MemoryTypes() const;  // "host, cuda"
  // mu held, efd >= 0: progress, then arms the worker's event descriptor; false when events are
  // pending (UCS_ERR_BUSY: progress again before sleeping) or arming failed.
  bool Arm();

  const Api& api;
  std::mutex mu;  // guards the worker, every connection on it and what follows
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;  // this worker's, for peers
  uint64_t memoryTypes = 0;
  std::map<uint64_t, Conn*> conns;            // by token
  std::vector<Conn*> kicked;                  // connections with work after the last progress
  std::vector<std::unique_ptr<Req>> orphans;  // requests of connections gone, UCX still has
  std::vector<void*> closing;                 // endpoint closes in flight
  uint64_t dropped = 0;                       // messages whose token named no connection
  int efd = -1;                               // the wake-up event descriptor (Create's wakeups)

 private:
  explicit Worker(const Api* a) : api(*a) {}
  // One endpoint, with (`errors`) or without UCX's handling of a peer's failure; the transports'
  // names and their text.
  StatusOr<ucp_ep_h> CreateEndpoint(const std::string& address, bool errors,
                                    std::vector<std::string>* names, std::string* text);
};

// One connection's end on a worker (under the worker's mu).
class Conn {
 public:
  Conn(std::shared_ptr<Worker> w, bool send, std::string peer, int channel, int fd, uint64_t token);
  ~Conn();  // not closed: aborted

  // NetComm's calls (each takes the worker's mu).
  bool CloseInOrder();
  void Abort();
  Status Post(char* data, size_t bytes, const NetInfo& info, NetMemory* mem, NetRequest** request);
  Status Test(NetRequest* request, bool* done, size_t* bytes, NetInfo* info);
  Status Poll();
  StatusOr<NetMemory*> RegMr(void* data, size_t bytes, NetMemoryType type);
  Status DeregMr(NetMemory* mem);

  // Set-up (worker's mu held): the peer's endpoint and token are known.
  void Attach(ucp_ep_h ep, uint64_t peerToken) {
    ep_ = ep;
    peerToken_ = peerToken;
  }
  void SetPeer(const std::string& peer) { peer_ = peer; }
  void SetFd(int fd) { fd_ = fd; }
  void SetCounter(std::atomic<uint64_t>* moved) { moved_ = moved; }
  void SetTransport(std::string t) { transport_ = std::move(t); }
  const std::string& transport() const { return transport_; }
  bool sending() const { return send_; }

  // From UCX's callbacks (worker's mu held).
  void OnCredit(uint64_t posted);
  ucs_status_t OnData(const WireHeader& h, void* data, size_t length,
                      const ucp_am_recv_param_t* param);
  void OnDone(Req* r, ucs_status_t status, size_t length);
  void OnEndpointError(ucp_ep_h ep, ucs_status_t status);
  // After the progress that kicked it (KickLater): starts the sends credits allow, fetches the
  // rendezvous messages that came, announces credits due, acknowledges a close.
  void Kick();

 private:
  void Fail(const std::string& why);
  void KickLater();
  void EndpointFailed();  // fails with epError_'s text
  // Reads the socket's control frames (close, acknowledgement, the end or a reset).
  void ReadControl();
  bool WriteControl(uint32_t kind, uint64_t value);
  void StartSends();
  void AnnounceCredits();
  // Lets the connection go: its token and endpoint, requests UCX still holds kept as orphans
  // until UCX lets them go; `reset`: the socket is reset (the peer fails naming this end).
  void Detach(bool reset);
  void Count(size_t n) {
    if (moved_ != nullptr) moved_->fetch_add(n, std::memory_order_relaxed);
  }

  std::shared_ptr<Worker> w_;
  const Api& api_;
  bool send_;
  std::string peer_;
  int channel_;
  int fd_;
  uint64_t token_, peerToken_ = 0;
  ucp_ep_h ep_ = nullptr;
  std::string transport_;
  std::atomic<uint64_t>* moved_ = nullptr;
  std::deque<std::unique_ptr<Req>> queue_;
  uint64_t posted_ = 0;     // requests posted (the next one's index)
  uint64_t granted_ = 0;    // send: receives the peer posted (its running count)
  uint64_t started_ = 0;    // send: messages handed to UCX
  uint64_t announced_ = 0;  // receive: receives announced to the sender
  uint64_t landed_ = 0;     // receive: messages arrived
  Status failed_;
  ucs_status_t epError_ = UCS_OK;  // the endpoint failed (UCX's error handler, a request's)
  bool kicked_ = false;
  bool closing_ = false, closeSent_ = false, acked_ = false;  // send
  bool peerClosed_ = false, ackSent_ = false;                 // receive
  uint64_t closeCount_ = 0;
  bool ended_ = false;     // the socket ended after an orderly close (or, sending, the receiver's)
  bool detached_ = false;  // closed or aborted
  Clock::time_point lastControl_{};
  char ctl_[16] = {};
  size_t ctlDone_ = 0;
};

// Whether transport `name` beats TCP between two processes: any but tcp and UCX's copies between
// host and device memory.
bool FastTransport(const std::string& name);
// The UCX the workers run on (once one was created).
const Api& LoadedApi();
// Whether transport `name` works only within one machine (shared memory, cma, GPU IPC and
// copies).
bool LocalTransport(const std::string& name);
// The memory types of ucp_context_query's mask in words ("host, cuda"); whether one is a GPU's.
std::string DescribeMemoryTypes(uint64_t mask);
bool DeviceMemory(uint64_t mask);

}  // namespace ucx

// The UCX network (`autoMode` false: every connection on UCX or an error) or JAX_RCCL_NET=auto
// (each connection on UCX where the receiver finds a transport faster than TCP, else on our
// TCP). `api` null (auto only): this process has no UCX; its connections go on our TCP, also with
// peers that have it.
StatusOr<std::unique_ptr<Net>> MakeUcxNet(const NetOptions& options, const ucx::Api* api,
                                          bool autoMode);

}  // namespace comm
}  // namespace jax_rccl
