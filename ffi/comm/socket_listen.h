// The socket transport's listener and the handshake every connection starts with.
//
// A process listens only when its run needs sockets (a group across hosts, or
// JAX_RCCL_TRANSPORT=socket), bound to the one address it advertises (jax_rccl/_bootstrap.py picks
// it: loopback when every process shares this host, else JAX_RCCL_SOCKET_IFADDR, the address of
// JAX_RCCL_SOCKET_IFNAME, or the interface that reaches JAX's coordinator).
//
// Handshake (mutual challenge-response over the run's secret K, world.h; nothing else of the
// connection is trusted before it ends):
//   connector -> acceptor  Hello: magic, group, channel, ranks (lo, hi), process, session, nonce Nc
//   acceptor -> connector  Challenge: nonce Na, HMAC-SHA-256(K, "accept" label | Hello | Na)
//   connector -> acceptor  Proof: HMAC-SHA-256(K, "connect" label | Hello | Na)
//   acceptor -> connector  one acknowledgement byte, once the proof checked out
// Each side checks the other's MAC (in constant time) before it sends or accepts a byte of data;
// the fresh nonces make a recorded handshake useless, and the labels keep one side's MAC from
// serving as the other's. A connection that fails, or does not finish within
// kHandshakeSeconds, is closed and logged (WARN); connections are served concurrently by one
// acceptor thread (non-blocking, at most kMaxPendingConnections at once: beyond that the oldest
// that has not sent its hello is dropped, else the oldest), so idle or slow clients cannot delay
// a job's connections; a connector whose connection was dropped before the acknowledgement
// connects again until its deadline. Authenticated
// connections are parked until their communicator claims them (AcceptFor). After the handshake,
// the stream itself has no per-message protection: an on-path attacker of the network is out of
// scope (docs/multiprocess.md, Security).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ffi/core/clock.h"
#include "ffi/core/status.h"

namespace jax_rccl {
namespace comm {

constexpr double kHandshakeSeconds = 10.0;
constexpr int kMaxPendingConnections = 256;

// Blocking I/O on a socket with a deadline (the handshakes' and the set-up messages' of the
// network backends): milliseconds left until `t` (0 when past); exactly `n` bytes read before
// `deadline` (1 done, 0 the peer closed or reset it, -1 the deadline or another error); all `n`
// bytes written before `deadline` (false on an error or the deadline).
int MillisUntil(Clock::time_point t);
int ReadUntil(int fd, void* buf, size_t n, Clock::time_point deadline);
bool WriteAll(int fd, const void* buf, size_t n, Clock::time_point deadline);

// Starts this process's listener once, bound to `address` (a numeric IPv4 or IPv6 address) on an
// ephemeral port, and returns the port; a later call with the same address returns the same port.
// Requires the session secret (SetSessionSecret).
StatusOr<int> SocketListen(const std::string& address);
// The listener's port, or 0 when this process does not listen.
int SocketListenerPort();

// This host's interfaces with an address (IPv4 first, then IPv6 other than link-local), for
// JAX_RCCL_SOCKET_IFNAME.
struct NetworkInterface {
  std::string name;
  std::string address;  // numeric
};
std::vector<NetworkInterface> NetworkInterfaces();

// The listener's counts, for tests and messages.
struct ListenerCounts {
  int64_t accepted = 0;      // connections that completed the handshake
  int64_t dropped = 0;       // connections closed before (failed, timed out, too many)
  int64_t unauthorized = 0;  // of those, a MAC that did not match
};
ListenerCounts SocketListenerCounts();

// (group, channel, lo, hi): the connection of channel `channel` between ranks lo < hi of a group.
using LinkKey = std::tuple<uint64_t, int, int, int>;

// Waits for the authenticated connection `key` until `deadline` (or `aborted`); its fd (blocking
// mode unspecified), or -1.
int AcceptFor(const LinkKey& key, Clock::time_point deadline, const std::atomic<bool>* aborted);

// Without waiting: the first parked connection of (group, channel, any lo, `hi`), its fd (*lo: its
// lo), or -1 when none is parked.
int TakeParkedTo(uint64_t group, int channel, int hi, int* lo);

// Runs the connector's side of the handshake on the connected socket `fd` for `key`, as
// `process`, until `deadline`. Errors: kTimeout (no answer in time), kInvalidUsage (the listener
// could not prove the secret, or closed the connection: it refused this process's proof); `peer`
// names the rank in messages.
// *closed (when given) says the listener closed the connection before the end (dropped it, e.g.
// evicted under a flood of connections): the caller may connect again.
Status ClientHandshake(int fd, const LinkKey& key, int process, const std::string& session,
                       Clock::time_point deadline, const std::string& peer, bool* closed = nullptr);

// Channels the listener answers itself instead of parking their connections: once the handshake
// of (group, channel, lo, hi) checks out, it writes `answer(lo, hi)` (at most kAnswerBytes, after
// its length as 4 bytes) and closes the connection. The answer comes from the acceptor thread, so
// a process whose own threads are blocked still answers (the CPU runtime's status queries,
// ffi/cpu/net_links.h). The registration lasts as long as the returned handle; destroying it waits
// for an answer in progress.
using ListenerAnswer = std::function<std::string(int lo, int hi)>;
constexpr size_t kAnswerBytes = 16 << 10;
std::shared_ptr<void> AnswerOnListener(uint64_t group, int channel, ListenerAnswer answer);
// Dials `endpoint`'s listener for `key` (DialListener, until `deadline`) and reads its answer.
// *refused (when given) says the last connection was refused: no process listens there any more.
StatusOr<std::string> AskListener(const std::string& endpoint, const LinkKey& key, int process,
                                  const std::string& session, Clock::time_point deadline,
                                  const std::string& peer, bool* refused = nullptr);

// Readies a connected stream for a progress loop: TCP_NODELAY, non-blocking.
Status PrepareStream(int fd);

// Connects to the listener at `endpoint` ("host:port", an IPv6 host in brackets) and runs the
// handshake for `key` (ClientHandshake), connecting again after a refused connection or a
// handshake the listener dropped, until `deadline` (or `aborted`): the connected fd (blocking).
// Errors: kInvalidArgument (not "host:port"), kSystem (the host does not resolve), the
// handshake's, and kTimeout whose message is the last connection error ("no connection to its
// listener at <endpoint>: <errno>"), which callers word into their own.
// *lastErrno (when given): the last connection attempt's error (0 when one connected).
StatusOr<int> DialListener(const std::string& endpoint, const LinkKey& key, int process,
                           const std::string& session, Clock::time_point deadline,
                           const std::atomic<bool>* aborted, const std::string& peer,
                           int* lastErrno = nullptr);

}  // namespace comm
}  // namespace jax_rccl
