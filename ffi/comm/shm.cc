#include "ffi/comm/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ios>
#include <mutex>
#include <set>
#include <string>
#include <thread>

extern char** environ;

namespace jax_rccl {
namespace comm {

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

// Sessions this process joined (their dead processes' segments are reaped at exit).
std::set<std::string>& Sessions() {
  static std::set<std::string>* s = new std::set<std::string>();
  return *s;
}

void UnlinkRegisteredAtExit() {
  std::set<std::string> sessions;
  {
    std::lock_guard<std::mutex> lock(RegistryMu());
    for (const std::string& n : Registry()) shm_unlink(n.c_str());
    Registry().clear();
    sessions = Sessions();
  }
  for (const std::string& s : sessions) ReapSession(s, /*ownToo=*/false);
}

void CleanUpAtExit() {
  static std::once_flag once;
  std::call_once(once, []() { std::atexit(UnlinkRegisteredAtExit); });
}

void Register(const std::string& name) {
  CleanUpAtExit();
  std::lock_guard<std::mutex> lock(RegistryMu());
  Registry().insert(name);
}

// The inode of this process's pid namespace: pids read from a segment mean the same process only
// when the creator's namespace is ours.
uint64_t PidNamespace() {
  struct stat sb;
  if (stat("/proc/self/ns/pid", &sb) != 0) return 0;
  return uint64_t(sb.st_ino);
}

// The names of this process's segments are removed when the process ends, however it ends: a
// process killed before its peers mapped its segment (SIGKILL), or ended by JAX without its exit
// handlers (the survivors of a job whose coordinator died), cannot remove them itself. A small
// process of its own (`sh`, in a session of its own, started once, at the first segment) reads the
// names from a pipe whose write end only this process holds (close-on-exec) and, at end-of-file,
// when this process is gone, removes them (a name already unlinked is skipped).
class Janitor {
 public:
  static Janitor& Get() {
    static Janitor* j = new Janitor();  // never destroyed: the pipe's end closes with the process
    return *j;
  }
  void Watch(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0 && !failed_) Start();
    if (fd_ < 0) return;
    std::string line = name.substr(name.find_first_not_of('/')) + "\n";
    for (char c : line.substr(0, line.size() - 1)) {
      const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
      if (!plain) return;  // the names jax_rccl makes never hold another character
    }
    const char* p = line.data();
    size_t left = line.size();
    while (left > 0) {
      const ssize_t n = write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      p += n;
      left -= size_t(n);
    }
  }

 private:
  void Start() {
    failed_ = true;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_adddup2(&fa, fds[0], 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
    const char* script =
        "while IFS= read -r n; do set -- \"$@\" \"/dev/shm/$n\"; done; exec rm -f -- \"$@\"";
    char* argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"), const_cast<char*>(script),
                    const_cast<char*>("jrccl-janitor"), nullptr};
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(fds[0]);
    if (rc != 0) {
      close(fds[1]);
      return;
    }
    fd_ = fds[1];
    failed_ = false;
  }

  std::mutex mu_;
  int fd_ = -1;
  bool failed_ = false;
};

void Unlink(const std::string& name) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  shm_unlink(name.c_str());
  Registry().erase(name);
}

}  // namespace

std::vector<std::string> PendingShmNames() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  return std::vector<std::string>(Registry().begin(), Registry().end());
}

ShmGroup::ShmGroup(std::string prefix, const GroupPlacement& placement, ShmRegionLayout layout,
                   std::vector<uint8_t> onHost)
    : placement_(placement), layout_(std::move(layout)), onHost_(std::move(onHost)) {
  NoteShmSession(placement_.session);
  regionOffset_ = int64_t((sizeof(ShmHeader) + 4095) / 4096 * 4096);
  totalBytes_ = regionOffset_ + layout_.bytes;
  std::set<int> procs;
  for (int r = 0; r < layout_.nRanks; ++r) {
    names_.push_back(detail::StrCat(prefix, ".", r));
    if (onHost_[size_t(r)]) {
      Register(names_.back());
      procs.insert(placement_.process[size_t(r)]);
    }
  }
  placement_.processes.assign(procs.begin(), procs.end());
  bases_.assign(size_t(layout_.nRanks), nullptr);
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
  for (int r = 0; r < layout_.nRanks; ++r) {
    if (!placement_.local[size_t(r)] || bases_[size_t(r)] != nullptr) continue;
    const std::string& name = names_[size_t(r)];
    // Sessions are random per run: a file under this name was not made by this run. It is
    // neither used nor removed (it may be another user's).
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    JR_REQUIRE(
        fd >= 0, Code::kSystem, "jax_rccl: cannot create the shared-memory segment ", name, ": ",
        ErrnoText(errno),
        errno == EEXIST ? " (a file of another user holds this run's name; it is not used)" : "");
    Janitor::Get().Watch(name);
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
    h->nRanks = layout_.nRanks;
    h->nChannels = layout_.nChannels;
    h->rank = r;
    h->slotBytes = layout_.slotBytes;
    h->regionOffset = regionOffset_;
    h->totalBytes = totalBytes_;
    h->pid = int32_t(getpid());
    h->pidNamespace = PidNamespace();
    if (layout_.init) layout_.init(base + regionOffset_);
    h->magic.store(kShmMagic, std::memory_order_release);
    bases_[size_t(r)] = base;
    MarkMapped(r);
  }
  return Status::Ok();
}

