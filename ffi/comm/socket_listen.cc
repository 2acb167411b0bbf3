// The socket transport's listener, its acceptor thread and the handshake (socket_listen.h).
#include "ffi/comm/socket_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ffi/comm/hmac.h"
#include "ffi/comm/world.h"
#include "ffi/core/thread_name.h"

namespace jax_rccl {
namespace comm {

namespace {

constexpr uint64_t kHelloMagic = 0x6a7263636e657432ull;  // "jrccnet2"
constexpr char kAcceptLabel[] = "jax_rccl socket handshake v1: accept";
constexpr char kConnectLabel[] = "jax_rccl socket handshake v1: connect";
constexpr size_t kNonceBytes = 16;
constexpr char kAck = 'A';

struct Hello {
  uint64_t magic;
  uint64_t group;
  int32_t channel, lo, hi, process;
  char session[64];
  uint8_t nonce[kNonceBytes];
};
static_assert(sizeof(Hello) == 112, "hello");

struct Challenge {
  uint8_t nonce[kNonceBytes];
  uint8_t mac[kDigestBytes];
};

// HMAC(K, label | hello | acceptor nonce).
Digest HandshakeMac(const std::string& secret, const char* label, size_t labelBytes, const Hello& h,
                    const uint8_t* nonce) {
  std::string msg(label, labelBytes);
  msg.append(reinterpret_cast<const char*>(&h), sizeof(h));
  msg.append(reinterpret_cast<const char*>(nonce), kNonceBytes);
  return HmacSha256(secret.data(), secret.size(), msg.data(), msg.size());
}

}  // namespace

int MillisUntil(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return int(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// Reads exactly `n` bytes before `deadline`; 1 done, 0 the peer closed, -1 the deadline or an
// error.
int ReadUntil(int fd, void* buf, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const int left = MillisUntil(deadline);
    if (left <= 0) return -1;
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, std::min(left, 100)) <= 0) continue;
    const ssize_t k = recv(fd, p, n, 0);
    if (k == 0) return 0;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno == ECONNRESET ? 0 : -1;
    }
    p += k;
    n -= size_t(k);
  }
  return 1;
}

bool WriteAll(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      const int left = MillisUntil(deadline);
      if (left <= 0) return false;
      struct pollfd pfd = {fd, POLLOUT, 0};
      poll(&pfd, 1, std::min(left, 100));
      continue;
    }
    p += k;
    n -= size_t(k);
  }
  return true;
}

