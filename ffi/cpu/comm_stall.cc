// Communicator::PoolStallError: a rendezvous that waits for a local rank XLA's CPU thread pool
// cannot start fails early with an error that says so (comm_stall.h has what it watches).
#include "ffi/cpu/comm_stall.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ffi/comm/world.h"
#include "ffi/cpu/comm.h"

namespace jax_rccl::cpu {

RunGauges& Gauges() {
  static RunGauges* g = new RunGauges();  // never destroyed: used by pool threads
  return *g;
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void Communicator::StallWindow::Reset(Clock::time_point now) {
  open = true;
  start = last = now;
  cpu = ProcessCpuSeconds();
  moves = Gauges().moves.load();
}

// Too many calls in flight. XLA's CPU client runs each device's part of an execution as a task of
// one thread pool (max(cores, devices) threads, or PJRT_NPROC) and lets a device run up to a fixed
// number of executions ahead; a launch past that limit blocks a pool thread. With more calls in
// flight than that, every thread can be taken - the present ranks of the oldest execution wait
// here, the other threads wait in XLA's limit - while the task of a missing rank of that
// execution is queued behind them: nothing can move, and the call would wait for
// JAX_RCCL_TIMEOUT and then blame a rank that is not slow but never got a thread. (The threads
// that wait here can cover fewer than the pool: measured on 2 cores, 16 devices, a pool of 16:
// 15 or 11 waited here, the rest in XLA's limit.) jax.lax.psum stalls the same way.
//
// What this process can see and requires before it says so, each with the healthy case it
// rules out:
// - the process is one of one (no world table of several): in a job of several processes a
//   local device's part can wait on a peer process inside XLA's own collectives or transfers,
//   which are invisible here (a slow peer);
// - the missing ranks have run every earlier execution of this communicator (not busy with one
//   of them) and every local rank ran this call site before: their parts exist and are what
//   XLA queues (not a group naming a device that never runs the call: that stays a timeout);
// - for the whole grace (JAX_RCCL_STALL_GRACE): no thread entered or left a jax_rccl call in the
//   process, every thread inside one waited in a rendezvous (none in a transfer, which may wait
//   on a peer process, or in an earlier execution's turn), and the process used at most 1% of a
//   core of CPU time (our polls use far less): no thread computes anything. A device whose part
//   is slow because it computes (a big computation before the collective, an oversubscribed
//   host) uses CPU: the Linux scheduler gives every runnable thread a share within a few
//   milliseconds, well above 1% unless a hundred threads compete for each core;
// - the polls came on time (no gap above four poll periods): a stopped process (SIGSTOP, a
//   debugger) restarts the window instead of counting as idle.
// What remains is a device whose part waits, without CPU and outside jax_rccl, for longer than
// the grace while every other thread idles (a host callback that sleeps before the collective);
// JAX_RCCL_STALL_GRACE raises the grace or turns the check off (0).
Status Communicator::PoolStallError(const ExecKey& key, const std::vector<uint8_t>& present,
                                    int rank, const std::string& name, StallWindow& w) {
  const Clock::time_point now = Clock::now();
  const double pollSeconds = std::clamp(stallGrace_ / 8, 0.05, 0.25);
  const bool late = w.open && SecondsBetween(w.last, now) > 4 * pollSeconds;
  w.last = now;
  RunGauges& g = Gauges();
  if (!w.open || late || g.moves.load() != w.moves || g.waiting.load() != g.inside.load()) {
    w.Reset(now);
    return Status::Ok();
  }
  const double idleFor = SecondsBetween(w.start, now);
  if (idleFor < stallGrace_) return Status::Ok();
  const double cpu = ProcessCpuSeconds() - w.cpu;
  if (cpu > 0.01 * idleFor) {  // something computes: not a stall
    w.Reset(now);
    return Status::Ok();
  }
  if (crossProcess() || !completedSites_.count({key.instance, key.callSite})) {
    return Status::Ok();
  }
  if (std::shared_ptr<const WorldTable> world = GetWorldTable()) {
    if (world->nprocesses > 1) return Status::Ok();
  }
  std::vector<int> missing;
  int arrived = 0;
  for (int q = 0; q < nRanks(); ++q) {
    if (!placement_.local[q]) continue;
    if (present[q]) {
      ++arrived;
    } else {
      if (served_[q] != nextTicket_) return Status::Ok();  // still busy with an earlier one
      missing.push_back(q);
    }
  }
  if (missing.empty()) return Status::Ok();
  std::ostringstream ranks;
  for (size_t i = 0; i < missing.size(); ++i) {
    ranks << (i ? ", " : "") << "rank " << missing[i] << " (device " << devices_[missing[i]] << ")";
  }
  char idle[32];
  std::snprintf(idle, sizeof(idle), "%.1f", idleFor);
  // The pool has at least as many threads as the call has devices (and every one of them ran a
  // jax_rccl call by now): twice what was seen is enough.
  const int64_t twice = 2 * std::max<int64_t>(nLocal_, g.threads.load());
  return Status(
      Code::kInvalidUsage,
      detail::StrCat(
          "jax_rccl: '", name, "': too many calls in flight: XLA's CPU thread pool cannot start ",
          "the part of ", ranks.str(),
          " in the oldest execution in flight on the group of devices ", DevicesString(),
          " (call site ", key.callSite, ", run id ", key.runId, ", after ", nextTicket_,
          " completed executions), while its other ", arrived,
          " ranks wait for it. XLA runs every device's part of a call on one pool of threads and ",
          "lets each device run a number of calls ahead; with that many calls dispatched without ",
          "waiting, every thread of the pool is taken: ", g.waiting.load(),
          " wait in this rendezvous, the others (of ", g.threads.load(),
          " threads that ran jax_rccl calls in this process) in XLA's own limit of calls ahead. ",
          "Nothing in this process moved or used CPU for ", idle,
          " s, so the call could only wait for JAX_RCCL_TIMEOUT (rank ", rank, " saw it). ",
          "To avoid it, wait on results more often (e.g. jax.block_until_ready every 16 calls), ",
          "or give XLA's CPU pool at least twice as many threads as the mesh has devices: ",
          "PJRT_NPROC=", twice, ", or more host devices than the mesh uses ",
          "(XLA_FLAGS=--xla_force_host_platform_device_count=", twice,
          "). JAX_RCCL_STALL_GRACE=0 turns this check off."));
}

}  // namespace jax_rccl::cpu
