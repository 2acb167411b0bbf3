// The TCP backend of the network interface (net.h).
//
// A connection is one TCP stream from the sender's process to the receiver's, opened by the
// sender through the socket transport's listener and its authenticated handshake (the key names
// the group, channel | kNetChannelFlag, sender and receiver, so it never meets the host
// executor's links). A message is a 24-byte header (magic, bytes, info) and its bytes. Requests
// progress in order: non-blocking writes of the oldest unfinished send, or reads into the oldest
// posted receive. Helper threads move the bytes (NCCL's socket transport, NCCL_SOCKET_NTHREADS):
// each connection belongs to one of the network's helpers (JAX_RCCL_NET_THREADS, round robin),
// which polls the sockets of its connections with requests pending (and an eventfd that a new
// request rings) and pumps those that are ready; the proxy's Test then only looks, and never waits
// for a copy in progress (a connection's socket calls run under a lock of their own, not the one
// its posts and tests take: with one lock, the proxy's single thread stalled on every busy
// connection in turn, and the steps of all the others waited with it). Without helpers, Test
// pumps. A sending end that closes in order sends a close header after its messages: its
// receiver then knows nothing more comes (receives posted ahead stay pending, no error). A stream
// that ends without one (the sender's process died) or is reset (Abort, or an end destroyed without
// closing in order) is an error naming the sender.
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ffi/comm/net.h"

namespace jax_rccl {
namespace comm {
namespace {

constexpr uint32_t kNetMagic = 0x6a726e31u;  // "jrn1"
constexpr uint32_t kNetClose = 0x6a726e30u;  // "jrn0": the sender closes its end in order
// Marks a network connection's channel in the handshake's key (the host executor's socket links
// use channels below it).
constexpr int kNetChannelFlag = 1 << 24;

struct MessageHeader {
  uint32_t magic;
  uint32_t pad;
  uint64_t bytes;
  uint64_t info;
};
static_assert(sizeof(MessageHeader) == 24, "message header");

LinkKey KeyOf(const NetKey& k) {
  return LinkKey(k.group, k.channel | kNetChannelFlag, k.from, k.to);
}

struct SocketRequest final : NetRequest {
  char* data = nullptr;
  size_t bytes = 0;  // sends: the message's bytes; receives: the posted buffer's
  MessageHeader header{};
  size_t done = 0;  // header and payload bytes moved so far
  bool complete = false;
};

class SocketComm;

// A thread that moves the bytes of its connections (see the top of the file).
class Helper {
 public:
  Helper() : wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    thread_ = std::thread([this]() { Loop(); });
  }
  ~Helper() {
    stop_.store(true);
    Wake();
    thread_.join();
    if (wake_ >= 0) close(wake_);
  }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;
  void Add(SocketComm* c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
  }
  // Once it returns, the helper no longer touches `c`.
  void Remove(SocketComm* c) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < comms_.size(); ++i) {
      if (comms_[i] != c) continue;
      comms_.erase(comms_.begin() + long(i));
      break;
    }
  }
  void Wake() {
    const uint64_t one = 1;
    if (wake_ >= 0) (void)!write(wake_, &one, sizeof(one));
  }

 private:
  void Loop();

