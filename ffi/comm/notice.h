// Failure notices: how a process tells the processes of its group on other hosts why its
// communicator failed.
//
// The processes of one host share a failure's reason through their group's segment (shm.h). Across
// hosts, a failing process resets its network connections (proxy.h), which tells the peers only
// that a rank went away, and a peer whose kernels wait on nothing from that rank hears nothing at
// all. So before it resets them, the failing process dials the listener of every process of its
// group on another host (socket_listen.h: the authenticated handshake, so a stranger can post no
// notice) on the group's notice channel and writes its error (code and text); the listener parks
// the connection like any other, and the peer's communicator takes it (TakeNotice) while it runs
// and fails with that text, naming what the failing process saw (both calls of a mismatch) rather
// than a reset connection. Notices are best effort: a host that cannot be reached before the
// deadline is skipped (connects give up at the deadline too), and its processes still fail from
// the reset or their timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ffi/comm/socket_listen.h"
#include "ffi/comm/world.h"
#include "ffi/core/status.h"

namespace jax_rccl {
namespace comm {

// The listener's channel of notices (LinkKey (group, kNoticeChannel, from process, to process));
// the network's own channels are all below it.
constexpr int kNoticeChannel = (1 << 24) - 2;
// The longest text a notice carries (longer ones are cut).
constexpr size_t kNoticeBytes = 16 << 10;

// A process a notice goes to: its number and its listener ("host:port").
struct NoticePeer {
  int process = 0;
  std::string endpoint;
};

// Writes `failure` (its code and text) to each of `peers` as process `process` of the run
// `session`, until `deadline` (at most kNoticeThreads connections at once); returns how many took
// it. `primary`: the failure is this process's own finding (a mismatch, a timeout of its own), not
// one it learned from a peer's reset: a receiver prefers a primary notice to others.
int SendNotices(uint64_t group, int process, const std::string& session,
                const std::vector<NoticePeer>& peers, const Status& failure, bool primary,
                Clock::time_point deadline);
constexpr int kNoticeThreads = 16;
// Runs fn(0) .. fn(n - 1) on at most kNoticeThreads threads at once (this one among them), as the
// notices go out and the CPU runtime's status questions are asked; returns once all are done.
void RunAtOnce(size_t n, const std::function<void(size_t)>& fn);

// The processes a notice goes to: those of the ranks r with reach[r] set (once each).
std::vector<NoticePeer> NoticePeersOf(const GroupPlacement& placement,
                                      const std::vector<uint8_t>& reach);

// TakeNotice, looked at until one comes or `ms` milliseconds pass (a peer whose connection reset
// has that long for its reason to arrive).
Status AwaitNotice(uint64_t group, int process, int ms, std::vector<int>* senders = nullptr);

// The notice of process `from` (primary or not) that comes within `ms` milliseconds (Ok: none
// came); the notices of other processes taken meanwhile are dropped.
Status AwaitNoticeFrom(uint64_t group, int process, int from, int ms);

// The notices parked for process `process` of `group`, taken without waiting for one to arrive
// (each one's text is read within `readSeconds`): the failure a primary one carries, else the
// first other one's (its text prefixed with the sending process), or Ok when none came. The
// notices taken are closed: a failed communicator calls it to drop those that keep coming.
// *senders (when given) gets the process of every notice taken; *primaryFrom (when given) the
// process whose primary notice is returned, or -1 (none came, or none was primary).
Status TakeNotice(uint64_t group, int process, double readSeconds = 0.5,
                  std::vector<int>* senders = nullptr, int* primaryFrom = nullptr);

}  // namespace comm
}  // namespace jax_rccl
