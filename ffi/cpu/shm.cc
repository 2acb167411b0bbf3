#include "ffi/cpu/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

namespace jax_rccl {
namespace cpu {

namespace {

// Names to unlink at exit (created or mapped, not unlinked yet).
std::mutex& RegistryMu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
std::set<std::string>& Registry() {
  static std::set<std::string>* names = new std::set<std::string>();
  return *names;
}

void UnlinkRegisteredAtExit() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  for (const std::string& n : Registry()) shm_unlink(n.c_str());
  Registry().clear();
}

void Register(const std::string& name) {
  static std::once_flag once;
  std::call_once(once, []() { std::atexit(UnlinkRegisteredAtExit); });
  std::lock_guard<std::mutex> lock(RegistryMu());
  Registry().insert(name);
}

void Unlink(const std::string& name) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  shm_unlink(name.c_str());
  Registry().erase(name);
}

std::string ErrnoText(int e) {
  return detail::StrCat(std::strerror(e), " (errno ", e, ")");
}

}  // namespace

std::vector<std::string> PendingShmNames() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  return std::vector<std::string>(Registry().begin(), Registry().end());
}

ShmGroup::ShmGroup(std::string prefix, const GroupPlacement& placement,
                   const TransportGeometry& geo, std::vector<uint8_t> onHost)
    : placement_(placement), geo_(geo), onHost_(std::move(onHost)) {
  regionOffset_ = int64_t((sizeof(ShmHeader) + 4095) / 4096 * 4096);
  totalBytes_ = regionOffset_ + RankRegion::Bytes(geo_);
  std::set<int> procs;
  for (int r = 0; r < geo_.nRanks; ++r) {
    names_.push_back(detail::StrCat(prefix, ".", r));
    if (onHost_[size_t(r)]) {
      Register(names_.back());
      procs.insert(placement_.process[size_t(r)]);
    }
  }
  placement_.processes.assign(procs.begin(), procs.end());
  bases_.assign(size_t(geo_.nRanks), nullptr);
}

ShmGroup::~ShmGroup() {
  UnlinkAll();
  for (char* b : bases_) {
    if (b != nullptr) munmap(b, size_t(totalBytes_));
  }
}

char* ShmGroup::Region(int rank) const {
  char* b = bases_[size_t(rank)];
  return b == nullptr ? nullptr : b + regionOffset_;
}

void ShmGroup::MarkMapped(int rank) {
  const int p = placement_.thisProcess;
  Header(rank)->mapped[p / 64].fetch_or(uint64_t(1) << (p % 64), std::memory_order_acq_rel);
}