  int wake_;
  std::mutex mu_;  // guards comms_; held while the helper pumps them
  std::vector<SocketComm*> comms_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class SocketComm final : public NetComm {
 public:
  SocketComm(int fd, bool send, std::string peer, std::shared_ptr<Helper> helper)
      : fd_(fd), send_(send), peer_(std::move(peer)), helper_(std::move(helper)) {
    if (helper_ != nullptr) helper_->Add(this);
  }
  // Not closed in order: the peer sees the connection reset (an error naming this end).
  ~SocketComm() override {
    if (helper_ != nullptr) helper_->Remove(this);
    Abort();
  }

  // What the helper polls this connection's socket for (0: nothing pending), and the socket.
  short Wants(int* fd) {
    std::lock_guard<std::mutex> lock(mu_);
    *fd = fd_;
    if (fd_ < 0 || !failed_.ok() || closed_) return 0;
    for (const auto& r : queue_) {
      if (!r->complete) return send_ ? POLLOUT : POLLIN;
    }
    return 0;
  }
  // The helper's turn once poll() said the socket is ready (or Test's, without helpers): moves
  // what the socket takes or holds. The socket calls run under io_ only, so the proxy's posts and
  // tests (mu_) never wait for a copy in progress.
  void Pump() {
    std::lock_guard<std::mutex> io(io_);
    Status s = send_ ? PumpSend() : PumpRecv();
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.ok()) failed_ = s;
    }
  }

  bool CloseInOrder() override {
    std::lock_guard<std::mutex> io(io_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fd_ < 0) return true;
      if (!send_) {
        close(fd_);
        fd_ = -1;
        return true;
      }
    }
    Status pumped = PumpSend();
    std::lock_guard<std::mutex> lock(mu_);
    if (!pumped.ok() && failed_.ok()) failed_ = pumped;
    if (!failed_.ok()) {
      ResetLocked();  // a failed end cannot close in order: the peer sees it reset
      return true;
    }
    for (const auto& r : queue_) {
      if (!r->complete) return false;
    }
    const MessageHeader h{kNetClose, 0, 0, 0};
    while (closeSent_ < sizeof(h)) {
      const ssize_t w = send(fd_, reinterpret_cast<const char*>(&h) + closeSent_,
                             sizeof(h) - closeSent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w <= 0) return false;
      closeSent_ += size_t(w);
    }
    close(fd_);
    fd_ = -1;
    return true;
  }

  Status Poll() override {
    // A pump in progress sees any failure itself (and a peek beside it could take the stream's
    // end for a failure just before the pump records the close header it read).
    std::unique_lock<std::mutex> io(io_, std::try_to_lock);
    if (!io.owns_lock()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
    if (fd_ < 0 || closed_) return Status::Ok();
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      failed_ = Status(Code::kSystem,
                       detail::StrCat("jax_rccl: ", peer_, " reset its network connection (",
                                      ErrnoText(errno), "; its proxy failed or its process died)"));
      return failed_;
    }
    if (n == 0 && !send_) {
      // The stream ended and nothing of it is left to read, yet no close header came.
      failed_ = Status(Code::kSystem, detail::StrCat("jax_rccl: ", peer_,
                                                     " closed its network connection without "
                                                     "closing it in order (its process exited or "
                                                     "failed)"));
      return failed_;
    }
    // Data waiting, nothing yet, or (a sending end) the receiver closed its end.
    return Status::Ok();
  }

  void Abort() override {
    std::lock_guard<std::mutex> io(io_);
    std::lock_guard<std::mutex> lock(mu_);
    ResetLocked();
  }

  StatusOr<NetMemory*> RegMr(void*, size_t, NetMemoryType) override {
    return static_cast<NetMemory*>(nullptr);
  }
  Status DeregMr(NetMemory*) override { return Status::Ok(); }

  Status Isend(const void* data, size_t bytes, uint64_t info, NetMemory*,
               NetRequest** request) override {
    JR_REQUIRE(send_, Code::kInternal, "jax_rccl: isend on the receiving end of a connection");
    return Post(const_cast<char*>(static_cast<const char*>(data)), bytes, info, request);
  }
  Status Irecv(void* data, size_t bytes, NetMemory*, NetRequest** request) override {
    JR_REQUIRE(!send_, Code::kInternal, "jax_rccl: irecv on the sending end of a connection");
    return Post(static_cast<char*>(data), bytes, 0, request);
  }

  Status Test(NetRequest* request, bool* done, size_t* bytes, uint64_t* info) override {
    if (helper_ == nullptr) Pump();
    std::lock_guard<std::mutex> lock(mu_);
    *done = false;
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->get() != request) continue;
      // What completed before a failure is still reported.
      if (!(*it)->complete) {
        JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
        return Status::Ok();
      }
      *done = true;
      if (bytes != nullptr) *bytes = send_ ? (*it)->bytes : size_t((*it)->header.bytes);
      if (info != nullptr) *info = (*it)->header.info;
      queue_.erase(it);
      return Status::Ok();
    }
    JR_FAIL(Code::kInternal, "jax_rccl: test of a request its connection does not hold");
  }

 private:
  // Closes the socket so that the peer sees it reset (an error naming this end). io_ and mu_ held.
  void ResetLocked() {
    if (fd_ < 0) return;
    const struct linger reset = {1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    close(fd_);
    fd_ = -1;
  }

  Status Post(char* data, size_t bytes, uint64_t info, NetRequest** request) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      *request = nullptr;
      JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
      if (int(queue_.size()) >= kMaxRequests) return Status::Ok();
      auto r = std::make_unique<SocketRequest>();
      r->data = data;
      r->bytes = bytes;
      r->header = MessageHeader{kNetMagic, 0, uint64_t(bytes), info};
      *request = r.get();
      queue_.push_back(std::move(r));
    }
    if (helper_ != nullptr) helper_->Wake();
    return Status::Ok();
  }

  // The oldest request not complete (null: none, or the connection is failed, closed or gone);
  // only the thread holding io_ moves its bytes, so it stays valid after mu_ is released.
  SocketRequest* Pending() {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0 || !failed_.ok() || closed_) return nullptr;
    for (auto& r : queue_) {
      if (!r->complete) return r.get();
    }
    return nullptr;
  }

  // Bytes `n` of request r moved (complete: all of them). io_ held.
  void Moved(SocketRequest* r, size_t n, bool complete) {
    std::lock_guard<std::mutex> lock(mu_);
    r->done += n;
    bytesMoved_ += uint64_t(n);
    r->complete = complete;
  }

  // Writes as much of the unfinished sends, oldest first, as the socket takes. io_ held.
  Status PumpSend() {
    while (SocketRequest* r = Pending()) {
      const size_t total = sizeof(MessageHeader) + r->bytes;
      struct iovec iov[2];
      int n = 0;
      if (r->done < sizeof(MessageHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&r->header) + r->done, sizeof(MessageHeader) - r->done};
        if (r->bytes > 0) iov[n++] = {r->data, r->bytes};
      } else {
        iov[n++] = {r->data + (r->done - sizeof(MessageHeader)), total - r->done};
      }
      struct msghdr msg;
      std::memset(&msg, 0, sizeof(msg));
      msg.msg_iov = iov;
      msg.msg_iovlen = size_t(n);
      const ssize_t w = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
        JR_FAIL(Code::kSystem, "jax_rccl: the network connection to ", peer_,
                " failed: ", ErrnoText(errno), " (did its process exit?)");
      }
      Moved(r, size_t(w), r->done + size_t(w) == total);
    }
    return Status::Ok();
  }

  // Reads into the posted receives, oldest first, as far as data has arrived. io_ held.
  Status PumpRecv() {
    while (SocketRequest* r = Pending()) {
      char* dst;
      size_t want;
      if (r->done < sizeof(MessageHeader)) {
        dst = reinterpret_cast<char*>(&r->header) + r->done;
        want = sizeof(MessageHeader) - r->done;
      } else {
        const size_t got = r->done - sizeof(MessageHeader);
        dst = r->data + got;
        want = size_t(r->header.bytes) - got;
      }
      size_t n = 0;
      if (want > 0) {
        const ssize_t got = recv(fd_, dst, want, MSG_DONTWAIT);
        if (got == 0) {
          JR_FAIL(Code::kSystem, "jax_rccl: ", peer_,
                  " closed its network connection without closing it in order (its process "
                  "exited or failed)");
        }
        if (got < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
          JR_FAIL(Code::kSystem, "jax_rccl: the network connection from ", peer_,
                  " failed: ", ErrnoText(errno), " (did its process exit?)");
        }
        n = size_t(got);
      }
      const size_t done = r->done + n;
      if (done == sizeof(MessageHeader) && r->done < done) {
        if (r->header.magic == kNetClose) {
          // Nothing more comes; the receives posted ahead stay pending.
          std::lock_guard<std::mutex> lock(mu_);
          bytesMoved_ += uint64_t(n);
          closed_ = true;
          return Status::Ok();
        }
        JR_REQUIRE(r->header.magic == kNetMagic, Code::kSystem, "jax_rccl: ", peer_,
                   " sent a malformed message on its network connection");
        JR_REQUIRE(r->header.bytes <= r->bytes, Code::kInternal, "jax_rccl: ", peer_, " sent ",
                   r->header.bytes, " bytes into a receive of ", r->bytes,
                   " (the two ends disagree on the step size)");
      }
      Moved(
          r, n,
          done >= sizeof(MessageHeader) && done == sizeof(MessageHeader) + size_t(r->header.bytes));
    }
    return Status::Ok();
  }

  // io_: held by the thread moving bytes (the socket calls, a request's `done` before it is
  // complete) and by whoever closes the socket; taken before mu_. mu_: guards what follows (the
  // proxy posts, tests and polls under it alone).
  std::mutex io_;
  std::mutex mu_;
  int fd_;
  bool send_;
  std::string peer_;
  std::shared_ptr<Helper> helper_;  // null: Test pumps
  std::deque<std::unique_ptr<SocketRequest>> queue_;
  Status failed_;
  bool closed_ = false;   // receiving end: the sender closed in order
  size_t closeSent_ = 0;  // sending end: bytes of the close header written
};

