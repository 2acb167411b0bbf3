// The world table: which process (and host) owns every device of a multi-process run, set once
// from Python (jax_rccl/_bootstrap.py calls _jax_rccl.set_world) when the first group is
// connected (EnsureWorld), not when a program is lowered. Without it every device is local (one
// process).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ffi/core/status.h"

namespace jax_rccl {
namespace comm {

struct WorldDevice {
  int64_t id = 0;  // global device id
  int process = 0;
  std::string host;
};

struct WorldTable {
  int process = 0;  // this process's index
  int nprocesses = 1;
  std::string session;  // hex, the same in every process of a run, unique per run
  std::vector<WorldDevice> devices;
  // By process: "host:port" of its socket listener (jax_rccl/_bootstrap.py), or empty when
  // the processes publish none (then every group must stay within one host).
  std::vector<std::string> endpoints;
  // By process: its pid and the inode of its pid namespace (/proc/self/ns/pid), or empty: a peer
  // of this host whose segment never appeared is told apart from one that exited by them.
  std::vector<int64_t> pids;
  std::vector<uint64_t> pidNamespaces;
  // The entry of device `id`, or null.
  const WorldDevice* Find(int64_t id) const;
};

// Who meets the other processes: a function that sets the table (SetWorldTable, and the secret)
// or leaves it unset in a single-process program. The bind layer installs one that runs
// jax_rccl/_bootstrap.py under the interpreter's lock; without one, nothing is met.
using WorldProvider = std::function<Status()>;
void SetWorldProvider(WorldProvider provider);
// Runs the provider once, the first time any group is connected (every process of an SPMD program
// connects its groups, so every process meets the others): later calls return at once. A failure
// is returned to every caller that comes while it stands (the provider remembers it).
// Call it holding no lock that Python code could wait for.
Status EnsureWorld();

// Validates and installs `table` (replacing an earlier one).
Status SetWorldTable(WorldTable table);
// The table set, or null when none was.
std::shared_ptr<const WorldTable> GetWorldTable();

// The run's secret: random bytes (at least 16) that process 0 draws and every process of the run
// reads from JAX's key-value store (jax_rccl/_bootstrap.py). It never appears in a name, a path or
// a message: every socket connection proves knowledge of it before it carries data (socket.cc),
// and shared-memory names carry a tag derived from it (ShmNameTag), so other users of the host
// cannot predict them. Set once per process (the same value again is a no-op; another is an
// error).
Status SetSessionSecret(std::string secret);
// The secret set, or empty.
std::string SessionSecret();
// 16 hex digits derived from the secret and `group` (an HMAC of a label and the group's name
// part), or empty without a secret: every group's names are unpredictable on their own.
std::string ShmNameTag(const std::string& group);

// Where the devices of one replica group live.
struct GroupPlacement {
  bool crossProcess = false;  // some device belongs to another process
  int thisProcess = 0;
  std::string thisHost;
  std::vector<int> process;            // by rank
  std::vector<std::string> host;       // by rank
  std::vector<std::string> endpoint;   // by rank: its process's "host:port" ("" if none)
  std::vector<uint8_t> local;          // by rank: owned by this process
  std::vector<int64_t> pid;            // by rank: its process's pid (0: unknown)
  std::vector<uint64_t> pidNamespace;  // by rank: that pid's namespace (0: unknown)
  std::vector<int> processes;          // the distinct processes of the group, ascending
  std::string session;
};

// Classifies `devices` (rank order) against the world table: all local (no table, or every
// device in this process), or spanning processes (of one host or several). Errors: a device
// missing from the table (kInvalidArgument), devices on several hosts when the processes published
// no socket endpoints (kUnsupported, naming the hosts), a group with none of this process's
// devices (kInvalidArgument), a group across processes without a session secret
// (kInvalidUsage).
StatusOr<GroupPlacement> PlaceGroup(const std::vector<int64_t>& devices);

}  // namespace comm
}  // namespace jax_rccl