// Every size and offset a peer's header states must be what this process derives from the
// geometry: nothing read from a segment may point outside it.
Status ShmGroup::CheckLayout(const char* base, int rank, const std::string& name) const {
  const ShmHeader* h = reinterpret_cast<const ShmHeader*>(base);
  if (h->nRanks != layout_.nRanks || h->nChannels != layout_.nChannels ||
      h->slotBytes != layout_.slotBytes || h->rank != rank) {
    JR_FAIL(Code::kInvalidUsage, "jax_rccl: the shared-memory segment ", name, " was made for ",
            h->nRanks, " ranks, ", h->nChannels, " channels, slots of ", h->slotBytes,
            " bytes (rank ", h->rank, "); this process expects ", layout_.nRanks, ", ",
            layout_.nChannels, ", ", layout_.slotBytes, " (rank ", rank,
            "; do the processes use the same JAX_RCCL_NCHANNELS?)");
  }
  JR_REQUIRE(h->regionOffset == regionOffset_ && h->totalBytes == totalBytes_, Code::kInvalidUsage,
             "jax_rccl: refused the shared-memory segment ", name,
             ": its header places the region at ", h->regionOffset, " of ", h->totalBytes,
             " bytes, this process expects ", regionOffset_, " of ", totalBytes_);
  if (layout_.check) JR_CHECK(layout_.check(base + regionOffset_, name));
  return Status::Ok();
}

