// The network proxy: the thread that carries a GPU communicator's FIFO steps between hosts
// (NCCL's proxy thread, src/proxy.cc, with its net transport's send and receive progress,
// src/transport/net.cc).
//
// The kernel of a rank talks to a rank of another host through FIFOs in host memory that the
// device maps (hip/device_conn.h: ProxyWindowLayout), which the proxy serves (tail: steps filled;
// head: steps consumed; kSteps slots, each holding a step of any protocol):
//   send side   the kernel fills a slot, writes the step's protocol and size into the slot's info
//               word, then posts `tail`. The proxy ships each filled step through the network
//               interface (net.h) and, once the interface no longer needs the slot, posts `head`
//               for the kernel, which may then fill the slot again;
//   recv side   the proxy posts a receive into each slot the receiving kernel has freed (`head`)
//               and, once the step is in, posts `tail`. The receiving kernel waits for `tail`
//               whatever the protocol: the network does not write an LL or LL128 line's flag after
//               its data, so the flags that a kernel-to-kernel connection relies on say nothing
//               here.
// Steps of every protocol share the connection's counters and slots; a step's protocol and size
// travel with it (the message's info word), so the proxy needs no plan: it follows the counters
// alone, and a graph that replays a launch is served like the launch itself. The plan's proxy ops
// (planner.h: ProxyOp) say which connections cross hosts and how many steps each launch moves
// over them; the proxy moves exactly what the kernels post.
//
// Timeline: with a trace folder (TraceTo, JAX_RCCL_NET_TRACE), the proxy records per step of each
// connection when it saw the kernel post it, posted it to the network and the network took it
// (sending), and when it posted the receive, the step landed and the kernel freed its slot
// (receiving), keeping the last kTraceEvents events, and writes them when it stops
// (benchmarks/net_trace.py reads them).
//
// Faults: a connection that fails (the peer's process exited or its proxy failed, a malformed
// message, counters out of step) or a step the peer does not take within the timeout (its process
// is stopped) fails the proxy with a message naming the rank; the communicator's failure callback
// runs once, every connection is reset so the peers fail at once naming this rank, and the kernels
// waiting on the proxy's counters stop with their own timeout or abort. Stop closes in order only
// connections whose posted steps are all out (the receivers then know nothing more comes).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ffi/comm/net.h"
#include "ffi/planner/work.h"

namespace jax_rccl {
namespace comm {

constexpr int kProxyProtocols = 3;  // LL, LL128, Simple (Proto's values)

// A step's info word: its protocol, its call's tag (hip/kernel_check.h: the receiving kernel
// compares it with its own call's; the proxy only carries it) and its bytes (the slot's bytes the
// kernel wrote, flags included).
inline uint64_t ProxyStepInfo(int protocol, uint64_t bytes) {
  return (uint64_t(protocol) << kProxyInfoShift) | bytes;
}
inline int ProxyStepProtocol(uint64_t info) {
  return int(info >> kProxyInfoShift);
}
inline uint64_t ProxyStepBytes(uint64_t info) {
  return info & ((uint64_t(1) << kProxyTagShift) - 1);
}

// One direction of a connection as the proxy sees it: kSteps slots of `slotBytes` from `slots`.
struct ProxyFifo {
  uint64_t* tail = nullptr;
  uint64_t* head = nullptr;
  // kSteps info words, one per slot: send side, the kernel's (written before tail); receive side
  // (optional), the proxy writes each received step's before it posts tail.
  uint64_t* info = nullptr;
  char* slots = nullptr;
  int64_t slotBytes = 0;
  // Optional: kSteps tags of kProxyTagBytes, one per slot, that travel with the steps (NetInfo's
  // tag: the CPU runtime's StepTag): send side, read when the step goes; receive side, written
  // before tail.
  char* tags = nullptr;
};
constexpr size_t kProxyTagBytes = sizeof(NetInfo::tag);

// One connection between a local rank and a rank on another host, on one channel.
struct ProxyConnection {
  int channel = 0;
  int local = 0;
  int remote = 0;
  bool send = false;  // local -> remote (else remote -> local)
  ProxyFifo fifo;
};

// What a communicator whose ranks are host threads adds to its proxy (the CPU runtime:
// ffi/cpu/net_links.h). Every member is optional.
struct ProxyHooks {
  // After the proxy posts a connection's head (send side: a slot is free again) or tail (receive
  // side: a step landed): wakes local rank `local`.
  std::function<void(int local)> ring;
  // Before a step that landed is posted (tail), after its info and tag are in place: a text fails
  // the proxy with it (a step of another call than the one the local rank runs).
  std::function<std::string(const ProxyConnection& c, uint64_t step, const NetInfo& info)> check;
  // An eventfd the idle proxy sleeps on instead of short sleeps: `arm(true)` before it sleeps (the
  // local ranks write the fd when they post while armed), `arm(false)` after. The network writes
  // it too where it can (Net::SetProgressFd); else the sleeps stay short.
  int wakeFd = -1;
  std::function<void(bool)> arm;
};

class NetProxy {
 public:
  // `endpoints[r]`: the "host:port" of rank r's process; `rankString` names a rank in messages;
  // `onFailure` runs once, on the proxy's thread, when the proxy fails.
  NetProxy(std::unique_ptr<Net> net, uint64_t group, std::vector<ProxyConnection> connections,
           std::vector<std::string> endpoints, std::function<std::string(int)> rankString,
           double timeoutSeconds, std::function<void(const std::string&)> onFailure = nullptr);
  ~NetProxy();
  NetProxy(const NetProxy&) = delete;
  NetProxy& operator=(const NetProxy&) = delete;

