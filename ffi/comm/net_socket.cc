// The TCP backend of the network interface (net.h): its connections on TCP streams
// (net_stream.h).
//
// A connection (NetComm) is one channel's end (a Lane) on a Stream from the sender's process to
// the receiver's, opened by the sender through the socket transport's listener and its
// authenticated handshake (the key names the group, the stream, the sender and the receiver,
// with a flag that keeps it apart from the host executor's links). With `streams` S > 0, the
// channels c < kSharedChannels of a pair of ranks share S streams (stream c % S), so fewer sockets
// carry the same channels (NCCL's socket transport goes the other way: several sockets per
// connection); with S = 0, and for other channels (the GPU communicator's record exchange), every
// channel has a stream of its own. Streams are shared by the connections that hold them and go
// when the last one does.
#include <sys/resource.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "ffi/comm/net.h"
#include "ffi/comm/net_stream.h"

namespace jax_rccl {
namespace comm {
namespace {

using tcp::Helper;
using tcp::kSharedChannels;
using tcp::Lane;
using tcp::Stream;

// Marks a network stream in the handshake's key (the host executor's socket links use channels
// below it); kNetStreamFlag marks a stream shared by channels (its index below it).
constexpr int kNetChannelFlag = 1 << 24;
constexpr int kNetStreamFlag = 1 << 23;

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

  Status Isend(const void* data, size_t bytes, const NetInfo& info, NetMemory*,
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
    return stream_->Post(lane_, static_cast<char*>(data), bytes, NetInfo{}, request);
  }
  Status Test(NetRequest* request, bool* done, size_t* bytes, NetInfo* info) override {
    JR_REQUIRE(!closed_, Code::kInternal, "jax_rccl: test on a closed connection");
    return stream_->Test(lane_, request, done, bytes, info);
  }
  Status Poll() override {
    if (closed_) return Status::Ok();
    return stream_->Poll();
  }
  std::string Transport() const override { return "socket"; }

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
  bool SleepOnFds() override {
    std::lock_guard<std::mutex> lock(mu_);
    callerPolls_ = threads_ <= 0 && streams_by_key_.empty();
    return callerPolls_;
  }
  // Without helpers Test pumps: the caller sleeps on the streams' sockets.
  bool PollFds(std::vector<struct pollfd>* fds) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!callerPolls_) return false;
    for (auto& [id, weak] : streams_by_key_) {
      std::shared_ptr<Stream> s = weak.lock();
      if (s == nullptr) continue;
      int fd = -1;
      const short events = s->Wants(&fd);
      if (events != 0 && fd >= 0) fds->push_back(pollfd{fd, events, 0});
    }
    return true;
  }
  void PumpFds(const std::vector<struct pollfd>& fds) override {
    std::vector<std::pair<std::shared_ptr<Stream>, bool>> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, weak] : streams_by_key_) {
        std::shared_ptr<Stream> s = weak.lock();
        if (s == nullptr) continue;
        const int fd = s->Fd();
        for (const struct pollfd& p : fds) {
          if (p.fd == fd && p.revents != 0) {
            ready.emplace_back(s, (p.revents & (POLLIN | POLLERR | POLLHUP)) != 0);
          }
        }
      }
    }
    for (auto& [s, readable] : ready) s->Pump(readable);
  }
  // Only the helpers pump in the background; without them Test does (and must be polled).
  bool SetProgressFd(int fd) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (threads_ <= 0 || !helpers_.empty()) return false;
    progressFd_ = fd;
    return true;
  }

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
          for (int t = 0; t < threads_; ++t) {
            helpers_.push_back(std::make_shared<Helper>(progressFd_));
          }
        }
        helper = helpers_[next_++ % helpers_.size()];
      }
      stream = std::make_shared<Stream>(fd, send, peer, helper, index < 0 ? 0 : streams_,
                                        index < 0 ? key.channel : index);
      if (callerPolls_) stream->SetCallerPolls();
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
  int progressFd_ = -1;       // SetProgressFd's, given to the helpers
  bool callerPolls_ = false;  // SleepOnFds: the caller polls the sockets and pumps them
  size_t next_ = 0;
  std::map<std::tuple<uint64_t, int, bool, int, int, bool>, std::weak_ptr<Stream>> streams_by_key_;
};

}  // namespace

namespace tcp {

// A group across hosts holds a socket per channel each way and rank of another host (and an
// eventfd per helper): a job of many hosts passes the usual soft limit of 1024 open files. The
// soft limit goes up to the hard one (at most 2^20), once per process, as `ulimit -n` would.
void RaiseOpenFileLimit() {
  static std::once_flag once;
  std::call_once(once, []() {
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    const rlim_t want = lim.rlim_max == RLIM_INFINITY ? rlim_t(1) << 20 : lim.rlim_max;
    if (lim.rlim_cur >= want) return;
    lim.rlim_cur = want;
    (void)setrlimit(RLIMIT_NOFILE, &lim);
  });
}

std::unique_ptr<NetComm> MakeStreamComm(int fd, bool send, std::string peer,
                                        std::shared_ptr<Helper> helper, int channel) {
  auto stream = std::make_shared<Stream>(fd, send, std::move(peer), std::move(helper), 0, channel);
  auto comm = std::make_unique<SocketComm>(std::move(stream));
  (void)comm->Attach(channel);  // a fresh stream: its one channel is free
  return comm;
}

}  // namespace tcp

std::unique_ptr<Net> MakeSocketNet(std::string session, int process, int threads, int streams) {
  tcp::RaiseOpenFileLimit();
  return std::make_unique<SocketNet>(std::move(session), process, threads, streams);
}

}  // namespace comm
}  // namespace jax_rccl
