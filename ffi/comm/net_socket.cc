// The TCP backend of the network interface (net.h).
//
// Streams and channels. A connection (NetComm) is one channel's end; its messages travel on a TCP
// stream from the sender's process to the receiver's, opened by the sender through the socket
// transport's listener and its authenticated handshake (the key names the group, the stream, the
// sender and the receiver, with a flag that keeps it apart from the host executor's links). With
// `streams` S > 0, the channels c of a pair of ranks share S streams (stream c % S), so fewer
// sockets carry the same channels (NCCL's socket transport goes the other way: several sockets
// per connection); with S = 0 every channel has a stream of its own.
//
// Credits. A sender writes a channel's message only into a receive its receiver posted: every
// receive posted sends the sender a credit back on the same stream (the receiving end writes,
// the sending end reads), and a message takes one. So no message ever waits in a stream for a
// receive: a channel whose receiver does not consume cannot hold the other channels of its stream
// behind it, and around a ring of hosts the streams cannot close into a cycle of full buffers.
//
// Framing: a 24-byte header (magic, channel, bytes, info) and, for a message, its bytes. Magics:
// a message; a credit (`bytes`: receives posted); a channel's close (its sender closed it in
// order: nothing more comes on it, and receives posted ahead stay pending without an error); the
// close's acknowledgement (the receiver sends nothing more on that channel). A sending end closes
// its socket only once every channel on it is acknowledged, so the socket never closes over
// unread bytes (which resets it and may drop what the peer has not read).
// Requests of a channel progress in order; the messages of a stream's channels go out round
// robin, one whole message at a time.
//
// Helper threads move the bytes (NCCL's socket transport, NCCL_SOCKET_NTHREADS): each stream
// belongs to one of the network's helpers (JAX_RCCL_NET_THREADS, round robin), which polls its
// streams' sockets (and an eventfd that a new request rings) and pumps those that are ready; the
// proxy's Test then only looks, and never waits for a copy in progress (a stream's socket calls
// run under a lock of their own, not the one its posts and tests take: with one lock, the proxy's
// single thread stalled on every busy connection in turn). Without helpers, Test pumps.
//
// Faults: a stream that ends without every channel closed in order (the sender's process died),
// or is reset (Abort of any of its channels, or a channel's end destroyed without closing in
// order), fails every channel on it with an error naming the peer; so does a malformed header, a
// message for a channel without a posted receive, or a message larger than that receive.
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ffi/comm/net.h"

namespace jax_rccl {
namespace comm {
namespace {

constexpr uint32_t kNetMagic = 0x6a726e31u;     // "jrn1": a message
constexpr uint32_t kNetClose = 0x6a726e30u;     // "jrn0": the sender closes the channel in order
constexpr uint32_t kNetCredit = 0x6a726e32u;    // "jrn2": the receiver posted `bytes` receives
constexpr uint32_t kNetCloseAck = 0x6a726e33u;  // "jrn3": the receiver read the channel's close
// Marks a network stream in the handshake's key (the host executor's socket links use channels
// below it); kNetStreamFlag marks a stream shared by channels (its index below it).
constexpr int kNetChannelFlag = 1 << 24;
constexpr int kNetStreamFlag = 1 << 23;
// Channels below this share streams when the network has S > 0 (others, such as the GPU
// communicator's record exchange, keep a stream of their own).
constexpr int kSharedChannels = 1 << 16;

struct MessageHeader {
  uint32_t magic;
  uint32_t channel;
  uint64_t bytes;
  uint64_t info;
};
static_assert(sizeof(MessageHeader) == 24, "message header");

struct SocketRequest final : NetRequest {
  char* data = nullptr;
  size_t bytes = 0;  // sends: the message's bytes; receives: the posted buffer's
  MessageHeader header{};
  bool complete = false;
};

// One channel's end on a stream. Under its stream's mu_; never erased before the stream goes.
struct Lane {
  int channel = 0;
  std::deque<std::unique_ptr<SocketRequest>> queue;
  // Sending end: receives the peer posted that no message took yet. Receiving end: receives
  // posted and not yet announced to the sender.
  uint64_t credits = 0;
  uint64_t inFlight = 0;    // receiving end: credits announced that no message has taken yet
  bool closing = false;     // sending end: its close header is wanted once its messages are out
  bool closed = false;      // sending end: close header written; receiving end: close header read
  bool acked = false;       // sending end: the receiver read the close header (and sends no more)
  bool ackPending = false;  // receiving end: the close header's acknowledgement is not written
  bool attached = false;    // its NetComm holds it
  bool detached = false;    // its NetComm let it go (a lane neither is one a peer's frame named
                            // before this end opened the channel: its credits or close wait here)
  std::atomic<uint64_t>* moved = nullptr;  // its NetComm's byte counter (null once detached)

