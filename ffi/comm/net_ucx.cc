// The UCX network and JAX_RCCL_NET=auto (net_ucx.h): connection set-up over the authenticated
// socket (offer, answer, the receiver's decision) and the connection ends it hands out.
#include "ffi/comm/net_ucx.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ffi/comm/hmac.h"
#include "ffi/comm/net_stream.h"

namespace jax_rccl {
namespace comm {
namespace {

using ucx::Conn;
using ucx::Worker;

// Marks a UCX (or auto) connection's socket in the handshake's key (the TCP backend's use
// 1 << 24, the host executor's links channels below it).
constexpr int kUcxChannelFlag = 1 << 25;

constexpr uint64_t kOfferMagic = 0x3176786375726a00ull | 'o';   // the offer (sender -> receiver)
constexpr uint64_t kAnswerMagic = 0x3176786375726a00ull | 'a';  // the answer
constexpr uint32_t kOfferHasUcx = 1;         // the sender has UCX (its worker's address follows)
constexpr uint32_t kOfferAuto = 2;           // the sender runs JAX_RCCL_NET=auto
constexpr uint32_t kMaxWireBytes = 1 << 16;  // an address or a message, at most

struct OfferWire {
  uint64_t magic;
  uint32_t flags;
  uint32_t addressBytes;
  uint64_t token;  // credits to the sender carry it
};
struct AnswerWire {
  uint64_t magic;
  uint32_t decision;  // 'U' UCX, 'S' our TCP on this socket, 'E' an error (its text follows)
  uint32_t addressBytes;
  uint64_t token;  // messages to the receiver carry it
  uint32_t textBytes;
  uint32_t pad;
};
static_assert(sizeof(OfferWire) == 24 && sizeof(AnswerWire) == 32, "set-up messages");

std::string UcxTls() {
  const char* t = std::getenv("UCX_TLS");
  return t != nullptr && *t != '\0' ? detail::StrCat("UCX_TLS=", t) : "UCX_TLS unset";
}

// A connection end on UCX.
class UcxComm final : public NetComm {
 public:
  UcxComm(std::shared_ptr<Worker> w, std::unique_ptr<Conn> c) : w_(std::move(w)), c_(std::move(c)) {
    std::lock_guard<std::mutex> lock(w_->mu);
    c_->SetCounter(&bytesMoved_);
  }
  ~UcxComm() override { c_.reset(); }  // not closed in order: aborted (the peer sees a reset)

  bool CloseInOrder() override { return c_->CloseInOrder(); }
  void Abort() override { c_->Abort(); }
  StatusOr<NetMemory*> RegMr(void* data, size_t bytes, NetMemoryType type) override {
    return c_->RegMr(data, bytes, type);
  }
  Status DeregMr(NetMemory* mem) override { return c_->DeregMr(mem); }
  Status Isend(const void* data, size_t bytes, const NetInfo& info, NetMemory* mem,
               NetRequest** request) override {
    JR_REQUIRE(c_->sending(), Code::kInternal,
               "jax_rccl: isend on the receiving end of a connection");
    return c_->Post(const_cast<char*>(static_cast<const char*>(data)), bytes, info, mem, request);
  }
  Status Irecv(void* data, size_t bytes, NetMemory* mem, NetRequest** request) override {
    JR_REQUIRE(!c_->sending(), Code::kInternal,
               "jax_rccl: irecv on the sending end of a connection");
    return c_->Post(static_cast<char*>(data), bytes, NetInfo{}, mem, request);
  }
  Status Test(NetRequest* request, bool* done, size_t* bytes, NetInfo* info) override {
    return c_->Test(request, done, bytes, info);
  }
  Status Poll() override { return c_->Poll(); }
  std::string Transport() const override { return "ucx: " + c_->transport(); }

 private:
  std::shared_ptr<Worker> w_;
  std::unique_ptr<Conn> c_;
};

// Closes a socket unless released.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

class UcxNet final : public Net {
 public:
  UcxNet(NetOptions o, std::shared_ptr<Worker> w, bool autoMode)
      : o_(std::move(o)), w_(std::move(w)), auto_(autoMode) {}

  ~UcxNet() override {
    // Answers no Accept took (a group that never got that far): their sockets go.
    for (auto& [id, a] : answered_) {
      if (a.fd >= 0) close(a.fd);
    }
  }

  const char* name() const override { return auto_ ? "auto" : "ucx"; }

  // A `ucx` network whose worker has its event descriptor: the caller sleeps on it once armed
  // (UCX's progress comes in Test, Post and here, under the worker's lock).
  bool SleepOnFds() override { return !auto_ && w_ != nullptr && w_->efd >= 0; }
  bool PollFds(std::vector<struct pollfd>* fds) override {
    std::lock_guard<std::mutex> lock(w_->mu);
    if (!w_->Arm()) return false;
    fds->push_back(pollfd{w_->efd, POLLIN, 0});
    return true;
  }
  void PumpFds(const std::vector<struct pollfd>& fds) override {
    (void)fds;
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->Progress();
  }