  // Before Connect: the hooks of a communicator whose ranks are host threads.
  void SetHooks(ProxyHooks hooks);
  // Opens both ends of every connection (until `deadline`) and starts the thread. On an error the
  // proxy is failed and the connections made so far are reset.
  Status Connect(Clock::time_point deadline);
  // Whether the proxy failed; *reason says why.
  bool Failed(std::string* reason) const;
  // The remote rank of the connection whose failure failed the proxy (-1: none, or another cause).
  int FailedRemote() const { return failedRemote_.load(); }
  // Fails the proxy from outside (its communicator failed): every connection is reset, so the
  // peers fail at once naming this rank. onFailure runs as for a failure of the proxy's own.
  void Abort(const std::string& reason) { Fail(reason); }
  // Stops the thread once every step the kernels posted is out (within the timeout, at most 10 s)
  // and closes the connections: in order where every step is out, else reset.
  void Stop();

  // Steps each connection moved (in the order given), for tests and statistics.
  std::vector<uint64_t> StepsMoved() const;
  // How each connection moves its bytes (NetComm::Transport; in the order given), once connected.
  std::vector<std::string> Transports() const;
  // Before Connect: record a timeline of the steps, the last `events` of it written into folder
  // `dir` when the proxy stops (see the top of the file); empty: none.
  void TraceTo(std::string dir, size_t events = kTraceEvents) {
    traceDir_ = std::move(dir);
    traceCap_ = std::max<size_t>(1, events);
  }
  // The timeline's events: when (steady clock, ns), the connection (its index), what, the step.
  enum TraceKind : uint8_t {
    kPosted = 0,      // sending: the kernel's step seen (its tail)
    kSendPosted = 1,  // sending: handed to the network (Isend)
    kSendDone = 2,    // sending: the network took it (head posted)
    kRecvPosted = 3,  // receiving: a receive posted into the freed slot (Irecv)
    kLanded = 4,      // receiving: the step is in (tail posted)
    kFreed = 5,       // receiving: the kernel consumed it (its head)
  };
  struct TraceEvent {
    int64_t ns;
    uint32_t link;
    uint32_t kind;
    uint64_t step;
  };
  static constexpr size_t kTraceEvents = size_t(1) << 20;
  int64_t bytesMoved() const { return bytesMoved_.load(); }

 private:
  struct Link;
  Status Open(Clock::time_point deadline);  // both ends of every connection
  Status Register(Link& link);              // its slots with the network (RegMr)
  void Release(Link& link);                 // its registration, then its end
  void Loop();
  // Idle: sleeps on the hooks' wakeFd until a rank or the network writes it (or a while passes).
  void WaitIdle(int idle);
  bool ProgressSend(Link& link, Clock::time_point now);
  bool ProgressRecv(Link& link);
  bool FailLink(const Link& link, const std::string& what);
  // Counts `ns` against link's state as it stood (runtime_stats: where the time went).
  void Account(const Link& link, int64_t ns);
  // Adds what the thread counted to the process's runtime counters (ffi/core/stats.h).
  void FlushStats();
  // Every step the kernels posted on the sending links is out (tested done).
  bool SendsDrained() const;
  void Fail(const std::string& reason);
  void Trace(const Link& link, TraceKind kind, uint64_t step);
  // Writes the timeline (after the thread ended); a failure to write is logged, not raised.
  void WriteTrace();

  std::unique_ptr<Net> net_;
  uint64_t group_;
  std::vector<std::string> endpoints_;
  std::function<std::string(int)> rankString_;
  double timeout_;
  std::function<void(const std::string&)> onFailure_;
  ProxyHooks hooks_;
  bool netWakes_ = false;               // the network writes hooks_.wakeFd on progress
  bool netPolls_ = false;               // the network's sockets can be polled (PollFds) instead
  std::vector<struct pollfd> pollFds_;  // WaitIdle's
  std::vector<std::unique_ptr<Link>> links_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  Clock::time_point drainUntil_;  // written before stop_
  static constexpr double kStopDrainSeconds = 10.0;
  std::atomic<bool> failed_{false};
  std::atomic<int> failedRemote_{-1};
  mutable std::mutex mu_;
  std::string reason_;
  std::atomic<int64_t> bytesMoved_{0};
  std::string traceDir_;
  size_t traceCap_ = kTraceEvents;
  std::vector<TraceEvent> trace_;  // a ring of traceCap_ once full (the thread's)
  uint64_t traced_ = 0;            // events recorded
  // Counted by the thread alone, flushed into the runtime counters every poll and at its end
  // (ffi/core/stats.h: the net_* counters).
  int64_t sent_ = 0, received_ = 0;
  int64_t sendNs_ = 0, sendFull_ = 0, sendIdle_ = 0, recvNs_ = 0, recvFull_ = 0, recvIdle_ = 0;
};

}  // namespace comm
}  // namespace jax_rccl
