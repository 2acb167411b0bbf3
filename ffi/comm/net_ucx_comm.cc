// The UCX backend's connection ends (net_ucx.h): active messages of data and credits, and the
// close and faults over each connection's socket.
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ffi/comm/net_ucx.h"

namespace jax_rccl {
namespace comm {
namespace ucx {
namespace {

constexpr uint32_t kControlMagic = 0x6a727563u;  // "jruc": a frame on a connection's socket
constexpr uint32_t kControlClose = 1;            // the sender closes in order; value: its messages
constexpr uint32_t kControlAck = 2;              // the receiver has every message of the close

// How often a Test reads its connection's socket (a close or a fault); Poll and CloseInOrder
// always do.
constexpr auto kControlEvery = std::chrono::microseconds(200);

struct ControlFrame {
  uint32_t magic;
  uint32_t kind;
  uint64_t value;
};
static_assert(sizeof(ControlFrame) == 16, "control frame");

// UCX's completions of the connections' requests (user_data: the request).
void SendDone(void* request, ucs_status_t status, void* user) {
  Req* r = static_cast<Req*>(user);
  r->op = nullptr;
  LoadedApi().ucp_request_free(request);
  if (r->conn != nullptr) {
    r->conn->OnDone(r, status, r->bytes);
  } else {
    r->complete = true;  // an orphan: its connection went
  }
}

void RecvDone(void* request, ucs_status_t status, size_t length, void* user) {
  Req* r = static_cast<Req*>(user);
  r->op = nullptr;
  LoadedApi().ucp_request_free(request);
  if (r->conn != nullptr) {
    r->conn->OnDone(r, status, length);
  } else {
    r->complete = true;
  }
}

void FreeWhenDone(void* request, ucs_status_t, void*) {
  LoadedApi().ucp_request_free(request);
}
// The parameters of a UCX operation on request `r`: its callback's data and its registration
// (the caller sets the callback).
ucp_request_param_t RequestParam(Req* r) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = r;
  if (r->mem != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = r->mem->memh;
  }
  return p;
}

}  // namespace

// ---- a connection's end ----

Conn::Conn(std::shared_ptr<Worker> w, bool send, std::string peer, int channel, int fd,
           uint64_t token)
    : w_(std::move(w)),
      api_(w_->api),
      send_(send),
      peer_(std::move(peer)),
      channel_(channel),
      fd_(fd),
      token_(token) {}

Conn::~Conn() {
  std::lock_guard<std::mutex> lock(w_->mu);
  if (!detached_) Detach(true);
}

void Conn::Fail(const std::string& why) {
  if (failed_.ok()) failed_ = Status(Code::kSystem, why);
}

void Conn::KickLater() {
  if (kicked_ || detached_) return;
  kicked_ = true;
  w_->kicked.push_back(this);
}

void Conn::Detach(bool reset) {
  detached_ = true;
  w_->conns.erase(token_);
  if (kicked_) {
    w_->kicked.erase(std::remove(w_->kicked.begin(), w_->kicked.end(), this), w_->kicked.end());
    kicked_ = false;
  }
  if (fd_ >= 0) {
    if (reset) {
      const struct linger now = {1, 0};
      setsockopt(fd_, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
    }
    close(fd_);
    fd_ = -1;
  }
  for (auto& r : queue_) {
    if (r->desc != nullptr) {  // a rendezvous not started: UCX's descriptor goes back
      api_.ucp_am_data_release(w_->worker, r->desc);
      r->desc = nullptr;
    }
    if (r->op == nullptr) continue;
    r->conn = nullptr;  // UCX still has it: kept until it lets it go
    w_->orphans.push_back(std::move(r));
  }
  queue_.clear();
  if (ep_ != nullptr) {
    w_->CloseEndpoint(ep_, reset || !failed_.ok());
    ep_ = nullptr;
  }
  moved_ = nullptr;
}

void Conn::OnEndpointError(ucp_ep_h ep, ucs_status_t status) {
  if (ep != ep_ || detached_) return;
  if (epError_ == UCS_OK) epError_ = status;
  // After an orderly end the peer's endpoint going is expected; an idle end learns it from its
  // socket or its next request (as the TCP backend's learns a receiver's close).
  const bool orderly = send_ ? (acked_ || ended_) : peerClosed_;
  if (orderly) return;
  bool busy = false;
  for (const auto& r : queue_) busy = busy || !r->complete;
  if (busy) EndpointFailed();
}

void Conn::EndpointFailed() {
  Fail(detail::StrCat("jax_rccl: the UCX connection with ", peer_, " was reset (",
                      StatusText(api_, epError_), "; its process exited or its end failed)"));
}

bool Conn::CloseInOrder() {
  std::lock_guard<std::mutex> lock(w_->mu);
  if (detached_) return true;
  w_->Progress();
  ReadControl();
  if (!failed_.ok() || fd_ < 0) {
    Detach(true);  // a failed end cannot close in order: the peer sees it reset
    return true;
  }
  if (!send_) {
    Detach(false);  // the sender, still sending, then fails naming this end
    return true;
  }
  closing_ = true;
  for (const auto& r : queue_) {
    if (!r->complete) return false;
  }
  if (!closeSent_) {
    if (!WriteControl(kControlClose, posted_)) {
      if (!failed_.ok()) Detach(true);
      return !failed_.ok();
    }
    closeSent_ = true;
  }
  // The receiver has every message once it acknowledges (or it closed its end first).
  if (!acked_ && !ended_) return false;
  Detach(false);
  return true;
}

void Conn::Abort() {
  std::lock_guard<std::mutex> lock(w_->mu);
  if (detached_) return;
  Detach(true);
}

Status Conn::Post(char* data, size_t bytes, const NetInfo& info, NetMemory* mem,
                  NetRequest** request) {
  std::lock_guard<std::mutex> lock(w_->mu);
  *request = nullptr;
  JR_REQUIRE(!detached_, Code::kInternal, "jax_rccl: a request on a closed connection");
  w_->Progress();
  JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
  if (send_) {
    JR_REQUIRE(!closing_, Code::kInternal, "jax_rccl: isend on channel ", channel_, " to ", peer_,
               " after closing it");
    JR_REQUIRE(!ended_, Code::kSystem, "jax_rccl: ", peer_,
               " closed its network connection (its process finished or failed); channel ",
               channel_, " has more to send");
    if (epError_ != UCS_OK) {
      EndpointFailed();
      return failed_;
    }
  }
  if (int(queue_.size()) >= NetComm::kMaxRequests) return Status::Ok();
  auto r = std::make_unique<Req>();
  r->conn = this;
  r->seq = posted_++;
  r->data = data;
  r->bytes = bytes;
  r->mem = static_cast<Memory*>(mem);
  r->header = WireHeader{peerToken_, r->seq, info};
  *request = r.get();
  queue_.push_back(std::move(r));
  if (send_) {
    StartSends();
  } else {
    AnnounceCredits();
  }
  return Status::Ok();
}

Status Conn::Test(NetRequest* request, bool* done, size_t* bytes, NetInfo* info) {
  std::lock_guard<std::mutex> lock(w_->mu);
  JR_REQUIRE(!detached_, Code::kInternal, "jax_rccl: test on a closed connection");
  *done = false;
  w_->Progress();
  const Clock::time_point now = Clock::now();
  if (now - lastControl_ > kControlEvery) ReadControl();
  bool before = true;  // every older request is complete (requests complete in order)
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    Req* r = it->get();
    if (r != request) {
      before = before && r->complete;
      continue;
    }
    // What completed before a failure is still reported.
    if (!r->complete || !before) {
      JR_REQUIRE(failed_.ok(), failed_.code(), failed_.message());
      return Status::Ok();
    }
    *done = true;
    if (bytes != nullptr) *bytes = send_ ? r->bytes : r->got;
    if (info != nullptr) *info = r->header.info;
    queue_.erase(it);
    return Status::Ok();
  }
  JR_FAIL(Code::kInternal, "jax_rccl: test of a request its connection does not hold");
}

Status Conn::Poll() {
  std::lock_guard<std::mutex> lock(w_->mu);
  if (detached_) return Status::Ok();
  w_->Progress();
  ReadControl();
  return failed_;
}

StatusOr<NetMemory*> Conn::RegMr(void* data, size_t bytes, NetMemoryType type) {
  std::lock_guard<std::mutex> lock(w_->mu);
  const bool device = type == NetMemoryType::kDevice;
  JR_REQUIRE(!device || DeviceMemory(w_->memoryTypes), Code::kUnsupported,
             "jax_rccl: the UCX loaded cannot move device memory (it reports memory types: ",
             w_->MemoryTypes(),
             "; its CUDA or ROCm modules are absent or found no GPU): register host memory");
  ucp_mem_map_params_t mp;
  std::memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = data;
  mp.length = bytes;
  if (!device) {  // device memory: UCX finds its type
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_HOST;
  }
  ucp_mem_h memh = nullptr;
  const ucs_status_t s = api_.ucp_mem_map(w_->context, &mp, &memh);
  JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX could not register ", bytes, " bytes of ",
             device ? "device" : "host", " memory for the connection with ", peer_, ": ",
             StatusText(api_, s));
  auto* m = new Memory();
  m->memh = memh;
  m->device = device;
  return static_cast<NetMemory*>(m);
}

Status Conn::DeregMr(NetMemory* mem) {
  if (mem == nullptr) return Status::Ok();
  std::lock_guard<std::mutex> lock(w_->mu);
  auto* m = static_cast<Memory*>(mem);
  const ucs_status_t s = api_.ucp_mem_unmap(w_->context, m->memh);
  delete m;
  JR_REQUIRE(s == UCS_OK, Code::kSystem,
             "jax_rccl: UCX could not deregister memory: ", StatusText(api_, s));
  return Status::Ok();
}

// ---- from UCX's callbacks (the worker's mu held) ----

void Conn::OnCredit(uint64_t posted) {
  if (!send_ || posted < granted_ || posted - started_ > uint64_t(NetComm::kMaxRequests)) {
    Fail(detail::StrCat("jax_rccl: ", peer_, " sent a malformed credit on channel ", channel_));
    return;
  }
  granted_ = posted;
  KickLater();
}

ucs_status_t Conn::OnData(const WireHeader& h, void* data, size_t length,
                          const ucp_am_recv_param_t* param) {
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const ucs_status_t refuse = rndv ? UCS_ERR_REJECTED : UCS_OK;
  if (send_ || !failed_.ok()) {
    if (send_) Fail(detail::StrCat("jax_rccl: ", peer_, " sent a malformed message"));
    return refuse;
  }
  if (peerClosed_ && h.seq >= closeCount_) {
    Fail(detail::StrCat("jax_rccl: ", peer_, " sent on channel ", channel_, " after closing it"));
    return refuse;
  }
  Req* r = nullptr;
  for (auto& q : queue_) {
    if (q->seq == h.seq && !q->started) r = q.get();
  }
  if (r == nullptr || h.seq >= announced_) {
    Fail(detail::StrCat("jax_rccl: ", peer_, " sent a step on channel ", channel_,
                        " without a receive posted for it (the two ends disagree on the credits)"));
    return refuse;
  }
  if (length > r->bytes) {
    failed_ = Status(Code::kInternal, detail::StrCat("jax_rccl: ", peer_, " sent ", length,
                                                     " bytes into a receive of ", r->bytes,
                                                     " (the two ends disagree on the step size)"));
    return refuse;
  }
  r->started = true;
  r->header.info = h.info;
  r->got = length;
  const bool persistent = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
  if (rndv || (r->mem != nullptr && r->mem->device && persistent)) {
    // UCX moves it into the receive (a rendezvous; or device memory, copied by memory type):
    // started after this callback, from Kick.
    r->desc = data;
    KickLater();
    return UCS_INPROGRESS;
  }
  if (length > 0) std::memcpy(r->data, data, length);
  OnDone(r, UCS_OK, length);
  return UCS_OK;
}

void Conn::OnDone(Req* r, ucs_status_t status, size_t length) {
  r->op = nullptr;
  if (status != UCS_OK) {
    if (status == UCS_ERR_CANCELED && detached_) return;
    if (epError_ == UCS_OK && status != UCS_ERR_REJECTED && status != UCS_ERR_MESSAGE_TRUNCATED) {
      epError_ = status;
    }
    if (status == UCS_ERR_REJECTED) {
      Fail(detail::StrCat("jax_rccl: ", peer_, " refused a step on channel ", channel_,
                          " (its end of the connection is gone)"));
    } else {
      EndpointFailed();
    }
    return;
  }
  r->complete = true;
  Count(sizeof(WireHeader) + (send_ ? r->bytes : length));
  if (!send_) {
    r->got = length;
    ++landed_;
    KickLater();  // credits due, or the close's acknowledgement
  }
}

void Conn::Kick() {
  kicked_ = false;
  if (detached_) return;
  if (send_) {
    StartSends();
    return;
  }
  for (auto& q : queue_) {
    Req* r = q.get();
    if (r->desc == nullptr) continue;
    void* desc = r->desc;
    r->desc = nullptr;
    ucp_request_param_t p = RequestParam(r);
    p.cb.recv_am = &RecvDone;
    void* op = api_.ucp_am_recv_data_nbx(w_->worker, desc, r->data, r->got, &p);
    if (UCS_PTR_IS_ERR(op)) {
      Fail(detail::StrCat("jax_rccl: receiving a step on channel ", channel_, " from ", peer_,
                          " failed: ", StatusText(api_, UCS_PTR_STATUS(op))));
      return;
    }
    if (op == nullptr) {
      OnDone(r, UCS_OK, r->got);
    } else {
      r->op = op;
    }
  }
  AnnounceCredits();
  if (peerClosed_ && !ackSent_ && landed_ >= closeCount_) {
    ackSent_ = WriteControl(kControlAck, 0);
  }
}

void Conn::StartSends() {
  while (failed_.ok() && ep_ != nullptr && started_ < granted_) {
    Req* r = nullptr;
    for (auto& q : queue_) {
      if (!q->started) {
        r = q.get();
        break;
      }
    }
    if (r == nullptr) return;
    ucp_request_param_t p = RequestParam(r);
    p.cb.send = &SendDone;
    r->started = true;
    ++started_;
    void* op =
        api_.ucp_am_send_nbx(ep_, kAmData, &r->header, sizeof(WireHeader), r->data, r->bytes, &p);
    if (UCS_PTR_IS_ERR(op)) {
      if (epError_ == UCS_OK) epError_ = UCS_PTR_STATUS(op);
      EndpointFailed();
      return;
    }
    if (op == nullptr) {
      OnDone(r, UCS_OK, r->bytes);
    } else {
      r->op = op;
    }
  }
}

void Conn::AnnounceCredits() {
  if (send_ || peerClosed_ || ep_ == nullptr || !failed_.ok()) return;
  const uint64_t pending = posted_ - announced_;
  const uint64_t inFlight = announced_ - landed_;
  const uint64_t half = uint64_t(NetComm::kMaxRequests / 2);
  // Half a window at a time, or at once when the sender holds less than half (a credit per
  // receive would cost a message per step each way).
  if (pending == 0 || (pending < half && inFlight >= half)) return;
  const WireHeader h{peerToken_, posted_, {}};
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK;
  p.flags = UCP_AM_SEND_FLAG_COPY_HEADER | UCP_AM_SEND_FLAG_EAGER;
  p.cb.send = &FreeWhenDone;
  void* op = api_.ucp_am_send_nbx(ep_, kAmCredit, &h, sizeof(h), nullptr, 0, &p);
  if (UCS_PTR_IS_ERR(op)) {
    if (epError_ == UCS_OK) epError_ = UCS_PTR_STATUS(op);
    EndpointFailed();
    return;
  }
  announced_ = posted_;
}

void Conn::ReadControl() {
  lastControl_ = Clock::now();
  while (fd_ >= 0 && !ended_ && failed_.ok()) {
    const ssize_t n = recv(fd_, ctl_ + ctlDone_, sizeof(ctl_) - ctlDone_, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      Fail(detail::StrCat("jax_rccl: ", peer_, " reset its network connection (", ErrnoText(errno),
                          "; its proxy failed or its process died)"));
      return;
    }
    if (n == 0) {
      ended_ = true;
      if (send_) {
        if (acked_) return;
        bool pending = false;
        for (const auto& r : queue_) pending = pending || !r->complete;
        if (pending) {
          Fail(detail::StrCat("jax_rccl: ", peer_,
                              " closed its network connection (its process finished or failed) "
                              "while channel ",
                              channel_, " had steps to send"));
        }
        return;
      }
      if (!peerClosed_) {
        Fail(detail::StrCat("jax_rccl: ", peer_,
                            " closed its network connection without closing it in order (its "
                            "process exited or failed)"));
      }
      return;
    }
    ctlDone_ += size_t(n);
    if (ctlDone_ < sizeof(ctl_)) continue;
    ctlDone_ = 0;
    ControlFrame f;
    std::memcpy(&f, ctl_, sizeof(f));
    if (f.magic == kControlMagic && f.kind == kControlClose && !send_ && !peerClosed_) {
      // Nothing more comes; receives posted beyond the last message stay pending.
      peerClosed_ = true;
      closeCount_ = f.value;
      KickLater();
    } else if (f.magic == kControlMagic && f.kind == kControlAck && send_ && closeSent_) {
      acked_ = true;
    } else {
      Fail(detail::StrCat("jax_rccl: ", peer_, " sent a malformed frame on channel ", channel_,
                          "'s connection"));
      return;
    }
  }
}

bool Conn::WriteControl(uint32_t kind, uint64_t value) {
  if (fd_ < 0) return false;
  const ControlFrame f{kControlMagic, kind, value};
  const ssize_t n = send(fd_, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n == ssize_t(sizeof(f))) return true;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  // A 16-byte frame into a socket that carries nothing else: short only when it failed.
  Fail(detail::StrCat("jax_rccl: the network connection with ", peer_,
                      " failed: ", n < 0 ? ErrnoText(errno) : std::string("a short write"),
                      " (did its process exit?)"));
  return false;
}

}  // namespace ucx
}  // namespace comm
}  // namespace jax_rccl