namespace {

std::string PeerAddress(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return detail::StrCat(host, ":", port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return detail::StrCat("[", host, "]:", port);
}

// One connection in its handshake.
struct Pending {
  int fd = -1;
  std::string peer;  // "address:port"
  Clock::time_point deadline;
  int stage = 0;  // 0 reading the hello, 1 writing the challenge, 2 reading the proof
  Hello hello{};
  Challenge challenge{};
  uint8_t proof[kDigestBytes] = {};
  size_t done = 0;  // bytes of the current stage
};

// A registration of AnswerOnListener: `alive` and the call of `answer` under `mu`.
struct Answering {
  std::mutex mu;
  bool alive = true;
  ListenerAnswer answer;
};

// The process-wide listener: its socket, the acceptor thread and the parked connections.
struct Listener {
  std::mutex mu;
  std::condition_variable cv;  // a connection was parked
  int fd = -1;
  int port = 0;
  std::string address;
  std::map<LinkKey, int> parked;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<Answering>> answering;
  ListenerCounts counts;
  int64_t logged = 0;
};

Listener& TheListener() {
  static Listener* l = new Listener();  // never destroyed: the acceptor thread outlives statics
  return *l;
}

void Drop(Listener& L, Pending& p, const char* why, bool unauthorized) {
  int64_t n;
  {
    std::lock_guard<std::mutex> lock(L.mu);
    ++L.counts.dropped;
    if (unauthorized) ++L.counts.unauthorized;
    n = ++L.logged;
  }
  close(p.fd);  // after counting: whoever sees the close sees the count
  p.fd = -1;
  // The first connections dropped each, then one line per 256 (a flood does not flood the log).
  if (n <= 16 || n % 256 == 0) {
    std::fprintf(stderr,
                 "jax_rccl: WARN: the socket listener dropped a connection from %s: %s (%lld "
                 "dropped so far)\n",
                 p.peer.c_str(), why, static_cast<long long>(n));
  }
}

void Park(Listener& L, Pending& p) {
  const Hello& h = p.hello;
  const LinkKey key(h.group, int(h.channel), int(h.lo), int(h.hi));
  std::shared_ptr<Answering> a;
  {
    std::lock_guard<std::mutex> lock(L.mu);
    auto it = L.answering.find({h.group, int(h.channel)});
    if (it != L.answering.end()) a = it->second;
  }
  if (a != nullptr) {
    // Answered here: a few bytes into an empty send buffer, which does not block for long.
    std::string text;
    {
      std::lock_guard<std::mutex> lock(a->mu);
      if (a->alive) text = a->answer(int(h.lo), int(h.hi));
    }
    text.resize(std::min(text.size(), kAnswerBytes));
    const uint32_t n = uint32_t(text.size());
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(200);
    if (WriteAll(p.fd, &n, sizeof(n), until)) (void)WriteAll(p.fd, text.data(), text.size(), until);
    close(p.fd);
    p.fd = -1;
    std::lock_guard<std::mutex> lock(L.mu);
    ++L.counts.accepted;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(L.mu);
    auto old = L.parked.find(key);
    if (old != L.parked.end()) close(old->second);  // a retry of the same connection
    L.parked[key] = p.fd;
    ++L.counts.accepted;
  }
  p.fd = -1;
  L.cv.notify_all();
}

// Advances one handshake as far as the socket allows: false when it ended (parked or dropped).
bool Advance(Listener& L, Pending& p, const std::string& secret) {
  while (true) {
    if (p.stage == 0 || p.stage == 2) {
      char* buf =
          p.stage == 0 ? reinterpret_cast<char*>(&p.hello) : reinterpret_cast<char*>(p.proof);
      const size_t want = p.stage == 0 ? sizeof(Hello) : sizeof(p.proof);
      const ssize_t k = recv(p.fd, buf + p.done, want - p.done, MSG_DONTWAIT);
      if (k == 0) {
        Drop(L, p, p.stage == 0 ? "it closed before its hello" : "it closed before its proof",
             false);
        return false;
      }
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        Drop(L, p, "a receive failed", false);
        return false;
      }
      p.done += size_t(k);
      if (p.done < want) continue;
      p.done = 0;
      if (p.stage == 0) {
        if (p.hello.magic != kHelloMagic) {
          Drop(L, p, "it is not a jax_rccl peer of this version (wrong hello)", false);
          return false;
        }
        if (!RandomBytes(p.challenge.nonce, kNonceBytes).ok()) {
          Drop(L, p, "no random bytes for the challenge", false);
          return false;
        }
        const Digest mac = HandshakeMac(secret, kAcceptLabel, sizeof(kAcceptLabel) - 1, p.hello,
                                        p.challenge.nonce);
        std::memcpy(p.challenge.mac, mac.data(), kDigestBytes);
        p.stage = 1;
        continue;
      }
      const Digest want2 = HandshakeMac(secret, kConnectLabel, sizeof(kConnectLabel) - 1, p.hello,
                                        p.challenge.nonce);
      if (!ConstantTimeEqual(want2.data(), p.proof, kDigestBytes)) {
        Drop(L, p, "it failed authentication (it does not know this run's secret)", true);
        return false;
      }
      // The acknowledgement (one byte into an empty send buffer: it does not block): the
      // connector counts the connection as made only once it reads it.
      const char ack = kAck;
      if (send(p.fd, &ack, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
        Drop(L, p, "the acknowledgement could not be sent", false);
        return false;
      }
      Park(L, p);
      return false;
    }
    // stage 1: the challenge
    const char* buf = reinterpret_cast<const char*>(&p.challenge);
    const ssize_t k =
        send(p.fd, buf + p.done, sizeof(Challenge) - p.done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      Drop(L, p, "a send failed", false);
      return false;
    }
    p.done += size_t(k);
    if (p.done < sizeof(Challenge)) continue;
    p.done = 0;
    p.stage = 2;
  }
}

void AcceptLoop(Listener* Lp, std::string secret) {
  NameThisThread("jrccl accept");
  Listener& L = *Lp;
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  const auto handshake =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kHandshakeSeconds));
  while (true) {
    fds.clear();
    fds.push_back({L.fd, POLLIN, 0});
    for (const Pending& p : pending) {
      fds.push_back({p.fd, short(p.stage == 1 ? POLLOUT : POLLIN), 0});
    }
    const int rc = poll(fds.data(), nfds_t(fds.size()), 100);
    if (rc < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const Clock::time_point now = Clock::now();
    // The connections in their handshakes first (fds[1 + i] is pending[i]).
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (rc > 0 && fds[1 + i].revents != 0 && !Advance(L, p, secret)) continue;
      if (p.fd >= 0 && now >= p.deadline) {
        Drop(L, p, "no handshake within the time allowed", false);
      }
    }
    pending.erase(
        std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return p.fd < 0; }),
        pending.end());
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    // New connections.
    while (true) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd =
          accept4(L.fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        break;
      }
      if (int(pending.size()) >= kMaxPendingConnections) {
        // The oldest that has not sent a whole hello goes (a peer of the run sends its hello at
        // once, so those are the idle ones); only when every one has, the oldest of all (its
        // connector sees the close before the acknowledgement and connects again).
        auto victim = std::find_if(pending.begin(), pending.end(),
                                   [](const Pending& q) { return q.stage == 0; });
        if (victim == pending.end()) victim = pending.begin();
        Drop(L, *victim, "too many connections in their handshakes", false);
        pending.erase(victim);
      }
      Pending p;
      p.fd = fd;
      p.peer = PeerAddress(ss);
      p.deadline = now + handshake;
      pending.push_back(std::move(p));
      if (!Advance(L, pending.back(), secret)) pending.pop_back();
    }
  }
}

}  // namespace