  SocketRequest* Oldest() const {
    for (const auto& r : queue) {
      if (!r->complete) return r.get();
    }
    return nullptr;
  }
};

class Stream;

// A thread that moves the bytes of its streams (see the top of the file).
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
  void Add(Stream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(s);
  }
  // Once it returns, the helper no longer touches `s`.
  void Remove(Stream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
  }
  void Wake() {
    const uint64_t one = 1;
    if (wake_ >= 0) (void)!write(wake_, &one, sizeof(one));
  }

 private:
  void Loop();

  int wake_;
  std::mutex mu_;  // guards streams_; held while the helper pumps them
  std::vector<Stream*> streams_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// One TCP stream and the channels it carries (one direction of data: `send` at the sender's
// process, else at the receiver's).
class Stream {
 public:
  // `streams` > 0: the stream carries the channels c < kSharedChannels with c % streams ==
  // `index`; 0: the one channel `index`.
  Stream(int fd, bool send, std::string peer, std::shared_ptr<Helper> helper, int streams,
         int index)
      : fd_(fd),
        send_(send),
        peer_(std::move(peer)),
        helper_(std::move(helper)),
        streams_(streams),
        index_(index) {
    if (helper_ != nullptr) helper_->Add(this);
  }
  // Every channel's end went away: closed already, or reset now (not closed in order).
  ~Stream() {
    if (helper_ != nullptr) helper_->Remove(this);
    std::lock_guard<std::mutex> io(io_);
    std::lock_guard<std::mutex> lock(mu_);
    ResetLocked();
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool sending() const { return send_; }
  const std::string& peer() const { return peer_; }
  Helper* helper() const { return helper_.get(); }
  std::mutex& mu() { return mu_; }

  // A channel's end on this stream (mu_ not held), taking over what the peer's frames for it
  // left (credits, a close). Null: the channel was opened on this end before.
  Lane* Attach(int channel, std::atomic<uint64_t>* moved) {
    std::lock_guard<std::mutex> lock(mu_);
    Lane* l = LaneLocked(channel);
    if (l == nullptr || l->attached || l->detached) return nullptr;
    l->attached = true;
    l->moved = moved;
    return l;
  }

  // What the helper polls this stream's socket for (0: nothing), and the socket.
  short Wants(int* fd) {
    std::lock_guard<std::mutex> lock(mu_);
    *fd = fd_;
    if (fd_ < 0 || !failed_.ok() || ended_) return 0;
    // Always readable: credits (sending end) or messages and closes (receiving end), and the
    // peer's reset or end.
    short events = POLLIN;
    if (WantsOutLocked()) events |= POLLOUT;
    polledOut_ = (events & POLLOUT) != 0;
    return events;
  }

  // The helper's turn once poll() said the socket is ready (or Test's, without helpers): moves
  // what the socket takes or holds. The socket calls run under io_ only, so the proxy's posts
  // and tests (mu_) never wait for a copy in progress.
  // `readable`: whether to read (poll() said the socket has something, or the caller cannot
  // tell).
  void Pump(bool readable = true) {
    std::lock_guard<std::mutex> io(io_);
    Status s = send_ ? PumpSend(readable) : PumpRecv(readable);
    if (!s.ok()) Fail(s);
  }

  Status Post(Lane* lane, char* data, size_t bytes, uint64_t info, NetRequest** request) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      *request = nullptr;
      JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
      JR_REQUIRE(!send_ || !lane->closing, Code::kInternal, "jax_rccl: isend on channel ",
                 lane->channel, " to ", peer_, " after closing it");
      JR_REQUIRE(!send_ || !ended_, Code::kSystem, "jax_rccl: ", peer_,
                 " closed its network connection (its process finished or failed); channel ",
                 lane->channel, " has more to send");
      if (int(lane->queue.size()) >= NetComm::kMaxRequests) return Status::Ok();
      auto r = std::make_unique<SocketRequest>();
      r->data = data;
      r->bytes = bytes;
      r->header = MessageHeader{kNetMagic, uint32_t(lane->channel), uint64_t(bytes), info};
      *request = r.get();
      lane->queue.push_back(std::move(r));
      if (!send_ && !lane->closed) ++lane->credits;
      // The helper needs a ring only for something to write that its poll() does not yet wait
      // for (anything else it sees when the socket is next ready).
      const bool writable = send_ ? lane->credits > 0 : CreditDueLocked(*lane);
      if (!writable || polledOut_) return Status::Ok();
    }
    if (helper_ != nullptr) helper_->Wake();
    return Status::Ok();
  }

