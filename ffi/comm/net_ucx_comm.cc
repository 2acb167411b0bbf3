// The UCX backend's worker and connection ends (net_ucx.h): UCP's context, worker, endpoints and
// active messages, the credits, and the close and faults over each connection's socket.
#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

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

// The UCX loaded (callbacks have no other way to it; there is one per process).
const Api* gApi = nullptr;

void SendDone(void* request, ucs_status_t status, void* user) {
  Req* r = static_cast<Req*>(user);
  r->op = nullptr;
  gApi->ucp_request_free(request);
  if (r->conn != nullptr) {
    r->conn->OnDone(r, status, r->bytes);
  } else {
    r->complete = true;  // an orphan: its connection went
  }
}

void RecvDone(void* request, ucs_status_t status, size_t length, void* user) {
  Req* r = static_cast<Req*>(user);
  r->op = nullptr;
  gApi->ucp_request_free(request);
  if (r->conn != nullptr) {
    r->conn->OnDone(r, status, length);
  } else {
    r->complete = true;
  }
}

void FreeWhenDone(void* request, ucs_status_t, void*) {
  gApi->ucp_request_free(request);
}

Conn* Lookup(Worker* w, const void* header, size_t headerBytes, WireHeader* h) {
  if (headerBytes != sizeof(WireHeader)) return nullptr;
  std::memcpy(h, header, sizeof(WireHeader));
  auto it = w->conns.find(h->token);
  return it == w->conns.end() ? nullptr : it->second;
}

ucs_status_t OnDataMessage(void* arg, const void* header, size_t headerBytes, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
  Worker* w = static_cast<Worker*>(arg);
  WireHeader h;
  Conn* c = Lookup(w, header, headerBytes, &h);
  if (c == nullptr) {
    // A connection closed since, or a message of no connection: dropped, a rendezvous refused
    // (its sender's request fails).
    ++w->dropped;
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED : UCS_OK;
  }
  return c->OnData(h, data, length, param);
}

ucs_status_t OnCreditMessage(void* arg, const void* header, size_t headerBytes, void*, size_t,
                             const ucp_am_recv_param_t* param) {
  Worker* w = static_cast<Worker*>(arg);
  WireHeader h;
  Conn* c = Lookup(w, header, headerBytes, &h);
  if (c == nullptr) {
    ++w->dropped;
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED : UCS_OK;
  }
  c->OnCredit(h.seq);
  return UCS_OK;
}

void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  Worker* w = static_cast<Worker*>(arg);
  for (auto& [token, c] : w->conns) c->OnEndpointError(ep, status);
}

const char* MemoryTypeName(int t) {
  switch (t) {
    case UCS_MEMORY_TYPE_HOST:
      return "host";
    case UCS_MEMORY_TYPE_CUDA:
      return "cuda";
    case UCS_MEMORY_TYPE_CUDA_MANAGED:
      return "cuda-managed";
    case UCS_MEMORY_TYPE_ROCM:
      return "rocm";
    case UCS_MEMORY_TYPE_ROCM_MANAGED:
      return "rocm-managed";
    default:
      return nullptr;
  }
}

}  // namespace

bool LocalTransport(const std::string& name) {
  static const std::set<std::string> local = {"self",     "posix",     "sysv",      "cma",
                                              "knem",     "xpmem",     "cuda_ipc",  "rocm_ipc",
                                              "ze_ipc",   "cuda_copy", "rocm_copy", "gdr_copy",
                                              "ze_copy"};
  return local.count(name) != 0;
}

bool FastTransport(const std::string& name) {
  // TCP, and UCX's copies between host and device memory (which stage, they do not cross hosts).
  static const std::set<std::string> slow = {"tcp",      "cuda_copy", "rocm_copy",
                                             "gdr_copy", "ze_copy",   ""};
  return slow.count(name) == 0;
}

std::string DescribeMemoryTypes(uint64_t mask) {
  std::string out;
  for (int t = 0; t < 64; ++t) {
    const char* n = (mask >> t) & 1 ? MemoryTypeName(t) : nullptr;
    if (n == nullptr) continue;
    out += out.empty() ? n : detail::StrCat(", ", n);
  }
  return out.empty() ? "host" : out;
}

bool DeviceMemory(uint64_t mask) {
  return (mask & ~(uint64_t(1) << UCS_MEMORY_TYPE_HOST)) != 0 &&
         ((mask >> UCS_MEMORY_TYPE_CUDA) & 1 || (mask >> UCS_MEMORY_TYPE_ROCM) & 1);
}