  Status Listen(const NetKey& key) override {
    JR_REQUIRE(SocketListenerPort() > 0, Code::kInvalidUsage,
               "jax_rccl: this process carries network connections but has no socket listener "
               "(the bootstrap starts it when the run needs sockets: _jax_rccl.socket_listen)");
    std::lock_guard<std::mutex> lock(setupMu_);
    listening_.insert(Id(key));
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<NetComm>> Connect(const NetKey& key, const std::string& endpoint,
                                             Clock::time_point deadline,
                                             const std::string& peer) override;
  StatusOr<std::unique_ptr<NetComm>> Accept(const NetKey& key, Clock::time_point deadline,
                                            const std::string& peer) override;

 private:
  using KeyId = std::tuple<uint64_t, int, int, int>;
  // A receiving end answered (Answer), until its Accept takes it.
  struct Answered {
    Status error;
    char decision = 'E';
    int fd = -1;
    std::unique_ptr<Conn> conn;  // 'U'
    std::string what;            // 'U': the transports; 'S': why TCP
  };

  static KeyId Id(const NetKey& k) { return KeyId(k.group, k.channel, k.from, k.to); }
  static LinkKey Link(const KeyId& id) {
    return LinkKey(std::get<0>(id), kUcxChannelFlag | std::get<1>(id), std::get<2>(id),
                   std::get<3>(id));
  }

  // Answers every key this network listens for whose sender has connected (setupMu_ held), and
  // makes UCX's progress: a process waiting in Connect or Accept answers its peers meanwhile.
  void Service(Clock::time_point deadline);
  // The receiving end's side of the set-up on the authenticated socket `fd` (setupMu_ held).
  Answered Answer(const KeyId& id, int fd, Clock::time_point deadline);
  std::shared_ptr<tcp::Helper> NextHelper();
  void Log(const KeyId& id, bool send, const std::string& peer, const std::string& what) const;
  std::string Choice(char decision, const std::string& what) const;

  NetOptions o_;
  std::shared_ptr<Worker> w_;  // null: this process has no UCX (auto only)
  bool auto_;
  std::mutex setupMu_;  // set-up one call at a time; guards what follows
  std::set<KeyId> listening_;
  std::map<KeyId, Answered> answered_;
  std::vector<std::shared_ptr<tcp::Helper>> helpers_;
  size_t next_ = 0;
};

std::string UcxNet::Choice(char decision, const std::string& what) const {
  if (decision == 'U') {
    return detail::StrCat("UCX ", w_->api.version, " over ", what,
                          auto_ ? " (JAX_RCCL_NET=auto: faster than TCP)" : " (JAX_RCCL_NET=ucx)");
  }
  return detail::StrCat("our TCP (JAX_RCCL_NET=auto: ", what, ")");
}

void UcxNet::Log(const KeyId& id, bool send, const std::string& peer,
                 const std::string& what) const {
  if (!o_.info) return;
  std::fprintf(stderr, "jax_rccl INFO net: channel %d, rank %d -> rank %d (%s %s): %s\n",
               std::get<1>(id), std::get<2>(id), std::get<3>(id), send ? "to" : "from",
               peer.c_str(), what.c_str());
}

std::shared_ptr<tcp::Helper> UcxNet::NextHelper() {
  if (o_.threads <= 0) return nullptr;
  if (helpers_.empty()) {
    for (int t = 0; t < o_.threads; ++t) helpers_.push_back(std::make_shared<tcp::Helper>());
  }
  return helpers_[next_++ % helpers_.size()];
}

void UcxNet::Service(Clock::time_point deadline) {
  for (const KeyId& id : listening_) {
    if (answered_.count(id) != 0) continue;
    const int fd = AcceptFor(Link(id), Clock::now(), nullptr);
    if (fd >= 0) answered_[id] = Answer(id, fd, deadline);
  }
  if (w_ != nullptr) {
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->Progress();
  }
}

UcxNet::Answered UcxNet::Answer(const KeyId& id, int fd, Clock::time_point deadline) {
  Answered a;
  FdGuard guard{fd};
  const std::string sender = detail::StrCat("rank ", std::get<2>(id));
  const std::string receiver = detail::StrCat("rank ", std::get<3>(id));
  // The offer follows the handshake at once.
  const Clock::time_point by = std::min(
      deadline, Clock::now() + std::chrono::milliseconds(int64_t(kHandshakeSeconds * 1e3)));
  OfferWire offer{};
  std::string address;
  if (ReadUntil(fd, &offer, sizeof(offer), by) != 1 || offer.magic != kOfferMagic ||
      offer.addressBytes > kMaxWireBytes) {
    a.error = Status(Code::kSystem, detail::StrCat("jax_rccl: ", sender,
                                                   " sent no valid offer for "
                                                   "its network connection (channel ",
                                                   std::get<1>(id), ")"));
    return a;
  }
  address.resize(offer.addressBytes);
  if (ReadUntil(fd, address.data(), address.size(), by) != 1) {
    a.error = Status(Code::kSystem, detail::StrCat("jax_rccl: ", sender, "'s offer broke off"));
    return a;
  }
  std::string text;  // 'E': the error; 'S': why TCP
  uint64_t token = 0;
  std::unique_ptr<Conn> conn;
  if (w_ == nullptr) {
    a.decision = 'S';
    text = "this process has no UCX";
  } else if ((offer.flags & kOfferHasUcx) == 0) {
    a.decision = auto_ ? 'S' : 'E';
    text = auto_ ? detail::StrCat(sender, " has no UCX")
                 : detail::StrCat("jax_rccl: ", receiver, " runs JAX_RCCL_NET=ucx, but ", sender,
                                  " has no UCX (every process of a run sets the same "
                                  "JAX_RCCL_NET, and with ucx each needs UCX)");
  } else {
    (void)RandomBytes(&token, sizeof(token));
    conn = std::make_unique<Conn>(w_, false, sender, std::get<1>(id), -1, token);
    std::lock_guard<std::mutex> lock(w_->mu);
    std::string transports;
    bool fast = false;
    StatusOr<ucp_ep_h> ep = w_->Connect(address, &transports, &fast);
    if (!ep.ok()) {
      a.decision = auto_ ? 'S' : 'E';
      text = auto_ ? detail::StrCat("UCX finds no transport to it: ", ep.status().message())
                   : detail::StrCat("jax_rccl: UCX finds no transport between ", sender, " and ",
                                    receiver, ": ", ep.status().message(), " (", UcxTls(), ")");
    } else if (auto_ && !fast) {
      a.decision = 'S';
      text = detail::StrCat("UCX offers only ", transports, " between these hosts");
      w_->CloseEndpoint(ep.value(), false);
    } else {
      a.decision = 'U';
      w_->conns[token] = conn.get();
      conn->Attach(ep.value(), offer.token);
      conn->SetTransport(transports);
      a.what = transports;
    }
  }
  if (a.decision == 'S') a.what = text;
  AnswerWire answer{kAnswerMagic, uint32_t(a.decision), 0, token, 0, 0};
  const std::string& mine = a.decision == 'U' ? w_->address : std::string();
  answer.addressBytes = uint32_t(mine.size());
  answer.textBytes = uint32_t(std::min<size_t>(text.size(), kMaxWireBytes));
  if (!WriteAll(fd, &answer, sizeof(answer), by) || !WriteAll(fd, mine.data(), mine.size(), by) ||
      !WriteAll(fd, text.data(), answer.textBytes, by)) {
    a.error = Status(Code::kSystem, detail::StrCat("jax_rccl: cannot answer ", sender,
                                                   "'s network connection: ", ErrnoText(errno)));
    return a;
  }
  if (a.decision == 'E') {
    a.error = Status(Code::kUnsupported, text);
    return a;
  }
  if (a.decision == 'U') {
    std::lock_guard<std::mutex> lock(w_->mu);
    conn->SetFd(guard.release());
    a.conn = std::move(conn);
    return a;
  }
  Status ready = PrepareStream(fd);
  if (!ready.ok()) {
    a.error = ready;
    return a;
  }
  a.fd = guard.release();
  return a;
}

StatusOr<std::unique_ptr<NetComm>> UcxNet::Connect(const NetKey& key, const std::string& endpoint,
                                                   Clock::time_point deadline,
                                                   const std::string& peer) {
  std::lock_guard<std::mutex> setup(setupMu_);
  const KeyId id = Id(key);
  JR_ASSIGN_OR_RETURN(
      int fd, DialListener(endpoint, Link(id), o_.process, o_.session, deadline, nullptr, peer));
  FdGuard guard{fd};
  uint64_t token = 0;
  JR_CHECK(RandomBytes(&token, sizeof(token)));
  std::unique_ptr<Conn> conn;
  OfferWire offer{kOfferMagic, auto_ ? kOfferAuto : 0u, 0, token};
  if (w_ != nullptr) {
    // Registered before the offer goes: the receiver's first credits may come before its answer.
    conn = std::make_unique<Conn>(w_, true, peer, key.channel, -1, token);
    std::lock_guard<std::mutex> lock(w_->mu);
    w_->conns[token] = conn.get();
    offer.flags |= kOfferHasUcx;
    offer.addressBytes = uint32_t(w_->address.size());
  }
  const std::string mine = w_ != nullptr ? w_->address : std::string();
  JR_REQUIRE(WriteAll(fd, &offer, sizeof(offer), deadline) &&
                 WriteAll(fd, mine.data(), mine.size(), deadline),
             Code::kSystem, "jax_rccl: cannot offer ", peer,
             " a network connection: ", ErrnoText(errno));
  // The answer, while this process answers its own peers (they may be connecting to it first).
  while (true) {
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, 1) > 0) break;
    Service(deadline);
    JR_REQUIRE(Clock::now() < deadline, Code::kTimeout, "no answer from ", peer,
               " to the set-up of channel ", key.channel, " (did its process reach this group?)");
  }
  AnswerWire answer{};
  JR_REQUIRE(ReadUntil(fd, &answer, sizeof(answer), deadline) == 1 &&
                 answer.magic == kAnswerMagic && answer.addressBytes <= kMaxWireBytes &&
                 answer.textBytes <= kMaxWireBytes,
             Code::kSystem, "jax_rccl: ", peer,
             " gave no valid answer to the set-up of its network connection (channel ", key.channel,
             "; did its process exit?)");
  std::string address(answer.addressBytes, '\0'), text(answer.textBytes, '\0');
  JR_REQUIRE(ReadUntil(fd, address.data(), address.size(), deadline) == 1 &&
                 ReadUntil(fd, text.data(), text.size(), deadline) == 1,
             Code::kSystem, "jax_rccl: ", peer, "'s answer broke off");
  if (answer.decision == 'E') JR_FAIL(Code::kUnsupported, text);
  if (answer.decision == 'S') {
    JR_CHECK(PrepareStream(fd));
    Log(id, true, peer, Choice('S', text));
    return tcp::MakeStreamComm(guard.release(), true, peer, NextHelper(), key.channel);
  }
  JR_REQUIRE(answer.decision == 'U' && conn != nullptr, Code::kSystem, "jax_rccl: ", peer,
             " answered the set-up of channel ", key.channel,
             " with a decision this process "
             "cannot follow (do the processes run the same build?)");
  {
    std::lock_guard<std::mutex> lock(w_->mu);
    std::string transports;
    bool fast = false;
    StatusOr<ucp_ep_h> ep = w_->Connect(address, &transports, &fast);
    if (!ep.ok()) {
      // The receiver has its end: reset the socket so that it fails too, naming this one.
      const struct linger now = {1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
      JR_FAIL(Code::kSystem, "jax_rccl: UCX finds no transport from this process to ", peer, ": ",
              ep.status().message(), " (", UcxTls(), ")");
    }
    conn->Attach(ep.value(), answer.token);
    conn->SetTransport(transports);
    conn->SetFd(guard.release());
  }
  Log(id, true, peer, Choice('U', conn->transport()));
  return std::unique_ptr<NetComm>(std::make_unique<UcxComm>(w_, std::move(conn)));
}

StatusOr<std::unique_ptr<NetComm>> UcxNet::Accept(const NetKey& key, Clock::time_point deadline,
                                                  const std::string& peer) {
  std::lock_guard<std::mutex> setup(setupMu_);
  const KeyId id = Id(key);
  listening_.insert(id);
  while (answered_.count(id) == 0) {
    Service(deadline);
    if (answered_.count(id) != 0) break;
    JR_REQUIRE(Clock::now() < deadline, Code::kTimeout, "no network connection from ", peer,
               " for channel ", key.channel, " (did its process reach this group?)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  Answered a = std::move(answered_[id]);
  answered_.erase(id);
  listening_.erase(id);
  JR_CHECK(a.error);
  if (a.decision == 'S') {
    Log(id, false, peer, Choice('S', a.what));
    return tcp::MakeStreamComm(a.fd, false, peer, NextHelper(), key.channel);
  }
  {
    std::lock_guard<std::mutex> lock(w_->mu);
    a.conn->SetPeer(peer);
  }
  Log(id, false, peer, Choice('U', a.what));
  return std::unique_ptr<NetComm>(std::make_unique<UcxComm>(w_, std::move(a.conn)));
}

}  // namespace

StatusOr<std::unique_ptr<Net>> MakeUcxNet(const NetOptions& options, const ucx::Api* api,
                                          bool autoMode) {
  tcp::RaiseOpenFileLimit();  // auto's connections on TCP, UCX's on its TCP transport too
  std::shared_ptr<Worker> w;
  if (api != nullptr) {
    JR_ASSIGN_OR_RETURN(w, Worker::Create(api, options.sleeps && !autoMode));
  }
  JR_REQUIRE(w != nullptr || autoMode, Code::kInternal, "jax_rccl: a UCX network without UCX");
  return std::unique_ptr<Net>(std::make_unique<UcxNet>(options, std::move(w), autoMode));
}

}  // namespace comm
}  // namespace jax_rccl