Status ShmGroup::OpenRemote(Clock::time_point deadline, const std::atomic<bool>* aborted,
                            int* missingRank) {
  *missingRank = -1;
  int sleepUs = 50;
  while (true) {
    bool all = true;
    for (int r = 0; r < layout_.nRanks; ++r) {
      if (bases_[size_t(r)] != nullptr || !onHost_[size_t(r)]) continue;
      const std::string& name = names_[size_t(r)];
      const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK, 0600);
      if (fd < 0) {
        JR_REQUIRE(errno == ENOENT, Code::kSystem,
                   "jax_rccl: cannot open the shared-memory segment ", name, " of rank ", r, ": ",
                   ErrnoText(errno));
        all = false;
        continue;
      }
      // Before mapping: the segment must be a regular file of this user, readable and writable by
      // no one else, of exactly the size this process expects (growing from 0 while its creator
      // sizes it). Anything else was not made by a process of this run: refused, never mapped.
      struct stat sb;
      if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        JR_FAIL(Code::kSystem, "jax_rccl: cannot stat the shared-memory segment ", name, ": ",
                ErrnoText(e));
      }
      const bool ours =
          S_ISREG(sb.st_mode) && sb.st_uid == geteuid() && (sb.st_mode & (S_IRWXG | S_IRWXO)) == 0;
      if (!ours) {
        close(fd);
        JR_FAIL(Code::kInvalidUsage, "jax_rccl: refused the shared-memory segment ", name,
                " of rank ", r, ": it belongs to uid ", int64_t(sb.st_uid), " with mode 0",
                std::oct, int(sb.st_mode & 07777), std::dec,
                ", while this run's segments belong to uid ", int64_t(geteuid()),
                " with mode 0600 (another user's file in the run's place; it was not mapped)");
      }
      if (sb.st_size == 0) {  // not sized yet (its creator sizes it in one step)
        close(fd);
        all = false;
        continue;
      }
      if (sb.st_size != totalBytes_) {
        close(fd);
        JR_FAIL(Code::kInvalidUsage, "jax_rccl: refused the shared-memory segment ", name,
                " of rank ", r, ": it has ", int64_t(sb.st_size), " bytes, this process expects ",
                totalBytes_, " (do the processes use the same JAX_RCCL_NCHANNELS and version?)");
      }
      void* p = mmap(nullptr, size_t(totalBytes_), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      const int e = errno;
      close(fd);
      JR_REQUIRE(p != MAP_FAILED, Code::kSystem, "jax_rccl: cannot map the shared-memory segment ",
                 name, ": ", ErrnoText(e));
      ShmHeader* h = static_cast<ShmHeader*>(p);
      if (h->magic.load(std::memory_order_acquire) != kShmMagic) {  // not initialized yet
        munmap(p, size_t(totalBytes_));
        all = false;
        continue;
      }
      Status layout = CheckLayout(static_cast<char*>(p), r, name);
      if (!layout.ok()) {
        munmap(p, size_t(totalBytes_));
        JR_CHECK(layout);
      }
      bases_[size_t(r)] = static_cast<char*>(p);
      MarkMapped(r);
    }
    if (all) return Status::Ok();
    // A rank whose process exited will never map its segment (its janitor removed the name).
    int exited = -1;
    for (int r = 0; r < layout_.nRanks && exited < 0; ++r) {
      if (bases_[size_t(r)] == nullptr && onHost_[size_t(r)] &&
          Liveness(r) == PeerLiveness::kExited) {
        exited = r;
      }
    }
    if (exited >= 0 || (aborted != nullptr && aborted->load()) || Clock::now() >= deadline) {
      for (int r = 0; r < layout_.nRanks && exited < 0; ++r) {
        if (bases_[size_t(r)] == nullptr && onHost_[size_t(r)]) exited = r;
      }
      *missingRank = exited;
      JR_FAIL(Code::kTimeout, "timed out");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleepUs));
    sleepUs = std::min(sleepUs * 2, 5000);
  }
}

