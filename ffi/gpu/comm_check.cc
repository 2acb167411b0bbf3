// The host side of the GPU call check (hip/kernel_check.h): the calls' names for messages, the
// error of a failed launch, and the watch that passes a failure between the processes of a group
// while their kernels run. See ffi/gpu/comm.h.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "ffi/gpu/comm.h"

namespace jax_rccl {
namespace gpu {

namespace {

std::string Hex(uint64_t v, int digits) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%0*llx", digits, static_cast<unsigned long long>(v));
  return buf;
}

// How far from a rank's own call number the numbers tried for a peer's tag reach.
constexpr uint64_t kSeqReach = 8;
// How long a rank that found a mismatch with a rank of another host waits for that rank's
// notice (its own account of the call it runs); GpuComm::Check waits up to 500 ms for the watch.
constexpr int kPeerNoticeMs = 300;
// How long a process answering such a rank's notice waits for its kernels to record their calls.
constexpr int kRunningCallMs = 50;

}  // namespace

void GpuComm::NoteCall(uint64_t id, const std::string& name, const std::string& what) {
  std::lock_guard<std::mutex> lock(callsMu_);
  calls_.emplace(id, std::make_pair(name, what));
}

namespace {

// "call #3 'psum over ('i',)' (all_reduce float32 x4096 sum; id 0123456789abcdef)".
std::string Described(uint64_t id, uint64_t seq, const std::pair<std::string, std::string>* c) {
  if (c == nullptr) return detail::StrCat("call #", seq, " (id ", Hex(id, 16), ")");
  return detail::StrCat("call #", seq, " '", c->first, "' (", c->second,
                        c->second.empty() ? "" : "; ", "id ", Hex(id, 16), ")");
}

}  // namespace

std::string GpuComm::CallText(uint64_t id, uint64_t seq) const {
  std::lock_guard<std::mutex> lock(callsMu_);
  auto it = calls_.find(id);
  return Described(id, seq, it == calls_.end() ? nullptr : &it->second);
}

bool GpuComm::FindPeerCall(uint32_t seen, int bits, uint64_t seq, int peer, std::string* text,
                           bool* sameSeq) const {
  *sameSeq = true;
  if (seen == 0) {
    *text = "a step without a call tag (a process that runs with JAX_RCCL_CHECK_CALLS=0?)";
    return true;
  }
  const uint32_t mask = bits >= 32 ? ~0u : (1u << bits) - 1;
  {
    std::lock_guard<std::mutex> lock(callsMu_);
    // The same number first: a peer at another call than this rank's names itself only so.
    for (uint64_t d = 0; d <= kSeqReach; ++d) {
      for (int sign = 0; sign < (d == 0 ? 1 : 2); ++sign) {
        if (sign == 1 && d > seq) continue;
        const uint64_t s = sign == 0 ? seq + d : seq - d;
        for (const auto& [id, call] : calls_) {
          if ((CallTag(id, s) & mask) != (seen & mask)) continue;
          *sameSeq = s == seq;
          *text = "a step of its " + Described(id, s, &call);
          return true;
        }
      }
    }
  }
  // A call this process never made: the one the peer published when its own launch failed (a
  // peer of this host, in its segment).
  uint64_t calls = 0, call = 0;
  std::string published;
  if (shm_ != nullptr && peer >= 0 && peer < nRanks() && !otherHost_[size_t(peer)] &&
      shm_->EnteredCall(peer, &calls, &call, &published) && calls > 0 &&
      (CallTag(call, calls - 1) & mask) == (seen & mask)) {
    *sameSeq = calls - 1 == seq;
    *text = "a step of its " + published;
    return true;
  }
  *sameSeq = false;
  *text = detail::StrCat("a step of a call this process never ran (tag ", Hex(seen, bits / 4),
                         "; its program differs from this process's)");
  return false;
}

Status GpuComm::LaunchError(int rank, const DevStatus& st, const std::string& who) const {
  std::string name = who;
  if (name.empty()) {
    std::lock_guard<std::mutex> lock(callsMu_);
    auto it = calls_.find(st.call);
    name = it == calls_.end() ? "a collective" : it->second.first;
  }
  if (st.code == kDevMismatch) {
    bool sameSeq = true;
    std::string peer;
    (void)FindPeerCall(st.seen, st.seenBits, st.seq, st.peer, &peer, &sameSeq);
    return Status(
        Code::kInvalidUsage,
        detail::StrCat("jax_rccl '", name, "': mismatched calls: ", RankText(st.peer), " sent ",
                       peer, " on channel ", st.channel, " where ", RankText(st.rank), " runs its ",
                       CallText(st.call, st.seq),
                       sameSeq ? " (the processes ran different collectives at this point, or the "
                                 "same ones in a different order)"
                               : " (the ranks are not at the same call of the group: one made "
                                 "more calls than the other)",
                       "; no data of the step was used (GPU group ", groupText_,
                       "); the communicator is unusable from now on"));
  }
  if (st.code == kDevWrongDevice) {
    return Status(
        Code::kInvalidUsage,
        detail::StrCat("jax_rccl '", name, "': partition ", st.step, " runs on device ", st.device,
                       " but the program was lowered with device ", st.seen64,
                       " there: an exported program must be called on the devices of the mesh it "
                       "was exported with, in the same mesh order (its replica groups name those "
                       "devices); nothing moved (GPU group ",
                       groupText_, "); the communicator is unusable from now on"));
  }
  const Code code = st.code == kDevTooManyRanks ? Code::kInvalidArgument : Code::kTimeout;
  const bool known = st.mine != 0 || st.seq != 0 || st.call != 0;
  return Status(code, detail::StrCat("jax_rccl '", name, "': an earlier launch on GPU group ",
                                     groupText_, " failed: ", DescribeStatus(st),
                                     known ? detail::StrCat(" (in ", RankText(rank), "'s ",
                                                            CallText(st.call, st.seq), ")")
                                           : std::string(),
                                     "; the communicator is unusable from now on"));
}

std::string GpuComm::RunningCalls(int ms) {
  if (abort_.host == nullptr || status_.host == nullptr) return std::string();
  RaiseAbort();
  const volatile DevStatus* st = static_cast<const volatile DevStatus*>(status_.host);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    bool waiting = false;
    for (int r = 0; r < nRanks(); ++r) {
      waiting = waiting || (placement_.local[size_t(r)] && st[r].complete == 0);
    }
    if (!waiting || std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::string text;
  for (int r = 0; r < nRanks(); ++r) {
    if (!placement_.local[size_t(r)] || st[r].complete == 0) continue;
    const DevStatus s = ReadStatus(st[r]);
    if (s.mine == 0) continue;  // an unchecked launch (JAX_RCCL_CHECK_CALLS=0): no call number
    text += detail::StrCat(text.empty() ? "" : "; ", RankText(r), " runs its ",
                           CallText(s.call, s.seq));
  }
  return text;
}

void GpuComm::StartWatch() {
  std::call_once(watchOnce_, [this]() {
    static std::once_flag atExit;
    std::call_once(atExit, []() { std::atexit(StopWatches); });
    watch_ = std::thread([this]() { Watch(); });
  });
}

void GpuComm::StopWatch() {
  stopWatch_.store(true, std::memory_order_release);
  if (watch_.joinable()) watch_.join();
}

void GpuComm::Watch() {
  WatchUntilFailed();
  // Failed: processes of other hosts that failed too may still post notices; they are dropped
  // as they come (each holds a descriptor while parked).
  while (crossHost_ && !stopWatch_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    (void)NoticeFromOtherHosts();
  }
}

void GpuComm::WatchUntilFailed() {
  const volatile DevStatus* st = static_cast<const volatile DevStatus*>(status_.host);
  while (!stopWatch_.load(std::memory_order_acquire) && !failed_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // A launch of this process failed: the other processes' kernels stop too (Fail posts the
    // reason in the segments and resets the network proxy's connections).
    for (int r = 0; r < nRanks(); ++r) {
      if (!placement_.local[size_t(r)]) continue;
      const int32_t code = st[r].code;
      if (code == kDevFine || code == kDevBadRagged) continue;
      // A rank stopped by another rank's failure reports after the one that failed, when it can.
      int culprit = r;
      for (int q = 0; q < nRanks(); ++q) {
        if (placement_.local[size_t(q)] && st[q].code != kDevAborted && st[q].code != kDevFine &&
            st[q].code != kDevBadRagged) {
          culprit = q;
        }
      }
      if (st[culprit].code == kDevAborted && shm_ != nullptr && shm_->AnyFailed()) break;
      // The kernel sets the code first and says when the other fields are in.
      const auto written = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      while (st[culprit].complete == 0 && std::chrono::steady_clock::now() < written) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      const DevStatus failed = ReadStatus(st[culprit]);
      // The peers of this host learn which call this rank ran (a peer that never made that call
      // can name it), and a mismatch waits a moment for the peer's own (published likewise).
      if (shm_ != nullptr)
        shm_->SetEntered(culprit, failed.seq + 1, failed.call, CallText(failed.call, failed.seq));
      if (failed.code == kDevMismatch && shm_ != nullptr) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
        std::string text;
        bool sameSeq = true;
        while (
            !FindPeerCall(failed.seen, failed.seenBits, failed.seq, failed.peer, &text, &sameSeq) &&
            std::chrono::steady_clock::now() < until && !shm_->AnyFailed()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      Status error = LaunchError(culprit, failed, "");
      if (failed.code == kDevMismatch && crossHost_ && failed.peer >= 0 && failed.peer < nRanks() &&
          otherHost_[size_t(failed.peer)]) {
        // A peer of another host publishes no call here: it names its own in its notice, when it
        // found the mismatch too. This process's goes first (the peer may wait for it likewise),
        // then the peer's has a moment to come (its process's notice, not another's: every
        // process this one told may answer), and the error carries both.
        TellOtherHosts(error, /*primary=*/true);
        const Status theirs = AwaitNotice(kPeerNoticeMs, placement_.process[size_t(failed.peer)]);
        if (!theirs.ok()) {
          error =
              Status(error.code(), detail::StrCat(error.message(), " [", theirs.message(), "]"));
        }
        (void)Fail(std::move(error), /*tell=*/false);
        return;
      }
      (void)Fail(std::move(error));
      return;
    }
    // Another process failed (of this host: its segment; of another: its notice): this
    // process's kernels stop now (the abort word), not at their deadline.
    std::string why;
    Code code = Code::kTimeout;
    if (shm_ != nullptr && shm_->AnyFailed(&why, &code)) {
      (void)Fail(Status(code, detail::StrCat("jax_rccl: another process of GPU group ", groupText_,
                                             " reported its communicator failed",
                                             why.empty() ? std::string() : ": " + why)),
                 false);
      return;
    }
    if (crossHost_) {
      int from = -1;
      Status notice = NoticeFromOtherHosts(&from);
      if (!notice.ok() && from >= 0 && notice.code() == Code::kInvalidUsage) {
        // A rank of another host found a mismatch with a call of this process: it names only
        // its own call when it never ran this process's. This process answers with the calls
        // its ranks run (the sender waits a moment for it), and its own error names them too;
        // the communicator fails first (a launch that finds its kernel aborted meanwhile then
        // reports this failure), and the answer goes out after.
        const std::string mine = RunningCalls(kRunningCallMs);
        if (!mine.empty()) {
          notice = Status(notice.code(),
                          detail::StrCat(notice.message(), " [in this process, ", mine, "]"));
        }
        (void)Fail(std::move(notice), false);
        if (!mine.empty()) TellOtherHosts(Status(Code::kInvalidUsage, mine), false, from);
        return;
      }
      if (!notice.ok()) {
        (void)Fail(std::move(notice), false);
        return;
      }
    }
  }
}

}  // namespace gpu
}  // namespace jax_rccl
