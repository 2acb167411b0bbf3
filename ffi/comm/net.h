// A network interface for the proxy (proxy.h), shaped like NCCL's net API (ncclNet_t in
// nccl_net.h: listen, connect, accept, regMr, deregMr, isend, irecv, test, close): what a backend
// implements to carry the steps of connections that cross hosts. Connections are one-way (a send
// end and a receive end), requests are non-blocking and complete in the order they were posted on
// their connection, and progress happens inside Test (a backend may add threads of its own).
//
// Differences from NCCL's, all small: a connection is named by a NetKey (group, channel, sender,
// receiver) instead of an opaque handle exchanged out of band (the world table already holds every
// process's endpoint); a message carries a few words besides its bytes (NetInfo: the proxy
// sends each step's protocol and size, and a CPU step's tag, in it), which the receiving Test
// reports, where NCCL matches integer tags; errors are Status values with the peer named in their
// text.
//
// Backends (JAX_RCCL_NET, MakeNet): TCP (net_socket.cc) over the socket transport's listener and
// its authenticated handshake (socket_listen.h): a stranger that cannot prove the run's secret
// never gets a connection; and UCX (net_ucx.h), loaded at run time, whose connections are set up
// over the same authenticated handshake (the UCP worker addresses travel on that socket only):
// RegMr registers the proxy's buffers with UCX (ucp_mem_map; device memory where the UCX found
// reports it can move it), Isend/Irecv are UCP active messages, and Test makes UCX's progress.
// `auto` picks UCX per connection where it offers a transport faster than TCP between the two
// ends, else TCP; docs/multiprocess.md says more. The planner and the kernels do not change.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ffi/comm/socket_listen.h"
#include "ffi/core/status.h"

namespace jax_rccl {
namespace comm {

// One connection: a group's channel from rank `from` to rank `to`.
struct NetKey {
  uint64_t group = 0;
  int channel = 0;
  int from = 0;
  int to = 0;
};

// What a message carries besides its bytes (where NCCL's net API matches integer tags): the
// proxy's step word (proxy.h: protocol, call tag, bytes) and 32 bytes of tag that the CPU
// runtime's steps carry (transport_host.h: StepTag; zero on GPU steps). Backends move it as is.
struct NetInfo {
  uint64_t word = 0;
  uint64_t tag[4] = {};
};

// Registered memory (ncclNet_t's mhandle): null for backends that need none.
struct NetMemory {
  virtual ~NetMemory() = default;
};

// Where registered memory lives (NCCL_PTR_HOST, NCCL_PTR_CUDA).
enum class NetMemoryType { kHost, kDevice };

// One posted send or receive, owned by its connection; valid until Test reports it done.
struct NetRequest {
  virtual ~NetRequest() = default;
};

// A connection's end (ncclNet_t's sendComm or recvComm). Closing (closeSend, closeRecv) is in
// order (CloseInOrder) or not (Abort, or destroying an end not closed in order): the peer's end
// then fails with an error naming this one.
class NetComm {
 public:
  virtual ~NetComm() = default;
  // Without blocking: true once the end is closed; a sending end first finishes its messages and
  // tells the receiver that nothing more comes. Call again until true (or Abort).
  virtual bool CloseInOrder() = 0;
  virtual void Abort() = 0;
  // ncclNet_t's regMr/deregMr: a backend without registration returns null and succeeds.
  virtual StatusOr<NetMemory*> RegMr(void* data, size_t bytes, NetMemoryType type) = 0;
  virtual Status DeregMr(NetMemory* mem) = 0;
  // Posts the send of `bytes` at `data` with the word `info` (send ends only). *request is null
  // when the connection cannot take another request now (try again after a Test): at most
  // kMaxRequests are in flight per connection, as in NCCL (NCCL_NET_MAX_REQUESTS). `data` must stay
  // valid and unchanged until the request is done. A send moves only into a receive its receiver
  // posted (as NCCL's IB transport waits for the receiver's clear-to-send): a send waits, never
  // fails, while no receive is posted.
  virtual Status Isend(const void* data, size_t bytes, const NetInfo& info, NetMemory* mem,
                       NetRequest** request) = 0;
  // Posts a receive of at most `bytes` into `data` (receive ends only); as Isend.
  virtual Status Irecv(void* data, size_t bytes, NetMemory* mem, NetRequest** request) = 0;
  // Makes progress; *done says whether `request` completed, then *bytes and *info (receives) say
  // what arrived and the request is gone. Errors (the peer's end went away without closing in
  // order, a message larger than the posted buffer, a malformed header) name the peer; the
  // connection is then failed for good, though requests that completed before are still
  // reported. After the sender closed its end in order, receives posted beyond its last message
  // stay pending without an error.
  virtual Status Test(NetRequest* request, bool* done, size_t* bytes, NetInfo* info) = 0;
  // Without a request: an error when the peer's end is known to have failed (reset), for a
  // caller with nothing in flight on this connection.
  virtual Status Poll() = 0;
  // Bytes this end moved so far (headers included): a caller that polls sees a message advance
  // before it completes (TCP; UCX, which does not show a message in progress, counts whole
  // messages).
  uint64_t bytesMoved() const { return bytesMoved_.load(std::memory_order_relaxed); }
  // How this end moves its bytes, in words ("socket", "ucx: posix/memory, cma/memory").
  virtual std::string Transport() const = 0;
  static constexpr int kMaxRequests = 8;

