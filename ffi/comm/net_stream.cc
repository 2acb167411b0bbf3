// TCP streams that carry the network interface's channels (net_stream.h).
#include "ffi/comm/net_stream.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "ffi/core/thread_name.h"

namespace jax_rccl {
namespace comm {
namespace tcp {
namespace {

constexpr uint32_t kNetMagic = 0x6a726e31u;     // "jrn1": a message
constexpr uint32_t kNetClose = 0x6a726e30u;     // "jrn0": the sender closes the channel in order
constexpr uint32_t kNetCredit = 0x6a726e32u;    // "jrn2": the receiver posted `bytes` receives
constexpr uint32_t kNetCloseAck = 0x6a726e33u;  // "jrn3": the receiver read the channel's close

std::atomic<int> gHelperPollMs{100};

}  // namespace

void SetHelperPollTimeoutMs(int ms) {
  gHelperPollMs.store(ms > 0 ? ms : 100);
}

Helper::Helper(int progressFd)
    : wake_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), progressFd_(progressFd) {
  thread_ = std::thread([this]() {
    NameThisThread("jrccl net");
    Loop();
  });
}

Helper::~Helper() {
  stop_.store(true);
  Wake();
  thread_.join();
  if (wake_ >= 0) close(wake_);
}

void Helper::Add(Stream* s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(s);
  }
  // The helper may be in a poll() over the streams it had: a new stream's first events (a
  // sending end's credits, which no Post() rings for) would wait for that poll's timeout.
  Wake();
}

void Helper::Remove(Stream* s) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
}

void Helper::Wake() {
  const uint64_t one = 1;
  if (wake_ >= 0) (void)!write(wake_, &one, sizeof(one));
}

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
    if (poll(fds.data(), nfds_t(fds.size()), gHelperPollMs.load()) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_, &v, sizeof(v));
    }
    bool pumped = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        // Removed while this thread polled: no longer this helper's to touch.
        if (std::find(streams_.begin(), streams_.end(), who[i]) == streams_.end()) continue;
        who[i]->Pump((fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0);
        pumped = true;
      }
    }
    if (pumped && progressFd_ >= 0) {
      const uint64_t one = 1;
      (void)!write(progressFd_, &one, sizeof(one));
    }
  }
}

Stream::Stream(int fd, bool send, std::string peer, std::shared_ptr<Helper> helper, int streams,
               int index)
    : fd_(fd),
      send_(send),
      peer_(std::move(peer)),
      helper_(std::move(helper)),
      streams_(streams),
      index_(index) {
  if (helper_ != nullptr) helper_->Add(this);
}

Stream::~Stream() {
  if (helper_ != nullptr) helper_->Remove(this);
  std::lock_guard<std::mutex> io(io_);
  std::lock_guard<std::mutex> lock(mu_);
  ResetLocked();
}

Lane* Stream::Attach(int channel, std::atomic<uint64_t>* moved) {
  std::lock_guard<std::mutex> lock(mu_);
  Lane* l = LaneLocked(channel);
  if (l == nullptr || l->attached || l->detached) return nullptr;
  l->attached = true;
  l->moved = moved;
  return l;
}