  Status Test(Lane* lane, NetRequest* request, bool* done, size_t* bytes, uint64_t* info) {
    if (helper_ == nullptr) Pump();
    std::lock_guard<std::mutex> lock(mu_);
    *done = false;
    for (auto it = lane->queue.begin(); it != lane->queue.end(); ++it) {
      if (it->get() != request) continue;
      // What completed before a failure is still reported.
      if (!(*it)->complete) {
        JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
        return Status::Ok();
      }
      *done = true;
      if (bytes != nullptr) *bytes = send_ ? (*it)->bytes : size_t((*it)->header.bytes);
      if (info != nullptr) *info = (*it)->header.info;
      lane->queue.erase(it);
      return Status::Ok();
    }
    JR_FAIL(Code::kInternal, "jax_rccl: test of a request its connection does not hold");
  }

  Status Poll() {
    if (helper_ == nullptr) Pump();
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

  // Without blocking: true once `lane` is closed (see NetComm::CloseInOrder).
  bool CloseInOrder(Lane* lane) {
    if (send_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        lane->closing = true;
      }
      Pump();
    }
    std::lock_guard<std::mutex> io(io_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!lane->attached) return true;
    if (!failed_.ok() || fd_ < 0) {
      ResetLocked();  // a failed end cannot close in order: the peer sees it reset
      DetachLocked(lane);
      return true;
    }
    // A sending end waits for the receiver's acknowledgement: after it, nothing more comes from
    // the receiver on this channel, so closing the socket never meets unread bytes (which would
    // reset it, and lose what the peer has not read yet).
    if (send_ && !(lane->closed && (lane->acked || ended_))) return false;
    DetachLocked(lane);
    bool any = false;
    for (const auto& [channel, l] : lanes_) any = any || l->attached;
    if (!any) {
      close(fd_);  // every channel closed in order: the stream ends
      fd_ = -1;
    }
    return true;
  }

  // Resets the stream (the peer's channels on it fail naming this end); `lane` is let go.
  void Abort(Lane* lane) {
    std::lock_guard<std::mutex> io(io_);
    std::lock_guard<std::mutex> lock(mu_);
    if (lane->attached && fd_ >= 0 && failed_.ok()) {
      failed_ = Status(Code::kSystem, detail::StrCat("jax_rccl: the network connection with ",
                                                     peer_, " was reset by this process (channel ",
                                                     lane->channel, " was aborted)"));
    }
    ResetLocked();
    DetachLocked(lane);
  }

 private:
  void Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = s;
  }