 protected:
  std::atomic<uint64_t> bytesMoved_{0};
};

class Net {
 public:
  virtual ~Net() = default;
  virtual const char* name() const = 0;
  // ncclNet_t's listen: makes this process ready to accept `key` (for sockets: the process's
  // listener must run, socket_listen.h).
  virtual Status Listen(const NetKey& key) = 0;
  // ncclNet_t's connect (the sending end of `key`) to the process at `endpoint` ("host:port"),
  // and accept (the receiving end), both until `deadline`. `peer` names the other rank in errors.
  virtual StatusOr<std::unique_ptr<NetComm>> Connect(const NetKey& key, const std::string& endpoint,
                                                     Clock::time_point deadline,
                                                     const std::string& peer) = 0;
  virtual StatusOr<std::unique_ptr<NetComm>> Accept(const NetKey& key, Clock::time_point deadline,
                                                    const std::string& peer) = 0;
  // Before the first Connect or Accept: the backend writes 1 to the eventfd `fd` whenever its
  // connections may have made progress (a message moved, a peer's end failed), so that a caller
  // can sleep on it rather than poll Test. False: this backend cannot (Test must be polled).
  virtual bool SetProgressFd(int fd) {
    (void)fd;
    return false;
  }
  // Before the first Connect or Accept, for a caller that moves the bytes itself (no helper
  // threads): it will sleep on the sockets PollFds gives and call PumpFds with what poll() found,
  // so Test need not touch the sockets. False: this backend cannot (Test must be polled).
  virtual bool SleepOnFds() { return false; }
  // Appends the sockets to poll() for, with their events (after SleepOnFds).
  virtual bool PollFds(std::vector<struct pollfd>* fds) {
    (void)fds;
    return false;
  }
  // After that poll(): moves what the ready sockets among `fds` take or hold.
  virtual void PumpFds(const std::vector<struct pollfd>& fds) { (void)fds; }
};

// The TCP backend (net_socket.cc). `session` and `process` as the socket transport's handshake
// takes them (socket_listen.h: ClientHandshake); `threads` helper threads move the connections'
// bytes (0: the caller's Test does); `streams` > 0: the channels between two ranks share that
// many TCP streams (channel c on stream c % streams; 0: a stream per channel).
std::unique_ptr<Net> MakeSocketNet(std::string session, int process, int threads, int streams);

// What MakeNet builds.
struct NetOptions {
  std::string backend = "auto";  // JAX_RCCL_NET: auto, socket or ucx
  std::string session;           // as MakeSocketNet's
  int process = 0;
  int threads = 0;    // TCP helper threads (MakeSocketNet's; auto's connections on TCP too)
  int streams = 0;    // TCP streams per pair of ranks (MakeSocketNet's; `socket` only)
  bool info = false;  // JAX_RCCL_DEBUG=INFO: a line per connection on stderr saying its backend
  // The caller sleeps on the network's descriptors between rounds (SleepOnFds): UCX then asks for
  // its wake-up event descriptor (a `ucx` network's SleepOnFds; `auto` keeps short sleeps).
  bool sleeps = false;
};

// The network JAX_RCCL_NET names: `socket` MakeSocketNet's; `ucx` UCX's (an error when this build
// has no UCX backend or UCX cannot be loaded); `auto` UCX per connection where it offers a
// transport faster than TCP between the two ends, else our TCP (also when UCX cannot be loaded
// here, or at the peer).
StatusOr<std::unique_ptr<Net>> MakeNet(const NetOptions& options);

// This build's UCX backend (UcxInfo(true) loads UCX when it is not yet).
struct UcxInfo {
  bool built = false;   // compiled with UCX's headers
  bool loaded = false;  // libucp loaded in this process
  std::string version, path;
  std::string memoryTypes;  // what UCX can move: "host", "host, cuda", ...
  std::string error;        // why it is not built or not loaded
};
UcxInfo DescribeUcx(bool load);
// Test hook: the library the UCX backend loads (empty: libucp.so.0); a name that does not exist
// makes a process where UCX cannot be loaded.
void SetUcxLibrary(const std::string& name);

}  // namespace comm
}  // namespace jax_rccl