StatusOr<int> SocketListen(const std::string& address) {
  Listener& L = TheListener();
  std::lock_guard<std::mutex> lock(L.mu);
  if (L.fd >= 0) {
    JR_REQUIRE(address == L.address, Code::kInvalidUsage,
               "jax_rccl: this process's socket listener is bound to ", L.address,
               "; it cannot listen on ", address, " too");
    return L.port;
  }
  std::string secret = SessionSecret();
  JR_REQUIRE(!secret.empty(), Code::kInvalidUsage,
             "jax_rccl: the socket listener needs the run's session secret first "
             "(set_session_secret)");
  JR_REQUIRE(!address.empty(), Code::kInvalidArgument,
             "jax_rccl: the socket listener needs an address to bind to");
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST;
  struct addrinfo* res = nullptr;
  std::string host = address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const int gai = getaddrinfo(host.c_str(), "0", &hints, &res);
  JR_REQUIRE(gai == 0 && res != nullptr, Code::kInvalidArgument, "jax_rccl: cannot listen on '",
             address, "': not a numeric IPv4 or IPv6 address (", gai_strerror(gai),
             "; JAX_RCCL_SOCKET_IFADDR / JAX_RCCL_SOCKET_IFNAME)");
  const bool wildcard =
      (res->ai_family == AF_INET &&
       reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY)) ||
      (res->ai_family == AF_INET6 &&
       IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(res->ai_addr)->sin6_addr));
  if (wildcard) {
    freeaddrinfo(res);
    JR_FAIL(Code::kInvalidArgument, "jax_rccl: cannot listen on '", address,
            "': the listener binds one address of this host, not every interface "
            "(JAX_RCCL_SOCKET_IFADDR / JAX_RCCL_SOCKET_IFNAME)");
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int e = errno;
    freeaddrinfo(res);
    JR_FAIL(Code::kSystem, "jax_rccl: cannot create a TCP socket: ", ErrnoText(e));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (res->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  const int rc = bind(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 || listen(fd, 4096) != 0 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0) {
    const int e = errno;
    close(fd);
    JR_FAIL(Code::kSystem, "jax_rccl: cannot listen on ", address,
            " (is it an address of this host? JAX_RCCL_SOCKET_IFADDR / JAX_RCCL_SOCKET_IFNAME): ",
            ErrnoText(e));
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  L.port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  L.fd = fd;
  L.address = address;
  std::thread(AcceptLoop, &L, std::move(secret)).detach();
  return L.port;
}

std::vector<NetworkInterface> NetworkInterfaces() {
  std::vector<NetworkInterface> v4, v6;
  struct ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return {};
  for (struct ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_name == nullptr) continue;
    char host[INET6_ADDRSTRLEN] = "";
    if (i->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, host,
                sizeof(host));
      v4.push_back({i->ifa_name, host});
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a)) continue;  // needs a scope: not an endpoint for peers
      inet_ntop(AF_INET6, &a, host, sizeof(host));
      v6.push_back({i->ifa_name, host});
    }
  }
  freeifaddrs(all);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