  // Channel `channel`'s lane (made on first use), or null when this stream does not carry it.
  // mu_ held.
  Lane* LaneLocked(int64_t channel) {
    const bool carried =
        streams_ > 0 ? channel >= 0 && channel < kSharedChannels && channel % streams_ == index_
                     : channel == index_;
    if (!carried) return nullptr;
    std::unique_ptr<Lane>& slot = lanes_[int(channel)];
    if (slot == nullptr) {
      slot = std::make_unique<Lane>();
      slot->channel = int(channel);
    }
    return slot.get();
  }

  // Closes the socket so that the peer sees it reset (an error naming this end). io_, mu_ held.
  void ResetLocked() {
    // No message goes on in either direction (its request may be freed next).
    outActive_ = false;
    out_ = nullptr;
    outLane_ = nullptr;
    inReq_ = nullptr;
    if (fd_ < 0) return;
    const struct linger reset = {1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    close(fd_);
    fd_ = -1;
  }

  // io_ and mu_ held. A message partly read into one of the lane's receives reads on into
  // nothing (the stream's other channels go on); a sending lane is detached only once its close
  // header is out or the stream is reset, so no message of its is partly written.
  void DetachLocked(Lane* lane) {
    if (inLane_ == lane) inReq_ = nullptr;
    lane->attached = false;
    lane->detached = true;
    lane->moved = nullptr;
    lane->queue.clear();
  }

  // Receiving end: whether the receives posted since the last credit are to be announced: once
  // half the window has gathered, or when the sender holds less than half (a credit for every
  // receive would cost a write, a read and a wake-up per step at each end).
  bool CreditDueLocked(const Lane& l) const {
    if (!l.attached || l.closed || l.credits == 0) return false;
    const uint64_t half = uint64_t(NetComm::kMaxRequests / 2);
    return l.credits >= half || l.inFlight < half;
  }

  // Whether there is something to write: a message with a credit, a close header, credits.
  bool WantsOutLocked() const {
    if (outActive_ || ctlPending_) return true;
    for (const auto& [channel, l] : lanes_) {
      if (!send_ && (l->ackPending || CreditDueLocked(*l))) return true;
      if (!l->attached) continue;
      if (send_) {
        const SocketRequest* r = l->Oldest();
        if (r != nullptr && l->credits > 0) return true;
        if (r == nullptr && l->closing && !l->closed) return true;
      }
    }
    return false;
  }

  void CountLocked(Lane* lane, size_t n) {
    if (lane != nullptr && lane->moved != nullptr) lane->moved->fetch_add(n);
  }

  // Picks the next message to write, round robin over the channels: the oldest unsent message
  // of a channel holding a credit, or a channel's close header. mu_ held; false: none.
  bool NextOutLocked() {
    if (fd_ < 0 || !failed_.ok() || lanes_.empty()) return false;
    auto it = lanes_.upper_bound(lastOut_);
    for (size_t k = 0; k < lanes_.size(); ++k, ++it) {
      if (it == lanes_.end()) it = lanes_.begin();
      Lane* l = it->second.get();
      if (!l->attached) continue;
      SocketRequest* r = l->Oldest();
      if (r != nullptr && l->credits > 0) {
        --l->credits;
        out_ = r;
        outHeader_ = r->header;
      } else if (r == nullptr && l->closing && !l->closed) {
        out_ = nullptr;
        outHeader_ = MessageHeader{kNetClose, uint32_t(l->channel), 0, 0};
      } else {
        continue;
      }
      outLane_ = l;
      outDone_ = 0;
      outActive_ = true;
      lastOut_ = it->first;
      return true;
    }
    return false;
  }

  // Sending end: reads the credits that arrived, then writes what the socket takes. io_ held.
  Status PumpSend(bool readable) {
    if (readable) JR_CHECK(ReadCredits());
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!outActive_ && !NextOutLocked()) return Status::Ok();
      }
      const size_t payload = out_ != nullptr ? out_->bytes : 0;
      const size_t total = sizeof(MessageHeader) + payload;
      struct iovec iov[2];
      int n = 0;
      if (outDone_ < sizeof(MessageHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&outHeader_) + outDone_,
                    sizeof(MessageHeader) - outDone_};
        if (payload > 0) iov[n++] = {out_->data, payload};
      } else {
        iov[n++] = {out_->data + (outDone_ - sizeof(MessageHeader)), total - outDone_};
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
      outDone_ += size_t(w);
      std::lock_guard<std::mutex> lock(mu_);
      CountLocked(outLane_, size_t(w));
      if (outDone_ < total) continue;
      if (out_ != nullptr) {
        out_->complete = true;
      } else {
        outLane_->closed = true;
      }
      outActive_ = false;
      out_ = nullptr;
      outLane_ = nullptr;
    }
  }

  // Sending end: takes the credits that arrived. io_ held.
  Status ReadCredits() {
    while (fd_ >= 0) {
      const ssize_t got = recv(fd_, reinterpret_cast<char*>(&credit_) + creditDone_,
                               sizeof(MessageHeader) - creditDone_, MSG_DONTWAIT);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
        JR_FAIL(Code::kSystem, "jax_rccl: ", peer_, " reset its network connection (",
                ErrnoText(errno), "; its proxy failed or its process died)");
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (got == 0) {
        // The receiver closed its end: fine once nothing is left to send.
        ended_ = true;
        for (const auto& [channel, l] : lanes_) {
          JR_REQUIRE(!l->attached || l->Oldest() == nullptr, Code::kSystem, "jax_rccl: ", peer_,
                     " closed its network connection (its process finished or failed) while "
                     "channel ",
                     channel, " had steps to send");
        }
        return Status::Ok();
      }
      creditDone_ += size_t(got);
      if (creditDone_ < sizeof(MessageHeader)) continue;
      creditDone_ = 0;
      // A receiver has at most kMaxRequests receives posted per channel: never more credits.
      Lane* l = LaneLocked(credit_.channel);
      JR_REQUIRE((credit_.magic == kNetCredit || credit_.magic == kNetCloseAck) && l != nullptr &&
                     credit_.bytes <= uint64_t(NetComm::kMaxRequests) - l->credits,
                 Code::kSystem, "jax_rccl: ", peer_,
                 " sent a malformed credit on its network connection");
      if (credit_.magic == kNetCloseAck) {
        l->acked = true;
      } else {
        l->credits += credit_.bytes;
      }
    }
    return Status::Ok();
  }

  // Receiving end: writes the credits of the receives posted, then reads messages into the posted
  // receives, oldest first per channel, as far as data has arrived. io_ held.
  Status PumpRecv(bool readable) {
    JR_CHECK(WriteCredits());
    while (readable && fd_ >= 0) {
      char* dst;
      size_t want;
      if (inDone_ < sizeof(MessageHeader)) {
        dst = reinterpret_cast<char*>(&in_) + inDone_;
        want = sizeof(MessageHeader) - inDone_;
      } else {
        const size_t got = inDone_ - sizeof(MessageHeader);
        want = size_t(in_.bytes) - got;
        if (inReq_ != nullptr) {
          dst = inReq_->data + got;
        } else {  // a message for a channel this end let go: read on into nothing
          dst = discard_;
          want = std::min(want, sizeof(discard_));
        }
      }
      size_t n = 0;
      if (want > 0) {
        const ssize_t got = recv(fd_, dst, want, MSG_DONTWAIT);
        if (got == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          for (const auto& [channel, l] : lanes_) {
            JR_REQUIRE(!l->attached || l->closed, Code::kSystem, "jax_rccl: ", peer_,
                       " closed its network connection without closing it in order (its "
                       "process exited or failed)");
          }
          ended_ = true;  // every channel closed in order, then the stream
          return Status::Ok();
        }
        if (got < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
          return EndedOrFailed(errno);
        }
        n = size_t(got);
      }
      const bool headerDone =
          inDone_ < sizeof(MessageHeader) && inDone_ + n == sizeof(MessageHeader);
      inDone_ += n;
      std::lock_guard<std::mutex> lock(mu_);
      if (headerDone) JR_CHECK(TakeHeaderLocked());
      CountLocked(inLane_, n);
      if (inDone_ >= sizeof(MessageHeader) &&
          inDone_ == sizeof(MessageHeader) + size_t(in_.bytes)) {
        if (inReq_ != nullptr) {
          inReq_->header = in_;
          inReq_->complete = true;
        }
        inReq_ = nullptr;
        inLane_ = nullptr;
        inDone_ = 0;
      }
    }
    return Status::Ok();
  }

  // Receiving end: the socket failed with `err`. Only the end of the stream once every channel
  // still held was closed in order (the sender may close before a last credit reaches it).
  Status EndedOrFailed(int err) {
    std::lock_guard<std::mutex> lock(mu_);
    bool open = false;
    for (const auto& [channel, l] : lanes_) open = open || (l->attached && !l->closed);
    JR_REQUIRE(!open, Code::kSystem, "jax_rccl: the network connection from ", peer_,
               " failed: ", ErrnoText(err), " (did its process exit?)");
    ended_ = true;
    return Status::Ok();
  }

  // A header arrived: find where its bytes go. mu_ held.
  Status TakeHeaderLocked() {
    Lane* l = LaneLocked(in_.channel);
    JR_REQUIRE(
        l != nullptr && (in_.magic == kNetMagic || (in_.magic == kNetClose && in_.bytes == 0)),
        Code::kSystem, "jax_rccl: ", peer_, " sent a malformed message on its network connection");
    JR_REQUIRE(!l->closed, Code::kSystem, "jax_rccl: ", peer_, " sent on channel ", l->channel,
               " after closing it");
    inLane_ = l;
    inReq_ = nullptr;
    if (in_.magic == kNetClose) {
      // Nothing more comes; the receives posted ahead stay pending, and no credit goes back.
      l->closed = true;
      l->ackPending = true;
      l->credits = 0;
      return Status::Ok();
    }
    if (l->detached) return Status::Ok();  // credited before this end let the channel go
    SocketRequest* r = l->attached ? l->Oldest() : nullptr;
    JR_REQUIRE(r != nullptr && l->inFlight > 0, Code::kSystem, "jax_rccl: ", peer_,
               " sent a step on channel ", l->channel,
               " without a receive posted for it (the two ends disagree on the credits)");
    JR_REQUIRE(in_.bytes <= r->bytes, Code::kInternal, "jax_rccl: ", peer_, " sent ", in_.bytes,
               " bytes into a receive of ", r->bytes, " (the two ends disagree on the step size)");
    --l->inFlight;
    inReq_ = r;
    return Status::Ok();
  }

  // Receiving end: announces the receives posted since the last credit, a header per channel.
  // io_ held.
  Status WriteCredits() {
    if (ctlDone_ == ctl_.size()) {
      ctl_.clear();
      ctlDone_ = 0;
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [channel, l] : lanes_) {
        MessageHeader h{kNetCredit, uint32_t(channel), l->credits, 0};
        if (l->ackPending) {
          h = MessageHeader{kNetCloseAck, uint32_t(channel), 0, 0};
          l->ackPending = false;
        } else if (CreditDueLocked(*l)) {
          l->inFlight += l->credits;
        } else {
          continue;
        }
        const char* p = reinterpret_cast<const char*>(&h);
        ctl_.insert(ctl_.end(), p, p + sizeof(h));
        l->credits = 0;
      }
    }
    while (fd_ >= 0 && ctlDone_ < ctl_.size()) {
      const ssize_t w =
          send(fd_, ctl_.data() + ctlDone_, ctl_.size() - ctlDone_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return EndedOrFailed(errno);
      }
      ctlDone_ += size_t(w);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ctlPending_ = ctlDone_ < ctl_.size();
    return Status::Ok();
  }

  // io_: held by the thread moving bytes (the socket calls, the out_/in_ state below) and by
  // whoever closes the socket; taken before mu_. mu_: guards the rest (the proxy posts, tests
  // and polls under it alone).
  std::mutex io_;
  std::mutex mu_;
  int fd_;
  bool send_;
  std::string peer_;
  std::shared_ptr<Helper> helper_;              // null: Test pumps
  int streams_, index_;                         // the channels it carries (the constructor's)
  std::map<int, std::unique_ptr<Lane>> lanes_;  // by channel
  Status failed_;
  bool ended_ = false;      // the peer ended the stream (after its channels closed in order)
  bool polledOut_ = false;  // the helper's poll() waits for the socket to take bytes
  // Sending end (io_; outActive_ also changes and is read under mu_).
  bool outActive_ = false;
  SocketRequest* out_ = nullptr;  // null with outActive_: a close header
  Lane* outLane_ = nullptr;
  MessageHeader outHeader_{};
  size_t outDone_ = 0;
  int lastOut_ = -1;  // the channel written last (round robin)
  MessageHeader credit_{};
  size_t creditDone_ = 0;
  // Receiving end (io_).
  MessageHeader in_{};
  size_t inDone_ = 0;
  SocketRequest* inReq_ = nullptr;  // null in a message's bytes: they go to discard_
  Lane* inLane_ = nullptr;
  char discard_[4096];
  std::vector<char> ctl_;  // credit headers being written
  size_t ctlDone_ = 0;
  bool ctlPending_ = false;  // (mu_) some of ctl_ is not written yet
};

