// Failure notices between the processes of a group on different hosts (notice.h).
#include "ffi/comm/notice.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

namespace jax_rccl {
namespace comm {

namespace {

constexpr uint32_t kNoticeMagic = 0x6e6f7469;  // "noti"

struct NoticeHeader {
  uint32_t magic;
  int32_t code;
  uint32_t bytes;
  uint32_t reserved;
};
static_assert(sizeof(NoticeHeader) == 16, "notice header");

bool SendOne(uint64_t group, int process, const std::string& session, const NoticePeer& peer,
             const std::string& text, int32_t code, Clock::time_point deadline) {
  const LinkKey key(group, kNoticeChannel, process, peer.process);
  StatusOr<int> fd = DialListener(peer.endpoint, key, process, session, deadline, nullptr,
                                  detail::StrCat("process ", peer.process));
  if (!fd.ok()) return false;
  const NoticeHeader h{kNoticeMagic, code, uint32_t(text.size()), 0};
  const bool ok = WriteAll(fd.value(), &h, sizeof(h), deadline) &&
                  WriteAll(fd.value(), text.data(), text.size(), deadline);
  // Every byte written before the close (the listener reads it all before it closes its end).
  shutdown(fd.value(), SHUT_WR);
  close(fd.value());
  return ok;
}

}  // namespace

int SendNotices(uint64_t group, int process, const std::string& session,
                const std::vector<NoticePeer>& peers, const Status& failure,
                Clock::time_point deadline) {
  const std::string text = failure.message().substr(0, kNoticeBytes);
  const int32_t code = int32_t(failure.code());
  std::atomic<int> took{0};
  std::vector<std::thread> threads;
  threads.reserve(peers.size());
  for (const NoticePeer& p : peers) {
    threads.emplace_back([&, p]() {
      if (SendOne(group, process, session, p, text, code, deadline)) took.fetch_add(1);
    });
  }
  for (std::thread& t : threads) t.join();
  return took.load();
}

Status TakeNotice(uint64_t group, int process, const std::vector<int>& fromProcesses,
                  double readSeconds) {
  for (int from : fromProcesses) {
    const int fd = AcceptFor(LinkKey(group, kNoticeChannel, from, process), Clock::now(), nullptr);
    if (fd < 0) continue;
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
    if (!ok) {
      // The sender is in the group and proved the run's secret: it failed, though its reason
      // did not come whole.
      return Status(Code::kTimeout,
                    detail::StrCat("process ", from,
                                   " (another host) reported a failure whose reason did not "
                                   "arrive whole"));
    }
    return Status(Code(h.code), detail::StrCat("process ", from, " (another host): ", text));
  }
  return Status::Ok();
}

}  // namespace comm
}  // namespace jax_rccl