int SocketListenerPort() {
  Listener& L = TheListener();
  std::lock_guard<std::mutex> lock(L.mu);
  return L.fd >= 0 ? L.port : 0;
}

ListenerCounts SocketListenerCounts() {
  Listener& L = TheListener();
  std::lock_guard<std::mutex> lock(L.mu);
  return L.counts;
}

int AcceptFor(const LinkKey& key, Clock::time_point deadline, const std::atomic<bool>* aborted) {
  Listener& L = TheListener();
  std::unique_lock<std::mutex> lock(L.mu);
  while (true) {
    auto it = L.parked.find(key);
    if (it != L.parked.end()) {
      const int fd = it->second;
      L.parked.erase(it);
      return fd;
    }
    if (Clock::now() >= deadline || (aborted != nullptr && aborted->load())) return -1;
    L.cv.wait_for(lock, std::chrono::milliseconds(20));
  }
}

int TakeParkedTo(uint64_t group, int channel, int hi, int* lo) {
  Listener& L = TheListener();
  std::lock_guard<std::mutex> lock(L.mu);
  const LinkKey first(group, channel, std::numeric_limits<int>::min(),
                      std::numeric_limits<int>::min());
  for (auto it = L.parked.lower_bound(first);
       it != L.parked.end() && std::get<0>(it->first) == group && std::get<1>(it->first) == channel;
       ++it) {
    if (std::get<3>(it->first) != hi) continue;
    *lo = std::get<2>(it->first);
    const int fd = it->second;
    L.parked.erase(it);
    return fd;
  }
  return -1;
}