void Helper::Loop() {
  // One poll() over the streams with something to move and the eventfd a new request rings, then
  // a pump of each socket that is ready: no read or write is tried on a socket that is not.
  std::vector<pollfd> fds;
  std::vector<Stream*> who;
  while (!stop_.load()) {
    fds.assign(1, pollfd{wake_, POLLIN, 0});
    who.assign(1, nullptr);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Stream* s : streams_) {
        int fd = -1;
        const short events = s->Wants(&fd);
        if (events == 0) continue;
        fds.push_back(pollfd{fd, events, 0});
        who.push_back(s);
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
      if (std::find(streams_.begin(), streams_.end(), who[i]) == streams_.end()) continue;
      who[i]->Pump((fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0);
    }
  }
}

// A channel's end (NetComm) on its stream.
class SocketComm final : public NetComm {
 public:
  explicit SocketComm(std::shared_ptr<Stream> stream) : stream_(std::move(stream)) {}
  // Not closed in order: the peer sees the stream reset (an error naming this end).
  ~SocketComm() override {
    if (lane_ != nullptr && !closed_) stream_->Abort(lane_);
  }
  // Takes channel `channel` of the stream; false: the stream has that channel already.
  bool Attach(int channel) {
    lane_ = stream_->Attach(channel, &bytesMoved_);
    return lane_ != nullptr;
  }

