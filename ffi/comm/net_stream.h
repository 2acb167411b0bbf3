// TCP streams that carry the network interface's channels (the TCP backend, net_socket.cc, maps
// its connections onto them).
//
// A Stream is one TCP socket carrying, in one direction of data, the messages of one or more
// channels between two ranks (a Lane each); the other direction carries the receiver's credits
// and acknowledgements.
//
// Credits. A sender writes a channel's message only into a receive its receiver posted: the
// receives posted go back to the sender as credits on the same socket (announced half a window
// at a time, or at once when the sender holds less than half), and a message takes one. So no
// message ever waits in a stream for a receive: a channel whose receiver does not consume cannot
// hold the other channels of its stream behind it, and around a ring of hosts the streams cannot
// close into a cycle of full buffers.
//
// Framing: a 56-byte header (magic, channel, bytes, info) and, for a message, its bytes. Magics:
// a message; a credit (`bytes`: receives posted); a channel's close (its sender closed it in
// order: nothing more comes on it, and receives posted ahead stay pending without an error); the
// close's acknowledgement (the receiver sends nothing more on that channel). A sending end closes
// its socket only once every channel on it is acknowledged, so the socket never closes over
// unread bytes (which resets it and may drop what the peer has not read); a receiving end closes
// at once (its peer, still sending, then fails naming it). Requests of a channel progress in
// order; the messages of a stream's channels go out round robin, one whole message at a time.
// Frames for a channel this end has not opened yet (a credit, a close) wait in its lane.
//
// Helper threads move the bytes (NCCL's socket transport, NCCL_SOCKET_NTHREADS): each stream
// belongs to one helper, which polls its streams' sockets and pumps those that are ready; the
// proxy's Test then only looks, and never waits for a copy in progress (a stream's socket calls
// run under a lock of their own, io_, not the one its posts and tests take: with one lock, the
// proxy's single thread stalled on every busy connection in turn). Without a helper, Test pumps.
// A post rings its helper only for something to write that its poll() does not wait for yet.
//
// Faults: a stream that ends without every channel closed in order (the sender's process died),
// or is reset (Abort of any of its channels, or a channel's end destroyed without closing in
// order), fails every channel on it with an error naming the peer; so does a malformed header, a
// message for a channel without a posted receive (credits broken), or a message larger than that
// receive.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ffi/comm/net.h"

namespace jax_rccl {
namespace comm {
namespace tcp {

// Channels below this share streams when the network has S > 0 (others, such as the GPU
// communicator's record exchange, keep a stream of their own).
constexpr int kSharedChannels = 1 << 16;

// How long a helper's poll() waits when nothing rings it, in ms (100): a safety net only, as
// every event a helper acts on either rings it or comes on a socket it polls. Tests raise it, so
// that an event nothing rings for shows as a stall.
void SetHelperPollTimeoutMs(int ms);

struct MessageHeader {
  uint32_t magic;
  uint32_t channel;
  uint64_t bytes;
  NetInfo info;
};
static_assert(sizeof(MessageHeader) == 56, "message header");

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

// A thread that moves the bytes of its streams: one poll() over their sockets (and an eventfd a
// new request rings), then a pump of each that is ready.
class Helper {
 public:
  // `progressFd` (an eventfd, or -1): written after every round that pumped a ready socket
  // (Net::SetProgressFd).
  explicit Helper(int progressFd = -1);
  ~Helper();
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;
  void Add(Stream* s);
  // Once it returns, the helper no longer touches `s`.
  void Remove(Stream* s);
  void Wake();

 private:
  void Loop();

  int wake_;
  int progressFd_;
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
         int index);
  // Every channel's end went away: closed already, or reset now (not closed in order).
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool sending() const { return send_; }

  // Without a helper, the caller sleeps on the sockets (Net::PollFds) and pumps those poll()
  // finds ready (Pump): Post then writes at once what it makes writable, and Test only looks.
  void SetCallerPolls() { callerPolls_ = true; }

  // A channel's end on this stream (mu_ not held), taking over what the peer's frames for it
  // left (credits, a close). Null: the channel was opened on this end before.
  Lane* Attach(int channel, std::atomic<uint64_t>* moved);