StatusOr<std::shared_ptr<Worker>> Worker::Create(const Api* api) {
  gApi = api;
  std::shared_ptr<Worker> w(new Worker(api));
  ucp_config_t* config = nullptr;
  ucs_status_t s = api->ucp_config_read(nullptr, nullptr, &config);
  JR_REQUIRE(s == UCS_OK, Code::kSystem,
             "jax_rccl: UCX could not read its settings (the UCX_* variables): ",
             StatusText(*api, s));
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  // The API version asked for: the headers', or the library's when older (ucp_init_version warns
  // about a request newer than the library).
  unsigned major = 0, minor = 0, release = 0;
  api->ucp_get_version(&major, &minor, &release);
  s = api->ucp_init_version(UCP_API_MAJOR, std::min<unsigned>(UCP_API_MINOR, minor), &params,
                            config, &w->context);
  api->ucp_config_release(config);
  JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX could not start (ucp_init: ",
             StatusText(*api, s), "; see UCX_TLS and UCX_NET_DEVICES)");
  ucp_context_attr_t ca;
  std::memset(&ca, 0, sizeof(ca));
  ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (api->ucp_context_query(w->context, &ca) == UCS_OK) w->memoryTypes = ca.memory_types;
  ucp_worker_params_t wp;
  std::memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one thread at a time: the worker's mu
  s = api->ucp_worker_create(w->context, &wp, &w->worker);
  JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX could not create a worker: ",
             StatusText(*api, s));
  ucp_worker_attr_t wa;
  std::memset(&wa, 0, sizeof(wa));
  wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  s = api->ucp_worker_query(w->worker, &wa);
  JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX gave no worker address: ",
             StatusText(*api, s));
  w->address.assign(reinterpret_cast<const char*>(wa.address), wa.address_length);
  api->ucp_worker_release_address(w->worker, wa.address);
  for (const auto& [id, cb] : {std::make_pair(kAmData, &OnDataMessage),
                               std::make_pair(kAmCredit, &OnCreditMessage)}) {
    ucp_am_handler_param_t hp;
    std::memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    // Device memory: eager data stays valid past the callback, so a receive into device memory
    // can hand it to UCX (ucp_am_recv_data_nbx), which copies by memory type.
    hp.flags = UCP_AM_FLAG_WHOLE_MSG |
               (DeviceMemory(w->memoryTypes) ? unsigned(UCP_AM_FLAG_PERSISTENT_DATA) : 0u);
    hp.cb = cb;
    hp.arg = w.get();
    s = api->ucp_worker_set_am_recv_handler(w->worker, &hp);
    JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX refused an active-message handler: ",
               StatusText(*api, s));
  }
  return w;
}

Worker::~Worker() {
  std::unique_lock<std::mutex> lock(mu);
  // Endpoints closing: a second at most, then the rest are left to the worker's end.
  const Clock::time_point until = Clock::now() + std::chrono::seconds(1);
  while (worker != nullptr && (!closing.empty() || !orphans.empty()) && Clock::now() < until) {
    Progress();
    if (!closing.empty() || !orphans.empty()) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
    }
  }
  // Requests UCX still holds keep their memory: the worker's end may still call them back.
  for (auto& r : orphans) (void)r.release();
  if (worker != nullptr) api.ucp_worker_destroy(worker);
  if (context != nullptr) api.ucp_cleanup(context);
}

void Worker::Progress() {
  for (int i = 0; i < 64 && api.ucp_worker_progress(worker) != 0; ++i) {
  }
  while (!kicked.empty()) {
    std::vector<Conn*> k;
    k.swap(kicked);
    for (Conn* c : k) c->Kick();
    api.ucp_worker_progress(worker);
  }
  orphans.erase(std::remove_if(orphans.begin(), orphans.end(),
                               [](const std::unique_ptr<Req>& r) {
                                 return r->op == nullptr && r->desc == nullptr;
                               }),
                orphans.end());
  closing.erase(std::remove_if(closing.begin(), closing.end(),
                               [this](void* op) {
                                 if (api.ucp_request_check_status(op) == UCS_INPROGRESS) {
                                   return false;
                                 }
                                 api.ucp_request_free(op);
                                 return true;
                               }),
                closing.end());
}