Status ShmGroup::CreateLocal() {
  JR_REQUIRE(placement_.thisProcess < 64 * kShmMaxProcessWords, Code::kUnsupported,
             "jax_rccl: shared-memory groups support processes 0..", 64 * kShmMaxProcessWords - 1,
             ", this is process ", placement_.thisProcess);
  for (int r = 0; r < geo_.nRanks; ++r) {
    if (!placement_.local[size_t(r)] || bases_[size_t(r)] != nullptr) continue;
    const std::string& name = names_[size_t(r)];
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {  // left by a crashed process with the same session
      shm_unlink(name.c_str());
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    JR_REQUIRE(fd >= 0, Code::kSystem, "jax_rccl: cannot create the shared-memory segment ", name,
               ": ", ErrnoText(errno));
    if (ftruncate(fd, off_t(totalBytes_)) != 0) {
      const int e = errno;
      close(fd);
      shm_unlink(name.c_str());
      JR_FAIL(Code::kSystem, "jax_rccl: cannot size the shared-memory segment ", name, " to ",
              totalBytes_, " bytes: ", ErrnoText(e));
    }
    void* p = mmap(nullptr, size_t(totalBytes_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
      shm_unlink(name.c_str());
      JR_FAIL(Code::kSystem, "jax_rccl: cannot map the shared-memory segment ", name, ": ",
              ErrnoText(e));
    }
    char* base = static_cast<char*>(p);
    ShmHeader* h = reinterpret_cast<ShmHeader*>(base);
    h->nRanks = geo_.nRanks;
    h->nChannels = geo_.nChannels;
    h->rank = r;
    h->slotBytes = geo_.slotBytes;
    h->regionOffset = regionOffset_;
    h->totalBytes = totalBytes_;
    RankRegion::Init(base + regionOffset_, geo_);
    h->magic.store(kShmMagic, std::memory_order_release);
    bases_[size_t(r)] = base;
    MarkMapped(r);
  }
  return Status::Ok();
}

Status ShmGroup::OpenRemote(Clock::time_point deadline, const std::atomic<bool>* aborted,
                            int* missingRank) {
  *missingRank = -1;
  int sleepUs = 50;
  while (true) {
    bool all = true;
    for (int r = 0; r < geo_.nRanks; ++r) {
      if (bases_[size_t(r)] != nullptr || !onHost_[size_t(r)]) continue;
      const std::string& name = names_[size_t(r)];
      const int fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) {
        JR_REQUIRE(errno == ENOENT, Code::kSystem,
                   "jax_rccl: cannot open the shared-memory "
                   "segment ",
                   name, ": ", ErrnoText(errno));
        all = false;
        continue;
      }
      struct stat sb;
      if (fstat(fd, &sb) != 0 || sb.st_size < totalBytes_) {  // not sized yet
        close(fd);
        all = false;
        continue;
      }
      JR_REQUIRE(sb.st_size == totalBytes_, Code::kInvalidUsage,
                 "jax_rccl: the shared-memory "
                 "segment ",
                 name, " has ", int64_t(sb.st_size), " bytes, this process expects ", totalBytes_,
                 " (do the processes use the same JAX_RCCL_NCHANNELS and version?)");
      void* p = mmap(nullptr, size_t(totalBytes_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      const int e = errno;
      close(fd);
      JR_REQUIRE(p != MAP_FAILED, Code::kSystem,
                 "jax_rccl: cannot map the shared-memory "
                 "segment ",
                 name, ": ", ErrnoText(e));
      ShmHeader* h = static_cast<ShmHeader*>(p);
      if (h->magic.load(std::memory_order_acquire) != kShmMagic) {  // not initialized yet
        munmap(p, size_t(totalBytes_));
        all = false;
        continue;
      }
      if (h->nRanks != geo_.nRanks || h->nChannels != geo_.nChannels ||
          h->slotBytes != geo_.slotBytes || h->rank != r) {
        munmap(p, size_t(totalBytes_));
        JR_FAIL(Code::kInvalidUsage, "jax_rccl: the shared-memory segment ", name, " was made for ",
                h->nRanks, " ranks, ", h->nChannels, " channels, slots of ", h->slotBytes,
                " bytes (rank ", h->rank, "); this process expects ", geo_.nRanks, ", ",
                geo_.nChannels, ", ", geo_.slotBytes,
                " (do the processes use the same JAX_RCCL_NCHANNELS?)");
      }
      bases_[size_t(r)] = static_cast<char*>(p);
      MarkMapped(r);
    }
    if (all) return Status::Ok();
    if ((aborted != nullptr && aborted->load()) || Clock::now() >= deadline) {
      for (int r = 0; r < geo_.nRanks; ++r) {
        if (bases_[size_t(r)] == nullptr && onHost_[size_t(r)]) {
          *missingRank = r;
          break;
        }
      }
      JR_FAIL(Code::kTimeout, "timed out");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleepUs));
    sleepUs = std::min(sleepUs * 2, 5000);
  }
}

void ShmGroup::MaybeUnlink() {
  if (unlinked()) return;
  for (int r = 0; r < geo_.nRanks; ++r) {
    if (!onHost_[size_t(r)]) continue;
    ShmHeader* h = Header(r);
    if (h == nullptr) return;
    for (int p : placement_.processes) {
      if ((h->mapped[p / 64].load(std::memory_order_acquire) & (uint64_t(1) << (p % 64))) == 0) {
        return;
      }
    }
  }
  UnlinkAll();
}

void ShmGroup::UnlinkAll() {
  if (unlinked_.exchange(true)) return;
  for (size_t r = 0; r < names_.size(); ++r) {
    if (onHost_[r]) Unlink(names_[r]);
  }
}

namespace {
uint64_t SlotOf(int64_t callSite) {
  uint64_t z = uint64_t(callSite) * 0x9e3779b97f4a7c15ull;
  return (z ^ (z >> 29)) % kShmFpEntries;
}
}  // namespace

void FingerprintRecord::Store(int64_t site, const ShmFingerprint& fp) {
  callSite = site;
  coll = fp.coll;
  send = fp.send;
  recv = fp.recv;
  const size_t len = std::min(fp.text.size(), size_t(kShmFpTextBytes - 1));
  std::memcpy(text, fp.text.data(), len);
  text[len] = '\0';
}

ShmFingerprint FingerprintRecord::Load() const {
  ShmFingerprint fp;
  fp.coll = coll;
  fp.send = send;
  fp.recv = recv;
  fp.text.assign(text, strnlen(text, kShmFpTextBytes));
  return fp;
}

bool ShmGroup::PostFingerprint(int rank, int64_t callSite, const ShmFingerprint& fp) {
  ShmHeader* h = Header(rank);
  if (h == nullptr) return false;
  const uint64_t start = SlotOf(callSite);
  for (int i = 0; i < kShmFpEntries; ++i) {
    ShmFpEntry& e = h->table[(start + i) % kShmFpEntries];
    const uint32_t s = e.state.load(std::memory_order_acquire);
    if (s == 2 && e.rec.callSite == callSite) return true;  // posted before
    if (s != 0) continue;
    e.rec.Store(callSite, fp);
    e.state.store(2, std::memory_order_release);
    return true;
  }
  h->tableFull.store(1, std::memory_order_release);
  return false;
}

int ShmGroup::FindFingerprint(int rank, int64_t callSite, ShmFingerprint* out) const {
  const ShmHeader* h = Header(rank);
  if (h == nullptr) return 0;
  const uint64_t start = SlotOf(callSite);
  for (int i = 0; i < kShmFpEntries; ++i) {
    const ShmFpEntry& e = h->table[(start + i) % kShmFpEntries];
    if (e.state.load(std::memory_order_acquire) != 2) break;
    if (e.rec.callSite != callSite) continue;
    *out = e.rec.Load();
    return 1;
  }
  return h->tableFull.load(std::memory_order_acquire) != 0 ? -1 : 0;
}

void ShmGroup::MarkFailed() {
  for (size_t r = 0; r < bases_.size(); ++r) {
    if (bases_[r] != nullptr) Header(int(r))->failed.store(1, std::memory_order_release);
  }
}

bool ShmGroup::AnyFailed() const {
  for (size_t r = 0; r < bases_.size(); ++r) {
    if (bases_[r] != nullptr && Header(int(r))->failed.load(std::memory_order_acquire) != 0) {
      return true;
    }
  }
  return false;
}

}  // namespace cpu
}  // namespace jax_rccl
