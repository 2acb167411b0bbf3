// Failure notices between the processes of a group on different hosts (notice.h).
#include "ffi/comm/notice.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>

namespace jax_rccl {
namespace comm {

namespace {

constexpr uint32_t kNoticeMagic = 0x6e6f7469;  // "noti"

struct NoticeHeader {
  uint32_t magic;
  int32_t code;
  uint32_t bytes;
  uint32_t primary;  // 1: the sender's own finding
};
static_assert(sizeof(NoticeHeader) == 16, "notice header");

bool SendOne(uint64_t group, int process, const std::string& session, const NoticePeer& peer,
             const std::string& text, int32_t code, bool primary, Clock::time_point deadline) {
  const LinkKey key(group, kNoticeChannel, process, peer.process);
  StatusOr<int> fd = DialListener(peer.endpoint, key, process, session, deadline, nullptr,
                                  detail::StrCat("process ", peer.process));
  if (!fd.ok()) return false;
  const NoticeHeader h{kNoticeMagic, code, uint32_t(text.size()), primary ? 1u : 0u};
  const bool ok = WriteAll(fd.value(), &h, sizeof(h), deadline) &&
                  WriteAll(fd.value(), text.data(), text.size(), deadline);
  // Every byte written before the close (the listener reads it all before it closes its end).
  shutdown(fd.value(), SHUT_WR);
  close(fd.value());
  return ok;
}

// One parked notice from process `from` on `fd` (closed here): its failure, primary or not.
Status ReadNotice(int fd, int from, double readSeconds, bool* primary) {
  const auto deadline =
      Clock::now() + std::chrono::microseconds(int64_t(std::max(0.0, readSeconds) * 1e6));
  NoticeHeader h{};
  std::string text;
  bool ok = ReadUntil(fd, &h, sizeof(h), deadline) == 1 && h.magic == kNoticeMagic &&
            h.bytes <= kNoticeBytes && h.code > int32_t(Code::kOk) &&
            h.code <= int32_t(Code::kSystem);
  if (ok) {
    text.resize(h.bytes);
    ok = h.bytes == 0 || ReadUntil(fd, text.data(), h.bytes, deadline) == 1;
  }
  close(fd);
  *primary = ok && h.primary == 1;
  if (!ok) {
    // The sender is in the group and proved the run's secret: it failed, though its reason did
    // not come whole.
    return Status(Code::kTimeout, detail::StrCat("process ", from,
                                                 " reported by network notice a failure whose "
                                                 "reason did not arrive whole"));
  }
  return Status(Code(h.code), detail::StrCat("process ", from, " (by network notice): ", text));
}

}  // namespace

int SendNotices(uint64_t group, int process, const std::string& session,
                const std::vector<NoticePeer>& peers, const Status& failure, bool primary,
                Clock::time_point deadline) {
  const std::string text = failure.message().substr(0, kNoticeBytes);
  const int32_t code = int32_t(failure.code());
  std::atomic<int> took{0};
  RunAtOnce(peers.size(), [&](size_t i) {
    if (SendOne(group, process, session, peers[i], text, code, primary, deadline)) {
      took.fetch_add(1);
    }
  });
  return took.load();
}

void RunAtOnce(size_t n, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min<size_t>(n, kNoticeThreads); ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no thread to be had: the ones started and this one do every item
    }
  }
  work();
  for (std::thread& t : threads) t.join();
}

std::vector<NoticePeer> NoticePeersOf(const GroupPlacement& placement,
                                      const std::vector<uint8_t>& reach) {
  std::vector<NoticePeer> peers;
  for (size_t r = 0; r < reach.size(); ++r) {
    if (!reach[r]) continue;
    const int p = placement.process[r];
    bool seen = false;
    for (const NoticePeer& q : peers) seen = seen || q.process == p;
    if (!seen) peers.push_back(NoticePeer{p, placement.endpoint[r]});
  }
  return peers;
}

Status AwaitNotice(uint64_t group, int process, int ms, std::vector<int>* senders) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  Status notice = TakeNotice(group, process, 0.5, senders);
  while (notice.ok() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    notice = TakeNotice(group, process, 0.5, senders);
  }
  return notice;
}

Status AwaitNoticeFrom(uint64_t group, int process, int from, int ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    int sender = 0;
    for (int fd = TakeParkedTo(group, kNoticeChannel, process, &sender); fd >= 0;
         fd = TakeParkedTo(group, kNoticeChannel, process, &sender)) {
      bool primary = false;
      Status s = ReadNotice(fd, sender, 0.5, &primary);
      if (sender == from) return s;
    }
    if (Clock::now() >= until) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status TakeNotice(uint64_t group, int process, double readSeconds, std::vector<int>* senders,
                  int* primaryFrom) {
  if (primaryFrom != nullptr) *primaryFrom = -1;
  Status first;
  int from = 0;
  for (int fd = TakeParkedTo(group, kNoticeChannel, process, &from); fd >= 0;
       fd = TakeParkedTo(group, kNoticeChannel, process, &from)) {
    if (senders != nullptr) senders->push_back(from);
    bool primary = false;
    Status s = ReadNotice(fd, from, readSeconds, &primary);
    if (primary) {
      if (primaryFrom != nullptr) *primaryFrom = from;
      return s;
    }
    if (first.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace comm
}  // namespace jax_rccl