  bool CloseInOrder() override {
    if (closed_) return true;
    closed_ = stream_->CloseInOrder(lane_);
    return closed_;
  }
  // After CloseInOrder succeeded: nothing (the other channels of the stream go on).
  void Abort() override {
    if (closed_) return;
    stream_->Abort(lane_);
    closed_ = true;
  }
  StatusOr<NetMemory*> RegMr(void*, size_t, NetMemoryType) override {
    return static_cast<NetMemory*>(nullptr);
  }
  Status DeregMr(NetMemory*) override { return Status::Ok(); }

  Status Isend(const void* data, size_t bytes, uint64_t info, NetMemory*,
               NetRequest** request) override {
    JR_REQUIRE(stream_->sending(), Code::kInternal,
               "jax_rccl: isend on the receiving end of a connection");
    JR_REQUIRE(!closed_, Code::kInternal, "jax_rccl: isend on a closed connection");
    return stream_->Post(lane_, const_cast<char*>(static_cast<const char*>(data)), bytes, info,
                         request);
  }
  Status Irecv(void* data, size_t bytes, NetMemory*, NetRequest** request) override {
    JR_REQUIRE(!stream_->sending(), Code::kInternal,
               "jax_rccl: irecv on the sending end of a connection");
    JR_REQUIRE(!closed_, Code::kInternal, "jax_rccl: irecv on a closed connection");
    return stream_->Post(lane_, static_cast<char*>(data), bytes, 0, request);
  }
  Status Test(NetRequest* request, bool* done, size_t* bytes, uint64_t* info) override {
    JR_REQUIRE(!closed_, Code::kInternal, "jax_rccl: test on a closed connection");
    return stream_->Test(lane_, request, done, bytes, info);
  }
  Status Poll() override {
    if (closed_) return Status::Ok();
    return stream_->Poll();
  }

