// Shared-memory segments of the communicators that span processes of one host.
//
// One POSIX segment per rank, owned by the receiver: rank t's segment
// "/jrccl.<session>.<group hash>.<tag>.<t>" is created by the process owning rank t (O_CREAT |
// O_EXCL, mode 0600), sized with ftruncate (sparse: pages materialize when touched) and mapped by
// every process of the group. <tag> is derived from the run's secret and the group hash (world.h:
// ShmNameTag), so other users of the host cannot predict any group's names. It starts with a header
// (ShmHeader: a magic word the creator sets last, the layout it was made with, one "mapped" bit per
// process and the state peers read for messages), followed at `regionOffset` by the rank's
// region, laid out by the runtime that made the group (ShmRegionLayout: the CPU runtime's FIFO
// transport region, ffi/cpu/shm_region.h; the GPU runtime's IPC records). Nothing in a segment is
// a pointer.
//
// Before a peer's segment is mapped it must be a regular file of this user with no permission for
// group or others and exactly the expected size; after, before it is used, every size and offset
// its headers state must be the ones this process derives from the geometry (CheckLayout). A
// segment that fails either is refused with an error naming it and is never used; a name that is
// taken when this process creates its own fails the same way (never reused or removed).
//
// Cleanup: once every process of the group has set its bit in every segment, the names are
// unlinked (the mappings stay); names not unlinked yet are unlinked when the communicator fails
// and at process exit, and a name never outlives the process that created it: a small process of
// its own (shm.cc: Janitor) removes the names once the creator is gone, however it ended.
// Sessions are unique per run, so segments of a crashed run never collide with a new one.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ffi/comm/world.h"
#include "ffi/core/clock.h"
#include "ffi/core/status.h"

namespace jax_rccl {
namespace comm {

// What a segment holds after its header: the owning rank's region of `bytes`, which `init` lays
// out in the zeroed memory of a new segment (its creator, once) and `check` verifies in a peer's
// segment before it is used (every size and offset its headers state must be the ones this
// process derives: nothing read from a segment may point outside it; `name` for messages). The
// header records and compares `nRanks`, `nChannels` and `slotBytes`.
struct ShmRegionLayout {
  int32_t nRanks = 0;
  int32_t nChannels = 0;
  int64_t slotBytes = 0;
  int64_t bytes = 0;
  std::function<void(char* region)> init;  // null: the zeroed memory as it is
  std::function<Status(const char* region, const std::string& name)> check;  // null: none
};

constexpr uint64_t kShmMagic = 0x6a72636370736d31ull;  // "jrccpsm1"
constexpr int kShmMaxProcessWords = 16;                // "mapped" bits for 1024 processes
constexpr int kShmFailTextBytes = 2048;
constexpr int kShmCallTextBytes = 192;

struct ShmHeader {
  std::atomic<uint64_t> magic;
  int32_t nRanks, nChannels, rank;
  int32_t pid;  // the creating process (the rank's owner)
  int64_t slotBytes, regionOffset, totalBytes;
  uint64_t pidNamespace;  // the creator's pid namespace (inode of /proc/self/ns/pid), 0 unknown
  std::atomic<uint64_t> mapped[kShmMaxProcessWords];
  // Calls the rank has started on the group's communicator (its owner writes it as each call
  // starts): a peer that times out reads it to tell a rank that never arrived from one that waits.
  std::atomic<uint64_t> entered;
  std::atomic<uint64_t> enteredCall;  // the identity of that call (written before `entered`)
  char callText[kShmCallTextBytes];   // "call #S 'name' (what; id ...)" of that call
  std::atomic<uint32_t> failed;       // set by a process whose communicator of this group failed
  std::atomic<uint32_t> failText;     // 0 none, 1 being written, 2 `reason` holds the failure
  int32_t failProcess;                // the process that posted `reason`
  int32_t failCode;                   // its Code (ffi/core/status.h)
  char reason[kShmFailTextBytes];     // the first failure posted here, NUL-terminated
};

// What a peer's process is doing, as far as this host can tell.
enum class PeerLiveness { kUnknown, kAlive, kExited, kStopped };

// The segments of one group, as seen from this process.
class ShmGroup {
 public:
  // `onHost[r]`: rank r has a segment (its process shares this host and talks to this process
  // through shared memory); the other ranks are reached over sockets.
  ShmGroup(std::string prefix, const GroupPlacement& placement, ShmRegionLayout layout,
           std::vector<uint8_t> onHost);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  const std::string& Name(int rank) const { return names_[size_t(rank)]; }
  // Creates (and maps) the segments of this process's ranks.
  Status CreateLocal();
  // Maps the other ranks' segments, retrying until `deadline` (a peer may not have created its
  // segment yet). On a timeout, *missingRank is the first rank whose segment did not appear.
  Status OpenRemote(Clock::time_point deadline, const std::atomic<bool>* aborted, int* missingRank);
  // Rank's transport region (null until mapped).
  char* Region(int rank) const;
  // Unlinks every segment of the group once every process of the group has mapped all of them
  // (cheap once done).
  void MaybeUnlink();
  // Unlinks every name of the group now (failure, exit).
  void UnlinkAll();
  bool unlinked() const { return unlinked_.load(std::memory_order_acquire); }

  // Tells the other processes of the group that this process's communicator failed and why (a
  // flag, the reason and its code in every mapped segment's header), and whether any process of
  // the group said so (*why: the reason it posted).
  void MarkFailed(const std::string& reason, Code code = Code::kTimeout);
  // *code (when given): the posted failure's Code (kTimeout when none was posted whole).
  bool AnyFailed(std::string* why = nullptr, Code* code = nullptr) const;

  // Rank's count of calls started, and the latest one's identity and text (its owner publishes
  // them; rank must be mapped).
  void SetEntered(int rank, uint64_t calls, uint64_t call, const std::string& text);
  uint64_t Entered(int rank) const;
  // A consistent (count, identity, text) of rank's latest call; false while it changes.
  bool EnteredCall(int rank, uint64_t* calls, uint64_t* call, std::string* text) const;
  // Whether the process that created rank's segment still runs (same pid namespace only).
  PeerLiveness Liveness(int rank) const;

 private:
  ShmHeader* Header(int rank) const { return reinterpret_cast<ShmHeader*>(bases_[size_t(rank)]); }
  void MarkMapped(int rank);
  // Checks that the header and the region of rank's segment at `base` state the layout this
  // process derives (OpenRemote, before the segment is used).
  Status CheckLayout(const char* base, int rank, const std::string& name) const;

  GroupPlacement placement_;  // processes: those of the ranks with a segment
  ShmRegionLayout layout_;
  std::vector<uint8_t> onHost_;
  int64_t regionOffset_ = 0;
  int64_t totalBytes_ = 0;
  std::vector<std::string> names_;
  std::vector<char*> bases_;
  std::atomic<bool> unlinked_{false};
};

// Names of every "jrccl." segment this process created or mapped and has not unlinked (unlinked
// at exit). Exposed for tests.
std::vector<std::string> PendingShmNames();

// Unlinks the segments of `session` whose creating process has exited (a process killed before
// every peer mapped its segments cannot unlink them itself). Runs when a communicator fails and at
// exit for every session this process joined; returns how many it unlinked. With `ownToo`, also
// this process's own segments of the session (it is leaving: at exit).
int ReapSession(const std::string& session, bool ownToo = true);
// Remembers `session` for the reaping at exit (the world table's, set once).
void NoteShmSession(const std::string& session);

}  // namespace comm
}  // namespace jax_rccl