void ShmGroup::MaybeUnlink() {
  if (unlinked()) return;
  for (int r = 0; r < layout_.nRanks; ++r) {
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

void ShmGroup::MarkFailed(const std::string& reason, Code code) {
  const size_t len = std::min(reason.size(), size_t(kShmFailTextBytes - 1));
  for (size_t r = 0; r < bases_.size(); ++r) {
    if (bases_[r] == nullptr) continue;
    ShmHeader* h = Header(int(r));
    uint32_t none = 0;
    if (h->failText.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) {
      h->failProcess = placement_.thisProcess;
      h->failCode = int32_t(code);
      std::memcpy(h->reason, reason.data(), len);
      h->reason[len] = '\0';
      h->failText.store(2, std::memory_order_release);
    }
    h->failed.store(1, std::memory_order_release);
  }
}

bool ShmGroup::AnyFailed(std::string* why, Code* code) const {
  if (code != nullptr) *code = Code::kTimeout;
  bool any = false;
  for (size_t r = 0; r < bases_.size(); ++r) {
    if (bases_[r] == nullptr) continue;
    const ShmHeader* h = Header(int(r));
    if (h->failed.load(std::memory_order_acquire) == 0) continue;
    any = true;
    if (why == nullptr) return true;
    if (h->failText.load(std::memory_order_acquire) == 2) {
      if (code != nullptr && h->failCode > int32_t(Code::kOk) &&
          h->failCode <= int32_t(Code::kSystem))
        *code = Code(h->failCode);
      *why = detail::StrCat("process ", h->failProcess, " reported its communicator failed: ",
                            std::string(h->reason, strnlen(h->reason, kShmFailTextBytes)));
      return true;
    }
  }
  if (any && why != nullptr) *why = "another process of the group reported its communicator failed";
  return any;
}

void ShmGroup::SetEntered(int rank, uint64_t calls, uint64_t call, const std::string& text) {
  if (bases_[size_t(rank)] == nullptr) return;
  ShmHeader* h = Header(rank);
  h->entered.store(0, std::memory_order_release);  // readers retry while the fields change
  h->enteredCall.store(call, std::memory_order_release);
  const size_t len = std::min(text.size(), size_t(kShmCallTextBytes - 1));
  std::memcpy(h->callText, text.data(), len);
  h->callText[len] = '\0';
  h->entered.store(calls, std::memory_order_release);
}

bool ShmGroup::EnteredCall(int rank, uint64_t* calls, uint64_t* call, std::string* text) const {
  if (bases_[size_t(rank)] == nullptr) return false;
  const ShmHeader* h = Header(rank);
  const uint64_t a = h->entered.load(std::memory_order_acquire);
  *call = h->enteredCall.load(std::memory_order_acquire);
  char buf[kShmCallTextBytes];
  std::memcpy(buf, h->callText, sizeof(buf));
  buf[sizeof(buf) - 1] = '\0';
  std::atomic_thread_fence(std::memory_order_acquire);
  const uint64_t b = h->entered.load(std::memory_order_acquire);
  if (a == 0 || a != b) return false;
  *calls = a;
  *text = buf;
  return true;
}

uint64_t ShmGroup::Entered(int rank) const {
  return bases_[size_t(rank)] == nullptr ? 0
                                         : Header(rank)->entered.load(std::memory_order_acquire);
}

namespace {

PeerLiveness LivenessOf(int32_t pid, uint64_t ns) {
  static const uint64_t mine = PidNamespace();
  if (pid <= 0 || ns == 0 || ns != mine) return PeerLiveness::kUnknown;
  if (kill(pid, 0) != 0 && errno == ESRCH) return PeerLiveness::kExited;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return PeerLiveness::kExited;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // the command may hold spaces and parentheses
  if (paren == nullptr || paren[1] == '\0') return PeerLiveness::kUnknown;
  const char state = paren[2];
  if (state == 'Z' || state == 'X') return PeerLiveness::kExited;
  if (state == 'T' || state == 't') return PeerLiveness::kStopped;
  return PeerLiveness::kAlive;
}

}  // namespace

PeerLiveness ShmGroup::Liveness(int rank) const {
  if (bases_[size_t(rank)] == nullptr) {
    // Not mapped (yet): the pid the world table gives its process.
    const size_t r = size_t(rank);
    if (r >= placement_.pid.size() || r >= placement_.pidNamespace.size()) {
      return PeerLiveness::kUnknown;
    }
    return LivenessOf(int32_t(placement_.pid[r]), placement_.pidNamespace[r]);
  }
  const ShmHeader* h = Header(rank);
  return LivenessOf(h->pid, h->pidNamespace);
}

void NoteShmSession(const std::string& session) {
  CleanUpAtExit();
  std::lock_guard<std::mutex> lock(RegistryMu());
  Sessions().insert(session);
}

int ReapSession(const std::string& session, bool ownToo) {
  if (session.empty()) return 0;
  const std::string prefix = detail::StrCat("jrccl.", session, ".");
  if (ownToo) {
    std::vector<std::string> own;
    {
      std::lock_guard<std::mutex> lock(RegistryMu());
      for (const std::string& n : Registry()) {
        if (n.compare(0, prefix.size() + 1, "/" + prefix) == 0) own.push_back(n);
      }
    }
    for (const std::string& n : own) Unlink(n);
  }
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::vector<std::string> dead;
  // Anyone can put an entry under the (public) session's names: only regular files of this user
  // that no one else may access are opened (never a FIFO, a device or a link: the open could
  // block or follow it), without blocking, and checked again once open.
  const auto isOurs = [](const struct stat& sb) {
    return S_ISREG(sb.st_mode) && sb.st_uid == geteuid() && (sb.st_mode & (S_IRWXG | S_IRWXO)) == 0;
  };
  while (struct dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    struct stat sb;
    if (fstatat(dirfd(dir), name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0 || !isOurs(sb)) continue;
    const int fd = openat(dirfd(dir), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    void* p = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && isOurs(sb) && sb.st_size >= off_t(sizeof(ShmHeader))) {
      p = mmap(nullptr, sizeof(ShmHeader), PROT_READ, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (p == MAP_FAILED) continue;
    const ShmHeader* h = static_cast<const ShmHeader*>(p);
    if (h->magic.load(std::memory_order_acquire) == kShmMagic &&
        LivenessOf(h->pid, h->pidNamespace) == PeerLiveness::kExited) {
      dead.push_back("/" + name);
    }
    munmap(p, sizeof(ShmHeader));
  }
  closedir(dir);
  for (const std::string& n : dead) Unlink(n);
  return int(dead.size());
}

}  // namespace comm
}  // namespace jax_rccl