Status ClientHandshake(int fd, const LinkKey& key, int process, const std::string& session,
                       Clock::time_point deadline, const std::string& peer, bool* closed) {
  if (closed != nullptr) *closed = false;
  const std::string secret = SessionSecret();
  JR_REQUIRE(!secret.empty(), Code::kInvalidUsage,
             "jax_rccl: no session secret to authenticate the connection to ", peer,
             " (set_session_secret)");
  Hello h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kHelloMagic;
  h.group = std::get<0>(key);
  h.channel = std::get<1>(key);
  h.lo = std::get<2>(key);
  h.hi = std::get<3>(key);
  h.process = process;
  std::strncpy(h.session, session.c_str(), sizeof(h.session) - 1);
  JR_CHECK(RandomBytes(h.nonce, kNonceBytes));
  if (!WriteAll(fd, &h, sizeof(h), deadline)) {
    const int e = errno;
    if (closed != nullptr) *closed = e == EPIPE || e == ECONNRESET;
    JR_FAIL(Code::kSystem, "jax_rccl: cannot greet ", peer, ": ", ErrnoText(e));
  }
  Challenge c;
  const int got = ReadUntil(fd, &c, sizeof(c), deadline);
  if (got == 0) {
    if (closed != nullptr) *closed = true;
    JR_FAIL(Code::kInvalidUsage, "jax_rccl: ", peer,
            " closed the connection during the handshake (is the process at that endpoint a "
            "process of this run?)");
  }
  JR_REQUIRE(got > 0, Code::kTimeout, "jax_rccl: ", peer,
             " did not answer the handshake in time (its process may be stopped)");
  const Digest want = HandshakeMac(secret, kAcceptLabel, sizeof(kAcceptLabel) - 1, h, c.nonce);
  JR_REQUIRE(ConstantTimeEqual(want.data(), c.mac, kDigestBytes), Code::kInvalidUsage,
             "jax_rccl: the process listening at the endpoint of ", peer,
             " failed authentication: it does not know this run's secret (another program on "
             "that port?); no data was sent to it");
  const Digest proof = HandshakeMac(secret, kConnectLabel, sizeof(kConnectLabel) - 1, h, c.nonce);
  if (!WriteAll(fd, proof.data(), proof.size(), deadline)) {
    const int e = errno;
    if (closed != nullptr) *closed = e == EPIPE || e == ECONNRESET;
    JR_FAIL(Code::kSystem, "jax_rccl: cannot finish the handshake with ", peer, ": ", ErrnoText(e));
  }
  char ack = 0;
  const int acked = ReadUntil(fd, &ack, 1, deadline);
  if (acked == 0) {
    if (closed != nullptr) *closed = true;
    JR_FAIL(Code::kInvalidUsage, "jax_rccl: ", peer,
            " closed the connection before it acknowledged this process's proof (does this "
            "process have the run's secret?)");
  }
  JR_REQUIRE(acked > 0 && ack == kAck, Code::kTimeout, "jax_rccl: ", peer,
             " did not acknowledge the handshake in time (its process may be stopped)");
  return Status::Ok();
}

namespace {
bool SplitEndpoint(const std::string& ep, std::string* host, std::string* port) {
  const size_t colon = ep.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= ep.size()) return false;
  *host = ep.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = ep.substr(colon + 1);
  return true;
}
}  // namespace

Status PrepareStream(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int flags = fcntl(fd, F_GETFL, 0);
  JR_REQUIRE(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, Code::kSystem,
             "jax_rccl: cannot make a socket non-blocking: ", ErrnoText(errno));
  return Status::Ok();
}

namespace {

// connect() of the blocking socket `s` that gives up at `deadline` (or once `aborted`), where a
// plain connect waits for the kernel's SYN retries (minutes when the host is gone or a firewall
// drops the packets): 0, or the error (ETIMEDOUT at the deadline). `s` is blocking again after.
int ConnectUntil(int s, const struct sockaddr* addr, socklen_t len, Clock::time_point deadline,
                 const std::atomic<bool>* aborted) {
  const int flags = fcntl(s, F_GETFL, 0);
  if (flags < 0 || fcntl(s, F_SETFL, flags | O_NONBLOCK) != 0) return errno;
  int err = 0;
  if (connect(s, addr, len) != 0) {
    err = errno;
    while (err == EINPROGRESS || err == EINTR) {
      if (aborted != nullptr && aborted->load()) {
        err = ECANCELED;
        break;
      }
      const int left = MillisUntil(deadline);
      if (left <= 0) {
        err = ETIMEDOUT;
        break;
      }
      struct pollfd pfd = {s, POLLOUT, 0};
      const int k = poll(&pfd, 1, std::min(left, 100));
      if (k < 0 && errno != EINTR) {
        err = errno;
        break;
      }
      if (k > 0) {
        socklen_t n = sizeof(err);
        if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &n) != 0) err = errno;
        break;
      }
    }
  }
  if (err == 0 && fcntl(s, F_SETFL, flags) != 0) err = errno;
  return err;
}

}  // namespace

