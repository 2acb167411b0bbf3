// The network proxy: the thread that carries a GPU communicator's FIFO steps between hosts
// (NCCL's proxy thread, src/proxy.cc, with its net transport's send and receive progress,
// src/transport/net.cc).
//
// The kernel of a rank talks to a rank of another host through FIFOs the proxy serves, laid out
// as any connection (tail: steps filled; head: steps consumed; kSteps slots per protocol):
//   send side   the kernel fills the connection's slots in memory the host can read (host-pinned
//               and mapped into the device), writes the step's protocol and size into the slot's
//               info word, then posts `tail`. The proxy ships each filled step through the network
//               interface (net.h) and, once the interface no longer needs the slot, posts `head`
//               for the kernel, which may then fill the slot again;
//   recv side   the proxy receives each step (into a staging buffer of its own), waits until the
//               receiving kernel has freed the step's slot (`head`), writes the step into it and
//               posts `tail`. The receiving kernel waits for `tail` whatever the protocol: a
//               copy does not write an LL or LL128 line's flag after its data, so the flags
//               that a kernel-to-kernel connection relies on say nothing here.
// Steps of every protocol share the connection's counters; a step's protocol and size travel
// with it (the message's info word), so the proxy needs no plan: it follows the counters alone,
// and a graph that replays a launch is served like the launch itself. The plan's proxy ops
// (planner.h: ProxyOp) say which connections cross hosts and how many steps each launch moves
// over them; the proxy moves exactly what the kernels post.
//
// Faults: a connection that fails (the peer's process exited or its proxy failed, a malformed
// message, counters out of step) or a step the peer does not take within the timeout (its process
// is stopped) fails the proxy with a message naming the rank; the communicator's failure callback
// runs once, every connection is reset so the peers fail at once naming this rank, and the kernels
// waiting on the proxy's counters stop with their own timeout or abort. Stop closes in order only
// connections whose posted steps are all out (the receivers then know nothing more comes).
//
// Memory: the proxy reads the send side and the receivers' `head` directly (host-visible memory);
// it writes slots and counters through ProxyMemory, so that a receive FIFO may live in device
// memory (the GPU runtime copies into it) or in host memory (HostProxyMemory).
#pragma once

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

// A step's info word: its protocol and its bytes (the slot's bytes the kernel wrote, flags
// included).
inline uint64_t ProxyStepInfo(int protocol, uint64_t bytes) {
  return (uint64_t(protocol) << kProxyInfoShift) | bytes;
}
inline int ProxyStepProtocol(uint64_t info) {
  return int(info >> kProxyInfoShift);
}
inline uint64_t ProxyStepBytes(uint64_t info) {
  return info & ((uint64_t(1) << kProxyInfoShift) - 1);
}

// One direction of a connection as the proxy sees it. `slots[p]`: slot 0 of protocol p, whose
// kSteps slots of `stepBytes[p]` follow one another.
struct ProxyFifo {
  uint64_t* tail = nullptr;
  uint64_t* head = nullptr;
  uint64_t* info = nullptr;  // send side: kSteps info words, one per slot (written before tail)
  char* slots[kProxyProtocols] = {nullptr, nullptr, nullptr};
  int64_t stepBytes[kProxyProtocols] = {0, 0, 0};
};

// One connection between a local rank and a rank on another host, on one channel.
struct ProxyConnection {
  int channel = 0;
  int local = 0;
  int remote = 0;
  bool send = false;  // local -> remote (else remote -> local)
  ProxyFifo fifo;
};

// How the proxy writes a receiving FIFO: the data of a step, then the counter that publishes it
// (a reader that sees the counter sees the data; Write may only start the copy, whose source stays
// untouched until the Post after it returns).
class ProxyMemory {
 public:
  virtual ~ProxyMemory() = default;
  virtual Status Write(char* dst, const char* src, size_t bytes) = 0;
  virtual Status Post(uint64_t* counter, uint64_t value) = 0;
  // The buffers the proxy receives steps into before it writes them (page-locked for a device).
  virtual StatusOr<char*> AllocStaging(size_t bytes) = 0;
  virtual void FreeStaging(char* p) = 0;
  // A counter the proxy posts (Post), read when it connects: the FIFOs persist across launches.
  virtual StatusOr<uint64_t> Read(const uint64_t* counter) = 0;
};
// Host memory: memcpy, then a release store.
ProxyMemory* HostProxyMemory();

class NetProxy {
 public:
  // `endpoints[r]`: the "host:port" of rank r's process; `rankString` names a rank in messages;
  // `onFailure` runs once, on the proxy's thread, when the proxy fails.
  NetProxy(std::unique_ptr<Net> net, ProxyMemory* memory, uint64_t group,
           std::vector<ProxyConnection> connections, std::vector<std::string> endpoints,
           std::function<std::string(int)> rankString, double timeoutSeconds,
           std::function<void(const std::string&)> onFailure = nullptr);
  ~NetProxy();
  NetProxy(const NetProxy&) = delete;
  NetProxy& operator=(const NetProxy&) = delete;

  // Opens both ends of every connection (until `deadline`) and starts the thread. On an error the
  // proxy is failed and the connections made so far are reset.
  Status Connect(Clock::time_point deadline);
  // Whether the proxy failed; *reason says why.
  bool Failed(std::string* reason) const;
  // Fails the proxy from outside (its communicator failed): every connection is reset, so the
  // peers fail at once naming this rank. onFailure runs as for a failure of the proxy's own.
  void Abort(const std::string& reason) { Fail(reason); }
  // Stops the thread and closes the connections.
  void Stop();

  // Steps each connection moved (in the order given), for tests and statistics.
  std::vector<uint64_t> StepsMoved() const;
  int64_t bytesMoved() const { return bytesMoved_.load(); }

 private:
  struct Link;
  Status Open(Clock::time_point deadline);  // both ends of every connection
  void Loop();
  bool ProgressSend(Link& link, Clock::time_point now);
  bool ProgressRecv(Link& link);
  bool FailLink(const Link& link, const std::string& what);
  void Fail(const std::string& reason);

  std::unique_ptr<Net> net_;
  ProxyMemory* mem_;
  uint64_t group_;
  std::vector<std::string> endpoints_;
  std::function<std::string(int)> rankString_;
  double timeout_;
  std::function<void(const std::string&)> onFailure_;
  std::vector<std::unique_ptr<Link>> links_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string reason_;
  std::atomic<int64_t> bytesMoved_{0};
};

}  // namespace comm
}  // namespace jax_rccl