  // What the helper polls this stream's socket for (0: nothing), and the socket.
  short Wants(int* fd);
  // The socket (-1 once closed).
  int Fd() {
    std::lock_guard<std::mutex> lock(mu_);
    return fd_;
  }

  // The helper's turn once poll() said the socket is ready (or Test's, without helpers): moves
  // what the socket takes or holds. The socket calls run under io_ only, so the proxy's posts
  // and tests (mu_) never wait for a copy in progress.
  // `readable`: whether to read (poll() said the socket has something, or the caller cannot
  // tell).
  void Pump(bool readable = true);

  Status Post(Lane* lane, char* data, size_t bytes, const NetInfo& info, NetRequest** request);

  Status Test(Lane* lane, NetRequest* request, bool* done, size_t* bytes, NetInfo* info);

  Status Poll();

  // Without blocking: true once `lane` is closed (see NetComm::CloseInOrder).
  bool CloseInOrder(Lane* lane);

  // Resets the stream (the peer's channels on it fail naming this end); `lane` is let go.
  void Abort(Lane* lane);

 private:
  void Fail(const Status& s);

  // Channel `channel`'s lane (made on first use), or null when this stream does not carry it.
  // mu_ held.
  Lane* LaneLocked(int64_t channel);

  // Closes the socket so that the peer sees it reset (an error naming this end). io_, mu_ held.
  void ResetLocked();

  // io_ and mu_ held. A message partly read into one of the lane's receives reads on into
  // nothing (the stream's other channels go on); a sending lane is detached only once its close
  // header is out or the stream is reset, so no message of its is partly written.
  void DetachLocked(Lane* lane);

  // Receiving end: whether the receives posted since the last credit are to be announced: once
  // half the window has gathered, or when the sender holds less than half (a credit for every
  // receive would cost a write, a read and a wake-up per step at each end).
  bool CreditDueLocked(const Lane& l) const;

  // Whether there is something to write: a message with a credit, a close header, credits.
  bool WantsOutLocked() const;

  void CountLocked(Lane* lane, size_t n);

  // Picks the next message to write, round robin over the channels: the oldest unsent message
  // of a channel holding a credit, or a channel's close header. mu_ held; false: none.
  bool NextOutLocked();

  // Sending end: reads the credits that arrived, then writes what the socket takes. io_ held.
  Status PumpSend(bool readable);

  // Sending end: takes the credits that arrived. io_ held.
  Status ReadCredits();

  // Receiving end: writes the credits of the receives posted, then reads messages into the posted
  // receives, oldest first per channel, as far as data has arrived. io_ held.
  Status PumpRecv(bool readable);

  // Receiving end: the stream ended (`err` 0) or its socket failed with `err`. Only the end of the
  // stream once every channel still held was closed in order (the sender may close before a last
  // credit reaches it); else an error naming the peer.
  Status EndedOrFailed(int err);

  // A header arrived: find where its bytes go. mu_ held.
  Status TakeHeaderLocked();

  // Receiving end: announces the receives posted since the last credit, a header per channel.
  // io_ held.
  Status WriteCredits();

  // io_: held by the thread moving bytes (the socket calls, the out_/in_ state below) and by
  // whoever closes the socket; taken before mu_. mu_: guards the rest (the proxy posts, tests
  // and polls under it alone).
  std::mutex io_;
  std::mutex mu_;
  int fd_;
  bool send_;
  std::string peer_;
  std::shared_ptr<Helper> helper_;  // null: Test pumps (or the caller: callerPolls_)
  bool callerPolls_ = false;
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

// A connection's end on a stream of its own over `fd` (connected, authenticated and ready:
// PrepareStream), carrying channel `channel` (net_socket.cc; JAX_RCCL_NET=auto's connections on
// TCP, net_ucx.cc).
std::unique_ptr<NetComm> MakeStreamComm(int fd, bool send, std::string peer,
                                        std::shared_ptr<Helper> helper, int channel);

// Raises this process's soft limit of open files to the hard one (at most 2^20), once: a group
// across many hosts holds a socket per channel each way and rank of another host.
void RaiseOpenFileLimit();

}  // namespace tcp
}  // namespace comm
}  // namespace jax_rccl