 private:
  std::shared_ptr<Stream> stream_;
  Lane* lane_ = nullptr;
  bool closed_ = false;  // closed in order or aborted: the lane is let go
};

class SocketNet final : public Net {
 public:
  SocketNet(std::string session, int process, int threads, int streams)
      : session_(std::move(session)), process_(process), threads_(threads), streams_(streams) {}
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
    return Open(key, true, peer, [&]() {
      return DialListener(endpoint, StreamKey(key), process_, session_, deadline, nullptr, peer);
    });
  }

  StatusOr<std::unique_ptr<NetComm>> Accept(const NetKey& key, Clock::time_point deadline,
                                            const std::string& peer) override {
    JR_CHECK(Listen(key));
    return Open(key, false, peer, [&]() -> StatusOr<int> {
      const int fd = AcceptFor(StreamKey(key), deadline, nullptr);
      JR_REQUIRE(fd >= 0, Code::kTimeout, "no network connection from ", peer, " for channel ",
                 key.channel, " (did its process reach this group?)");
      return fd;
    });
  }

 private:
  // The stream that carries `key`'s channel: its own, or with S > 0 stream channel % S.
  int StreamIndex(const NetKey& key) const {
    if (streams_ <= 0 || key.channel < 0 || key.channel >= kSharedChannels) return -1;
    return key.channel % streams_;
  }
  LinkKey StreamKey(const NetKey& key) const {
    const int index = StreamIndex(key);
    return LinkKey(key.group, kNetChannelFlag | (index < 0 ? key.channel : kNetStreamFlag | index),
                   key.from, key.to);
  }

  template <typename OpenFd>
  StatusOr<std::unique_ptr<NetComm>> Open(const NetKey& key, bool send, const std::string& peer,
                                          OpenFd openFd) {
    const int index = StreamIndex(key);
    const auto id = std::make_tuple(key.group, index < 0 ? key.channel : index, index < 0, key.from,
                                    key.to, send);
    std::shared_ptr<Stream> stream;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = streams_by_key_.find(id);
      if (it != streams_by_key_.end()) stream = it->second.lock();
    }
    if (stream == nullptr) {
      JR_ASSIGN_OR_RETURN(int fd, openFd());
      Status ready = PrepareStream(fd);
      if (!ready.ok()) close(fd);
      JR_CHECK(ready);
      std::shared_ptr<Helper> helper;
      std::lock_guard<std::mutex> lock(mu_);
      if (threads_ > 0) {
        if (helpers_.empty()) {
          for (int t = 0; t < threads_; ++t) helpers_.push_back(std::make_shared<Helper>());
        }
        helper = helpers_[next_++ % helpers_.size()];
      }
      stream = std::make_shared<Stream>(fd, send, peer, helper, index < 0 ? 0 : streams_,
                                        index < 0 ? key.channel : index);
      streams_by_key_[id] = stream;
    }
    auto comm = std::make_unique<SocketComm>(stream);
    JR_REQUIRE(comm->Attach(key.channel), Code::kInternal, "jax_rccl: channel ", key.channel,
               " with ", peer, " opened twice");
    return std::unique_ptr<NetComm>(std::move(comm));
  }

  std::string session_;
  int process_;
  int threads_;
  int streams_;
  std::mutex mu_;  // guards what follows
  std::vector<std::shared_ptr<Helper>> helpers_;
  size_t next_ = 0;
  std::map<std::tuple<uint64_t, int, bool, int, int, bool>, std::weak_ptr<Stream>> streams_by_key_;
};

}  // namespace

std::unique_ptr<Net> MakeSocketNet(std::string session, int process, int threads, int streams) {
  return std::make_unique<SocketNet>(std::move(session), process, threads, streams);
}

}  // namespace comm
}  // namespace jax_rccl