StatusOr<ucp_ep_h> Worker::CreateEndpoint(const std::string& peerAddress, bool errors,
                                          std::vector<std::string>* names, std::string* text) {
  ucp_ep_params_t ep;
  std::memset(&ep, 0, sizeof(ep));
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(peerAddress.data());
  ep.err_mode = errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (errors) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_handler.cb = &OnEndpointError;
    ep.err_handler.arg = this;
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t s = api.ucp_ep_create(worker, &ep, &h);
  JR_REQUIRE(s == UCS_OK, Code::kSystem, StatusText(api, s));
  ucp_transport_entry_t entries[32];
  ucp_ep_attr_t attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
  attr.transports.entries = entries;
  attr.transports.num_entries = 32;
  attr.transports.entry_size = sizeof(ucp_transport_entry_t);
  names->clear();
  text->clear();
  if (api.ucp_ep_query(h, &attr) == UCS_OK) {
    std::set<std::string> seen;
    for (unsigned i = 0; i < attr.transports.num_entries; ++i) {
      const char* t = entries[i].transport_name;
      const char* d = entries[i].device_name;
      const std::string name = t != nullptr ? t : "";
      const std::string one = detail::StrCat(name, "/", d != nullptr ? d : "?");
      if (!seen.insert(one).second) continue;
      names->push_back(name);
      *text += text->empty() ? one : ", " + one;
    }
  }
  if (text->empty()) *text = "?";
  return h;
}

StatusOr<ucp_ep_h> Worker::Connect(const std::string& peerAddress, std::string* transports,
                                   bool* fast) {
  auto anyFast = [](const std::vector<std::string>& names) {
    return std::any_of(names.begin(), names.end(), FastTransport);
  };
  // With error handling (a peer's failure is the endpoint's status, not the end of this
  // process): the transports that can tell a peer's failure, which UCX's shared-memory ones do
  // not.
  std::vector<std::string> names;
  StatusOr<ucp_ep_h> ep = CreateEndpoint(peerAddress, true, &names, transports);
  *fast = ep.ok() && anyFast(names);
  if (*fast) return ep;
  // Without: taken only when every transport it picks is local to this machine (shared memory,
  // cma, GPU IPC; a peer's death shows on the connection's socket) and one beats TCP.
  std::vector<std::string> localNames;
  std::string localText;
  StatusOr<ucp_ep_h> local = CreateEndpoint(peerAddress, false, &localNames, &localText);
  const bool allLocal =
      local.ok() && std::all_of(localNames.begin(), localNames.end(), LocalTransport);
  if (allLocal && anyFast(localNames)) {
    if (ep.ok()) CloseEndpoint(ep.value(), false);
    *transports = localText;
    *fast = true;
    return local;
  }
  if (local.ok()) CloseEndpoint(local.value(), false);
  return ep;
}

void Worker::CloseEndpoint(ucp_ep_h ep, bool force) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* op = api.ucp_ep_close_nbx(ep, &p);
  if (op != nullptr && !UCS_PTR_IS_ERR(op)) closing.push_back(op);
}

std::string Worker::MemoryTypes() const {
  return DescribeMemoryTypes(memoryTypes);
}

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

Status Conn::Post(char* data, size_t bytes, uint64_t info, NetMemory* mem, NetRequest** request) {
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

Status Conn::Test(NetRequest* request, bool* done, size_t* bytes, uint64_t* info) {
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
  JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX could not register ", bytes,
             " bytes of ", device ? "device" : "host", " memory for the connection with ", peer_,
             ": ", StatusText(api_, s));
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
  JR_REQUIRE(s == UCS_OK, Code::kSystem, "jax_rccl: UCX could not deregister memory: ",
             StatusText(api_, s));
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
    failed_ = Status(Code::kInternal,
                     detail::StrCat("jax_rccl: ", peer_, " sent ", length, " bytes into a receive of ",
                                    r->bytes, " (the two ends disagree on the step size)"));
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
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &RecvDone;
    p.user_data = r;
    if (r->mem != nullptr) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = r->mem->memh;
    }
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
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &SendDone;
    p.user_data = r;
    if (r->mem != nullptr) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = r->mem->memh;
    }
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
  const WireHeader h{peerToken_, posted_, 0};
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
  Fail(detail::StrCat("jax_rccl: the network connection with ", peer_, " failed: ",
                      n < 0 ? ErrnoText(errno) : std::string("a short write"),
                      " (did its process exit?)"));
  return false;
}

}  // namespace ucx
}  // namespace comm
}  // namespace jax_rccl