short Stream::Wants(int* fd) {
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

void Stream::Pump(bool readable) {
  std::lock_guard<std::mutex> io(io_);
  Status s = send_ ? PumpSend(readable) : PumpRecv(readable);
  if (!s.ok()) Fail(s);
}

Status Stream::Post(Lane* lane, char* data, size_t bytes, const NetInfo& info,
                    NetRequest** request) {
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
  if (helper_ != nullptr) {
    helper_->Wake();
  } else if (callerPolls_) {
    Pump(false);  // the write; what comes in, the caller's poll() finds
  }
  return Status::Ok();
}

Status Stream::Test(Lane* lane, NetRequest* request, bool* done, size_t* bytes, NetInfo* info) {
  if (helper_ == nullptr && !callerPolls_) Pump();
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

Status Stream::Poll() {
  if (helper_ == nullptr) Pump();
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

bool Stream::CloseInOrder(Lane* lane) {
  if (send_) {
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu_);
      first = !lane->closing;
      lane->closing = true;
    }
    // What this pump cannot write (a full socket) is the helper's to write, and its poll() may
    // not be waiting for the socket to take bytes: ring it, as a post does.
    if (first && helper_ != nullptr) helper_->Wake();
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

void Stream::Abort(Lane* lane) {
  std::lock_guard<std::mutex> io(io_);
  std::lock_guard<std::mutex> lock(mu_);
  if (lane->attached && fd_ >= 0 && failed_.ok()) {
    failed_ = Status(Code::kSystem, detail::StrCat("jax_rccl: the network connection with ", peer_,
                                                   " was reset by this process (channel ",
                                                   lane->channel, " was aborted)"));
  }
  ResetLocked();
  DetachLocked(lane);
}

void Stream::Fail(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.ok()) failed_ = s;
}

Lane* Stream::LaneLocked(int64_t channel) {
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

void Stream::ResetLocked() {
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

void Stream::DetachLocked(Lane* lane) {
  if (inLane_ == lane) inReq_ = nullptr;
  lane->attached = false;
  lane->detached = true;
  lane->moved = nullptr;
  lane->queue.clear();
}

bool Stream::CreditDueLocked(const Lane& l) const {
  if (!l.attached || l.closed || l.credits == 0) return false;
  const uint64_t half = uint64_t(NetComm::kMaxRequests / 2);
  return l.credits >= half || l.inFlight < half;
}

bool Stream::WantsOutLocked() const {
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

void Stream::CountLocked(Lane* lane, size_t n) {
  if (lane != nullptr && lane->moved != nullptr) lane->moved->fetch_add(n);
}

bool Stream::NextOutLocked() {
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
      outHeader_ = MessageHeader{kNetClose, uint32_t(l->channel), 0, {}};
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

Status Stream::PumpSend(bool readable) {
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

Status Stream::ReadCredits() {
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

Status Stream::PumpRecv(bool readable) {
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
      if (got == 0) return EndedOrFailed(0);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::Ok();
        return EndedOrFailed(errno);
      }
      n = size_t(got);
    }
    const bool headerDone = inDone_ < sizeof(MessageHeader) && inDone_ + n == sizeof(MessageHeader);
    inDone_ += n;
    std::lock_guard<std::mutex> lock(mu_);
    if (headerDone) JR_CHECK(TakeHeaderLocked());
    CountLocked(inLane_, n);
    if (inDone_ >= sizeof(MessageHeader) && inDone_ == sizeof(MessageHeader) + size_t(in_.bytes)) {
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

Status Stream::EndedOrFailed(int err) {
  std::lock_guard<std::mutex> lock(mu_);
  bool open = false;
  for (const auto& [channel, l] : lanes_) open = open || (l->attached && !l->closed);
  if (open && err == 0) {
    JR_FAIL(Code::kSystem, "jax_rccl: ", peer_,
            " closed its network connection without closing it in order (its process exited or "
            "failed)");
  }
  JR_REQUIRE(!open, Code::kSystem, "jax_rccl: the network connection from ", peer_,
             " failed: ", ErrnoText(err), " (did its process exit?)");
  ended_ = true;  // every channel still held closed in order, then the stream
  return Status::Ok();
}

Status Stream::TakeHeaderLocked() {
  Lane* l = LaneLocked(in_.channel);
  JR_REQUIRE(l != nullptr && (in_.magic == kNetMagic || (in_.magic == kNetClose && in_.bytes == 0)),
             Code::kSystem, "jax_rccl: ", peer_,
             " sent a malformed message on its network connection");
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

Status Stream::WriteCredits() {
  if (ctlDone_ == ctl_.size()) {
    ctl_.clear();
    ctlDone_ = 0;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [channel, l] : lanes_) {
      MessageHeader h{kNetCredit, uint32_t(channel), l->credits, {}};
      if (l->ackPending) {
        h = MessageHeader{kNetCloseAck, uint32_t(channel), 0, {}};
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

}  // namespace tcp
}  // namespace comm
}  // namespace jax_rccl
