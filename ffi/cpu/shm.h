// Shared-memory segments of the communicators that span processes of one host.
//
// One POSIX segment per rank, owned by the receiver: rank t's segment "/jrccl.<session>.<group
// hash>.<t>" is created by the process owning rank t, sized with ftruncate (sparse: pages
// materialize when touched) and mapped by every process of the group. It starts with a header
// (ShmHeader: a magic word the creator sets last, the layout it was made with, one "mapped" bit
// per process and the call-site fingerprint table), followed at `regionOffset` by the rank's
// transport region (its doorbell and the connections to it, transport_host.h: RankRegion).
// Nothing in a segment is a pointer.
//
// Cleanup: once every process of the group has set its bit in every segment, the names are
// unlinked (the mappings stay); names not unlinked yet are unlinked when the communicator fails
// and at process exit. Sessions are unique per run, so segments left by a crashed run never
// collide with a new one.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ffi/cpu/executor.h"
#include "ffi/cpu/transport_host.h"
#include "ffi/cpu/world.h"
#include "ffi/planner/status.h"

namespace jax_rccl {
namespace cpu {

constexpr uint64_t kShmMagic = 0x6a72636370736d31ull;  // "jrccpsm1"
constexpr int kShmMaxProcessWords = 16;                // "mapped" bits for 1024 processes
constexpr int kShmFpEntries = 256;                     // call sites a segment remembers
constexpr int kShmFpTextBytes = 200;

// What one rank posted for a call site.
struct ShmFingerprint {
  uint64_t coll = 0, send = 0, recv = 0;
  std::string text;
};

// A rank's fingerprint for one call site as a fixed-size record: a segment's table entry, the
// payload of a socket's fingerprint frame.
struct FingerprintRecord {
  int64_t callSite;
  uint64_t coll, send, recv;   // the rank's call fingerprint (comm.h: CallFingerprint)
  char text[kShmFpTextBytes];  // a short text of the rank's tasks, NUL-terminated
  void Store(int64_t site, const ShmFingerprint& fp);  // text cut to fit
  ShmFingerprint Load() const;
};

// One rank's entry for one call site: written once by the rank (state 0 -> 2 with release).
struct alignas(64) ShmFpEntry {
  std::atomic<uint32_t> state;  // 0 empty, 2 ready
  uint32_t pad;
  FingerprintRecord rec;
};

struct ShmHeader {
  std::atomic<uint64_t> magic;
  int32_t nRanks, nChannels, rank, pad;
  int64_t slotBytes, regionOffset, totalBytes;
  std::atomic<uint64_t> mapped[kShmMaxProcessWords];
  std::atomic<uint32_t> tableFull;  // set when the owner could not post an entry
  ShmFpEntry table[kShmFpEntries];
  std::atomic<uint32_t> failed;  // set by a process whose communicator of this group failed
};

// The segments of one group, as seen from this process.
class ShmGroup {
 public:
  // `onHost[r]`: rank r has a segment (its process shares this host and talks to this process
  // through shared memory); the other ranks are reached over sockets.
  ShmGroup(std::string prefix, const GroupPlacement& placement, const TransportGeometry& geo,
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

  // Tells the other processes of the group that this process's communicator failed (a flag in
  // every mapped segment's header), and whether any process of the group said so.
  void MarkFailed();
  bool AnyFailed() const;

  // Posts rank's entry for `callSite` in its own segment (rank must be local). False when the
  // table is full (the check is then skipped).
  bool PostFingerprint(int rank, int64_t callSite, const ShmFingerprint& fp);
  // Reads rank's entry for `callSite`: 1 found, 0 not posted yet, -1 never will be (the rank's
  // table is full; the check is skipped).
  int FindFingerprint(int rank, int64_t callSite, ShmFingerprint* out) const;

 private:
  ShmHeader* Header(int rank) const { return reinterpret_cast<ShmHeader*>(bases_[size_t(rank)]); }
  void MarkMapped(int rank);

  GroupPlacement placement_;  // processes: those of the ranks with a segment
  TransportGeometry geo_;
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

}  // namespace cpu
}  // namespace jax_rccl
