// What Communicator's check for a stalled CPU thread pool watches (comm_stall.cc): gauges of the
// threads inside jax_rccl calls in this process and the window a waiting rank keeps over them.
// Internal to the CPU runtime (comm.cc, comm_stall.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "ffi/cpu/comm.h"

namespace jax_rccl::cpu {

// The host executor's types this layer uses (ffi/host/).
using host::Clock;

// Process-wide gauges of the threads inside Communicator::Run, for PoolStallError: how many are
// inside, how many of them wait in a rendezvous, a count of their entries and exits (anything
// that moves), and how many distinct threads ever ran a call.
struct RunGauges {
  std::atomic<int64_t> inside{0};
  std::atomic<int64_t> waiting{0};
  std::atomic<uint64_t> moves{0};
  std::atomic<int64_t> threads{0};
};
RunGauges& Gauges();

// One thread inside Communicator::Run.
struct InsideRun {
  InsideRun() {
    thread_local bool seen = false;
    if (!seen) {
      seen = true;
      Gauges().threads.fetch_add(1, std::memory_order_relaxed);
    }
    Gauges().inside.fetch_add(1);
    Gauges().moves.fetch_add(1);
  }
  ~InsideRun() {
    Gauges().inside.fetch_sub(1);
    Gauges().moves.fetch_add(1);
  }
  InsideRun(const InsideRun&) = delete;
  InsideRun& operator=(const InsideRun&) = delete;
};

// CPU seconds this process has used (all its threads).
double ProcessCpuSeconds();

inline double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One thread waiting in a rendezvous (RunGauges::waiting).
struct WaitingInRendezvous {
  WaitingInRendezvous() { Gauges().waiting.fetch_add(1); }
  ~WaitingInRendezvous() { Gauges().waiting.fetch_sub(1); }
  WaitingInRendezvous(const WaitingInRendezvous&) = delete;
  WaitingInRendezvous& operator=(const WaitingInRendezvous&) = delete;
};

// The window over which a waiting rank watches the process for PoolStallError: since `start`
// nothing moved (`moves`), every thread inside jax_rccl waited in a rendezvous, and the process
// used `cpu` CPU seconds up to then; `last` is the previous poll.
struct Communicator::StallWindow {
  bool open = false;  // opened at the first poll: a wait that ends sooner costs no system call
  Clock::time_point start, last;
  double cpu = 0;
  uint64_t moves = 0;
  void Reset(Clock::time_point now);
};

}  // namespace jax_rccl::cpu