std::shared_ptr<void> AnswerOnListener(uint64_t group, int channel, ListenerAnswer answer) {
  auto a = std::make_shared<Answering>();
  a->answer = std::move(answer);
  Listener& L = TheListener();
  {
    std::lock_guard<std::mutex> lock(L.mu);
    L.answering[{group, channel}] = a;
  }
  return std::shared_ptr<void>(nullptr, [a, group, channel](void*) {
    Listener& L = TheListener();
    {
      std::lock_guard<std::mutex> lock(L.mu);
      auto it = L.answering.find({group, channel});
      if (it != L.answering.end() && it->second == a) L.answering.erase(it);
    }
    std::lock_guard<std::mutex> lock(a->mu);
    a->alive = false;
  });
}

StatusOr<std::string> AskListener(const std::string& endpoint, const LinkKey& key, int process,
                                  const std::string& session, Clock::time_point deadline,
                                  const std::string& peer, bool* refused) {
  int err = 0;
  StatusOr<int> fd = DialListener(endpoint, key, process, session, deadline, nullptr, peer, &err);
  if (refused != nullptr) *refused = !fd.ok() && err == ECONNREFUSED;
  JR_CHECK(fd.status());
  uint32_t n = 0;
  std::string text;
  int got = ReadUntil(fd.value(), &n, sizeof(n), deadline);
  if (got == 1 && n <= kAnswerBytes) {
    text.resize(n);
    got = n == 0 ? 1 : ReadUntil(fd.value(), &text[0], n, deadline);
  }
  close(fd.value());
  JR_REQUIRE(got == 1 && n <= kAnswerBytes, Code::kTimeout, "no answer from ", peer, " at ",
             endpoint);
  return text;
}

StatusOr<int> DialListener(const std::string& endpoint, const LinkKey& key, int process,
                           const std::string& session, Clock::time_point deadline,
                           const std::atomic<bool>* aborted, const std::string& peer,
                           int* lastErrno) {
  std::string host, portText;
  JR_REQUIRE(SplitEndpoint(endpoint, &host, &portText), Code::kInvalidArgument, "jax_rccl: ", peer,
             " has no socket endpoint (got '", endpoint,
             "'; the world table gives every process a 'host:port')");
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  const int gai = getaddrinfo(host.c_str(), portText.c_str(), &hints, &res);
  JR_REQUIRE(gai == 0 && res != nullptr, Code::kSystem, "jax_rccl: cannot resolve the endpoint ",
             endpoint, " of ", peer, ": ", gai_strerror(gai));
  std::unique_ptr<struct addrinfo, void (*)(struct addrinfo*)> hold(res, freeaddrinfo);
  int lastErr = 0;
  int sleepMs = 1;
  while (true) {
    int fd = -1;
    for (struct addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
      const int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (s < 0) {
        lastErr = errno;
        continue;
      }
      const int err = ConnectUntil(s, a->ai_addr, a->ai_addrlen, deadline, aborted);
      if (err == 0) {
        fd = s;
      } else {
        // An attempt the deadline cut short says less than the answer of the one before.
        if (err != ETIMEDOUT || lastErr == 0) lastErr = err;
        close(s);
      }
      if (lastErrno != nullptr) *lastErrno = err == 0 ? 0 : lastErr;
    }
    if (fd >= 0) {
      // A connection the listener dropped before it acknowledged (a flood of connections evicted
      // it) is made again.
      bool closed = false;
      Status shake = ClientHandshake(fd, key, process, session, deadline,
                                     detail::StrCat(peer, " at ", endpoint), &closed);
      if (shake.ok()) return fd;
      close(fd);
      if (!closed || Clock::now() >= deadline) JR_CHECK(shake);
      lastErr = ECONNRESET;
    }
    if (Clock::now() >= deadline || (aborted != nullptr && aborted->load())) {
      JR_FAIL(Code::kTimeout, "no connection to its listener at ", endpoint, ": ",
              ErrnoText(lastErr));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
    sleepMs = std::min(sleepMs * 2, 100);
  }
}

}  // namespace comm
}  // namespace jax_rccl
