// Parameters, declared once: name, environment variable, type, default, one-line doc.
// Values are read at instantiate (or when Python asks), never inside kernels; docs and
// jax_rccl.params() are generated from this list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ffi/core/status.h"

namespace jax_rccl {

// X(field, env, kind, default, allowed, doc): kind is Int, Float or String; `allowed` says which
// values LoadValidParams takes (its errors and jax_rccl.params() quote it).
#define JAX_RCCL_PARAMS(X)                                                                         \
  X(algo, "JAX_RCCL_ALGO", String, "",                                                             \
    "tree, ring, direct (a comma list, '^' in front to exclude; empty: all)",                      \
    "Algorithms the planner may choose, NCCL syntax: 'Ring', 'Tree,Ring', 'Direct', '^Tree'; "     \
    "empty: all")                                                                                  \
  X(proto, "JAX_RCCL_PROTO", String, "",                                                           \
    "ll, ll128, simple (a comma list, '^' in front to exclude; empty: all)",                       \
    "Protocols the planner may choose, NCCL syntax: 'Simple', 'LL,LL128', '^LL128'; empty: all")   \
  X(timeout, "JAX_RCCL_TIMEOUT", Float, 300.0, "a finite number of seconds > 0",                   \
    "Seconds a rank waits for its peers before the call fails with an error")                      \
  X(stall_grace, "JAX_RCCL_STALL_GRACE", Float, 2.0, "a finite number of seconds >= 0 (0: off)",   \
    "Seconds of an idle process after which a local rank that XLA's CPU thread pool cannot "       \
    "start (too many calls in flight) fails the call; 0: wait for JAX_RCCL_TIMEOUT")               \
  X(debug, "JAX_RCCL_DEBUG", String, "WARN", "WARN, INFO or TRACE (any case)",                     \
    "Log level: WARN, INFO (each plan choice) or TRACE")                                           \
  X(p2p_ll_threshold, "JAX_RCCL_P2P_LL_THRESHOLD", Int, 16384, "an integer >= 0",                  \
    "Point-to-point chunks up to this many bytes use the LL protocol")                             \
  X(nchannels, "JAX_RCCL_NCHANNELS", Int, 0, "an integer 0..64 (0: the topology's count)",         \
    "Channels for collectives; 0 keeps the topology's value (CPU: 2; GPU groups: 32 up to 4 "      \
    "ranks, 16 above; at most 32 on GPUs)")                                                        \
  X(huge_pages, "JAX_RCCL_HUGE_PAGES", Int, 1, "0 or 1",                                           \
    "1: advise transparent huge pages on large CPU outputs before writing them; 0: leave them")    \
  X(cpu_oneshot, "JAX_RCCL_CPU_ONESHOT", Int, 2097152, "an integer >= 0 (0: off)",                 \
    "CPU groups within one process: a Direct call whose larger buffer per rank holds at most "     \
    "this many bytes (all_reduce's counted 4 times) runs one-shot: the last rank to arrive runs "  \
    "every rank's part (one wake-up per call)")                                                    \
  X(transport, "JAX_RCCL_TRANSPORT", String, "auto", "auto, shm, socket",                          \
    "Between processes: auto (shared memory on one host, the network between hosts: "              \
    "JAX_RCCL_NET), shm, or socket (the network between all processes, also on one host)")         \
  X(net, "JAX_RCCL_NET", String, "auto", "auto, socket, ucx",                                      \
    "Network between hosts for CPU and GPU groups: auto (UCX per connection where it offers a "    \
    "transport "                                                                                   \
    "faster than TCP between the two hosts, such as verbs or shared memory; else our TCP), "       \
    "socket (our TCP) or ucx (UCX on every connection: an error when UCX cannot be loaded); "      \
    "every process sets the same")                                                                 \
  X(check_calls, "JAX_RCCL_CHECK_CALLS", Int, 1, "0 or 1",                                         \
    "1: a rank checks every FIFO step it receives against its own call; 0: skip the check "        \
    "(benchmarks; CPU senders still tag their steps, GPU kernels neither tag nor count)")          \
  X(socket_ifaddr, "JAX_RCCL_SOCKET_IFADDR", String, "",                                           \
    "an address of this host, IPv4 or IPv6; empty: chosen",                                        \
    "Address this process's socket listener binds to and other hosts reach it at; empty: "         \
    "JAX_RCCL_SOCKET_IFNAME's, else the interface that reaches JAX's coordinator")                 \
  X(socket_ifname, "JAX_RCCL_SOCKET_IFNAME", String, "",                                           \
    "a comma list of interface name prefixes ('^' in front: excluded; '=' in front: exact); "      \
    "empty: any",                                                                                  \
    "Interfaces the socket listener may bind to, NCCL syntax: prefixes 'eth,ib', '^docker' "       \
    "(exclude), '=eth0' (exact); the first match's address")                                       \
  X(net_threads, "JAX_RCCL_NET_THREADS", Int, 32, "an integer 0..64 (0: the proxy's own thread)",  \
    "Helper threads per GPU communicator across hosts that move its TCP connections' bytes "       \
    "(NCCL_SOCKET_NTHREADS; a CPU communicator takes one); 0: the network proxy's thread moves "   \
    "them itself")                                                                                 \
  X(net_nchannels, "JAX_RCCL_NET_NCHANNELS", Int, 32, "an integer 0..64 (0: no cap)",              \
    "Channels of a GPU group whose ranks span hosts, at most (each channel is a TCP connection "   \
    "each way between two ranks of different hosts); 0: as many as within a host")                 \
  X(net_streams, "JAX_RCCL_NET_STREAMS", Int, 0, "an integer 0..64 (0: a stream per channel)",     \
    "TCP streams each way between two ranks of different hosts that carry a group's "              \
    "channels (channel c on stream c % S; a step goes only into a receive its receiver posted, "   \
    "so channels sharing a stream never hold each other up); 0: a stream per channel; every "      \
    "process of a group sets the same; JAX_RCCL_NET=socket only (auto's TCP connections have a "   \
    "stream each)")                                                                                \
  X(net_trace, "JAX_RCCL_NET_TRACE", String, "", "a folder this process can write; empty: none",   \
    "An existing folder where the network proxy of each GPU group across hosts writes, when it "   \
    "stops, a timeline of its last 2^20 step events (benchmarks/net_trace.py summarizes them); "   \
    "empty: none")                                                                                 \
  X(buffsize, "JAX_RCCL_BUFFSIZE", Int, 4194304,                                                   \
    "a multiple of 4096 from 65536 to 67108864 bytes",                                             \
    "Bytes of a GPU connection's Simple buffer in a group within one host, 8 steps of an eighth "  \
    "each (NCCL_BUFFSIZE); a rank's device memory holds one per channel and rank; every process "  \
    "of a group sets the same")                                                                    \
  X(net_buffsize, "JAX_RCCL_NET_BUFFSIZE", Int, 1048576,                                           \
    "a multiple of 4096 from 65536 to 67108864 bytes",                                             \
    "Bytes of a GPU connection's Simple buffer in a group whose ranks span hosts (its "            \
    "connections within a host too), 8 steps of an eighth each; a window across hosts holds one "  \
    "per channel and direction; every process of a group sets the same")                           \
  X(hostname, "JAX_RCCL_HOSTNAME", String, "", "any name; empty: the machine's host name",         \
    "Host name this process gives its peers (processes with the same one share memory); empty: "   \
    "the machine's host name. Tests set it to run one machine's processes as several hosts")       \
  X(lax, "JAX_RCCL_LAX", String, "", "empty, 0, 1, or a comma-separated list of cpu, cuda, rocm",  \
    "1: jax.lax's collectives run on jax_rccl (jax_rccl.install()) in every program, also one "    \
    "that never imports jax_rccl; a comma-separated list of cpu, cuda, rocm: on those platforms; " \
    "empty or 0: off")

struct Params {
#define JAX_RCCL_PARAM_FIELD_Int(name, def) int64_t name = def;
#define JAX_RCCL_PARAM_FIELD_Float(name, def) double name = def;
#define JAX_RCCL_PARAM_FIELD_String(name, def) std::string name = def;
#define JAX_RCCL_PARAM_FIELD(name, env, kind, def, allowed, doc) \
  JAX_RCCL_PARAM_FIELD_##kind(name, def)
  JAX_RCCL_PARAMS(JAX_RCCL_PARAM_FIELD)
#undef JAX_RCCL_PARAM_FIELD
};

struct ParamInfo {
  const char* name;
  const char* env;
  const char* kind;  // "int", "float", "string"
  std::string defaultValue;
  std::string value;    // as read from the environment (or the default)
  const char* allowed;  // the values LoadValidParams takes, in words
  const char* doc;
};

// Reads every parameter from the environment; values that do not parse keep the default with a
// warning in `warnings`.
Params LoadParams(std::vector<std::string>* warnings = nullptr);
// Reads and checks every parameter: a value that does not parse or is out of its range is an
// error naming the variable, the value and what is allowed (JAX_RCCL_DEBUG is case-insensitive
// and normalized to upper case). The runtime reads its parameters this way.
StatusOr<Params> LoadValidParams();
std::vector<ParamInfo> DescribeParams(const Params& p);
// "jax_rccl: ENV='value' <problem>; allowed: <the parameter's allowed text>": the one shape of
// every settings error (also the planner's JAX_RCCL_ALGO / JAX_RCCL_PROTO checks).
std::string SettingError(const char* env, const std::string& problem);

}  // namespace jax_rccl
