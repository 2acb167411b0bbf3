// The UCX backend's worker (net_ucx.h): UCP's context and worker, their endpoints, the
// active-message handlers and the progress.
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

// The UCX loaded (UCX's callbacks have no other way to it; there is one per process).
const Api* gApi = nullptr;

Conn* Lookup(Worker* w, const void* header, size_t headerBytes, WireHeader* h) {
  if (headerBytes != sizeof(WireHeader)) return nullptr;
  std::memcpy(h, header, sizeof(WireHeader));
  auto it = w->conns.find(h->token);
  return it == w->conns.end() ? nullptr : it->second;
}

// A message for no connection (one closed since, or of no connection at all) is dropped, and a
// rendezvous refused (its sender's request fails).
ucs_status_t Dropped(Worker* w, const ucp_am_recv_param_t* param) {
  ++w->dropped;
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED : UCS_OK;
}

ucs_status_t OnDataMessage(void* arg, const void* header, size_t headerBytes, void* data,
                           size_t length, const ucp_am_recv_param_t* param) {
  Worker* w = static_cast<Worker*>(arg);
  WireHeader h;
  Conn* c = Lookup(w, header, headerBytes, &h);
  return c == nullptr ? Dropped(w, param) : c->OnData(h, data, length, param);
}

ucs_status_t OnCreditMessage(void* arg, const void* header, size_t headerBytes, void*, size_t,
                             const ucp_am_recv_param_t* param) {
  Worker* w = static_cast<Worker*>(arg);
  WireHeader h;
  Conn* c = Lookup(w, header, headerBytes, &h);
  if (c == nullptr) return Dropped(w, param);
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

const Api& LoadedApi() {
  return *gApi;
}

bool LocalTransport(const std::string& name) {
  static const std::set<std::string> local = {
      "self",     "posix",  "sysv",      "cma",       "knem",     "xpmem",  "cuda_ipc",
      "rocm_ipc", "ze_ipc", "cuda_copy", "rocm_copy", "gdr_copy", "ze_copy"};
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
  return ((mask >> UCS_MEMORY_TYPE_CUDA) & 1) != 0 || ((mask >> UCS_MEMORY_TYPE_ROCM) & 1) != 0;
}

StatusOr<std::shared_ptr<Worker>> Worker::Create(const Api* api, bool wakeups) {
  gApi = api;
  std::shared_ptr<Worker> w(new Worker(api));
  ucp_config_t* config = nullptr;
  ucs_status_t s = api->ucp_config_read(nullptr, nullptr, &config);
  JR_REQUIRE(
      s == UCS_OK, Code::kSystem,
      "jax_rccl: UCX could not read its settings (the UCX_* variables): ", StatusText(*api, s));
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | (wakeups ? UCP_FEATURE_WAKEUP : 0);
  // The API version asked for: the headers', or the library's when older (ucp_init_version warns
  // about a request newer than the library).
  unsigned major = 0, minor = 0, release = 0;
  api->ucp_get_version(&major, &minor, &release);
  s = api->ucp_init_version(UCP_API_MAJOR, std::min<unsigned>(UCP_API_MINOR, minor), &params,
                            config, &w->context);
  api->ucp_config_release(config);
  JR_REQUIRE(s == UCS_OK, Code::kSystem,
             "jax_rccl: UCX could not start (ucp_init: ", StatusText(*api, s),
             "; see UCX_TLS and UCX_NET_DEVICES)");
  ucp_context_attr_t ca;
  std::memset(&ca, 0, sizeof(ca));
  ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (api->ucp_context_query(w->context, &ca) == UCS_OK) w->memoryTypes = ca.memory_types;
  ucp_worker_params_t wp;
  std::memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one thread at a time: the worker's mu
  s = api->ucp_worker_create(w->context, &wp, &w->worker);
  JR_REQUIRE(s == UCS_OK, Code::kSystem,
             "jax_rccl: UCX could not create a worker: ", StatusText(*api, s));
  ucp_worker_attr_t wa;
  std::memset(&wa, 0, sizeof(wa));
  wa.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  s = api->ucp_worker_query(w->worker, &wa);
  JR_REQUIRE(s == UCS_OK, Code::kSystem,
             "jax_rccl: UCX gave no worker address: ", StatusText(*api, s));
  w->address.assign(reinterpret_cast<const char*>(wa.address), wa.address_length);
  api->ucp_worker_release_address(w->worker, wa.address);
  if (wakeups && api->ucp_worker_get_efd(w->worker, &w->efd) != UCS_OK) w->efd = -1;
  for (const auto& [id, cb] :
       {std::make_pair(kAmData, &OnDataMessage), std::make_pair(kAmCredit, &OnCreditMessage)}) {
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
    JR_REQUIRE(s == UCS_OK, Code::kSystem,
               "jax_rccl: UCX refused an active-message handler: ", StatusText(*api, s));
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

bool Worker::Arm() {
  if (efd < 0) return false;
  Progress();
  return api.ucp_worker_arm(worker) == UCS_OK;
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

}  // namespace ucx
}  // namespace comm
}  // namespace jax_rccl