void Helper::Loop() {
  // One poll() over the sockets with requests pending and the eventfd a new request rings, then a
  // pump of each socket that is ready: no read or write is tried on a socket that is not.
  std::vector<pollfd> fds;
  std::vector<SocketComm*> who;
  while (!stop_.load()) {
    fds.assign(1, pollfd{wake_, POLLIN, 0});
    who.assign(1, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (SocketComm* c : comms_) {
        int fd = -1;
        const short events = c->Wants(&fd);
        if (events == 0) continue;
        fds.push_back(pollfd{fd, events, 0});
        who.push_back(c);
      }
    }
    if (poll(fds.data(), nfds_t(fds.size()), 100) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_, &v, sizeof(v));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      // Removed while this thread polled: no longer this helper's to touch.
      if (std::find(comms_.begin(), comms_.end(), who[i]) == comms_.end()) continue;
      who[i]->Pump();
    }
  }
}

class SocketNet final : public Net {
 public:
  SocketNet(std::string session, int process, int threads)
      : session_(std::move(session)), process_(process), threads_(threads) {}
  const char* name() const override { return "socket"; }

  Status Listen(const NetKey&) override {
    JR_REQUIRE(SocketListenerPort() > 0, Code::kInvalidUsage,
               "jax_rccl: this process carries network connections but has no socket listener "
               "(the bootstrap starts it when the run needs sockets: _jax_rccl.socket_listen)");
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<NetComm>> Connect(const NetKey& key, const std::string& endpoint,
                                             Clock::time_point deadline,
                                             const std::string& peer) override {
    JR_ASSIGN_OR_RETURN(
        int fd, DialListener(endpoint, KeyOf(key), process_, session_, deadline, nullptr, peer));
    return Finish(fd, true, peer);
  }

  StatusOr<std::unique_ptr<NetComm>> Accept(const NetKey& key, Clock::time_point deadline,
                                            const std::string& peer) override {
    JR_CHECK(Listen(key));
    const int fd = AcceptFor(KeyOf(key), deadline, nullptr);
    JR_REQUIRE(fd >= 0, Code::kTimeout, "no network connection from ", peer, " for channel ",
               key.channel, " (did its process reach this group?)");
    return Finish(fd, false, peer);
  }

 private:
  StatusOr<std::unique_ptr<NetComm>> Finish(int fd, bool send, const std::string& peer) {
    Status ready = PrepareStream(fd);
    if (!ready.ok()) close(fd);
    JR_CHECK(ready);
    std::shared_ptr<Helper> helper;
    if (threads_ > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (helpers_.empty()) {
        for (int t = 0; t < threads_; ++t) helpers_.push_back(std::make_shared<Helper>());
      }
      helper = helpers_[next_++ % helpers_.size()];
    }
    return std::unique_ptr<NetComm>(std::make_unique<SocketComm>(fd, send, peer, helper));
  }

  std::string session_;
  int process_;
  int threads_;
  std::mutex mu_;  // guards helpers_, next_
  std::vector<std::shared_ptr<Helper>> helpers_;
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<Net> MakeSocketNet(std::string session, int process, int threads) {
  return std::make_unique<SocketNet>(std::move(session), process, threads);
}

}  // namespace comm
}  // namespace jax_rccl
